#!/usr/bin/env bash
# README command 1: set up what is missing, then run the main job on the shipped defaults:
# `python -m emulator run` (topologies/default.yaml, traces/default.csv, SpinSearch). Needs root.
# Extra arguments go to `emulator run` (e.g. --json, --planner blind).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$ROOT/scripts/setup.sh"
cd "$ROOT"
exec "$ROOT/.venv/bin/python" -m emulator run "$@"
