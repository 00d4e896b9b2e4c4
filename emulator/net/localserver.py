"""A second "server" on this machine, for testing ``--servers`` without a second machine.

``up`` makes, and records in ``DIR/server.json`` before each step:

- a network namespace ``NAME`` (default ``sf-srv2``) joined to the root namespace by a veth pair
  ``NAME-a`` (root side, ``.1``) / ``NAME-b`` (inside, ``.2``) on a private /30;
- an ed25519 host key, a client key and ``authorized_keys`` in ``DIR``;
- ``sshd`` inside the namespace with its own config (``DIR/sshd_config``): listening only on the
  veth address, root login by key only, Ethernet tunnels allowed (Mininet's ``RemoteLink``
  uses ``ssh -w``), no PAM, no passwords;
- ``DIR/ssh_config``: a ``Host NAME`` entry (address, key, known host), for ``--ssh-config``.

A namespace shares the filesystem, so the project path and venv are the same "on both servers".
That also hides any path that works only because the servers share files. ``--private PATH``
(repeatable; ``LocalServer(private=(PATH, ...))``) gives the second server a view of its own of
each PATH: sshd starts in a new mount namespace (``ip netns exec NAME unshare --mount
--propagation private sh -c 'mount -t tmpfs ... PATH && ... exec sshd ...'``: every exec keeps
the pid, so the recorded pid is sshd's own) where each PATH is covered by an empty tmpfs with
PATH's mode and owner. What the second server writes there is invisible here and what this
server writes there is invisible to it; everything it starts over SSH (node shells, the agent,
the rank pool, ``mnexec -a`` children) inherits that view. A PATH inside another is private with
it. Refused in one line: a relative or missing PATH, and a PATH that is or holds what the second
server must see as this one does (the project, its venv and Python, ``DIR`` with sshd's config
and keys, ``/run/sshd``). The view is checked in sshd's ``/proc/PID/mountinfo`` before ``up``
returns; the record lists the paths and the mount namespace, which ends with its last process.

``down`` removes exactly what the record lists: the processes our sshd started (its process
tree, and anything left inside the namespace or the private view's mount namespace), sshd by pid
(checked against its start time), the namespace, the veth, ``/run/sshd`` if we made it, and
``DIR`` if we made it; it works after a crash at any step (what was never made is skipped).

    python -m emulator.net.localserver up --dir /root/sf-srv2 [--private /tmp ...]   # prints the ssh config path
    python -m emulator.net.localserver down --dir /root/sf-srv2
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from emulator.net.servers import REPO
from emulator.net.state import end_processes, proc_starttime
from spiderflow.errors import EmulatorError

DEFAULT_NAME = "sf-srv2"
DEFAULT_SUBNET = "192.168.254"  # .0/30: .1 root side, .2 the server
PRIVSEP_DIR = Path("/run/sshd")
SSHD = "/usr/sbin/sshd"
READY_TIMEOUT_S = 10.0
PRIVATE_FS = "sf-private"  # the source name of the private view's tmpfs mounts (in mountinfo)


@dataclass(frozen=True, kw_only=True)
class LocalServer:
    name: str
    dir: Path
    subnet: str = DEFAULT_SUBNET
    private: tuple[Path, ...] = ()  # paths the server sees an empty view of its own of (--private)

    def __post_init__(self) -> None:
        object.__setattr__(self, "private", check_private(self.private, self.dir))

    @property
    def private_mounts(self) -> tuple[Path, ...]:
        """The private paths that are not inside another: one tmpfs each."""
        return tuple(p for p in self.private if not any(q in p.parents for q in self.private))

    @property
    def address(self) -> str:
        return f"{self.subnet}.2"

    @property
    def root_address(self) -> str:
        return f"{self.subnet}.1"

    @property
    def veth_root(self) -> str:
        return f"{self.name}-a"

    @property
    def veth_inside(self) -> str:
        return f"{self.name}-b"

    @property
    def record(self) -> Path:
        return self.dir / "server.json"

    @property
    def ssh_config(self) -> Path:
        return self.dir / "ssh_config"

    @property
    def client_key(self) -> Path:
        return self.dir / "id_ed25519"


def kept_paths(server_dir: Path) -> dict[str, Path]:
    """What the second server must see as this one does, so no private path may be or hold it."""
    return {"the project": REPO, "its venv": Path(sys.prefix), "its Python": Path(sys.base_prefix),
            "--dir (sshd's config and keys)": server_dir, "sshd's privilege separation directory": PRIVSEP_DIR}


def check_private(paths, server_dir: Path) -> tuple[Path, ...]:
    """``paths`` resolved and sorted, or EmulatorError naming the path, what it would hide, and the fix."""
    out = set()
    for given in paths:
        if not Path(given).is_absolute():
            raise EmulatorError(f"localserver: --private {given}: not an absolute path; give one (e.g. /tmp)")
        real = Path(os.path.realpath(given))
        if not real.is_dir():
            raise EmulatorError(f"localserver: --private {given}: no such directory here; the tmpfs covers an "
                                "existing one: make it first or pick another")
        for what, kept in kept_paths(server_dir).items():
            kept = Path(os.path.realpath(kept))
            if kept == real or real in kept.parents:
                raise EmulatorError(f"localserver: --private {given} would hide {what} ({kept}) from the second "
                                    "server, which needs it; pick a path that holds none of the project, its venv, "
                                    "its Python and --dir (or move --dir out of it)")
        out.add(real)
    return tuple(sorted(out))


def mount_command(path: Path) -> list[str]:
    """An empty tmpfs over ``path`` with its mode and owner (``/tmp`` stays 1777 root:root)."""
    st = os.stat(path)
    return ["mount", "-t", "tmpfs", "-o", f"mode={st.st_mode & 0o7777:o},uid={st.st_uid},gid={st.st_gid}",
            PRIVATE_FS, str(path)]


def sshd_argv(srv: LocalServer) -> list[str]:
    """sshd in the server's network namespace, in the foreground; with private paths, in a mount
    namespace of its own whose tmpfs mounts cover them. Every step execs the next, so the pid is sshd's."""
    sshd = [SSHD, "-D", "-e", "-f", str(srv.dir / "sshd_config")]  # -D: foreground, -e: log to stderr
    inside = ["ip", "netns", "exec", srv.name]
    if not srv.private:
        return inside + sshd
    mounts = " && ".join(shlex.join(mount_command(p)) for p in srv.private_mounts)
    return inside + ["unshare", "--mount", "--propagation", "private",
                     "sh", "-c", f'{mounts} && exec "$@"', "sh"] + sshd


def private_view(pid: int) -> set[str]:
    """Mount points of our private tmpfs mounts in process ``pid``'s mount namespace."""
    found = set()
    for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
        head, _, tail = line.partition(" - ")
        fstype, source = (tail.split() + ["", ""])[:2]
        if fstype == "tmpfs" and source == PRIVATE_FS:
            found.add(head.split()[4].replace("\\040", " "))
    return found


def _mntns_pids(inode: int) -> list[int]:
    pids = []
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.stat(f"/proc/{p}/ns/mnt").st_ino == inode:
                pids.append(int(p))
        except OSError:
            continue
    return pids


def sshd_config(srv: LocalServer) -> str:
    d = srv.dir
    return "\n".join([
        f"ListenAddress {srv.address}", "Port 22", f"HostKey {d / 'host_ed25519'}", f"PidFile {d / 'sshd.pid'}",
        f"AuthorizedKeysFile {d / 'authorized_keys'}", "PermitRootLogin prohibit-password",
        "PubkeyAuthentication yes", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
        "UsePAM no", "StrictModes no", "UseDNS no", "PermitTunnel ethernet", "AllowTcpForwarding no",
        "X11Forwarding no", "PrintMotd no", "MaxSessions 200", "MaxStartups 200:30:400",
        "ClientAliveInterval 5", "ClientAliveCountMax 3", "LogLevel ERROR", ""])


def ssh_client_config(srv: LocalServer) -> str:
    return "\n".join([
        f"Host {srv.name}", f"  HostName {srv.address}", "  User root", f"  IdentityFile {srv.client_key}",
        "  IdentitiesOnly yes", f"  UserKnownHostsFile {srv.dir / 'known_hosts'}", "  StrictHostKeyChecking yes",
        "  GlobalKnownHostsFile /dev/null", ""])


def _run(argv: list[str], **kw) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, **kw)
    if done.returncode != 0:
        why = ((done.stderr or done.stdout).strip().splitlines() or ["no error output"])[-1]
        raise EmulatorError(f"localserver: `{' '.join(argv)}` failed with exit {done.returncode}: {why}")
    return done


class Recorder:
    """The record of what ``up`` made, written before each thing is made."""

    def __init__(self, srv: LocalServer) -> None:
        self.srv = srv
        self.data: dict = {"name": srv.name, "dir": str(srv.dir), "subnet": srv.subnet,
                           "private": [str(p) for p in srv.private], "made": []}

    def add(self, kind: str, **info) -> None:
        self.data["made"].append({"kind": kind, **info})
        self.write()

    def write(self) -> None:
        tmp = self.srv.record.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1))
        os.replace(tmp, self.srv.record)


def up(srv: LocalServer, *, log=lambda _m: None) -> LocalServer:
    """Make the server; on any failure remove what was made and raise."""
    if os.geteuid() != 0:
        raise EmulatorError("localserver: run as root (network namespace, veth, sshd)")
    if not Path(SSHD).exists():
        raise EmulatorError(f"localserver: {SSHD} missing; install openssh-server (sudo scripts/setup.sh)")
    if srv.record.exists():
        raise EmulatorError(f"localserver: {srv.record} exists (a server is up, or a crashed one left it); "
                            f"run `python -m emulator.net.localserver down --dir {srv.dir}` first")
    if Path(f"/run/netns/{srv.name}").exists():
        raise EmulatorError(f"localserver: network namespace {srv.name} already exists and is not ours; "
                            "pick another --name")
    made_dir = not srv.dir.exists()
    srv.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    rec = Recorder(srv)
    if made_dir:
        rec.add("dir", path=str(srv.dir))
    try:
        _build(srv, rec, log)
    except BaseException:
        down(srv, log=log)
        raise
    return srv


def _build(srv: LocalServer, rec: Recorder, log) -> None:
    d = srv.dir
    for key, comment in (("host_ed25519", "sf-srv host"), ("id_ed25519", "sf-srv client")):
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(d / key)])
    shutil.copy(d / "id_ed25519.pub", d / "authorized_keys")
    host_pub = (d / "host_ed25519.pub").read_text().split()
    (d / "known_hosts").write_text(f"{srv.address} {host_pub[0]} {host_pub[1]}\n")
    (d / "sshd_config").write_text(sshd_config(srv))
    srv.ssh_config.write_text(ssh_client_config(srv))
    rec.add("netns", name=srv.name)
    _run(["ip", "netns", "add", srv.name])
    rec.add("veth", name=srv.veth_root)
    _run(["ip", "link", "add", srv.veth_root, "type", "veth", "peer", "name", srv.veth_inside,
          "netns", srv.name])
    _run(["ip", "addr", "add", f"{srv.root_address}/30", "dev", srv.veth_root])
    _run(["ip", "link", "set", srv.veth_root, "up"])
    inside = ["ip", "netns", "exec", srv.name]
    _run(inside + ["ip", "link", "set", "lo", "up"])
    _run(inside + ["ip", "addr", "add", f"{srv.address}/30", "dev", srv.veth_inside])
    _run(inside + ["ip", "link", "set", srv.veth_inside, "up"])
    if not PRIVSEP_DIR.exists():
        rec.add("privsep-dir", path=str(PRIVSEP_DIR))
        PRIVSEP_DIR.mkdir(mode=0o755)
    _run([SSHD, "-t", "-f", str(d / "sshd_config")])
    log_file = open(d / "sshd.log", "wb")
    proc = subprocess.Popen(sshd_argv(srv), stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file,
                            start_new_session=True)
    log_file.close()
    # `ip netns exec`, `unshare` and `sh -c 'exec ...'` each exec the next in place: the pid is sshd's
    rec.add("sshd", pid=proc.pid, starttime=proc_starttime(proc.pid) or 0)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            tail = (d / "sshd.log").read_text(errors="replace").strip().splitlines()
            raise EmulatorError(f"localserver: sshd exited with {proc.returncode}: {tail[-1] if tail else 'no output'}")
        probe = subprocess.run(["ssh", "-F", str(srv.ssh_config), "-o", "BatchMode=yes", "-o", "ConnectTimeout=2",
                                srv.name, "true"], capture_output=True, text=True, timeout=15)
        if probe.returncode == 0:
            break
        if time.monotonic() > deadline:
            why = (probe.stderr.strip().splitlines() or ["no error output"])[-1]
            raise EmulatorError(f"localserver: ssh to {srv.name} ({srv.address}) does not work: {why}")
        time.sleep(0.1)
    if os.path.realpath(f"/proc/{proc.pid}/exe") != os.path.realpath(SSHD):
        raise EmulatorError(f"localserver: pid {proc.pid} is not sshd ({os.path.realpath(f'/proc/{proc.pid}/exe')})")
    if srv.private:
        mntns = os.stat(f"/proc/{proc.pid}/ns/mnt").st_ino
        rec.add("private-view", mntns=mntns, paths=[str(p) for p in srv.private_mounts])
        missing = {str(p) for p in srv.private_mounts} - private_view(proc.pid)
        if missing or mntns == os.stat("/proc/self/ns/mnt").st_ino:
            raise EmulatorError(f"localserver: sshd's private view lacks {sorted(missing) or 'its own namespace'}")
    view = f", private {', '.join(map(str, srv.private))}" if srv.private else ""
    log(f"server {srv.name} up: sshd pid {proc.pid} on {srv.address}{view}, ssh config {srv.ssh_config}")


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{p}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        kids.setdefault(ppid, []).append(int(p))
    return kids


def _tree(pid: int) -> list[int]:
    kids, out, todo = _children(), [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += kids.get(p, [])
    return out


def _netns_pids(name: str) -> list[int]:
    done = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True)
    return [int(x) for x in done.stdout.split()] if done.returncode == 0 else []


def down(srv: LocalServer, *, log=lambda _m: None) -> list[str]:
    """Remove what ``srv``'s record lists (idempotent); returns what was removed."""
    try:
        data = json.loads(srv.record.read_text())
    except FileNotFoundError:
        log(f"nothing to remove (no {srv.record})")
        return []
    except ValueError as exc:
        raise EmulatorError(f"localserver: {srv.record} unreadable ({exc}); remove by hand") from None
    srv = LocalServer(name=data["name"], dir=Path(data["dir"]), subnet=data.get("subnet", srv.subnet))
    made = data.get("made", [])
    kinds = {m["kind"]: m for m in made}
    removed = []
    sshd = kinds.get("sshd")
    if sshd and proc_starttime(sshd["pid"]) == sshd["starttime"]:
        procs = {p: proc_starttime(p) for p in _tree(sshd["pid"])}
        left = end_processes({p: s for p, s in procs.items() if s is not None}, grace_s=2.0)
        removed.append(f"sshd pid {sshd['pid']} and {len(procs) - 1} processes it started")
        if left:
            raise EmulatorError(f"localserver: could not end {sorted(left)}; kill them, then run down again")
    view = kinds.get("private-view")
    if view:  # only our sshd made it: whatever is still in it is ours (it ends with its last process)
        # once gone, its inode may name another namespace: only processes started after our sshd
        since = sshd["starttime"] if sshd else 0
        rest = {p: s for p in _mntns_pids(view["mntns"]) if (s := proc_starttime(p)) is not None and s >= since}
        left = end_processes(rest, grace_s=2.0) if rest else {}
        if left:
            raise EmulatorError(f"localserver: could not end {sorted(left)} (in the private view); kill them, "
                                "then run down again")
        removed.append(f"private view of {', '.join(view['paths'])}"
                       + (f" ({len(rest)} processes left in it)" if rest else ""))
    if "netns" in kinds and Path(f"/run/netns/{srv.name}").exists():
        rest = {p: proc_starttime(p) for p in _netns_pids(srv.name)}
        rest = {p: s for p, s in rest.items() if s is not None}
        if rest:  # started inside our namespace: only we put processes there
            end_processes(rest, grace_s=2.0)
            removed.append(f"{len(rest)} processes left in namespace {srv.name}")
        subprocess.run(["ip", "netns", "del", srv.name], capture_output=True)
        removed.append(f"namespace {srv.name}")
    if "veth" in kinds and subprocess.run(["ip", "link", "show", srv.veth_root], capture_output=True).returncode == 0:
        subprocess.run(["ip", "link", "del", srv.veth_root], capture_output=True)
        removed.append(f"veth {srv.veth_root}")
    if "privsep-dir" in kinds:
        try:
            PRIVSEP_DIR.rmdir()
            removed.append(str(PRIVSEP_DIR))
        except OSError:
            pass
    if "dir" in kinds:
        shutil.rmtree(srv.dir, ignore_errors=True)
        removed.append(str(srv.dir))
    else:  # the directory was the caller's: remove only our files
        for f in ("host_ed25519", "host_ed25519.pub", "id_ed25519", "id_ed25519.pub", "authorized_keys",
                  "known_hosts", "sshd_config", "ssh_config", "sshd.pid", "sshd.log", "server.json", "server.tmp"):
            (srv.dir / f).unlink(missing_ok=True)
    log("removed: " + (", ".join(removed) or "nothing left"))
    return removed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m emulator.net.localserver", description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("up", "down"))
    parser.add_argument("--dir", required=True, help="where keys, configs and the record live")
    parser.add_argument("--name", default=DEFAULT_NAME, help="namespace and ssh Host name (default %(default)s)")
    parser.add_argument("--subnet", default=DEFAULT_SUBNET, help="first three octets of the /30 (default %(default)s)")
    parser.add_argument("--private", action="append", default=[], metavar="PATH",
                        help="up: the server sees an empty view of its own of PATH (repeatable; not the project, "
                             "its venv or --dir)")
    args = parser.parse_args(argv)
    log = lambda m: print(f"[localserver] {m}", file=sys.stderr, flush=True)  # noqa: E731
    try:
        srv = LocalServer(name=args.name, dir=Path(args.dir).resolve(), subnet=args.subnet,
                          private=tuple(args.private) if args.action == "up" else ())
        if args.action == "up":
            up(srv, log=log)
            print(srv.ssh_config)
        else:
            down(srv, log=log)
    except EmulatorError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    sys.exit(main())
