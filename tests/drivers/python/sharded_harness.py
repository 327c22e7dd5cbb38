"""Shared by the sharded driver suites (sharded_*.py, run by
crates/refract-dispatch/tests/it/pg_sharded_drivers.rs).

Usage: sharded_SUITE.py REFRACT_PORT ORACLE_PORT SHARD_PORT...: refract in front of the shards
(customers sharded by `id`, orders by `customer_id`, both hash; products replicated) and one
plain PostgreSQL, the oracle. Each check runs the same driver calls against refract and against
the oracle and compares what they answered step by step: the same rows (in order where the
ORDER BY fixes it, as a multiset otherwise), the same row counts and status, the same SQLSTATE
when a statement fails. A few checks look at the shard servers directly (where the rows sit,
no prepared transaction left behind). The output is harness.py's: `ok NAME` or
`FAIL NAME: reason` per check, then `done`.

This module knows no driver: each suite gives it a `query(port, sql) -> [tuple]` function
(simple protocol, autocommit) for the oracle and shard servers.
"""
import sys
from decimal import Decimal

import harness as h

# Seconds a check may take (26 checks stay within the Rust test's limit for a suite even if
# every one hangs).
LIMIT = 15

REFRACT = int(sys.argv[1])
ORACLE = int(sys.argv[2]) if len(sys.argv) > 2 else REFRACT
SHARDS = [int(p) for p in sys.argv[3:]]

# Statements sent through each driver's simple protocol to create the tables (through refract:
# DDL goes to every shard).
SCHEMA = [
    "DROP TABLE IF EXISTS orders",
    "DROP TABLE IF EXISTS customers",
    "DROP TABLE IF EXISTS products",
    "CREATE TABLE customers (id int8 PRIMARY KEY, name text NOT NULL, city text, score int4, balance numeric(10,2))",
    "CREATE TABLE orders (id int8 NOT NULL, customer_id int8 NOT NULL, qty int4 NOT NULL, "
    "amount numeric(10,2), PRIMARY KEY (customer_id, id))",
    "CREATE TABLE products (id int4 PRIMARY KEY, name text NOT NULL, price numeric(8,2))",
]

CITIES = ["Bern", "Chur", "Zug", "aarau", "Basel", None]

# Loaded customers have ids 1..=LOADED; orders belong to them. Writes of later checks use
# ids from their own ranges (see key_on), so one check's failure leaves the others' rows alone.
LOADED = 80


def customer(i):
    """The loaded customer `i`: (id, name, city, score, balance)."""
    score = None if i % 11 == 0 else (i * 37) % 101 - 50
    balance = None if i % 13 == 0 else Decimal((i * 7919) % 200001 - 100000) / 100
    return (i, f"c{i:03d}", CITIES[i % len(CITIES)], score, balance)


def order(i):
    """The loaded order `i`: (id, customer_id, qty, amount)."""
    return (i, (i * 13) % LOADED + 1, i % 7 + 1, Decimal(i * 250 % 9999) / 100)


def product(i):
    return (i, f"p{i}", Decimal(i * 325) / 100)


def literal(v):
    if v is None:
        return "NULL"
    if isinstance(v, str):
        return "'" + v.replace("'", "''") + "'"
    return str(v)


def values(rows):
    return ", ".join("(" + ", ".join(literal(v) for v in r) + ")" for r in rows)


# Multi-row INSERTs as simple queries (through refract: split by key over the shards).
LOAD = [
    f"INSERT INTO customers VALUES {values(customer(i) for i in range(1, LOADED + 1))}",
    f"INSERT INTO orders VALUES {values(order(i) for i in range(1, 201))}",
    f"INSERT INTO products VALUES {values(product(i) for i in range(1, 11))}",
]

# Keys -> shard, as PostgreSQL's PARTITION BY HASH places them (filled by init()).
PROBE_RANGE = (-100, 20000)
_shard = {}


def init(query):
    """Asks the oracle which partition PostgreSQL's `PARTITION BY HASH (int8)` with
    MODULUS len(SHARDS) gives every key of PROBE_RANGE: the shard refract must put it on."""
    n = max(len(SHARDS), 1)
    ddl = [
        "DROP TABLE IF EXISTS refract_probe",
        "CREATE TABLE refract_probe (k int8) PARTITION BY HASH (k)",
    ] + [
        f"CREATE TABLE refract_probe_{i} PARTITION OF refract_probe FOR VALUES WITH (MODULUS {n}, REMAINDER {i})"
        for i in range(n)
    ]
    for sql in ddl:
        query(ORACLE, sql)
    lo, hi = PROBE_RANGE
    query(ORACLE, f"INSERT INTO refract_probe SELECT generate_series({lo}, {hi})")
    for k, part in query(ORACLE, "SELECT k, tableoid::regclass::text FROM refract_probe"):
        _shard[int(k)] = int(part.rsplit("_", 1)[1])


def shard_of(key):
    return _shard[key]


def key_on(shard, start):
    """The first key >= start that PostgreSQL's hash partitioning puts on `shard`."""
    k = start
    while _shard[k] != shard:
        k += 1
    return k


def keys_on_both(start, n):
    """`n` keys from `start` on, alternating shard 0 and shard 1."""
    out, k = [], start
    while len(out) < n:
        k = key_on(len(out) % 2, k)
        out.append(k)
        k += 1
    return out


def span(start, count):
    """`count` consecutive keys from `start` (asserts they fall on every shard)."""
    keys = list(range(start, start + count))
    assert {shard_of(k) for k in keys} == set(range(len(SHARDS))), f"{start}..: not on every shard"
    return keys


def check(name, fn, timeout=LIMIT):
    """harness.check with this suite's time limit."""
    h.check(name, fn, timeout)


class Rec:
    """What one run of a check's steps saw, in order: (label, value) with the driver's error
    message kept apart (only the SQLSTATE is compared)."""

    def __init__(self):
        self.steps = []

    def add(self, label, value, detail=None):
        self.steps.append((label, value, detail))

    def rows(self, label, rows, ordered=True):
        rows = [tuple(r) for r in rows]
        if not ordered:
            rows = sorted(rows, key=repr)
        self.add(label, ("rows", rows))

    def error(self, label, sqlstate, message):
        self.add(label, ("error", sqlstate), message)

    def __repr__(self):
        return repr(self.steps)


def show(value, limit=300):
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def compare(got, want):
    """Raises naming the first step where refract's run (`got`) differs from the oracle's.
    Only the steps labelled `duplicate ...` may fail on the oracle: any other failure there is
    a mistake of the suite's, not refract's."""
    for label, w, detail in want.steps:
        if isinstance(w, tuple) and w[0] == "error" and not label.startswith("duplicate"):
            raise AssertionError(f"the suite's own step {label!r} failed on PostgreSQL: {w[1]} {detail}")
    for (label, g, detail), (wlabel, w, wdetail) in zip(got.steps, want.steps):
        h.eq(label, wlabel, "step order")
        if g != w:
            if isinstance(g, tuple) and g[0] == "rows" and isinstance(w, tuple) and w[0] == "rows":
                gr, wr = g[1], w[1]
                at = next((i for i, (a, b) in enumerate(zip(gr, wr)) if a != b), min(len(gr), len(wr)))
                g = f"{len(gr)} rows, row {at} = {show(gr[at] if at < len(gr) else None)}"
                w = f"{len(wr)} rows, row {at} = {show(wr[at] if at < len(wr) else None)}"
            extra = f" [{detail}]" if detail else ""
            want_extra = f" [{wdetail}]" if wdetail else ""
            raise AssertionError(f"{label}: refract {show(g)}{extra}; PostgreSQL {show(w)}{want_extra}")
    if len(got.steps) != len(want.steps):
        raise AssertionError(f"refract ran {len(got.steps)} steps, PostgreSQL {len(want.steps)}: {got!r}")


def refusal(sqlstate, message, what):
    """The documented refusal (docs/sharding.md): 0A000, a message starting `refract:` that
    names `what`."""
    if sqlstate != "0A000" or not message.startswith("refract:") or what not in message:
        raise AssertionError(f"want 0A000 'refract: ...{what}...', got {sqlstate} {message!r}")


def check_loaded(query):
    """The rows LOAD put in, counted on the oracle and on the shards directly (a count through
    refract would be a scatter read, a check of its own)."""
    want = [LOADED, 200, 10]
    h.eq([query(ORACLE, f"SELECT count(*) FROM {t}")[0][0] for t in ("customers", "orders", "products")], want, "oracle")
    on_shards = [sum(query(p, f"SELECT count(*) FROM {t}")[0][0] for p in SHARDS) for t in ("customers", "orders")]
    copies = [query(p, "SELECT count(*) FROM products")[0][0] for p in SHARDS]
    h.eq(on_shards + [copies], want[:2] + [[10] * len(SHARDS)], "rows on the shards (customers, orders, products per shard)")


def no_prepared_left(query):
    """No two-phase transaction of refract's left prepared on any shard."""
    for i, port in enumerate(SHARDS):
        left = query(port, "SELECT gid FROM pg_prepared_xacts WHERE gid LIKE 'refract:%'")
        if left:
            raise AssertionError(f"shard {i}: prepared transactions left: {left}")


def placement(query):
    """Every row through refract sits on the shard PostgreSQL's hash partitioning names for its
    key, every shard holds some rows, and the shards hold identical copies of products."""
    problems = []
    for table, key in [("customers", "id"), ("orders", "customer_id")]:
        for i, port in enumerate(SHARDS):
            keys = [int(r[0]) for r in query(port, f"SELECT {key} FROM {table}")]
            wrong = [k for k in keys if shard_of(k) != i]
            if wrong:
                problems.append(f"{table}: {len(wrong)} keys on shard {i} that PostgreSQL puts elsewhere: {wrong[:5]}")
            if not keys:
                problems.append(f"{table}: shard {i} holds no row")
    copies = [sorted((tuple(r) for r in query(port, "SELECT * FROM products")), key=repr) for port in SHARDS]
    for i, copy in enumerate(copies[1:], 1):
        if copy != copies[0]:
            problems.append(f"products on shard {i}: {show(copy)}, on shard 0 {show(copies[0])}")
    if problems:
        raise AssertionError(" | ".join(problems))


def tables_equal(query):
    """The shards' rows together are the oracle's rows (after every check wrote the same on
    both), and each shard's products are the oracle's."""
    problems = []
    for table in ["customers", "orders"]:
        everything = sorted((tuple(r) for port in SHARDS for r in query(port, f"SELECT * FROM {table}")), key=repr)
        oracle = sorted((tuple(r) for r in query(ORACLE, f"SELECT * FROM {table}")), key=repr)
        if everything != oracle:
            extra = [r for r in everything if r not in oracle][:3]
            missing = [r for r in oracle if r not in everything][:3]
            problems.append(
                f"{table}: shards hold {len(everything)} rows, PostgreSQL {len(oracle)}; "
                f"not in PostgreSQL: {show(extra)}; missing: {show(missing)}"
            )
    products = sorted((tuple(r) for r in query(ORACLE, "SELECT * FROM products")), key=repr)
    for i, port in enumerate(SHARDS):
        copy = sorted((tuple(r) for r in query(port, "SELECT * FROM products")), key=repr)
        if copy != products:
            problems.append(f"products on shard {i}: {show(copy)}, PostgreSQL {show(products)}")
    if problems:
        raise AssertionError(" | ".join(problems))


# Checks in the format paramstyle (`%s`), the same for psycopg2 and psycopg 3 (each suite imports
# them and lists them among its checks; asyncpg's own use `$1`). `s` is the suite's session pair.


def dsn(port):
    return f"host={h.HOST} port={port} user={h.USER} password={h.PASSWORD} dbname={h.DATABASE} connect_timeout=10"


SELECT_CUSTOMER = "SELECT id, name, city, score, balance FROM customers WHERE id = %s"


def keyed_read(s):
    for shard in (0, 1):
        k = key_on(shard, 1)
        s.rows(f"id {k} (shard {shard})", SELECT_CUSTOMER, (k,))
    s.rows("absent id", SELECT_CUSTOMER, (100000,))


def any_array(s):
    keys = keys_on_both(3, 6) + [100000]
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
    s.rows("keyed join", sql, (key_on(1, 1),))


def replicated_read(s):
    s.rows("products", "SELECT id, name, price FROM products WHERE price > %s ORDER BY id", (10,))
    s.rows("product by id", "SELECT name FROM products WHERE id = %s", (3,))


INSERT_CUSTOMER = "INSERT INTO customers (id, name, city, score, balance) VALUES (%s, %s, %s, %s, %s)"


def insert_one(s):
    keys = keys_on_both(1000, 2)
    for k in keys:
        s.run(f"insert {k} (shard {shard_of(k)})", INSERT_CUSTOMER, (k, f"n{k}", "Zug", k % 50, None))
    for k in keys:
        s.rows(f"read {k}", SELECT_CUSTOMER, (k,))


def insert_many(s):
    keys = span(2000, 200)
    s.many("executemany", INSERT_CUSTOMER, [(k, f"m{k}", "Chur", k % 100, None) for k in keys])
    s.rows("count", "SELECT count(*), sum(score) FROM customers WHERE id BETWEEN %s AND %s", (2000, 2199))
    s.rows("keyed", SELECT_CUSTOMER, (2001,))


def keyed_update(s):
    for k in keys_on_both(10, 2):
        s.run(f"update {k}", "UPDATE customers SET score = score + %s, name = %s WHERE id = %s", (5, f"u{k}", k))
        s.rows(f"read {k}", SELECT_CUSTOMER, (k,))
    s.run("update absent", "UPDATE customers SET score = 0 WHERE id = %s", (100000,))


def keyed_delete(s):
    for k in keys_on_both(40, 2):
        s.run(f"delete {k}", "DELETE FROM customers WHERE id = %s", (k,))
        s.rows(f"read {k}", SELECT_CUSTOMER, (k,))
    s.run("delete absent", "DELETE FROM customers WHERE id = %s", (100000,))


def replicated_write(s):
    s.run("insert", "INSERT INTO products (id, name, price) VALUES (%s, %s, %s)", (100, "new", 1.5))
    s.run("update", "UPDATE products SET price = price * %s WHERE id <= %s", (2, 3))
    s.run("delete", "DELETE FROM products WHERE id = %s", (4,))
    s.rows("read", "SELECT id, name, price FROM products ORDER BY id")


def tx_one_shard_commit(s):
    k = key_on(0, 3000)
    s.run("insert", INSERT_CUSTOMER, (k, "t1", "Bern", 1, None))
    s.run("update", "UPDATE customers SET score = score + %s WHERE id = %s", (10, k))
    s.rows("read inside", SELECT_CUSTOMER, (k,))
    s.end("commit", True)
    s.rows("after commit", SELECT_CUSTOMER, (k,))
    s.end("commit the read", True)


def tx_one_shard_rollback(s):
    k = key_on(1, 3100)
    s.run("insert", INSERT_CUSTOMER, (k, "t2", "Bern", 1, None))
    s.rows("read inside", SELECT_CUSTOMER, (k,))
    s.end("rollback", False)
    s.rows("after rollback", SELECT_CUSTOMER, (k,))
    s.end("commit the read", True)


def tx_scatter_read(s):
    a, b = keys_on_both(3400, 2)
    s.run("insert shard 0", INSERT_CUSTOMER, (a, "z0", "Zug", 3, None))
    s.run("insert shard 1", INSERT_CUSTOMER, (b, "z1", "Zug", 4, None))
    sql = "SELECT count(*), sum(score) FROM customers WHERE id BETWEEN %s AND %s"
    s.rows("scatter inside", sql, (3400, 3499))
    s.rows("scatter rows inside", "SELECT id, name FROM customers WHERE id >= %s ORDER BY id", (3400,))
    s.end("commit", True)
    s.rows("after commit", "SELECT count(*) FROM customers WHERE id BETWEEN %s AND %s", (3400, 3499))
    s.end("commit the read", True)


def unique_violation(s):
    for k in keys_on_both(1, 2):
        s.run(f"duplicate {k}", INSERT_CUSTOMER, (k, "dup", None, None, None))
    s.rows("usable after", "SELECT 1")
