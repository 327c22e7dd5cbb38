"""psycopg 3 through sharded refract, compared with one plain PostgreSQL (run by
crates/refract-dispatch/tests/it/pg_sharded_drivers.rs; see sharded_harness.py).

Usage: sharded_psycopg3.py REFRACT_PORT ORACLE_PORT SHARD_PORT... psycopg 3 with its defaults:
a statement with parameters goes through the extended protocol (the unnamed statement, named
after `prepare_threshold` = 5 executions), results in text format; one without parameters is
a simple Query; `executemany` runs in pipeline mode. Connections are not autocommit: the
first statement sends BEGIN, `commit()`/`rollback()` end the transaction, and
`with conn.transaction()` wraps a block in one. The checks that are not about transactions
use autocommit connections, as applications that do not want a transaction per read do.
"""
import psycopg

import harness as h
import sharded_harness as sh
from sharded_harness import check


def dsn(port):
    return f"host={h.HOST} port={port} user={h.USER} password={h.PASSWORD} dbname={h.DATABASE} connect_timeout=10"


def connect(port, autocommit=True):
    return psycopg.connect(dsn(port), autocommit=autocommit)


def query(port, sql):
    """Rows of `sql` on `port` (a simple Query, autocommit), for the harness."""
    with connect(port) as c:
        cur = c.execute(sql)
        return [tuple(r) for r in cur.fetchall()] if cur.description else []


class S:
    """One connection's steps, recorded in `rec`; a PostgreSQL error is recorded, not raised."""

    def __init__(self, conn, rec):
        self.c, self.rec = conn, rec

    def rows(self, label, sql, params=None, ordered=True):
        try:
            rows = self.c.execute(sql, params).fetchall()
        except psycopg.Error as e:
            self.rec.error(label, e.sqlstate, str(e))
            return None
        self.rec.rows(label, rows, ordered)
        return rows

    def run(self, label, sql, params=None):
        """A statement's status and row count."""
        try:
            cur = self.c.execute(sql, params)
            self.rec.add(label, (cur.statusmessage, cur.rowcount))
        except psycopg.Error as e:
            self.rec.error(label, e.sqlstate, str(e))

    def many(self, label, sql, params):
        try:
            with self.c.cursor() as cur:
                cur.executemany(sql, params)
            self.rec.add(label, "ok")
        except psycopg.Error as e:
            self.rec.error(label, e.sqlstate, str(e))

    def end(self, label, commit):
        """`commit()` or `rollback()` of the connection's transaction."""
        try:
            self.c.commit() if commit else self.c.rollback()
            self.rec.add(label, str(self.c.info.transaction_status))
        except psycopg.Error as e:
            self.rec.error(label, e.sqlstate, str(e))


def both(body, autocommit=True):
    """A check: `body(S)` against refract, then against the oracle, compared."""

    def on(port):
        rec = sh.Rec()
        with connect(port, autocommit) as c:
            body(S(c, rec))
        return rec

    return lambda: sh.compare(on(sh.REFRACT), on(sh.ORACLE))


def t_setup():
    for port in (sh.ORACLE, sh.REFRACT):
        with connect(port) as c:
            for sql in sh.SCHEMA + sh.LOAD:
                c.execute(sql)
    sh.check_loaded(query)


SELECT_CUSTOMER = "SELECT id, name, city, score, balance FROM customers WHERE id = %s"


def keyed_read(s):
    for shard in (0, 1):
        k = sh.key_on(shard, 1)
        s.rows(f"id {k} (shard {shard})", SELECT_CUSTOMER, (k,))
    s.rows("absent id", SELECT_CUSTOMER, (100000,))


def in_list(s):
    keys = sh.keys_on_both(1, 4)
    s.rows("IN", "SELECT id, name FROM customers WHERE id IN (%s, %s, %s, %s) ORDER BY id", keys)


def any_array(s):
    keys = sh.keys_on_both(3, 6) + [100000]
    s.rows("= ANY", "SELECT id, name, score FROM customers WHERE id = ANY(%s) ORDER BY id", (keys,))
    s.rows("orders = ANY", "SELECT id, customer_id, qty FROM orders WHERE customer_id = ANY(%s) ORDER BY id", (keys,))


def scatter_count(s):
    s.rows("count(*)", "SELECT count(*) FROM customers")
    s.rows("count with a parameter", "SELECT count(*) FROM orders WHERE qty >= %s", (3,))


def scatter_where(s):
    s.rows("balance > %s", "SELECT id, name, balance FROM customers WHERE balance > %s", (0,), ordered=False)
    s.rows("count balance > %s", "SELECT count(*) FROM customers WHERE balance > %s", (0,))


def scatter_order_limit(s):
    sql = "SELECT id, name, score FROM customers WHERE score > %s ORDER BY score DESC, id LIMIT 7 OFFSET 2"
    s.rows("ORDER BY LIMIT OFFSET", sql, (-20,))
    s.rows("ORDER BY name LIMIT", "SELECT name, id FROM customers WHERE id > %s ORDER BY name DESC LIMIT 5", (10,))


def group_by_aggregates(s):
    sql = "SELECT city, count(*), sum(score), min(score), max(score) FROM customers WHERE id > %s GROUP BY city ORDER BY city"
    s.rows("GROUP BY city", sql, (5,))
    sql = "SELECT count(*), sum(qty), min(customer_id), max(customer_id) FROM orders WHERE qty > %s"
    s.rows("whole-table aggregates", sql, (2,))


def group_by_avg(s):
    sql = "SELECT city, avg(score), avg(balance), sum(balance) FROM customers WHERE id > %s GROUP BY city ORDER BY city"
    s.rows("avg", sql, (5,))


def distinct(s):
    s.rows("DISTINCT", "SELECT DISTINCT city FROM customers WHERE score > %s ORDER BY city", (0,))
    s.rows("DISTINCT 2", "SELECT DISTINCT qty, customer_id %% 3 AS m FROM orders WHERE qty < %s", (5,), ordered=False)


def colocated_join(s):
    sql = (
        "SELECT c.id AS cid, c.name, o.id AS oid, o.qty FROM customers c JOIN orders o ON o.customer_id = c.id "
        "WHERE o.qty > %s ORDER BY oid"
    )
    s.rows("join on the key", sql, (4,))
    sql = "SELECT c.name, o.id, o.qty FROM customers c JOIN orders o ON o.customer_id = c.id WHERE c.id = %s ORDER BY o.id"
    s.rows("keyed join", sql, (sh.key_on(1, 1),))


def replicated_read(s):
    s.rows("products", "SELECT id, name, price FROM products WHERE price > %s ORDER BY id", (10,))
    s.rows("product by id", "SELECT name FROM products WHERE id = %s", (3,))


INSERT_CUSTOMER = "INSERT INTO customers (id, name, city, score, balance) VALUES (%s, %s, %s, %s, %s)"


def insert_one(s):
    keys = sh.keys_on_both(1000, 2)
    for k in keys:
        s.run(f"insert {k} (shard {sh.shard_of(k)})", INSERT_CUSTOMER, (k, f"n{k}", "Zug", k % 50, None))
    for k in keys:
        s.rows(f"read {k}", SELECT_CUSTOMER, (k,))


def insert_many(s):
    keys = sh.span(2000, 200)
    s.many("executemany", INSERT_CUSTOMER, [(k, f"m{k}", "Chur", k % 100, None) for k in keys])
    s.rows("count", "SELECT count(*), sum(score) FROM customers WHERE id BETWEEN %s AND %s", (2000, 2199))
    s.rows("keyed", SELECT_CUSTOMER, (2001,))


def keyed_update(s):
    for k in sh.keys_on_both(10, 2):
        s.run(f"update {k}", "UPDATE customers SET score = score + %s, name = %s WHERE id = %s", (5, f"u{k}", k))
        s.rows(f"read {k}", SELECT_CUSTOMER, (k,))
    s.run("update absent", "UPDATE customers SET score = 0 WHERE id = %s", (100000,))


def keyed_delete(s):
    for k in sh.keys_on_both(40, 2):
        s.run(f"delete {k}", "DELETE FROM customers WHERE id = %s", (k,))
        s.rows(f"read {k}", SELECT_CUSTOMER, (k,))
    s.run("delete absent", "DELETE FROM customers WHERE id = %s", (100000,))


def replicated_write(s):
    s.run("insert", "INSERT INTO products (id, name, price) VALUES (%s, %s, %s)", (100, "new", 1.5))
    s.run("update", "UPDATE products SET price = price * %s WHERE id <= %s", (2, 3))
    s.run("delete", "DELETE FROM products WHERE id = %s", (4,))
    s.rows("read", "SELECT id, name, price FROM products ORDER BY id")


# Transactions with the driver's defaults: not autocommit (BEGIN before the first statement).


def tx_one_shard_commit(s):
    k = sh.key_on(0, 3000)
    s.run("insert", INSERT_CUSTOMER, (k, "t1", "Bern", 1, None))
    s.run("update", "UPDATE customers SET score = score + %s WHERE id = %s", (10, k))
    s.rows("read inside", SELECT_CUSTOMER, (k,))
    s.end("commit", True)
    s.rows("after commit", SELECT_CUSTOMER, (k,))
    s.end("commit the read", True)


def tx_one_shard_rollback(s):
    k = sh.key_on(1, 3100)
    s.run("insert", INSERT_CUSTOMER, (k, "t2", "Bern", 1, None))
    s.rows("read inside", SELECT_CUSTOMER, (k,))
    s.end("rollback", False)
    s.rows("after rollback", SELECT_CUSTOMER, (k,))
    s.end("commit the read", True)


def tx_two_shards_commit(s):
    a, b = sh.keys_on_both(3200, 2)
    with s.c.transaction():
        s.run("insert shard 0", INSERT_CUSTOMER, (a, "x0", "Zug", 1, None))
        s.run("insert shard 1", INSERT_CUSTOMER, (b, "x1", "Zug", 2, None))
        s.run("update shard 0", "UPDATE customers SET score = %s WHERE id = %s", (7, a))
    for k in (a, b):
        s.rows(f"read {k}", SELECT_CUSTOMER, (k,))
    s.end("commit the reads", True)


def tx_two_shards_rollback(s):
    a, b = sh.keys_on_both(3300, 2)
    try:
        with s.c.transaction():
            s.run("insert shard 0", INSERT_CUSTOMER, (a, "y0", "Zug", 1, None))
            s.run("insert shard 1", INSERT_CUSTOMER, (b, "y1", "Zug", 2, None))
            raise LookupError("roll back")
    except LookupError:
        pass
    for k in (a, b):
        s.rows(f"read {k}", SELECT_CUSTOMER, (k,))
    s.end("commit the reads", True)


def tx_scatter_read(s):
    a, b = sh.keys_on_both(3400, 2)
    s.run("insert shard 0", INSERT_CUSTOMER, (a, "z0", "Zug", 3, None))
    s.run("insert shard 1", INSERT_CUSTOMER, (b, "z1", "Zug", 4, None))
    sql = "SELECT count(*), sum(score) FROM customers WHERE id BETWEEN %s AND %s"
    s.rows("scatter inside", sql, (3400, 3499))
    s.rows("scatter rows inside", "SELECT id, name FROM customers WHERE id >= %s ORDER BY id", (3400,))
    s.end("commit", True)
    s.rows("after commit", "SELECT count(*) FROM customers WHERE id BETWEEN %s AND %s", (3400, 3499))
    s.end("commit the read", True)


def unique_violation(s):
    for k in sh.keys_on_both(1, 2):
        s.run(f"duplicate {k}", INSERT_CUSTOMER, (k, "dup", None, None, None))
    s.rows("usable after", "SELECT 1")


def t_refused_window():
    with connect(sh.REFRACT) as c:
        try:
            c.execute("SELECT id, row_number() OVER (ORDER BY id) FROM customers WHERE score > %s", (0,))
        except psycopg.Error as e:
            sh.refusal(e.sqlstate, str(e), "window functions")
        else:
            raise AssertionError("not refused")
        h.eq(c.execute("SELECT count(*) FROM customers WHERE id = %s", (1,)).fetchone()[0], 1, "usable after")


def t_tx_two_shards_commit():
    both(tx_two_shards_commit, autocommit=False)()
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
]:
    check(name, both(body))
check("tx_one_shard_commit", both(tx_one_shard_commit, autocommit=False))
check("tx_one_shard_rollback", both(tx_one_shard_rollback, autocommit=False))
check("tx_two_shards_commit", t_tx_two_shards_commit)
check("tx_two_shards_rollback", both(tx_two_shards_rollback, autocommit=False))
check("tx_scatter_read", both(tx_scatter_read, autocommit=False))
check("unique_violation", both(unique_violation))
check("refused_window", t_refused_window)
check("placement", lambda: sh.placement(query))
check("tables_equal", lambda: sh.tables_equal(query))
h.finish()
