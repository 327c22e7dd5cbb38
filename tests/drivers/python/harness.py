"""Shared by the Python driver suites: connection settings, checks, bounded waits.

Every suite is run as `python SUITE.py PORT` (refract's PostgreSQL port; user/password/database
of refract-testkit) and prints one line per check, `ok NAME` or `FAIL NAME: reason`, then
`done`; it exits non-zero when any check failed. Each check runs with a time limit, so a hung
driver is a failed check, never a hung suite.
"""
import contextlib
import os
import sys
import threading
import time
import traceback

HOST = "127.0.0.1"
PORT = int(sys.argv[1]) if len(sys.argv) > 1 else 5432
USER = os.environ.get("REFRACT_PG_USER", "refract")
PASSWORD = os.environ.get("REFRACT_PG_PASSWORD", "refract")
DATABASE = os.environ.get("REFRACT_PG_DATABASE", "postgres")
DSN = f"host={HOST} port={PORT} user={USER} password={PASSWORD} dbname={DATABASE} connect_timeout=10"
URL_AUTH = f"{USER}:{PASSWORD}@{HOST}:{PORT}/{DATABASE}"

# Concurrent client connections in the concurrency checks.
CLIENTS = 20
# 200 MiB: the size of the big result.
BIG = 200 * 1024 * 1024

_failures = []
_lock = threading.Lock()


def say(line):
    with _lock:
        print(line, flush=True)


def check(name, fn, timeout=30):
    """Runs `fn()` in a thread with a time limit; prints `ok NAME` or `FAIL NAME: reason`."""
    outcome = {}

    def target():
        try:
            fn()
            outcome["ok"] = True
        except BaseException as e:  # noqa: BLE001 - any failure is the check's failure
            outcome["err"] = f"{type(e).__name__}: {e}".replace("\n", " | ")
            outcome["tb"] = traceback.format_exc()

    t0 = time.monotonic()
    t = threading.Thread(target=target, daemon=True, name=name)
    t.start()
    t.join(timeout)
    took = time.monotonic() - t0
    if t.is_alive():
        _failures.append(name)
        say(f"FAIL {name}: timed out after {timeout} s")
    elif "err" in outcome:
        _failures.append(name)
        say(f"FAIL {name}: {outcome['err']}")
        sys.stderr.write(f"--- {name}\n{outcome['tb']}")
        sys.stderr.flush()
    else:
        say(f"ok {name} ({took:.1f} s)")


def eq(got, want, what):
    if got != want:
        raise AssertionError(f"{what}: got {got!r}, want {want!r}")


def parallel(n, fn, timeout=25):
    """Runs `fn(i)` for i in 0..n, each in its own thread, all started together; raises the
    first failure (naming the client) or a timeout."""
    barrier = threading.Barrier(n, timeout=timeout)
    errors = [None] * n

    def run(i):
        try:
            barrier.wait()
            fn(i)
        except BaseException as e:  # noqa: BLE001
            errors[i] = e

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    stuck = [i for i, t in enumerate(threads) if t.is_alive()]
    if stuck:
        raise TimeoutError(f"clients {stuck} still running after {timeout} s")
    for i, e in enumerate(errors):
        if e is not None:
            raise AssertionError(f"client {i}: {type(e).__name__}: {e}") from e


# Statements of the churn clients: short, on the primary (the hint is a comment to PostgreSQL)
# and on a replica, so that a client's statements land on whichever server connection is free.
CHURN = ["/* refract: route=primary */ SELECT pg_sleep(0.002)", "SELECT pg_sleep(0.002)"]


@contextlib.contextmanager
def churn(loop, n=3):
    """Runs `loop(stop)` on `n` threads (each a client running CHURN statements until `stop` is
    set) while the block runs: session state a client's statements rely on must stay with that
    client while other clients take and return server connections."""
    stop = threading.Event()
    threads = [threading.Thread(target=loop, args=(stop,), daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    try:
        time.sleep(0.05)
        yield
    finally:
        stop.set()
        for t in threads:
            t.join(5)


def finish():
    """Prints the summary and exits (without waiting for threads a timed-out check left)."""
    if _failures:
        say(f"failed: {', '.join(_failures)}")
    say("done")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1 if _failures else 0)
