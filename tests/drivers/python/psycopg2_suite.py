"""psycopg2 through refract (run by crates/refract-dispatch/tests/it/pg_drivers.rs).

Usage: psycopg2_suite.py PORT. psycopg2 interpolates parameters on the client and sends every
statement as a simple Query; its only server-side prepared statements are SQL PREPARE/EXECUTE,
so it has no protocol-level prepared or unnamed-statement checks and no extended-protocol SET.
Every check asserts what a direct connection to PostgreSQL gives; see harness.py.
"""
import io
import select
import threading
import time

import psycopg2
import psycopg2.errors as errors
import psycopg2.extensions

import harness as h
from harness import check, eq, parallel

NAME = "psycopg2"


class Conn:
    """An autocommit connection with a cursor."""

    def __init__(self, **kw):
        self.conn = psycopg2.connect(h.DSN, **kw)
        self.conn.autocommit = True
        self.cur = self.conn.cursor()

    def one(self, sql, params=None):
        self.cur.execute(sql, params)
        row = self.cur.fetchone()
        if row is None:
            raise AssertionError(f"{sql}: no row")
        return row[0]

    def run(self, sql, params=None):
        self.cur.execute(sql, params)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.conn.close()


def busy(stop):
    with Conn() as c:
        while not stop.is_set():
            for sql in h.CHURN:
                c.run(sql)


def t_connect():
    with Conn() as c:
        eq(c.one("SELECT 1 + 1"), 2, "SELECT 1 + 1")
        eq(c.one("SELECT %s::int * 2", (21,)), 42, "a parameter")


def t_sql_prepare_concurrent():
    # SQL PREPARE / EXECUTE / DEALLOCATE, the same name with a text of each client's own.
    def client(i):
        with Conn() as c:
            c.run(f"PREPARE drv_q (int) AS SELECT $1 + {i * 100}")
            for r in range(4):
                eq(c.one("EXECUTE drv_q (%s)", (r,)), r + i * 100, f"EXECUTE round {r}")
                time.sleep(0.003)
            c.run("DEALLOCATE drv_q")
            try:
                c.run("EXECUTE drv_q (1)")
                raise AssertionError("EXECUTE after DEALLOCATE succeeded")
            except errors.InvalidSqlStatementName:
                pass

    parallel(h.CLIENTS, client)


def t_set_simple_concurrent():
    def client(i):
        with Conn() as c:
            before = c.one("SHOW application_name")
            c.run(f"SET application_name = 'drv-{i}'")
            for r in range(5):
                eq(c.one("SHOW application_name"), f"drv-{i}", f"SHOW, round {r}")
                eq(c.one("SELECT current_setting(%s)", ("application_name",)), f"drv-{i}", "current_setting")
                time.sleep(0.003)
            c.run("RESET application_name")
            eq(c.one("SHOW application_name"), before, "after RESET")

    parallel(h.CLIENTS, client)


def t_startup_options_concurrent():
    # Startup parameters: `options` (-c name=value) and application_name, each client its own.
    def client(i):
        with Conn(options=f"-c work_mem={2049 + i}kB", application_name=f"drv-start-{i}") as c:
            for r in range(5):
                eq(c.one("SHOW work_mem"), f"{2049 + i}kB", f"work_mem, round {r}")
                eq(c.one("SHOW application_name"), f"drv-start-{i}", "application_name")
                time.sleep(0.003)

    parallel(h.CLIENTS, client)


def t_set_config():
    with Conn() as a, Conn() as b, h.churn(busy):
        default = b.one("SHOW work_mem")
        eq(a.one("SELECT set_config('work_mem', %s, false)", ("3333kB",)), "3333kB", "set_config")
        for r in range(8):
            eq(b.one("SHOW work_mem"), default, "another client's work_mem")
            eq(a.one("SHOW work_mem"), "3333kB", f"work_mem after set_config, round {r}")


def t_temp_table():
    with Conn() as a, Conn() as b, h.churn(busy):
        a.run("CREATE TEMP TABLE drv_tmp (k int, v text)")
        a.run("INSERT INTO drv_tmp VALUES (%s, %s)", (1, NAME))
        for r in range(8):
            eq(b.one("SELECT 1"), 1, "another client's statement")
            eq(a.one("SELECT v FROM drv_tmp WHERE k = %s", (1,)), NAME, f"read back, round {r}")
        try:
            b.run("SELECT * FROM drv_tmp")
            raise AssertionError("another client sees the temp table")
        except errors.UndefinedTable:
            pass
        b.run("CREATE TEMP TABLE drv_tmp (k int, v text)")
        eq(b.one("SELECT count(*) FROM drv_tmp"), 0, "the other client's own temp table")
        eq(a.one("SELECT count(*) FROM drv_tmp"), 1, "the first client's temp table")


def t_advisory_lock():
    key = 4_200_002
    with Conn() as a, Conn() as b, h.churn(busy):
        # try-lock, so that a lock some earlier client left on a pooled connection fails the
        # check instead of blocking it.
        eq(a.one("SELECT pg_try_advisory_lock(%s)", (key,)), True, "the holder takes the lock")
        for r in range(8):
            eq(a.one("SELECT 1"), 1, "the holder's other statement")
            eq(b.one("SELECT pg_try_advisory_lock(%s)", (key,)), False, f"another client takes the lock, round {r}")
        eq(a.one("SELECT pg_advisory_unlock(%s)", (key,)), True, "the holder unlocks")
        b.run("SELECT pg_advisory_lock(%s)", (key,))
        eq(b.one("SELECT pg_advisory_unlock(%s)", (key,)), True, "and unlocks it")


def wait_notifies(conn, n, timeout):
    """Polls `conn` (idle) until `n` notifications arrived or `timeout` passed."""
    deadline = time.monotonic() + timeout
    while len(conn.notifies) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        select.select([conn], [], [], left)
        conn.poll()
    got = [(x.channel, x.payload) for x in conn.notifies]
    conn.notifies.clear()
    return got


def t_listen_notify():
    chan = f"drv_{NAME}"
    with Conn() as listener, Conn() as other, Conn() as sender, h.churn(busy):
        listener.run(f"LISTEN {chan}")
        eq(other.one("SELECT 1"), 1, "another client's statement")
        sender.run(f"NOTIFY {chan}, 'hello'")
        sender.run("SELECT pg_notify(%s, %s)", (chan, "second"))
        got = wait_notifies(listener.conn, 2, 5)
        eq(got, [(chan, "hello"), (chan, "second")], "notifications of an idle listener")
        for _ in range(3):
            other.one("SELECT 1")
        eq(list(other.conn.notifies), [], "notifications seen by a client that did not LISTEN")
        listener.run(f"UNLISTEN {chan}")
        sender.run(f"NOTIFY {chan}, 'after unlisten'")
        eq(wait_notifies(listener.conn, 1, 1), [], "notifications after UNLISTEN")


def t_copy_in():
    with Conn() as c:
        c.run(f"DROP TABLE IF EXISTS drv_copy_{NAME}")
        c.run(f"CREATE TABLE drv_copy_{NAME} (k int, v text)")
        data = io.StringIO("".join(f"{k}\trow {k}\n" for k in range(20000)))
        c.cur.copy_expert(f"COPY drv_copy_{NAME} (k, v) FROM STDIN", data)
        c.run(f"SELECT count(*), sum(k) FROM drv_copy_{NAME}")
        eq(c.cur.fetchone(), (20000, 199990000), "rows copied in")


def t_copy_out():
    with Conn() as c:
        out = io.StringIO()
        c.cur.copy_expert("COPY (SELECT g, 'row ' || g FROM generate_series(0, 19999) g) TO STDOUT", out)
        lines = out.getvalue().splitlines()
        eq(len(lines), 20000, "rows copied out")
        eq(lines[12345], "12345\trow 12345", "row 12345")


def t_cancel():
    # A bystander's statement running meanwhile is not cancelled.
    with Conn() as c, Conn() as bystander:
        outcome = []
        by = threading.Thread(target=lambda: outcome.append(bystander.one("SELECT pg_sleep(1.5)::text || 'slept'")))
        timer = threading.Timer(0.5, c.conn.cancel)
        t0 = time.monotonic()
        by.start()
        timer.start()
        try:
            c.run("SELECT pg_sleep(30)")
            raise AssertionError("pg_sleep(30) was not cancelled")
        except errors.QueryCanceled as e:
            eq(e.pgcode, "57014", "SQLSTATE")
        took = time.monotonic() - t0
        if took > 5:
            raise AssertionError(f"cancelled after {took:.1f} s")
        eq(c.one("SELECT 1"), 1, "the connection after the cancel")
        by.join(5)
        eq(outcome, ["slept"], "the bystander's statement")


def t_result_200mb():
    with Conn() as c:
        v = c.one(f"SELECT repeat('x', {h.BIG})")
        eq(len(v), h.BIG, "length")
        del v
        eq(c.one("SELECT 2"), 2, "the connection after")


def t_errors():
    with Conn() as c:
        for sql, code in [("SELECT 1/0", "22012"), ("SELEC 1", "42601"), ("SELECT * FROM drv_no_such_table", "42P01")]:
            try:
                c.run(sql)
                raise AssertionError(f"{sql}: no error")
            except psycopg2.Error as e:
                eq(e.pgcode, code, sql)
        c.conn.autocommit = False
        try:
            c.run("SELECT 1/0")
        except errors.DivisionByZero:
            pass
        try:
            c.run("SELECT 1")
            raise AssertionError("a statement in a failed transaction succeeded")
        except errors.InFailedSqlTransaction as e:
            eq(e.pgcode, "25P02", "in a failed transaction")
        c.conn.rollback()
        eq(c.one("SELECT 3"), 3, "after ROLLBACK")
        c.conn.commit()


check("connect", t_connect)
check("sql_prepare_concurrent", t_sql_prepare_concurrent)
check("set_simple_concurrent", t_set_simple_concurrent)
check("startup_options_concurrent", t_startup_options_concurrent)
check("set_config", t_set_config)
check("temp_table", t_temp_table)
check("advisory_lock", t_advisory_lock)
check("listen_notify", t_listen_notify)
check("copy_in", t_copy_in)
check("copy_out", t_copy_out)
check("cancel", t_cancel)
check("result_200mb", t_result_200mb)
check("errors", t_errors)
h.finish()
