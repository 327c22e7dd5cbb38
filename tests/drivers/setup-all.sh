#!/usr/bin/env bash
# Installs and builds every driver suite pg_drivers.rs and pg_sharded_drivers.rs run (`make test-drivers` calls it):
# the Python venv (setup-python.sh), pgx v5 from the Go module proxy (go build), node-postgres
# from npm (npm ci, from package-lock.json), pgjdbc from Maven Central (mvn package, a shaded
# jar). Needs go, node/npm, mvn and a JDK 17 on the PATH.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${CARGO_TARGET_DIR:-$root/target}/drivers"
mkdir -p "$out"

"$here/setup-python.sh"

echo "building the pgx suites"
(cd "$here/go" && go mod download && go build -o "$out/pgx-suite" . && go build -o "$out/pgx-sharded-suite" ./sharded)

echo "installing node-postgres"
(cd "$here/node" && npm ci --no-audit --no-fund --loglevel=error)

echo "building the pgjdbc suite"
(cd "$here/java" && mvn -q -B package)
