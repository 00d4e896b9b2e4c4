#!/usr/bin/env bash
# One set-up path for every entry point (README commands, CI, docker/).
# Installs what is missing and is a no-op the second time:
#   apt packages -> .venv -> torch (CPU build) -> the project (editable, with test extras).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV="$ROOT/.venv"
PY=${SPIDERFLOW_PYTHON:-python3}
APT_PKGS=(mininet iproute2 iptables iperf3 bridge-utils libnetfilter-queue-dev openssh-server
          build-essential python3-venv procps git)

log() { printf '[setup] %s\n' "$*" >&2; }
# pip -q still warns about this machine's local index folders; keep real errors.
quiet() { grep -v -e 'is neither a file nor a directory' -e 'BuildBackendWarning' >&2 || true; }

missing=()
for p in "${APT_PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    log "missing apt packages: ${missing[*]}; run this with sudo"; exit 2
  fi
  log "apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # --no-install-recommends: Mininet recommends Open vSwitch, which we do not use.
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip setuptools wheel 2>&1 | quiet
fi

stamp="$VENV/.spiderflow-installed"
want=$(cat "$ROOT/pyproject.toml" | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  if ! "$VENV/bin/python" -c 'import torch' 2>/dev/null; then
    log "installing torch==2.13.0 (CPU build)"
    "$VENV/bin/pip" install -q torch==2.13.0 2>&1 | quiet
  fi
  log "installing the project and its test tools"
  "$VENV/bin/pip" install -q -e "$ROOT[test,emulator]" 2>&1 | quiet
  echo "$want" > "$stamp"
fi
