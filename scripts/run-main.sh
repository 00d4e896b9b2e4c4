#!/usr/bin/env bash
# README command 1: set up what is missing, then run the main job on the shipped defaults.
# Extra arguments go to the main job.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$ROOT/scripts/setup.sh"
cd "$ROOT"
if "$ROOT/.venv/bin/python" -c 'import emulator.runner' 2>/dev/null; then
  exec "$ROOT/.venv/bin/python" -m emulator run "$@"
fi
# Fallback when the emulator is not importable: plan the default job.
exec "$ROOT/.venv/bin/python" -m spiderflow plan --topology topologies/default.yaml \
  --model gpt3-1.3b --gpus 16 "$@"
