#!/usr/bin/env bash
# Runs every fuzz target under AFL++ (cargo-afl, stable Rust) for SECONDS each, one after the
# other, then prints executions, time and findings per target from AFL's fuzzer_stats.
# Exits 1 if any target saved a crash or a hang (inputs under fuzz/out/<target>/default/).
# Usage: fuzz/run.sh SECONDS   (`make fuzz FUZZ_SECONDS=...`, `make fuzz-smoke`; docs/fuzzing.md)
# FUZZ_TARGETS narrows the list; FUZZ_NICE (default 10) lowers the fuzzer's priority;
# FUZZ_EXECS=N stops each target after N executions instead (SECONDS is then the time limit).
set -euo pipefail
seconds=${1:?usage: run.sh SECONDS}
cd "$(dirname "$0")"
read -ra targets <<<"${FUZZ_TARGETS:-http_head http_chunked pg_frontend pg_backend pg_startup handover_msg pg_keyparam pg_copyrows pg_numeric pg_scram pg_hybrid peer_cancel}"

# cargo-afl builds AFL++ itself on install; `config --build` covers an install that did not
# (it refuses, harmlessly, when AFL++ is there already).
command -v cargo-afl >/dev/null || cargo install cargo-afl --locked
if ! out=$(cargo afl config --build 2>&1) && ! grep -q "already built" <<<"$out"; then
  echo "$out"
  exit 1
fi
cargo afl build --release --features afl --bins

# Non-interactive on any box: no CPU governor check, no core-pattern check, no curses UI, no
# pinning to a core (shared machines have none free); -t: an input slower than 1 s is a hang.
export AFL_SKIP_CPUFREQ=1 AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1 AFL_NO_UI=1 AFL_NO_AFFINITY=1
mkdir -p out
for t in "${targets[@]}"; do
  rm -rf "out/$t"
  echo "fuzzing $t for ${seconds}s (log: fuzz/out/$t.log)"
  limit=(-V "$seconds")
  # -E: stop at that many executions (AFL++ checks it between runs, so it may overshoot a little).
  [ -n "${FUZZ_EXECS:-}" ] && limit+=(-E "$FUZZ_EXECS")
  nice -n "${FUZZ_NICE:-10}" cargo afl fuzz "${limit[@]}" -t 1000 -i "corpus/$t" -o "out/$t" "target/release/$t" \
    >"out/$t.log" 2>&1 || { echo "afl-fuzz failed for $t:"; tail -20 "out/$t.log"; exit 1; }
done

stat() { awk -F' *: *' -v k="$1" '$1 == k { print $2 }' "$2"; }
found=0
printf '%-14s %12s %8s %10s %8s %6s %6s\n' target executions seconds execs/s paths crashes hangs
for t in "${targets[@]}"; do
  s="out/$t/default/fuzzer_stats"
  crashes=$(find "out/$t/default/crashes" -type f ! -name README.txt | wc -l)
  hangs=$(find "out/$t/default/hangs" -type f | wc -l)
  execs=$(stat execs_done "$s")
  time=$(stat run_time "$s")
  printf '%-14s %12s %8s %10s %8s %6s %6s\n' "$t" "$execs" "$time" "$((execs / (time > 0 ? time : 1)))" \
    "$(stat corpus_count "$s")" "$crashes" "$hangs"
  found=$((found + crashes + hangs))
done
if [ "$found" -gt 0 ]; then
  echo "fuzzing found $found crash(es)/hang(s): inputs in fuzz/out/<target>/default/{crashes,hangs}"
  exit 1
fi
