#!/usr/bin/env bash
# Containerized CI: build docker/Dockerfile from this checkout and run the whole test suite
# in it with gloo, root tests included (a --privileged container, its own network namespace).
# Exits with the suite's status.
#
#   scripts/docker-test.sh [--build-only] [--torch-wheels DIR] [-- PYTEST_ARGS...]
#   scripts/docker-test.sh --stop-engine     # stop the Docker engine an earlier run started
#
# Works on a normal Docker host and on a machine with neither an engine nor a registry
# (run it as root there):
#   - no engine answers: installs docker.io if dockerd is missing and starts one
#     (dockerd --storage-driver=vfs, in the background, log SPIDERFLOW_DOCKERD_LOG, pid in
#     SPIDERFLOW_DOCKERD_PIDFILE). That engine makes no bridge and leaves the host's
#     iptables and ip_forward alone: builds use the host's network (apt, pip), the test
#     container gets --network none either way (loopback only; Mininet makes the rest).
#     It is left running for the next run; --stop-engine stops it.
#   - base image: SPIDERFLOW_BASE_IMAGE if set; else a local debian:bookworm, a local
#     spiderflow-base:bookworm, `docker pull debian:bookworm`, and last
#     `debootstrap --variant=minbase bookworm` + `docker import` (installs debootstrap).
#   - torch's CPU build: --torch-wheels DIR (or SPIDERFLOW_TORCH_WHEELS) names a directory
#     holding the wheel; without it, PyTorch's CPU index if it answers, else a
#     torch-<setup.sh's version>+cpu wheel found in pip's configured find-links.
#   - CA certificates this host added (SPIDERFLOW_CA_CERTS, default
#     /usr/local/share/ca-certificates/*.crt) are trusted while dependencies install.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
IMAGE=${SPIDERFLOW_IMAGE:-spiderflow}
PIDFILE=${SPIDERFLOW_DOCKERD_PIDFILE:-/run/spiderflow-dockerd.pid}
ENGINE_LOG=${SPIDERFLOW_DOCKERD_LOG:-/var/log/spiderflow-dockerd.log}
LOCAL_BASE=spiderflow-base:bookworm
TORCH_INDEX_URL=${SPIDERFLOW_TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}
STAGE=build/docker-extra   # git-ignored; let into the build context by .dockerignore

log() { printf '[docker-test] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 2; }

build_only=0 stop_engine=0 torch_wheels=${SPIDERFLOW_TORCH_WHEELS:-}
while [ $# -gt 0 ]; do
  case $1 in
    --build-only) build_only=1 ;;
    --stop-engine) stop_engine=1 ;;
    --torch-wheels) [ $# -ge 2 ] || die "--torch-wheels needs a directory"; torch_wheels=$2; shift ;;
    --torch-wheels=*) torch_wheels=${1#*=} ;;
    -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    --) shift; break ;;
    *) die "unknown argument $1 (pytest arguments go after --)" ;;
  esac
  shift
done

engine_pid() {  # the pid of the engine this script started, if it still runs
  local pid
  pid=$(cat "$PIDFILE" 2>/dev/null) || return 1
  [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = dockerd ] && echo "$pid"
}

if [ "$stop_engine" = 1 ]; then
  pid=$(engine_pid) || { log "no engine started by this script runs ($PIDFILE)"; exit 0; }
  log "stopping dockerd (pid $pid)"
  kill "$pid"
  for _ in $(seq 60); do [ -d "/proc/$pid" ] || break; sleep 1; done
  [ -d "/proc/$pid" ] && die "dockerd (pid $pid) still runs after 60 s; see $ENGINE_LOG"
  rm -f "$PIDFILE"; exit 0
fi

apt_install() {
  [ "$(id -u)" -eq 0 ] || die "need $* (apt-get install $*); run this as root"
  log "apt-get install $*"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# --- the engine ---------------------------------------------------------------------------
if ! docker info >/dev/null 2>&1; then
  [ "$(id -u)" -eq 0 ] || die "no Docker engine answers and starting one needs root"
  command -v dockerd >/dev/null || apt_install docker.io
fi
if ! docker info >/dev/null 2>&1; then  # (installing docker.io may have started its service)
  log "starting dockerd --storage-driver=vfs (log $ENGINE_LOG)"
  # --bridge=none --iptables=false --ip-forward=false: no docker0, no NAT rules, no FORWARD
  # policy change, nothing in the host's network namespace for its emulations to trip on.
  setsid dockerd --storage-driver=vfs --bridge=none --iptables=false --ip-forward=false \
    --pidfile "$PIDFILE" </dev/null >>"$ENGINE_LOG" 2>&1 &
  started=$!
  for _ in $(seq 90); do
    docker info >/dev/null 2>&1 && break
    [ -d "/proc/$started" ] || { tail -n 20 "$ENGINE_LOG" >&2; die "dockerd exited; see $ENGINE_LOG"; }
    sleep 1
  done
  docker info >/dev/null 2>&1 || die "dockerd (pid $started) did not answer in 90 s; see $ENGINE_LOG"
  log "dockerd runs (pid $(engine_pid || echo "$started"))"
fi
# An engine without the default bridge (the one above) gives RUN steps the host's network.
build_net=()
docker network inspect bridge >/dev/null 2>&1 || build_net=(--network host)

# --- the base image -----------------------------------------------------------------------
have_image() { docker image inspect "$1" >/dev/null 2>&1; }
make_base() {  # debootstrap a minimal bookworm and import it as $LOCAL_BASE
  command -v debootstrap >/dev/null || apt_install debootstrap
  local dir
  dir=$(mktemp -d /tmp/spiderflow-rootfs.XXXXXX)
  # debootstrap mounts /proc and /sys in the target while it runs; never leave them behind.
  trap 'umount -l "'"$dir"'/proc" "'"$dir"'/sys" 2>/dev/null; rm -rf --one-file-system "'"$dir"'"' EXIT
  log "debootstrap --variant=minbase bookworm (a few minutes)"
  debootstrap --variant=minbase bookworm "$dir" http://deb.debian.org/debian >"$dir.log" 2>&1 \
    || { tail -n 20 "$dir.log" >&2; die "debootstrap failed; see $dir.log"; }
  rm -f "$dir.log"
  chmod 755 "$dir"  # mktemp's 0700 would become the image's / (and lock out non-root users)
  # the suites of the official debian:bookworm image
  printf 'deb http://deb.debian.org/debian %s main\n' bookworm bookworm-updates >"$dir/etc/apt/sources.list"
  echo 'deb http://deb.debian.org/debian-security bookworm-security main' >>"$dir/etc/apt/sources.list"
  rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/*
  tar -C "$dir" --numeric-owner -c . | docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["bash"]' - "$LOCAL_BASE" >/dev/null
  umount -l "$dir/proc" "$dir/sys" 2>/dev/null || true
  rm -rf --one-file-system "$dir"; trap - EXIT
  log "imported $LOCAL_BASE"
}
base=${SPIDERFLOW_BASE_IMAGE:-}
if [ -z "$base" ]; then
  if have_image debian:bookworm; then base=debian:bookworm
  elif have_image "$LOCAL_BASE"; then base=$LOCAL_BASE
  elif timeout 60 docker pull -q debian:bookworm >/dev/null 2>&1; then base=debian:bookworm
  else log "no registry answers; making the base image"; make_base; base=$LOCAL_BASE
  fi
fi
have_image "$base" || die "base image $base not found"

# --- torch's CPU wheel --------------------------------------------------------------------
torch_version=$(grep -o 'torch==[0-9][0-9.]*' "$ROOT/scripts/setup.sh" | head -n 1 | cut -d= -f3)
[ -n "$torch_version" ] || die "scripts/setup.sh names no torch==VERSION"
wheel_glob="torch-$torch_version+cpu-cp311-cp311-*$(uname -m).whl"  # bookworm's python3 is 3.11
if [ -z "$torch_wheels" ] && ! curl -fsS --max-time 15 -o /dev/null "$TORCH_INDEX_URL/torch/" 2>/dev/null; then
  log "$TORCH_INDEX_URL does not answer; looking for $wheel_glob in pip's find-links"
  for d in ${PIP_FIND_LINKS:-} $(python3 -m pip config list 2>/dev/null | sed -n "s/^[a-z:]*\.find-links='\(.*\)'$/\1/p"); do
    d=${d#file://}
    if [ -d "$d" ] && compgen -G "$d/$wheel_glob" >/dev/null; then torch_wheels=$d; break; fi
  done
  [ -n "$torch_wheels" ] || die "no torch CPU wheel source: give --torch-wheels DIR holding $wheel_glob"
fi
build_args=(--build-arg "BASE_IMAGE=$base")
staged="$ROOT/$STAGE"
rm -rf "$staged"
trap 'rm -rf "$staged"; rmdir "$ROOT/build" 2>/dev/null || true' EXIT
if [ -n "$torch_wheels" ]; then
  compgen -G "$torch_wheels/$wheel_glob" >/dev/null || die "$torch_wheels holds no $wheel_glob"
  # Only the wheel(s) setup.sh asks for go into the build context (hard links where possible).
  mkdir -p "$staged/wheels"
  for w in "$torch_wheels"/$wheel_glob; do ln "$w" "$staged/wheels/" 2>/dev/null || cp "$w" "$staged/wheels/"; done
  build_args+=(--build-arg "TORCH_WHEELS=$STAGE/wheels")
  log "torch wheels: $(cd "$staged/wheels" && echo *) (from $torch_wheels)"
else
  build_args+=(--build-arg "TORCH_INDEX_URL=$TORCH_INDEX_URL")
  log "torch wheels: $TORCH_INDEX_URL"
fi

# Trust anchors this host added (/usr/local/share/ca-certificates: a TLS-intercepting proxy's
# CA, say) are trusted by apt and pip during the dependency step, not by the finished image.
ca_dir=${SPIDERFLOW_CA_CERTS-/usr/local/share/ca-certificates}
if [ -n "$ca_dir" ] && compgen -G "$ca_dir/*.crt" >/dev/null; then
  mkdir -p "$staged/ca"; cp "$ca_dir"/*.crt "$staged/ca/"
  build_args+=(--build-arg "EXTRA_CA_CERTS=$STAGE/ca")
  log "build-time CA certificates: $(cd "$staged/ca" && echo *) (from $ca_dir)"
fi

# --- build --------------------------------------------------------------------------------
log "docker build -f docker/Dockerfile -t $IMAGE ${build_net[*]} (base $base)"
t0=$(date +%s)
docker build --force-rm -f "$ROOT/docker/Dockerfile" -t "$IMAGE" "${build_args[@]}" "${build_net[@]}" "$ROOT"
rm -rf "$staged"; rmdir "$ROOT/build" 2>/dev/null || true; trap - EXIT
size=$(docker image inspect -f '{{.Size}}' "$IMAGE")
log "built $IMAGE in $(( $(date +%s) - t0 )) s; image size $(( size / 1000000 )) MB"

# --- test ---------------------------------------------------------------------------------
# Mininet needs a privileged container. --privileged asks runc for every capability the
# kernel has; where this process's bounding set lacks some (a sandbox without
# CAP_SYS_RESOURCE, say), runc fails with "unable to apply caps". There, the same minus
# those: every other capability, no seccomp or AppArmor confinement, /proc/sys writable,
# /sys remounted read-write, and the host's /dev/net/tun (--privileged passes every device; the
# multihost tests' tap tunnels need that one).
privileged() {
  local names=(CHOWN DAC_OVERRIDE DAC_READ_SEARCH FOWNER FSETID KILL SETGID SETUID SETPCAP
    LINUX_IMMUTABLE NET_BIND_SERVICE NET_BROADCAST NET_ADMIN NET_RAW IPC_LOCK IPC_OWNER
    SYS_MODULE SYS_RAWIO SYS_CHROOT SYS_PTRACE SYS_PACCT SYS_ADMIN SYS_BOOT SYS_NICE
    SYS_RESOURCE SYS_TIME SYS_TTY_CONFIG MKNOD LEASE AUDIT_WRITE AUDIT_CONTROL SETFCAP
    MAC_OVERRIDE MAC_ADMIN SYSLOG WAKE_ALARM BLOCK_SUSPEND AUDIT_READ PERFMON BPF
    CHECKPOINT_RESTORE)
  local bnd last i drop=() lacks=()
  bnd=$((16#$(awk '/^CapBnd:/ {print $2}' /proc/self/status)))
  last=$(cat /proc/sys/kernel/cap_last_cap)
  for ((i = 0; i <= last && i < ${#names[@]}; i++)); do
    (( bnd >> i & 1 )) || { drop+=(--cap-drop "${names[i]}"); lacks+=("${names[i]}"); }
  done
  if [ ${#drop[@]} -eq 0 ]; then run_flags=(--privileged); return; fi
  log "this host's capability bounding set lacks ${lacks[*]}: --privileged minus those"
  run_flags=(--cap-add ALL "${drop[@]}" --security-opt seccomp=unconfined
             --security-opt apparmor=unconfined --security-opt systempaths=unconfined)
  if [ -c /dev/net/tun ]; then run_flags+=(--device /dev/net/tun); fi
  remount_sys=1
}
status=0
if [ "$build_only" = 0 ]; then
  run_flags=() remount_sys=0
  privileged
  name="spiderflow-test-$$"
  trap 'docker rm -f "$name" >/dev/null 2>&1 || true' EXIT
  trap 'exit 130' INT TERM
  cmd=(bash scripts/run-tests.sh "$@")
  [ "$remount_sys" = 0 ] || cmd=(bash -c 'mount -o remount,rw /sys && exec "$@"' - "${cmd[@]}")
  log "docker run --rm ${run_flags[*]} --network none $IMAGE (${*:-the whole suite})"
  t0=$(date +%s)
  docker run --rm "${run_flags[@]}" --network none --name "$name" "$IMAGE" "${cmd[@]}" || status=$?
  log "suite exited $status after $(( $(date +%s) - t0 )) s"
fi
if pid=$(engine_pid); then
  log "the engine started for this keeps running (pid $pid); stop it with:"
  log "  $ROOT/scripts/docker-test.sh --stop-engine    # or: kill \$(cat $PIDFILE)"
fi
exit "$status"
