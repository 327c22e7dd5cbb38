#!/bin/bash
# Issue 21's open-loop check with the shipped example config: refract with
# examples/loopback.toml as it is, three blob servers of 4 workers x 20 ms on the example's
# ports (b1 primary; reads go to b2 and b3), Poisson reads at 0.5x and 3x the measured
# capacity, client timeout 1000 ms. Prints one JSON line per run (refract bench loadgen).
# Needs 127.0.0.1:8080, 8081 and 9001-9003 free. Usage: tests/overload-loopback.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/refract}
SECS=${1:-10}
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
for i in 1 2 3; do
  "$BIN" blob-server --listen 127.0.0.1:900$i --name b$i --delay-ms 20 --concurrency 4 & pids+=($!)
done
RUST_LOG=warn "$BIN" dispatch --config examples/loopback.toml & pids+=($!)
for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/8080) 2>/dev/null && break; sleep 0.1; done
sleep 2 # the first health probes
load() { "$BIN" bench loadgen --target 127.0.0.1:8080 "$@"; }
# Summarises a loadgen run: goodput, p50/p99 of served reads, refused share and refusal p99.
summary() {
  python3 -c '
import json, sys
o = json.load(sys.stdin); r = o["records"]
pct = lambda v, q: sorted(v)[round((len(v) - 1) * q)] / 1000 if v else float("nan")
ok = [x["l"] for x in r if x["o"] == "ok"]; ref = [x["l"] for x in r if x["o"] == "refused"]
other = len(r) - len(ok) - len(ref)
print(json.dumps({"offered": len(r), "goodput": round(len(ok) / o["duration_s"], 1),
  "p50_ms": pct(ok, 0.5), "p99_ms": pct(ok, 0.99), "refused": len(ref),
  "refused_p99_ms": pct(ref, 0.99), "timeouts_or_errors": other}))'
}
cap=$(load --closed 32 --duration 3s | python3 -c 'import json,sys; o=json.load(sys.stdin); print(round(sum(x["o"] == "ok" for x in o["records"]) / o["duration_s"]))')
echo "capacity: $cap req/s (closed loop of 32 for 3 s)"
for level in 0.5 3; do
  rate=$(python3 -c "print(round($level * $cap))")
  load --rate "$rate" --duration 1s --seed 9 >/dev/null # warm-up at this load
  echo "$level x ($rate req/s, ${SECS} s): $(load --rate "$rate" --duration "${SECS}s" --seed 1 | summary)"
done
