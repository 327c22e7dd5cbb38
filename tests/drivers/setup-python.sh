#!/usr/bin/env bash
# Creates the venv the pg_drivers Python suites run in (psycopg 3, psycopg2, asyncpg,
# SQLAlchemy from PyPI, versions pinned in python/requirements.txt). Idempotent: does nothing
# when the venv already has exactly these requirements.
# Where: $REFRACT_PYENV, else ${CARGO_TARGET_DIR:-<repo>/target}/pyenv (where pg_drivers.rs looks).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="${REFRACT_PYENV:-${CARGO_TARGET_DIR:-$root/target}/pyenv}"
req="$here/python/requirements.txt"
python="${PYTHON:-python3}"
stamp="$venv/.requirements"
if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && cmp -s "$req" "$stamp"; then
  exit 0
fi
echo "setting up the Python driver venv in $venv"
"$python" -m venv --clear "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$req"
"$venv/bin/python" -c "import psycopg, psycopg2, asyncpg, sqlalchemy"
cp "$req" "$stamp"
