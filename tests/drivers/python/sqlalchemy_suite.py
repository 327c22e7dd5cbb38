"""SQLAlchemy 2 through refract (run by crates/refract-dispatch/tests/it/pg_drivers.rs), on its
psycopg (3), psycopg2 and asyncpg dialects, with a pool of 20 connections used by 20 threads
or tasks at once.

Usage: sqlalchemy_suite.py PORT. COPY, LISTEN/NOTIFY, cancel and the 200 MB result have no
SQLAlchemy API of their own (they go to the driver's connection) and are checked by the
driver suites. Every check asserts what a direct connection to PostgreSQL gives; see harness.py.
"""
import asyncio
import time

from sqlalchemy import Column, Integer, MetaData, String, Table, bindparam, create_engine, func, select, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import harness as h
from harness import check, eq, parallel

NAME = "sqlalchemy"


class Base(DeclarativeBase):
    pass


class Item(Base):
    __tablename__ = "drv_items_sqlalchemy"
    id: Mapped[int] = mapped_column(primary_key=True)
    client: Mapped[int]
    note: Mapped[str] = mapped_column(String(40))


def engine(dialect, **kw):
    return create_engine(f"postgresql+{dialect}://{h.URL_AUTH}", pool_size=h.CLIENTS, max_overflow=0, **kw)


def autocommit(dialect, **kw):
    return engine(dialect, isolation_level="AUTOCOMMIT", **kw)


def sqlstate(e):
    orig = e.orig
    return getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)


def busy_on(eng):
    def loop(stop):
        with eng.connect() as c:
            while not stop.is_set():
                for sql in h.CHURN:
                    c.exec_driver_sql(sql)

    return loop


def t_orm_concurrent():
    # 20 threads, each an ORM Session (transactions: BEGIN ... COMMIT) on psycopg 3 with every
    # statement prepared from its first execution.
    eng = engine("psycopg", connect_args={"prepare_threshold": 1})
    try:
        Base.metadata.drop_all(eng)
        Base.metadata.create_all(eng)

        def client(i):
            with Session(eng) as s:
                for r in range(5):
                    with s.begin():
                        s.add(Item(id=i * 100 + r, client=i, note=f"c{i} r{r}"))
                    time.sleep(0.002)
                with s.begin():
                    mine = s.scalars(select(Item).where(Item.client == i).order_by(Item.id)).all()
                    eq([x.note for x in mine], [f"c{i} r{r}" for r in range(5)], "the client's rows")
                with s.begin():
                    s.get(Item, i * 100).note = "changed"
                with s.begin():
                    eq(s.scalar(select(Item.note).where(Item.id == i * 100)), "changed", "the update")

        parallel(h.CLIENTS, client)
    finally:
        eng.dispose()


def t_prepared_concurrent():
    # Autocommit: each statement on its own, psycopg 3 preparing it (named _pg3_N per
    # connection) from the first execution; every client's texts are its own.
    eng = autocommit("psycopg", connect_args={"prepare_threshold": 1})
    try:

        def client(i):
            with eng.connect() as c:
                for r in range(8):
                    for j in range(3):
                        q = text(f"SELECT CAST(:x AS int) + {i * 100 + j}")
                        eq(c.execute(q, {"x": r}).scalar(), r + i * 100 + j, f"statement {j}, round {r}")
                    time.sleep(0.002)

        parallel(h.CLIENTS, client)
    finally:
        eng.dispose()


def t_asyncpg_dialect_concurrent():
    # The asyncpg dialect prepares every statement (named, cached per connection).
    async def main():
        eng = create_async_engine(
            f"postgresql+asyncpg://{h.URL_AUTH}", pool_size=h.CLIENTS, max_overflow=0, isolation_level="AUTOCOMMIT"
        )
        try:

            async def client(i):
                async with eng.connect() as c:
                    for r in range(8):
                        for j in range(3):
                            q = text(f"SELECT CAST(:x AS int) + {i * 100 + j}")
                            eq((await c.execute(q, {"x": r})).scalar(), r + i * 100 + j, f"statement {j}, round {r}")
                        await asyncio.sleep(0.002)

            await asyncio.wait_for(asyncio.gather(*(client(i) for i in range(h.CLIENTS))), 25)
        finally:
            await eng.dispose()

    asyncio.run(main())


def t_set_simple_concurrent():
    # On psycopg2 (every statement a simple Query), SET and later statements on one pooled
    # connection in autocommit.
    eng = autocommit("psycopg2")
    try:

        def client(i):
            with eng.connect() as c:
                c.exec_driver_sql(f"SET application_name = 'drv-{i}'")
                for r in range(5):
                    eq(c.exec_driver_sql("SHOW application_name").scalar(), f"drv-{i}", f"SHOW, round {r}")
                    q = select(func.current_setting(bindparam("n")))
                    eq(c.execute(q, {"n": "application_name"}).scalar(), f"drv-{i}", "current_setting")
                    time.sleep(0.003)
                c.exec_driver_sql("RESET application_name")

        parallel(h.CLIENTS, client)
    finally:
        eng.dispose()


def t_set_extended_concurrent():
    # On asyncpg (every statement through Parse/Bind/Execute), SET then SHOW.
    async def main():
        eng = create_async_engine(
            f"postgresql+asyncpg://{h.URL_AUTH}", pool_size=h.CLIENTS, max_overflow=0, isolation_level="AUTOCOMMIT"
        )
        try:

            async def client(i):
                async with eng.connect() as c:
                    await c.exec_driver_sql(f"SET work_mem = '{1025 + i}kB'")
                    for r in range(5):
                        eq((await c.exec_driver_sql("SHOW work_mem")).scalar(), f"{1025 + i}kB", f"SHOW, round {r}")
                        await asyncio.sleep(0.003)
                    await c.exec_driver_sql("RESET work_mem")

            await asyncio.wait_for(asyncio.gather(*(client(i) for i in range(h.CLIENTS))), 25)
        finally:
            await eng.dispose()

    asyncio.run(main())


def t_temp_table():
    eng = autocommit("psycopg")
    try:
        meta = MetaData()
        tmp = Table("drv_tmp", meta, Column("k", Integer), Column("v", String), prefixes=["TEMPORARY"])
        with eng.connect() as a, eng.connect() as b, h.churn(busy_on(eng)):
            meta.create_all(a)
            a.execute(tmp.insert(), [{"k": 1, "v": NAME}, {"k": 2, "v": "two"}])
            for r in range(8):
                eq(b.execute(text("SELECT 1")).scalar(), 1, "another client's statement")
                eq(a.execute(select(tmp.c.v).where(tmp.c.k == 1)).scalar(), NAME, f"read back, round {r}")
            try:
                b.execute(select(tmp.c.v))
                raise AssertionError("another client sees the temp table")
            except DBAPIError as e:
                eq(sqlstate(e), "42P01", "the other client's SELECT")
            eq(a.execute(select(func.count()).select_from(tmp)).scalar(), 2, "rows")
    finally:
        eng.dispose()


def t_advisory_lock():
    key = 4_200_004
    eng = autocommit("psycopg")
    try:
        with eng.connect() as a, eng.connect() as b, h.churn(busy_on(eng)):
            # try-lock, so that a lock some earlier client left on a pooled connection fails
            # the check instead of blocking it.
            eq(a.execute(select(func.pg_try_advisory_lock(key))).scalar(), True, "the holder takes the lock")
            for r in range(8):
                eq(a.execute(text("SELECT 1")).scalar(), 1, "the holder's other statement")
                got = b.execute(select(func.pg_try_advisory_lock(key))).scalar()
                eq(got, False, f"another client takes the lock, round {r}")
            eq(a.execute(select(func.pg_advisory_unlock(key))).scalar(), True, "the holder unlocks")
            b.execute(select(func.pg_advisory_lock(key)))
            eq(b.execute(select(func.pg_advisory_unlock(key))).scalar(), True, "and unlocks it")
    finally:
        eng.dispose()


def t_savepoint():
    eng = engine("psycopg")
    try:
        with Session(eng) as s:
            with s.begin():
                s.add(Item(id=9001, client=-1, note="outer"))
                try:
                    with s.begin_nested():
                        s.add(Item(id=9002, client=-1, note="inner"))
                        s.flush()
                        s.execute(text("SELECT 1/0"))
                except DBAPIError as e:
                    eq(sqlstate(e), "22012", "the failing statement")
            with s.begin():
                ids = s.scalars(select(Item.id).where(Item.client == -1).order_by(Item.id)).all()
                eq(ids, [9001], "the outer row kept, the savepoint's rolled back")
    finally:
        eng.dispose()


check("orm_concurrent", t_orm_concurrent)
check("prepared_concurrent", t_prepared_concurrent)
check("asyncpg_dialect_concurrent", t_asyncpg_dialect_concurrent)
check("set_simple_concurrent", t_set_simple_concurrent)
check("set_extended_concurrent", t_set_extended_concurrent)
check("temp_table", t_temp_table)
check("advisory_lock", t_advisory_lock)
check("savepoint", t_savepoint)
h.finish()
