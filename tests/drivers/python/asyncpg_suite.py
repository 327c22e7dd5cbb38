"""asyncpg through refract (run by crates/refract-dispatch/tests/it/pg_drivers.rs).

Usage: asyncpg_suite.py PORT. asyncpg always uses the extended protocol for statements with
or without parameters (except `execute()` without arguments, a simple Query); with its
statement cache it names statements `__asyncpg_stmt_N__` per connection, and with
`statement_cache_size=0` it prepares the unnamed statement (Parse("")+Describe+Sync) and runs
it later (Bind("")+Execute+Sync), the pattern PgBouncer users know. Every check asserts what a
direct connection to PostgreSQL gives; see harness.py.
"""
import asyncio
import contextlib
import io
import time

import asyncpg

import harness as h
from harness import check, eq

NAME = "asyncpg"


def connect(**kw):
    return asyncpg.connect(host=h.HOST, port=h.PORT, user=h.USER, password=h.PASSWORD, database=h.DATABASE, timeout=10, **kw)


def sync(fn):
    """A check body: runs the coroutine function `fn` in its own event loop."""
    return lambda: asyncio.run(fn())


async def gather(n, fn, timeout=25):
    async def tagged(i):
        try:
            await fn(i)
        except Exception as e:  # noqa: BLE001
            raise AssertionError(f"client {i}: {type(e).__name__}: {e}") from e

    await asyncio.wait_for(asyncio.gather(*(tagged(i) for i in range(n))), timeout)


@contextlib.asynccontextmanager
async def churn(n=3):
    """Clients running short statements meanwhile (harness.churn, as tasks)."""
    stop = asyncio.Event()

    async def loop():
        c = await connect()
        try:
            while not stop.is_set():
                for sql in h.CHURN:
                    await c.execute(sql)
        finally:
            await c.close()

    tasks = [asyncio.create_task(loop()) for _ in range(n)]
    await asyncio.sleep(0.05)
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait(tasks, timeout=5)


async def t_connect():
    c = await connect()
    try:
        eq(await c.fetchval("SELECT 1 + 1"), 2, "SELECT 1 + 1")
        eq(await c.fetchval("SELECT $1::int * 2", 21), 42, "a parameter")
    finally:
        await c.close()


async def t_prepared_concurrent():
    # Connection.prepare() (named statements) and the statement cache (fetchval of the same
    # text again): every client's __asyncpg_stmt_N__ has a text of its own.
    async def client(i):
        c = await connect()
        try:
            stmts = [await c.prepare(f"SELECT $1::int + {i * 100 + j}") for j in range(3)]
            for r in range(8):
                for j, s in enumerate(stmts):
                    eq(await s.fetchval(r), r + i * 100 + j, f"prepared {j}, round {r}")
                eq(await c.fetchval(f"SELECT $1::int - {i * 100}", r), r - i * 100, f"cached, round {r}")
                await asyncio.sleep(0.002)
        finally:
            await c.close()

    await gather(h.CLIENTS, client)


async def t_unnamed_statement_concurrent():
    async def client(i):
        c = await connect(statement_cache_size=0)
        try:
            for r in range(8):
                eq(await c.fetchrow(f"SELECT $1::int + {i * 100}, {r}", r), (r + i * 100, r), f"round {r}")
                await asyncio.sleep(0.002)
        finally:
            await c.close()

    await gather(h.CLIENTS, client)


async def t_sql_prepare_concurrent():
    async def client(i):
        c = await connect()
        try:
            await c.execute(f"PREPARE drv_q (int) AS SELECT $1 + {i * 100}")
            for r in range(4):
                eq(await c.fetchval(f"EXECUTE drv_q ({r})"), r + i * 100, f"EXECUTE round {r}")
                await asyncio.sleep(0.003)
            await c.execute("DEALLOCATE drv_q")
            try:
                await c.execute("EXECUTE drv_q (1)")
                raise AssertionError("EXECUTE after DEALLOCATE succeeded")
            except asyncpg.InvalidSQLStatementNameError:
                pass
        finally:
            await c.close()

    await gather(h.CLIENTS, client)


async def t_set_simple_concurrent():
    async def client(i):
        c = await connect()
        try:
            before = await c.fetchval("SHOW application_name")
            await c.execute(f"SET application_name = 'drv-{i}'")  # no arguments: a simple Query
            for r in range(5):
                eq(await c.fetchval("SHOW application_name"), f"drv-{i}", f"SHOW, round {r}")
                await asyncio.sleep(0.003)
            await c.execute("RESET application_name")
            eq(await c.fetchval("SHOW application_name"), before, "after RESET")
        finally:
            await c.close()

    await gather(h.CLIENTS, client)


async def t_set_extended_concurrent():
    async def client(i):
        c = await connect(statement_cache_size=0)
        try:
            await c.fetch(f"SET work_mem = '{1025 + i}kB'")  # Parse/Bind/Execute
            for r in range(5):
                eq(await c.fetchval("SHOW work_mem"), f"{1025 + i}kB", f"SHOW, round {r}")
                eq(await c.fetchval("SELECT current_setting($1)", "work_mem"), f"{1025 + i}kB", "current_setting")
                await asyncio.sleep(0.003)
        finally:
            await c.close()

    await gather(h.CLIENTS, client)


async def t_startup_options_concurrent():
    # Startup parameters (asyncpg's server_settings are sent as such), each client its own.
    async def client(i):
        c = await connect(server_settings={"work_mem": f"{2049 + i}kB", "application_name": f"drv-start-{i}"})
        try:
            for r in range(5):
                eq(await c.fetchval("SHOW work_mem"), f"{2049 + i}kB", f"work_mem, round {r}")
                eq(await c.fetchval("SELECT current_setting($1)", "application_name"), f"drv-start-{i}", "application_name")
                await asyncio.sleep(0.003)
        finally:
            await c.close()

    await gather(h.CLIENTS, client)


async def t_set_config():
    a, b = await connect(), await connect()
    try:
        async with churn():
            default = await b.fetchval("SHOW work_mem")
            eq(await a.fetchval("SELECT set_config('work_mem', $1, false)", "3333kB"), "3333kB", "set_config")
            for r in range(8):
                eq(await b.fetchval("SHOW work_mem"), default, "another client's work_mem")
                eq(await a.fetchval("SHOW work_mem"), "3333kB", f"work_mem after set_config, round {r}")
    finally:
        await a.close()
        await b.close()


async def t_temp_table():
    a, b = await connect(), await connect()
    try:
        async with churn():
            await a.execute("CREATE TEMP TABLE drv_tmp (k int, v text)")
            await a.execute("INSERT INTO drv_tmp VALUES ($1, $2)", 1, NAME)
            for r in range(8):
                eq(await b.fetchval("SELECT 1"), 1, "another client's statement")
                eq(await a.fetchval("SELECT v FROM drv_tmp WHERE k = $1", 1), NAME, f"read back, round {r}")
            try:
                await b.fetch("SELECT * FROM drv_tmp")
                raise AssertionError("another client sees the temp table")
            except asyncpg.UndefinedTableError:
                pass
            await b.execute("CREATE TEMP TABLE drv_tmp (k int, v text)")
            eq(await b.fetchval("SELECT count(*) FROM drv_tmp"), 0, "the other client's own temp table")
            eq(await a.fetchval("SELECT count(*) FROM drv_tmp"), 1, "the first client's temp table")
    finally:
        await a.close()
        await b.close()


async def t_advisory_lock():
    key = 4_200_003
    a, b = await connect(), await connect()
    try:
        async with churn():
            # try-lock, so that a lock some earlier client left on a pooled connection fails
            # the check instead of blocking it.
            eq(await a.fetchval("SELECT pg_try_advisory_lock($1)", key), True, "the holder takes the lock")
            for r in range(8):
                eq(await a.fetchval("SELECT 1"), 1, "the holder's other statement")
                eq(await b.fetchval("SELECT pg_try_advisory_lock($1)", key), False, f"another client takes the lock, round {r}")
            eq(await a.fetchval("SELECT pg_advisory_unlock($1)", key), True, "the holder unlocks")
            await b.execute("SELECT pg_advisory_lock($1)", key)
            eq(await b.fetchval("SELECT pg_advisory_unlock($1)", key), True, "and unlocks it")
    finally:
        await a.close()
        await b.close()


async def t_listen_notify():
    chan = f"drv_{NAME}"
    listener, other, sender = await connect(), await connect(), await connect()
    try:
        async with churn():
            got, seen_by_other = asyncio.Queue(), []

            def on_notify(_conn, _pid, ch, payload):
                got.put_nowait((ch, payload))

            await listener.add_listener(chan, on_notify)
            await other.add_listener(f"{chan}_other", lambda *a: seen_by_other.append(a))
            eq(await other.fetchval("SELECT 1"), 1, "another client's statement")
            await sender.execute(f"NOTIFY {chan}, 'hello'")
            await sender.execute("SELECT pg_notify($1, $2)", chan, "second")
            first = await asyncio.wait_for(got.get(), 5)
            second = await asyncio.wait_for(got.get(), 5)
            eq([first, second], [(chan, "hello"), (chan, "second")], "notifications of an idle listener")
            for _ in range(3):
                await other.fetchval("SELECT 1")
            eq(seen_by_other, [], "notifications seen by a client that listens on another channel")
            await listener.remove_listener(chan, on_notify)  # UNLISTEN
            await sender.execute(f"NOTIFY {chan}, 'after unlisten'")
            await asyncio.sleep(1)
            eq(got.qsize(), 0, "notifications after UNLISTEN")
    finally:
        for c in (listener, other, sender):
            await c.close()


async def t_copy_in():
    c = await connect()
    try:
        await c.execute(f"DROP TABLE IF EXISTS drv_copy_{NAME}")
        await c.execute(f"CREATE TABLE drv_copy_{NAME} (k int, v text)")
        # asyncpg prepares `SELECT * FROM t LIMIT 1` (Parse+Describe+Flush, no Sync) and sends the
        # COPY right after it; a second later the replica has the table too, so a read-only
        # routing of that batch would run the COPY there.
        await asyncio.sleep(1)
        n = await c.copy_records_to_table(f"drv_copy_{NAME}", records=[(k, f"row {k}") for k in range(20000)])
        eq(n, "COPY 20000", "command tag")
        eq(tuple(await c.fetchrow(f"SELECT count(*), sum(k) FROM drv_copy_{NAME}")), (20000, 199990000), "rows copied in")
    finally:
        await c.close()


async def t_copy_out():
    c = await connect()
    try:
        out = io.BytesIO()
        await c.copy_from_query("SELECT g, 'row ' || g FROM generate_series(0, 19999) g", output=out)
        lines = out.getvalue().decode().splitlines()
        eq(len(lines), 20000, "rows copied out")
        eq(lines[12345], "12345\trow 12345", "row 12345")
    finally:
        await c.close()


async def t_cancel():
    # A bystander's statement running meanwhile is not cancelled.
    c, bystander = await connect(), await connect()
    try:
        by = asyncio.create_task(bystander.fetchval("SELECT pg_sleep(1.5)::text || 'slept'"))
        t0 = time.monotonic()
        try:
            await c.fetchval("SELECT pg_sleep(30)", timeout=0.5)  # asyncpg sends a CancelRequest
            raise AssertionError("pg_sleep(30) was not cancelled")
        except asyncio.TimeoutError:
            pass
        eq(await asyncio.wait_for(c.fetchval("SELECT 1"), 5), 1, "the connection after the cancel")
        took = time.monotonic() - t0
        if took > 5:
            raise AssertionError(f"usable again after {took:.1f} s")
        eq(await asyncio.wait_for(by, 5), "slept", "the bystander's statement")
    finally:
        await c.close()
        await bystander.close()


async def t_result_200mb():
    c = await connect()
    try:
        v = await c.fetchval(f"SELECT repeat('x', {h.BIG})")
        eq(len(v), h.BIG, "length")
        del v
        eq(await c.fetchval("SELECT 2"), 2, "the connection after")
    finally:
        await c.close()


async def t_errors():
    c = await connect()
    try:
        for sql, args, code in [
            ("SELECT 1/0", (), "22012"),
            ("SELECT $1::int / 0", (1,), "22012"),
            ("SELEC 1", (), "42601"),
            ("SELECT * FROM drv_no_such_table", (), "42P01"),
        ]:
            try:
                await c.fetch(sql, *args)
                raise AssertionError(f"{sql}: no error")
            except asyncpg.PostgresError as e:
                eq(e.sqlstate, code, sql)
        async with c.transaction():
            try:
                async with c.transaction():
                    await c.fetch("SELECT 1/0")
            except asyncpg.DivisionByZeroError:
                pass
            eq(await c.fetchval("SELECT 3"), 3, "after a failed savepoint")
        eq(await c.fetchval("SELECT 4"), 4, "after the transaction")
    finally:
        await c.close()


check("connect", sync(t_connect))
check("prepared_concurrent", sync(t_prepared_concurrent))
check("unnamed_statement_concurrent", sync(t_unnamed_statement_concurrent))
check("sql_prepare_concurrent", sync(t_sql_prepare_concurrent))
check("set_simple_concurrent", sync(t_set_simple_concurrent))
check("set_extended_concurrent", sync(t_set_extended_concurrent))
check("startup_options_concurrent", sync(t_startup_options_concurrent))
check("set_config", sync(t_set_config))
check("temp_table", sync(t_temp_table))
check("advisory_lock", sync(t_advisory_lock))
check("listen_notify", sync(t_listen_notify))
check("copy_in", sync(t_copy_in))
check("copy_out", sync(t_copy_out))
check("cancel", sync(t_cancel))
check("result_200mb", sync(t_result_200mb))
check("errors", sync(t_errors))
h.finish()
