#!/usr/bin/env bash
# README command 2: set up what is missing, then run the whole test suite.
# Root tests (Mininet, tc, iptables) run when this runs as root and skip otherwise.
# With no arguments the tests that build no network run on two workers (pytest-xdist), then the
# root tests one at a time: they build real networks and time real links, so they run alone.
# Arguments go to one plain pytest run instead (e.g. scripts/run-tests.sh tests/planner -k costmodel).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$ROOT/scripts/setup.sh"
cd "$ROOT"
PY="$ROOT/.venv/bin/python"
if [ $# -gt 0 ]; then
  exec "$PY" -m pytest -q "$@"
fi
status=0
"$PY" -m pytest -q -m "not root" -n 2 || status=$?
"$PY" -m pytest -q -m root || status=$?
exit "$status"
