"""asyncpg through sharded refract, compared with one plain PostgreSQL (run by
crates/refract-dispatch/tests/it/pg_sharded_drivers.rs; see sharded_harness.py).

Usage: sharded_asyncpg.py REFRACT_PORT ORACLE_PORT SHARD_PORT... asyncpg with its defaults:
every statement with or without arguments through the extended protocol as a named prepared
statement (`__asyncpg_stmt_N__`, its statement cache), results in binary format;
`execute()` without arguments is a simple Query (the schema, BEGIN/COMMIT of
`conn.transaction()`); `executemany` pipelines Bind/Execute of one statement under one Sync.
"""
import asyncio

import asyncpg

import harness as h
import sharded_harness as sh
from sharded_harness import check

# Seconds a statement may take before the driver gives up (a hung statement fails its check).
TIMEOUT = 10


def connect(port):
    return asyncpg.connect(
        host=h.HOST, port=port, user=h.USER, password=h.PASSWORD, database=h.DATABASE, timeout=10, command_timeout=TIMEOUT
    )


def query(port, sql):
    """Rows of `sql` (a simple Query when it returns none) on `port`, for the harness."""

    async def go():
        c = await connect(port)
        try:
            return [tuple(r) for r in await c.fetch(sql)]
        finally:
            await c.close()

    return asyncio.run(go())


class S:
    """One connection's steps, recorded in `rec`; a PostgreSQL error is recorded, not raised."""

    def __init__(self, conn, rec):
        self.c, self.rec = conn, rec

    async def rows(self, label, sql, *args, ordered=True):
        try:
            rows = await self.c.fetch(sql, *args)
        except asyncpg.PostgresError as e:
            self.rec.error(label, e.sqlstate, str(e))
            return None
        self.rec.rows(label, rows, ordered)
        return rows

    async def run(self, label, sql, *args):
        """A statement's status (`UPDATE 2`)."""
        try:
            self.rec.add(label, await self.c.execute(sql, *args))
        except asyncpg.PostgresError as e:
            self.rec.error(label, e.sqlstate, str(e))

    async def many(self, label, sql, args):
        try:
            await self.c.executemany(sql, args)
            self.rec.add(label, "ok")
        except asyncpg.PostgresError as e:
            self.rec.error(label, e.sqlstate, str(e))


def both(body):
    """A check: `body(S)` against refract, then against the oracle, compared."""

    async def on(port):
        rec = sh.Rec()
        c = await connect(port)
        try:
            await body(S(c, rec))
        finally:
            await c.close()
        return rec

    def run():
        got = asyncio.run(on(sh.REFRACT))
        want = asyncio.run(on(sh.ORACLE))
        sh.compare(got, want)

    return run


def t_setup():
    async def go(port):
        c = await connect(port)
        try:
            for sql in sh.SCHEMA + sh.LOAD:
                await c.execute(sql)
        finally:
            await c.close()

    asyncio.run(go(sh.ORACLE))
    asyncio.run(go(sh.REFRACT))
    sh.check_loaded(query)


SELECT_CUSTOMER = "SELECT id, name, city, score, balance FROM customers WHERE id = $1"


async def keyed_read(s):
    for shard in (0, 1):
        k = sh.key_on(shard, 1)
        await s.rows(f"id {k} (shard {shard})", SELECT_CUSTOMER, k)
    await s.rows("absent id", SELECT_CUSTOMER, 100000)


async def in_list(s):
    a, b, c, d = sh.keys_on_both(1, 4)
    await s.rows("IN", "SELECT id, name FROM customers WHERE id IN ($1, $2, $3, $4) ORDER BY id", a, b, c, d)


async def any_array(s):
    keys = sh.keys_on_both(3, 6) + [100000]
    await s.rows("= ANY", "SELECT id, name, score FROM customers WHERE id = ANY($1::int8[]) ORDER BY id", keys)
    await s.rows("orders = ANY", "SELECT id, customer_id, qty FROM orders WHERE customer_id = ANY($1) ORDER BY id", keys)


async def scatter_count(s):
    await s.rows("count(*)", "SELECT count(*) FROM customers")
    await s.rows("count with a parameter", "SELECT count(*) FROM orders WHERE qty >= $1", 3)


async def scatter_where(s):
    await s.rows("balance > $1", "SELECT id, name, balance FROM customers WHERE balance > $1", 0, ordered=False)
    await s.rows("count balance > $1", "SELECT count(*) FROM customers WHERE balance > $1", 0)


async def scatter_order_limit(s):
    sql = "SELECT id, name, score FROM customers WHERE score > $1 ORDER BY score DESC, id LIMIT 7 OFFSET 2"
    await s.rows("ORDER BY LIMIT OFFSET", sql, -20)
    await s.rows("ORDER BY name LIMIT", "SELECT name, id FROM customers WHERE id > $1 ORDER BY name DESC LIMIT 5", 10)


async def group_by_aggregates(s):
    sql = "SELECT city, count(*), sum(score), min(score), max(score) FROM customers WHERE id > $1 GROUP BY city ORDER BY city"
    await s.rows("GROUP BY city", sql, 5)
    sql = "SELECT count(*), sum(qty), min(customer_id), max(customer_id) FROM orders WHERE qty > $1"
    await s.rows("whole-table aggregates", sql, 2)


async def group_by_avg(s):
    sql = "SELECT city, avg(score), avg(balance), sum(balance) FROM customers WHERE id > $1 GROUP BY city ORDER BY city"
    await s.rows("avg", sql, 5)


async def distinct(s):
    await s.rows("DISTINCT", "SELECT DISTINCT city FROM customers WHERE score > $1 ORDER BY city", 0)
    await s.rows("DISTINCT 2", "SELECT DISTINCT qty, customer_id % 3 AS m FROM orders WHERE qty < $1", 5, ordered=False)


async def colocated_join(s):
    sql = (
        "SELECT c.id AS cid, c.name, o.id AS oid, o.qty FROM customers c JOIN orders o ON o.customer_id = c.id "
        "WHERE o.qty > $1 ORDER BY oid"
    )
    await s.rows("join on the key", sql, 4)
    sql = "SELECT c.name, o.id, o.qty FROM customers c JOIN orders o ON o.customer_id = c.id WHERE c.id = $1 ORDER BY o.id"
    await s.rows("keyed join", sql, sh.key_on(1, 1))


async def replicated_read(s):
    await s.rows("products", "SELECT id, name, price FROM products WHERE price > $1 ORDER BY id", 10)
    await s.rows("product by id", "SELECT name FROM products WHERE id = $1", 3)


INSERT_CUSTOMER = "INSERT INTO customers (id, name, city, score, balance) VALUES ($1, $2, $3, $4, $5)"


async def insert_one(s):
    keys = sh.keys_on_both(1000, 2)
    for k in keys:
        await s.run(f"insert {k} (shard {sh.shard_of(k)})", INSERT_CUSTOMER, k, f"n{k}", "Zug", k % 50, None)
    for k in keys:
        await s.rows(f"read {k}", SELECT_CUSTOMER, k)


async def insert_many(s):
    keys = sh.span(2000, 200)
    await s.many("executemany", INSERT_CUSTOMER, [(k, f"m{k}", "Chur", k % 100, None) for k in keys])
    await s.rows("count", "SELECT count(*), sum(score) FROM customers WHERE id BETWEEN $1 AND $2", 2000, 2199)
    await s.rows("keyed", SELECT_CUSTOMER, 2001)


async def keyed_update(s):
    for k in sh.keys_on_both(10, 2):
        await s.run(f"update {k}", "UPDATE customers SET score = score + $1, name = $2 WHERE id = $3", 5, f"u{k}", k)
        await s.rows(f"read {k}", SELECT_CUSTOMER, k)
    await s.run("update absent", "UPDATE customers SET score = 0 WHERE id = $1", 100000)


async def keyed_delete(s):
    for k in sh.keys_on_both(40, 2):
        await s.run(f"delete {k}", "DELETE FROM customers WHERE id = $1", k)
        await s.rows(f"read {k}", SELECT_CUSTOMER, k)
    await s.run("delete absent", "DELETE FROM customers WHERE id = $1", 100000)


async def replicated_write(s):
    await s.run("insert", "INSERT INTO products (id, name, price) VALUES ($1, $2, $3)", 100, "new", 1.5)
    await s.run("update", "UPDATE products SET price = price * $1 WHERE id <= $2", 2, 3)
    await s.run("delete", "DELETE FROM products WHERE id = $1", 4)
    await s.rows("read", "SELECT id, name, price FROM products ORDER BY id")


async def tx_one_shard_commit(s):
    k = sh.key_on(0, 3000)
    async with s.c.transaction():
        await s.run("insert", INSERT_CUSTOMER, k, "t1", "Bern", 1, None)
        await s.run("update", "UPDATE customers SET score = score + $1 WHERE id = $2", 10, k)
        await s.rows("read inside", SELECT_CUSTOMER, k)
    await s.rows("after commit", SELECT_CUSTOMER, k)


async def tx_one_shard_rollback(s):
    k = sh.key_on(1, 3100)
    tx = s.c.transaction()
    await tx.start()
    await s.run("insert", INSERT_CUSTOMER, k, "t2", "Bern", 1, None)
    await s.rows("read inside", SELECT_CUSTOMER, k)
    await tx.rollback()
    await s.rows("after rollback", SELECT_CUSTOMER, k)


async def tx_two_shards_commit(s):
    a, b = sh.keys_on_both(3200, 2)
    async with s.c.transaction():
        await s.run("insert shard 0", INSERT_CUSTOMER, a, "x0", "Zug", 1, None)
        await s.run("insert shard 1", INSERT_CUSTOMER, b, "x1", "Zug", 2, None)
        await s.run("update shard 0", "UPDATE customers SET score = $1 WHERE id = $2", 7, a)
    for k in (a, b):
        await s.rows(f"read {k}", SELECT_CUSTOMER, k)


async def tx_two_shards_rollback(s):
    a, b = sh.keys_on_both(3300, 2)
    try:
        async with s.c.transaction():
            await s.run("insert shard 0", INSERT_CUSTOMER, a, "y0", "Zug", 1, None)
            await s.run("insert shard 1", INSERT_CUSTOMER, b, "y1", "Zug", 2, None)
            raise LookupError("roll back")
    except LookupError:
        pass
    for k in (a, b):
        await s.rows(f"read {k}", SELECT_CUSTOMER, k)


async def tx_scatter_read(s):
    a, b = sh.keys_on_both(3400, 2)
    async with s.c.transaction():
        await s.run("insert shard 0", INSERT_CUSTOMER, a, "z0", "Zug", 3, None)
        await s.run("insert shard 1", INSERT_CUSTOMER, b, "z1", "Zug", 4, None)
        sql = "SELECT count(*), sum(score) FROM customers WHERE id BETWEEN $1 AND $2"
        await s.rows("scatter inside", sql, 3400, 3499)
        await s.rows("scatter rows inside", "SELECT id, name FROM customers WHERE id >= $1 ORDER BY id", 3400)
    await s.rows("after commit", "SELECT count(*) FROM customers WHERE id BETWEEN $1 AND $2", 3400, 3499)


def t_unique_violation():
    async def body(s):
        for k in sh.keys_on_both(1, 2):
            await s.run(f"duplicate {k}", INSERT_CUSTOMER, k, "dup", None, None, None)
        await s.rows("usable after", "SELECT 1")

    both(body)()


def t_refused_window():
    async def go():
        c = await connect(sh.REFRACT)
        try:
            try:
                await c.fetch("SELECT id, row_number() OVER (ORDER BY id) FROM customers WHERE score > $1", 0)
            except asyncpg.PostgresError as e:
                sh.refusal(e.sqlstate, str(e), "window functions")
            else:
                raise AssertionError("not refused")
            h.eq(await c.fetchval("SELECT count(*) FROM customers WHERE id = $1", 1), 1, "usable after")
        finally:
            await c.close()

    asyncio.run(go())


def t_tx_two_shards_commit():
    both(tx_two_shards_commit)()
    sh.no_prepared_left(query)


sh.init(query)
check("setup", t_setup, timeout=40)
for name, body in [
    ("keyed_read", keyed_read),
    ("in_list", in_list),
    ("any_array", any_array),
    ("scatter_count", scatter_count),
    ("scatter_where", scatter_where),
    ("scatter_order_limit", scatter_order_limit),
    ("group_by_aggregates", group_by_aggregates),
    ("group_by_avg", group_by_avg),
    ("distinct", distinct),
    ("colocated_join", colocated_join),
    ("replicated_read", replicated_read),
    ("insert_one", insert_one),
    ("insert_many", insert_many),
    ("keyed_update", keyed_update),
    ("keyed_delete", keyed_delete),
    ("replicated_write", replicated_write),
    ("tx_one_shard_commit", tx_one_shard_commit),
    ("tx_one_shard_rollback", tx_one_shard_rollback),
]:
    check(name, both(body))
check("tx_two_shards_commit", t_tx_two_shards_commit)
check("tx_two_shards_rollback", both(tx_two_shards_rollback))
check("tx_scatter_read", both(tx_scatter_read))
check("unique_violation", t_unique_violation)
check("refused_window", t_refused_window)
check("placement", lambda: sh.placement(query))
check("tables_equal", lambda: sh.tables_equal(query))
h.finish()
