#!/usr/bin/env bash
# Emulation over two servers without a second machine (issue 20), as root:
#   scripts/multihost-test.sh [--topology FILE] [--tunnel vxlan|ssh] [other `emulator check` arguments, e.g. --json]
# --tunnel defaults to vxlan here (the CLI's default is ssh): both "servers" share this machine's
# cores, and an SSH tunnel's userspace work per packet lands on the same core as everything else
# (docs/multihost.md: on one core, ssh tunnels meet the targets at --scale 20, vxlan at 10).
# 1. makes a second server on this machine: network namespace sf-srv2 joined by a veth
#    (192.168.254.1/30 <-> .2), its own sshd (own config, host key and authorised key in a temp dir;
#    root by key only; listening only on 192.168.254.2), emulator/net/localserver.py;
# 2. runs `emulator check --servers localhost,sf-srv2` (clusters split over both; WAN links between
#    them through tunnels) and prints its table, the cross-server vs local summary and the
#    tunnel's overhead;
# 3. removes everything it made (trap on exit: the emulation's own teardown, then
#    `emulator clean` for anything a crash left, then the second server).
# Exits with the check's status. Heavy work runs on core 0 (taskset), like the other scripts' callers.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY="$ROOT/.venv/bin/python"
TOPOLOGY=topologies/default.yaml
TUNNEL=vxlan
ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --topology) TOPOLOGY=$2; shift 2 ;;
    --tunnel) TUNNEL=$2; shift 2 ;;
    *) ARGS+=("$1"); shift ;;
  esac
done
log() { printf '[multihost-test] %s\n' "$*" >&2; }
if [ "$(id -u)" -ne 0 ]; then log "run as root (network namespaces, tc, sshd)"; exit 2; fi
if [ ! -x "$PY" ] || [ ! -x /usr/sbin/sshd ]; then
  log "setting up (venv, openssh-server): scripts/setup.sh"; "$ROOT/scripts/setup.sh"
fi
CPU=(taskset -c 0)
command -v taskset >/dev/null || CPU=()
WORK=$(mktemp -d /tmp/sf-multihost.XXXXXX)
SRV="$WORK/srv2"
# the agent's lock directory for sf-srv2 (emulator/net/agent.py), removed after if this run made it
PART_DIR="$("$PY" -c 'from emulator.net.state import default_state_dir; print(default_state_dir())')/remote-sf-srv2"
[ -e "$PART_DIR" ] && MADE_PART_DIR=0 || MADE_PART_DIR=1

cleanup() {
  status=$?
  trap - EXIT INT TERM
  cd "$ROOT"
  # an emulation that crashed leaves its state file: clean ends what it lists, here and on sf-srv2
  "$PY" -m emulator clean >/dev/null 2>&1 || log "emulator clean failed; run it by hand"
  "$PY" -m emulator.net.localserver down --dir "$SRV" || log "removing the second server failed; see $SRV/server.json"
  if [ "$MADE_PART_DIR" = 1 ] && [ ! -e "$PART_DIR/emulation.json" ]; then
    rm -f "$PART_DIR/emulator.lock"; rmdir "$PART_DIR" 2>/dev/null || true
  fi
  rm -rf "$WORK"
  log "removed everything this script made"
  exit "$status"
}
trap cleanup EXIT INT TERM

cd "$ROOT"
log "making the second server (network namespace sf-srv2 with its own sshd)"
# sshd and everything it starts (the far side of the emulation) on the same core as the check
SSH_CONFIG=$("${CPU[@]}" "$PY" -m emulator.net.localserver up --dir "$SRV")
log "emulator check --servers localhost,sf-srv2 --tunnel $TUNNEL on $TOPOLOGY"
set +e
"${CPU[@]}" "$PY" -m emulator check --topology "$TOPOLOGY" --servers localhost,sf-srv2 \
    --ssh-config "$SSH_CONFIG" --tunnel "$TUNNEL" "${ARGS[@]}"
rc=$?
set -e
log "emulator check exited with $rc"
exit "$rc"
