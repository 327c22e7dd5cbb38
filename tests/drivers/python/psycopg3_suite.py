"""psycopg 3 through refract (run by crates/refract-dispatch/tests/it/pg_drivers.rs).

Usage: psycopg3_suite.py PORT. Every check asserts what a direct connection to PostgreSQL
gives; see harness.py for the output format.
"""
import threading
import time

import psycopg
from psycopg import errors, pq

import harness as h
from harness import check, eq, parallel

NAME = "psycopg3"


def connect(**kw):
    return psycopg.connect(h.DSN, autocommit=True, **kw)


def one(conn, sql, params=None, **kw):
    row = conn.execute(sql, params, **kw).fetchone()
    if row is None:
        raise AssertionError(f"{sql}: no row")
    return row[0]


def busy(stop):
    with connect() as c:
        while not stop.is_set():
            for sql in h.CHURN:
                c.execute(sql)


def t_connect():
    with connect() as c:
        eq(one(c, "SELECT 1 + 1"), 2, "SELECT 1 + 1")
        eq(one(c, "SELECT %s::int * 2", (21,)), 42, "a parameter")


def t_prepared_concurrent():
    # psycopg names its server-side statements _pg3_0, _pg3_1, ... per connection, so every
    # client has statements of the same names with texts of its own: a statement mixed up
    # between clients gives another client's sum. j = 0: prepare=True (prepared at once);
    # j = 1, 2: prepared automatically after prepare_threshold executions; then the same in
    # pipeline mode and executemany().
    def client(i):
        with connect(prepare_threshold=2) as c:
            for r in range(8):
                for j in range(3):
                    got = one(c, f"SELECT %s::int + {i * 100 + j}", (r,), prepare=True if j == 0 else None)
                    eq(got, r + i * 100 + j, f"statement {j}, round {r}")
                time.sleep(0.002)
            eq(len(c._prepared._names), 3, "statements psycopg prepared")
            # Pipeline mode: the (prepared) statements' messages go out with one Sync.
            for r in range(3):
                with c.pipeline():
                    curs = [c.execute(f"SELECT %s::int + {i * 100 + j}", (r,)) for j in range(3)]
                eq([cur.fetchone()[0] for cur in curs], [r + i * 100 + j for j in range(3)], f"pipeline, round {r}")
            with c.cursor() as cur:
                cur.executemany(f"SELECT %s::int * 2 + {i * 100}", [(k,) for k in range(5)], returning=True)
                got = [cur.fetchone()[0]]
                while cur.nextset():
                    got.append(cur.fetchone()[0])
                eq(got, [k * 2 + i * 100 for k in range(5)], "executemany")

    parallel(h.CLIENTS, client)


def t_unnamed_statement_concurrent():
    # libpq's PQprepare(conn, "") + PQdescribePrepared, later PQexecPrepared(conn, ""):
    # Parse("")+Sync, Describe(S "")+Sync, then Bind("")+Describe(P)+Execute+Sync; other
    # clients run their own unnamed statements in between. Then psycopg's prepare=False
    # (Parse("")/Bind/Execute in one go).
    def client(i):
        with connect() as c:
            pg = c.pgconn
            for r in range(5):
                res = pg.prepare(b"", f"SELECT $1::int + {i * 100}, {r}".encode())
                eq(res.status, pq.ExecStatus.COMMAND_OK, f"Parse: {res.error_message!r}")
                time.sleep(0.005)
                d = pg.describe_prepared(b"")
                eq(d.status, pq.ExecStatus.COMMAND_OK, f"Describe: {d.error_message!r}")
                eq((d.nparams, d.nfields), (1, 2), "parameters and columns described")
                time.sleep(0.005)
                res = pg.exec_prepared(b"", [str(r).encode()])
                eq(res.status, pq.ExecStatus.TUPLES_OK, f"Bind/Execute: {res.error_message!r}")
                eq((res.get_value(0, 0), res.get_value(0, 1)), (str(r + i * 100).encode(), str(r).encode()), "row")
            for r in range(5):
                eq(one(c, f"SELECT %s::int + {i * 100}", (r,), prepare=False), r + i * 100, "prepare=False")

    parallel(h.CLIENTS, client)


def t_sql_prepare_concurrent():
    # SQL PREPARE / EXECUTE / DEALLOCATE, the same name with a text of each client's own.
    def client(i):
        with connect() as c:
            c.execute(f"PREPARE drv_q (int) AS SELECT $1 + {i * 100}")
            for r in range(4):
                eq(one(c, f"EXECUTE drv_q ({r})"), r + i * 100, f"EXECUTE round {r}")
                time.sleep(0.003)
            c.execute("DEALLOCATE drv_q")
            try:
                c.execute("EXECUTE drv_q (1)")
                raise AssertionError("EXECUTE after DEALLOCATE succeeded")
            except errors.InvalidSqlStatementName:
                pass

    parallel(h.CLIENTS, client)


def t_set_simple_concurrent():
    # SET by simple Query; read back by simple (SHOW) and extended (current_setting) queries.
    def client(i):
        with connect() as c:
            before = one(c, "SHOW application_name")
            c.execute(f"SET application_name = 'drv-{i}'")
            for r in range(5):
                eq(one(c, "SHOW application_name"), f"drv-{i}", f"SHOW, round {r}")
                eq(one(c, "SELECT current_setting(%s)", ("application_name",)), f"drv-{i}", "current_setting")
                time.sleep(0.003)
            c.execute("RESET application_name")
            eq(one(c, "SHOW application_name"), before, "after RESET")

    parallel(h.CLIENTS, client)


def t_set_extended_concurrent():
    # SET by Parse/Bind/Execute (binary=True makes psycopg use the extended protocol).
    def client(i):
        with connect() as c:
            c.execute(f"SET work_mem = '{1025 + i}kB'", binary=True)
            for r in range(5):
                eq(one(c, "SHOW work_mem"), f"{1025 + i}kB", f"SHOW, round {r}")
                eq(one(c, "SELECT current_setting(%s)", ("work_mem",)), f"{1025 + i}kB", "current_setting")
                time.sleep(0.003)

    parallel(h.CLIENTS, client)


def t_startup_options_concurrent():
    # Startup parameters: `options` (-c name=value) and application_name, each client its own.
    def client(i):
        with connect(options=f"-c work_mem={2049 + i}kB", application_name=f"drv-start-{i}") as c:
            for r in range(5):
                eq(one(c, "SHOW work_mem"), f"{2049 + i}kB", f"work_mem, round {r}")
                eq(one(c, "SELECT current_setting(%s)", ("application_name",)), f"drv-start-{i}", "application_name")
                time.sleep(0.003)

    parallel(h.CLIENTS, client)


def t_set_config():
    # set_config(name, value, false) is a session-wide SET made by a function.
    with connect() as a, connect() as b, h.churn(busy):
        default = one(b, "SHOW work_mem")
        eq(one(a, "SELECT set_config('work_mem', %s, false)", ("3333kB",)), "3333kB", "set_config")
        for r in range(8):
            eq(one(b, "SHOW work_mem"), default, "another client's work_mem")
            eq(one(a, "SHOW work_mem"), "3333kB", f"work_mem after set_config, round {r}")


def t_temp_table():
    with connect() as a, connect() as b, h.churn(busy):
        a.execute("CREATE TEMP TABLE drv_tmp (k int, v text)")
        a.execute("INSERT INTO drv_tmp VALUES (%s, %s)", (1, NAME))
        for r in range(8):
            eq(one(b, "SELECT 1"), 1, "another client's statement")
            eq(one(a, "SELECT v FROM drv_tmp WHERE k = %s", (1,)), NAME, f"read back, round {r}")
            eq(one(a, "SELECT count(*) FROM drv_tmp"), 1, "count")
        try:
            b.execute("SELECT * FROM drv_tmp")
            raise AssertionError("another client sees the temp table")
        except errors.UndefinedTable:
            pass
        b.execute("CREATE TEMP TABLE drv_tmp (k int, v text)")
        eq(one(b, "SELECT count(*) FROM drv_tmp"), 0, "the other client's own temp table")
        eq(one(a, "SELECT count(*) FROM drv_tmp"), 1, "the first client's temp table")


def t_advisory_lock():
    key = 4_200_001
    with connect() as a, connect() as b, h.churn(busy):
        # try-lock, so that a lock some earlier client left on a pooled connection fails the
        # check instead of blocking it.
        eq(one(a, "SELECT pg_try_advisory_lock(%s)", (key,)), True, "the holder takes the lock")
        for r in range(8):
            eq(one(a, "SELECT 1"), 1, "the holder's other statement")
            eq(one(b, "SELECT pg_try_advisory_lock(%s)", (key,)), False, f"another client takes the lock, round {r}")
        eq(one(a, "SELECT pg_advisory_unlock(%s)", (key,)), True, "the holder unlocks")
        b.execute("SELECT pg_advisory_lock(%s)", (key,))
        eq(one(b, "SELECT pg_advisory_unlock(%s)", (key,)), True, "and unlocks it")


def t_listen_notify():
    chan = f"drv_{NAME}"
    with connect() as listener, connect() as other, connect() as sender, h.churn(busy):
        seen_by_other = []
        other.add_notify_handler(seen_by_other.append)
        listener.execute(f"LISTEN {chan}")
        eq(one(other, "SELECT 1"), 1, "another client's statement")
        sender.execute(f"NOTIFY {chan}, 'hello'")
        sender.execute("SELECT pg_notify(%s, %s)", (chan, "second"))
        got = [(n.channel, n.payload) for n in listener.notifies(timeout=5, stop_after=2)]
        eq(got, [(chan, "hello"), (chan, "second")], "notifications of an idle listener")
        for _ in range(3):
            one(other, "SELECT 1")
        eq(seen_by_other, [], "notifications seen by a client that did not LISTEN")
        listener.execute(f"UNLISTEN {chan}")
        sender.execute(f"NOTIFY {chan}, 'after unlisten'")
        eq([n.payload for n in listener.notifies(timeout=1)], [], "notifications after UNLISTEN")


def t_copy_in():
    with connect() as c:
        c.execute(f"DROP TABLE IF EXISTS drv_copy_{NAME}")
        c.execute(f"CREATE TABLE drv_copy_{NAME} (k int, v text)")
        with c.cursor().copy(f"COPY drv_copy_{NAME} (k, v) FROM STDIN") as cp:
            for k in range(20000):
                cp.write_row((k, f"row {k}"))
        eq(c.execute(f"SELECT count(*), sum(k) FROM drv_copy_{NAME}").fetchone(), (20000, 199990000), "rows copied in")


def t_copy_out():
    with connect() as c:
        with c.cursor().copy("COPY (SELECT g, 'row ' || g FROM generate_series(0, 19999) g) TO STDOUT") as cp:
            rows = list(cp.rows())
        eq(len(rows), 20000, "rows copied out")
        eq(rows[12345], ("12345", "row 12345"), "row 12345")


def t_cancel():
    # A bystander's statement running meanwhile is not cancelled.
    with connect() as c, connect() as bystander:
        outcome = []
        by = threading.Thread(target=lambda: outcome.append(one(bystander, "SELECT pg_sleep(1.5)::text || 'slept'")))
        timer = threading.Timer(0.5, c.cancel)
        t0 = time.monotonic()
        by.start()
        timer.start()
        try:
            c.execute("SELECT pg_sleep(30)")
            raise AssertionError("pg_sleep(30) was not cancelled")
        except errors.QueryCanceled as e:
            eq(e.sqlstate, "57014", "SQLSTATE")
        took = time.monotonic() - t0
        if took > 5:
            raise AssertionError(f"cancelled after {took:.1f} s")
        eq(one(c, "SELECT 1"), 1, "the connection after the cancel")
        by.join(5)
        eq(outcome, ["slept"], "the bystander's statement")


def t_result_200mb():
    with connect() as c:
        v = one(c, f"SELECT repeat('x', {h.BIG})")
        eq(len(v), h.BIG, "length")
        del v
        eq(one(c, "SELECT 2"), 2, "the connection after")


def t_errors():
    with connect() as c:
        for sql, params, code in [
            ("SELECT 1/0", None, "22012"),
            ("SELECT %s::int / 0", (1,), "22012"),
            ("SELEC 1", None, "42601"),
            ("SELECT * FROM drv_no_such_table", None, "42P01"),
        ]:
            try:
                c.execute(sql, params)
                raise AssertionError(f"{sql}: no error")
            except psycopg.Error as e:
                eq(e.sqlstate, code, sql)
        with c.transaction():
            try:
                with c.transaction():
                    c.execute("SELECT 1/0")
            except errors.DivisionByZero:
                pass
            eq(one(c, "SELECT 3"), 3, "after a failed savepoint")
        eq(one(c, "SELECT 4"), 4, "after the transaction")


check("connect", t_connect)
check("prepared_concurrent", t_prepared_concurrent)
check("unnamed_statement_concurrent", t_unnamed_statement_concurrent)
check("sql_prepare_concurrent", t_sql_prepare_concurrent)
check("set_simple_concurrent", t_set_simple_concurrent)
check("set_extended_concurrent", t_set_extended_concurrent)
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
