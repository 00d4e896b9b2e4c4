#!/usr/bin/env bash
# Emulation over two servers without a second machine (issue 20), as root:
#   scripts/multihost-test.sh [--topology FILE] [--trace FILE] [--tunnel vxlan|ssh] [--no-run]
#                             [other `emulator check` arguments, e.g. --json]
# --tunnel defaults to vxlan here (the CLI's default is ssh): both "servers" share this machine's
# cores, and an SSH tunnel's userspace work per packet lands on the same core as everything else
# (docs/multihost.md: on one core, ssh tunnels meet the targets at --scale 20, vxlan at 10).
# 1. makes a second server on this machine: network namespace sf-srv2 joined by a veth
#    (192.168.254.1/30 <-> .2), its own sshd (own config, host key and authorised key in a temp dir;
#    root by key only; listening only on 192.168.254.2), emulator/net/localserver.py;
# 2. runs `emulator check --servers localhost,sf-srv2` (clusters split over both; WAN links between
#    them through tunnels) and prints its table, the cross-server vs local summary and the
#    tunnel's overhead;
# 3. unless --no-run: runs `emulator run` (the trace, default traces/default.csv) split over both
#    servers, then the same run on this machine alone, and prints every job's status and error in
#    both and their median |error| (issue 20's target: within 1 point of each other);
# 4. removes everything it made (trap on exit: the emulation's own teardown, then
#    `emulator clean` for anything a crash left, then the second server).
# Exits 0 when the check and both runs passed. Heavy work runs on core 0 (taskset), like the other
# scripts' callers.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY="$ROOT/.venv/bin/python"
TOPOLOGY=topologies/default.yaml
TRACE=traces/default.csv
TUNNEL=vxlan
RUN=1
ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --topology) TOPOLOGY=$2; shift 2 ;;
    --trace) TRACE=$2; shift 2 ;;
    --tunnel) TUNNEL=$2; shift 2 ;;
    --no-run) RUN=0; shift ;;
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
[ "$RUN" = 1 ] || exit "$rc"

run() {  # run NAME [--servers ...]: `emulator run` of the trace, JSON in $WORK/NAME.json
  local name=$1; shift
  set +e
  "${CPU[@]}" "$PY" -m emulator run --topology "$TOPOLOGY" --trace "$TRACE" --out "$WORK/$name" --json "$@" \
      > "$WORK/$name.json"
  local status=$?
  set -e
  log "emulator run ($name) exited with $status"
  return "$status"
}
log "emulator run --servers localhost,sf-srv2 --tunnel $TUNNEL on $TOPOLOGY, $TRACE"
run two-servers --servers localhost,sf-srv2 --ssh-config "$SSH_CONFIG" --tunnel "$TUNNEL" || rc=1
log "the same run on this machine alone"
run one-server || rc=1
"$PY" - "$WORK/one-server.json" "$WORK/two-servers.json" <<'PYEOF' || rc=1
import json, sys
one, two = ({j["job_id"]: j for j in json.load(open(p))["jobs"]} if open(p).read().strip() else {}
            for p in sys.argv[1:])
def med(p):
    text = open(p).read().strip()
    return json.loads(text)["median_abs_error_pct"] if text else None
def fmt(j):
    if j is None:
        return "(no result)"
    err = "" if j.get("error_pct") is None else f"{j['error_pct']:+.1f}%"
    place = " ".join(f"{c}:{g}" for c, g in j["placement"].items())
    return f"{j['status']:<6} {err:>7}  {place}"
print(f"{'job':<14} {'one server':<40} two servers")
for jid in sorted(set(one) | set(two)):
    print(f"{jid:<14} {fmt(one.get(jid)):<40} {fmt(two.get(jid))}")
m1, m2 = med(sys.argv[1]), med(sys.argv[2])
ok = m1 is not None and m2 is not None and abs(m1 - m2) <= 1.0 and all(
    j["status"] == "ok" for j in list(one.values()) + list(two.values()))
print(f"median |error|: one server {m1 if m1 is None else f'{m1:.2f}%'}, two servers "
      f"{m2 if m2 is None else f'{m2:.2f}%'}; every job ok and within 1 point: {'yes' if ok else 'NO'}")
sys.exit(0 if ok else 1)
PYEOF
exit "$rc"
