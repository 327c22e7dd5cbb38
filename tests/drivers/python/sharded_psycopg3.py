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
from sharded_harness import (  # noqa: F401 - the shared checks are listed below
    check,
    dsn,
    SELECT_CUSTOMER,
    keyed_read,
    any_array,
    scatter_count,
    scatter_where,
    scatter_order_limit,
    group_by_aggregates,
    group_by_avg,
    distinct,
    colocated_join,
    replicated_read,
    INSERT_CUSTOMER,
    insert_one,
    insert_many,
    keyed_update,
    keyed_delete,
    replicated_write,
    tx_one_shard_commit,
    tx_one_shard_rollback,
    tx_scatter_read,
    unique_violation,
)


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


def in_list(s):
    keys = sh.keys_on_both(1, 4)
    s.rows("IN", "SELECT id, name FROM customers WHERE id IN (%s, %s, %s, %s) ORDER BY id", keys)


# Transactions with the driver's defaults: not autocommit (BEGIN before the first statement).


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
