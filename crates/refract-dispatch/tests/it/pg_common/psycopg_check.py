"""psycopg2 through refract (run by pg_frontend.rs): routing, parameters, transactions, errors.

Usage: psycopg_check.py REFRACT_PORT PRIMARY_PORT REPLICA_PORT. Prints one line per check and
exits non-zero (with the failed assertion) on the first that fails.
"""
import sys

import psycopg2
import psycopg2.errors

port, primary, replica = (int(a) for a in sys.argv[1:4])
dsn = f"dbname=postgres host=127.0.0.1 port={port} user=refract password=refract"


def check(name, got, want):
    assert got == want, f"{name}: got {got!r}, want {want!r}"
    print(f"ok {name}")


conn = psycopg2.connect(dsn)
conn.autocommit = True  # otherwise psycopg2 opens a transaction, which pins to the primary
cur = conn.cursor()

# A plain read goes to the replica (before any write: read-your-writes would pin it).
cur.execute("SELECT pg_is_in_recovery(), inet_server_port()")
check("read on the replica", cur.fetchone(), (True, replica))

# Parameters (psycopg2 interpolates them client-side, quoting included).
cur.execute("SELECT %s::int + 1, %s::text, %s IS NULL", (41, "it's", None))
check("parameters", cur.fetchone(), (42, "it's", True))

# A write lands on the primary.
cur.execute("CREATE TABLE t_psycopg (id int PRIMARY KEY, note text)")
cur.execute("INSERT INTO t_psycopg VALUES (%s, %s) RETURNING inet_server_port()", (1, "first"))
check("write on the primary", cur.fetchone()[0], primary)

# A transaction that commits and one that rolls back.
conn.autocommit = False
cur.execute("INSERT INTO t_psycopg VALUES (%s, %s)", (2, "committed"))
cur.execute("SELECT pg_is_in_recovery()")
check("transaction pinned to the primary", cur.fetchone()[0], False)
conn.commit()
cur.execute("INSERT INTO t_psycopg VALUES (%s, %s)", (3, "rolled back"))
conn.rollback()
conn.autocommit = True
cur.execute("SELECT array_agg(id ORDER BY id) FROM t_psycopg")
check("commit kept, rollback dropped", cur.fetchone()[0], [1, 2])

# Server errors arrive as psycopg2.errors.* with their SQLSTATE.
for sql, cls, code in [
    ("SELECT 1/0", psycopg2.errors.DivisionByZero, "22012"),
    ("SELECT * FROM no_such_table_psycopg", psycopg2.errors.UndefinedTable, "42P01"),
    ("INSERT INTO t_psycopg VALUES (1, 'dup')", psycopg2.errors.UniqueViolation, "23505"),
]:
    try:
        cur.execute(sql)
        raise AssertionError(f"{sql}: no error")
    except cls as e:
        check(f"error {code}", e.pgcode, code)

# The connection is still usable after the errors, in and out of a transaction.
conn.autocommit = False
try:
    cur.execute("SELECT 1/0")
except psycopg2.errors.DivisionByZero:
    conn.rollback()
cur.execute("SELECT count(*) FROM t_psycopg")
check("usable after a failed transaction", cur.fetchone()[0], 2)
conn.commit()
conn.close()
print("done")
