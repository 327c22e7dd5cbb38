# Run by `refract bench cluster` (lab/src/bench/cluster/cancels.rs) in each client
# host: N psycopg2 connections to HOST:PORT each start `SELECT pg_sleep(10)` (autocommit, so
# the statement is the only one on its way); 0.5 s after the driver was asked to run it, each
# is cancelled with the driver's own cancel (libpq's PQcancel: a CancelRequest on a new
# connection to the same address, which the router may send to either dispatcher). Prints one
# JSON object: per connection the seconds from the cancel to the statement's end and how it
# ended (the SQLSTATE, 57014 when the cancel took effect).
import json, sys, threading, time
import psycopg2

host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
results = [None] * n

def one(i):
    try:
        c = psycopg2.connect(host=host, port=port, user="refract", password="refract", dbname="postgres",
                             connect_timeout=10)
    except Exception as e:
        results[i] = {"error": "connect: %s" % e}
        return
    c.autocommit = True
    done = {}
    asked = threading.Event()
    def run():
        cur = c.cursor()
        asked.set()
        try:
            cur.execute("SELECT pg_sleep(10)")
            done["code"] = "00000"
        except psycopg2.Error as e:
            done["code"] = e.pgcode or "?"
            done["message"] = str(e).strip()[:200]
        done["at"] = time.monotonic()
    t = threading.Thread(target=run)
    t.start()
    asked.wait(10)
    time.sleep(0.5)
    sent = time.monotonic()
    try:
        c.cancel()
    except Exception as e:
        done.setdefault("cancel_error", str(e))
    t.join(15)
    results[i] = {"code": done.get("code"), "seconds": (done["at"] - sent) if "at" in done else None,
                  "cancel_error": done.get("cancel_error"), "message": done.get("message")}
    c.close()

threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
for t in threads:
    t.start()
for t in threads:
    t.join(30)
print(json.dumps(results))
