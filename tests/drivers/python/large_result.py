"""One large result fetched by a driver, digested client-side (run by pg_drivers.rs).

Usage: python large_result.py PORT DRIVER MIB (the port first, as harness.py reads it), DRIVER one of psycopg2, psycopg3, asyncpg.
Fetches `select n, md5(n::text), repeat('x', 1000) from generate_series(1, ROWS) n` (ROWS
rows of about 1 KiB, MIB MiB in all) with the driver's plain query call (the whole result in
one go, as an analysis script pulls a data set), and prints `rows N md5 HEX`: the MD5 of every
row as the text `n|md5|xxx...` plus a newline, which is what `psql -XAt -F '|'` prints, so
every driver and psql must print the same line, through refract or directly.
"""
import asyncio
import hashlib
import sys

import harness as h

WIDTH = 1000
BATCH = 10000


def sql(mib):
    rows = max(1, mib * 1024 * 1024 // (WIDTH + 45))
    return f"select n, md5(n::text), repeat('x', {WIDTH}) from generate_series(1, {rows}) n"


def digest_rows(rows, md5):
    count = 0
    for n, m, pad in rows:
        md5.update(f"{n}|{m}|{pad}\n".encode())
        count += 1
    return count


def with_dbapi(module, query):
    conn = module.connect(h.DSN)
    try:
        cur = conn.cursor()
        cur.execute(query)
        md5, count = hashlib.md5(), 0
        while True:
            rows = cur.fetchmany(BATCH)
            if not rows:
                break
            count += digest_rows(rows, md5)
        return count, md5.hexdigest()
    finally:
        conn.close()


async def with_asyncpg(query):
    import asyncpg

    conn = await asyncpg.connect(host=h.HOST, port=h.PORT, user=h.USER, password=h.PASSWORD, database=h.DATABASE)
    try:
        md5 = hashlib.md5()
        count = digest_rows(await conn.fetch(query), md5)
        return count, md5.hexdigest()
    finally:
        await conn.close()


def main():
    driver, mib = sys.argv[2], int(sys.argv[3])
    query = sql(mib)
    if driver == "psycopg2":
        import psycopg2

        count, hexdigest = with_dbapi(psycopg2, query)
    elif driver == "psycopg3":
        import psycopg

        count, hexdigest = with_dbapi(psycopg, query)
    elif driver == "asyncpg":
        count, hexdigest = asyncio.run(with_asyncpg(query))
    else:
        sys.exit(f"unknown driver {driver!r}")
    print(f"rows {count} md5 {hexdigest}", flush=True)


if __name__ == "__main__":
    main()
