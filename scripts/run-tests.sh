#!/usr/bin/env bash
# README command 2: set up what is missing, then run the whole test suite.
# Root tests (Mininet, tc, iptables) run when this runs as root and skip otherwise.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$ROOT/scripts/setup.sh"
cd "$ROOT"
exec "$ROOT/.venv/bin/python" -m pytest -q "$@"
