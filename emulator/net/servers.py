"""The servers of a multi-host emulation: ``--servers``, which cluster runs where, SSH, clocks.

``--servers HOST[,HOST...]`` names the machines an emulation spans; the first is
this machine (its name is only a label: it is never reached over SSH), every
other one is an SSH destination (``host``, ``user@host`` or a ``Host`` alias of
the SSH configuration). Each cluster -- its hosts, bridge and gateway router --
lives on one server (:func:`assign_clusters`):

- a cluster with ``server: NAME`` in the topology file runs on that server
  (NAME must be one of ``--servers``);
- the others are laid out in topology order in contiguous blocks, filling
  server 1, then server 2, ..., each up to ``ceil(total ranks / servers)``
  ranks counting the clusters pinned there; a block ends early when what is
  left must still cover the servers after it. Contiguous blocks keep
  neighbours of the topology file together, so fewer WAN links cross servers.

A WAN link between clusters on two servers is carried by an SSH Ethernet
tunnel (Mininet's ``RemoteLink``) or, with ``--tunnel vxlan``, a kernel VXLAN
device (:mod:`emulator.net.multihost`).

Commands reach a server by ``ssh -T -o BatchMode=yes -o ConnectTimeout=...``
(``-F`` an SSH config and ``-i`` a key when given), as root, in the same
project path and venv as here. :func:`measure_offset` measures a server's
monotonic and wall clocks against ours, NTP-style (Mills, RFC 5905: offset
``((t1 - t0) + (t2 - t3)) / 2``, the sample with the smallest round trip).
"""

from __future__ import annotations

import math
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spiderflow.errors import ConfigError, EmulatorError
from spiderflow.topology import Topology, parse_topology
from spiderflow.topology.load import read_topology_data

REPO = Path(__file__).resolve().parents[2]
# An SSH destination: [user@]host or an alias; no spaces, quotes or shell characters, no leading '-'.
SERVER_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.@:\[\]%-]{0,127}$")
MAX_SERVERS = 64
TUNNELS = ("ssh", "vxlan")
LOCAL_NAMES = ("localhost", "127.0.0.1", "::1")  # Mininet's cluster mode never reaches these over SSH
CONNECT_TIMEOUT_S = 5
CLOCK_SAMPLES = 16
SERVERS_HELP = ("run the clusters on these machines, the first being this one (e.g. "
                "--servers localhost,gpu2); others are reached as root over SSH and need this "
                "project at the same path (docs/multihost.md)")


@dataclass(frozen=True, kw_only=True)
class Ssh:
    """How to reach the other servers: an SSH config file and/or key, and the connect timeout."""

    config: str | None = None
    key: str | None = None
    connect_timeout_s: int = CONNECT_TIMEOUT_S
    control_dir: str | None = None  # with a master per server (:meth:`master_argv`): one TCP connection each

    def control_path(self, dest: str) -> str | None:
        return None if self.control_dir is None else os.path.join(self.control_dir, f"cm-{_label(dest)}")

    def master_argv(self, dest: str) -> list[str]:
        """``ssh -M -N``: the connection that later ssh calls to ``dest`` share (ends when killed)."""
        return self.argv(dest, mux=False, options=("-M", "-N", "-o", f"ControlPath={self.control_path(dest)}"))

    def argv(self, dest: str, *, tty: bool = False, options: tuple[str, ...] = (), mux: bool = True) -> list[str]:
        """``ssh ... dest`` (the remote command follows, as one pre-quoted string); ``mux``: over the
        server's master connection when there is one (else a connection of its own)."""
        out = ["ssh", "-tt" if tty else "-T", "-o", "BatchMode=yes",
               "-o", f"ConnectTimeout={self.connect_timeout_s}",
               "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3", "-o", "LogLevel=ERROR"]
        if self.config:
            out += ["-F", self.config]
        if self.key:
            out += ["-i", self.key, "-o", "IdentitiesOnly=yes"]
        out += list(options)  # before ours: ssh keeps the first value of an option
        if mux and self.control_dir is not None:
            out += ["-o", f"ControlPath={self.control_path(dest)}", "-o", "ControlMaster=no"]
        elif not any(o.startswith("ControlPath=") for o in options):
            out += ["-o", "ControlPath=none"]
        return out + [dest]


def _label(server: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", server)


def remote_command(argv: list[str], *, env: dict[str, str] | None = None, cwd: str | None = None) -> str:
    """``argv`` as the one string ssh hands to the remote shell, quoted: ``env [--chdir=D] K=V... argv``."""
    if not argv:
        raise ValueError("remote_command: empty argv")
    head = ["env"] + ([f"--chdir={cwd}"] if cwd else []) + [f"{k}={v}" for k, v in (env or {}).items()]
    return shlex.join(head + list(argv) if (env or cwd) else list(argv))


def parse_servers(text: str | None) -> tuple[str, ...]:
    """``--servers`` -> names, first = this machine. One line naming the flag and the fix if bad."""
    if text is None:
        return ()
    fix = "give HOST[,HOST...], this machine first (e.g. --servers localhost,gpu2)"
    names = [part.strip() for part in str(text).split(",")]
    if not text.strip() or any(not n for n in names):
        raise ConfigError(f"--servers: empty server name in {text!r}; {fix}")
    for n in names:
        if not SERVER_NAME.match(n):
            raise ConfigError(f"--servers: {n!r} is not a host name or SSH destination "
                              f"(letters, digits and ._@:-% only, no leading '-'); {fix}")
    for n in names[1:]:
        if n.rsplit("@", 1)[-1] in LOCAL_NAMES:
            raise ConfigError(f"--servers: {n!r} names this machine, which only the first may; {fix}")
    seen = set()
    for n in names:
        if n in seen:
            raise ConfigError(f"--servers: {n!r} is named twice; {fix}")
        seen.add(n)
    if len(names) > MAX_SERVERS:
        raise ConfigError(f"--servers: {len(names)} servers, at most {MAX_SERVERS}; {fix}")
    return tuple(names)


def load_topology_with_servers(path: str | Path, *, routing: str | None = None) -> tuple[Topology, dict[str, str]]:
    """The topology of ``path`` and its clusters' optional ``server:`` keys (cluster -> server).

    The planner's schema has no ``server`` key (where a cluster is emulated is no concern of the
    planner), so it is taken out of each cluster here and the rest parsed by the planner's own
    loader, with its checks and messages."""
    data, source = read_topology_data(path)
    pins: dict[str, str] = {}
    if isinstance(data, dict) and isinstance(data.get("clusters"), list):
        clusters = []
        for i, raw in enumerate(data["clusters"]):
            if isinstance(raw, dict) and "server" in raw:
                raw = dict(raw)
                server = raw.pop("server")
                if not isinstance(server, str) or not SERVER_NAME.match(server):
                    raise ConfigError(f"{source}: clusters[{i}].server must be a host name as in "
                                      f"--servers (got {server!r}); fix the value or remove the key")
                pins[str(raw.get("name"))] = server
            clusters.append(raw)
        data = dict(data, clusters=clusters)
    return parse_topology(data, source=source, routing=routing), pins


def assign_clusters(names: tuple[str, ...] | list[str], servers: tuple[str, ...], *,
                    pins: dict[str, str] | None = None, weights: dict[str, int] | None = None,
                    source: str = "topology") -> dict[str, str]:
    """Cluster -> server by the rule of the module docstring (deterministic; pure)."""
    if not servers:
        raise ValueError("assign_clusters: no servers")
    pins = dict(pins or {})
    for i, name in enumerate(names):
        if name in pins and pins[name] not in servers:
            raise ConfigError(f"{source}: clusters[{i}].server {pins[name]!r} is not one of --servers "
                              f"({', '.join(servers)}); add it to --servers or remove the key")
    w = {n: int((weights or {}).get(n, 1)) for n in names}
    if any(v < 0 for v in w.values()):
        raise ValueError(f"assign_clusters: negative weight in {w}")
    target = math.ceil(sum(w.values()) / len(servers))
    load = {s: sum(w[n] for n in names if pins.get(n) == s) for s in servers}
    out: dict[str, str] = {n: pins[n] for n in names if n in pins}
    free = [n for n in names if n not in pins]
    s = 0
    for k, name in enumerate(free):
        # move on when this server is full, or when the clusters left (this one included) are just
        # enough to give every later server one
        while s < len(servers) - 1 and load[servers[s]] > 0 and (
                load[servers[s]] + w[name] > target or len(free) - k <= len(servers) - 1 - s):
            s += 1
        out[name] = servers[s]
        load[servers[s]] += w[name]
    return {n: out[n] for n in names}


# ---------------------------------------------------------------------------------------------- ssh
def run_ssh(ssh: Ssh, dest: str, argv: list[str], *, env: dict[str, str] | None = None,
            cwd: str | None = None, input: str | None = None, timeout_s: float = 60.0,
            check: bool = True) -> subprocess.CompletedProcess:
    """Run ``argv`` on server ``dest`` (root namespace) and return its output (text)."""
    cmd = ssh.argv(dest) + [remote_command(argv, env=env, cwd=cwd)]
    try:
        done = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout_s,
                              stdin=None if input is not None else subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise EmulatorError(f"{dest}: `{shlex.join(argv)}` over ssh did not finish in {timeout_s:g} s") from None
    if done.returncode == 255:
        why = (done.stderr.strip().splitlines() or ["no error output"])[-1]
        raise EmulatorError(f"{dest}: ssh failed ({why}); check that `ssh root@{dest}` works without a "
                            "password (BatchMode), or pass --ssh-config / --ssh-key (docs/multihost.md)")
    if check and done.returncode != 0:
        why = ((done.stderr or done.stdout).strip().splitlines() or ["no error output"])[-1]
        raise EmulatorError(f"{dest}: `{shlex.join(argv)}` failed with exit {done.returncode}: {why}")
    return done


def server_address(ssh: Ssh, dest: str) -> str:
    """The IPv4 address ssh connects to for ``dest`` (``ssh -G``, then the resolver)."""
    cmd = ["ssh", "-G"] + (["-F", ssh.config] if ssh.config else []) + [dest]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
    host = dest.rsplit("@", 1)[-1]
    for line in done.stdout.splitlines():
        if line.startswith("hostname "):
            host = line.split(None, 1)[1].strip()
    if re.fullmatch(r"\d+\.\d+\.\d+\.\d+", host):
        return host
    got = subprocess.run(["getent", "ahostsv4", host], capture_output=True, text=True, timeout=10)
    ips = re.findall(r"^(\d+\.\d+\.\d+\.\d+)", got.stdout, flags=re.M)
    if not ips:
        raise EmulatorError(f"--servers: cannot resolve {dest!r} (host {host!r}) to an IPv4 address; "
                            "use an address or an SSH Host alias with HostName")
    return ips[0]


# ------------------------------------------------------------------------------------------- clocks
@dataclass(frozen=True, kw_only=True)
class ClockOffset:
    """A server's clocks minus ours: ``remote = local + offset``, within +- ``error_ns``."""

    monotonic_ns: int
    realtime_ns: int
    rtt_ns: int
    samples: int

    @property
    def error_ns(self) -> int:
        return self.rtt_ns // 2

    def as_json(self) -> dict:
        return {"monotonic_offset_ms": self.monotonic_ns / 1e6, "realtime_offset_ms": self.realtime_ns / 1e6,
                "error_ms": self.error_ns / 1e6, "rtt_ms": self.rtt_ns / 1e6, "samples": self.samples}


@dataclass(frozen=True)
class ClockSample:
    """One exchange: we send at ``t0``, the server reads its clocks at ``t1`` (mono) / ``r1``
    (wall), we read ours at ``t3`` (mono); ``r0``/``r3``: our wall clock at t0/t3."""

    t0: int
    t1: int
    t3: int
    r0: int = 0
    r1: int = 0
    r3: int = 0

    @property
    def rtt_ns(self) -> int:
        return self.t3 - self.t0


def offset_from_samples(samples: list[ClockSample]) -> ClockOffset:
    """NTP's rule with one server timestamp (t1 = t2): the sample of least round trip, offset
    ``t1 - (t0 + t3) / 2`` (error at most half that round trip)."""
    good = [s for s in samples if s.t3 >= s.t0]
    if not good:
        raise EmulatorError("clock offset: no usable sample (the local clock went backwards?)")
    best = min(good, key=lambda s: (s.rtt_ns, s.t0))
    return ClockOffset(monotonic_ns=best.t1 - (best.t0 + best.t3) // 2,
                       realtime_ns=best.r1 - (best.r0 + best.r3) // 2,
                       rtt_ns=best.rtt_ns, samples=len(samples))


def to_local_ns(remote_ns: int, offset_ns: int) -> int:
    """A server's clock reading on our clock."""
    return remote_ns - offset_ns


def one_way_ms(sent_local_ns: int, arrived_remote_ns: int, offset_ns: int) -> float:
    """One-way delay of a packet sent here and stamped on arrival by a server's clock."""
    return (to_local_ns(arrived_remote_ns, offset_ns) - sent_local_ns) / 1e6


def measure_offset(ssh: Ssh, dest: str, *, samples: int = CLOCK_SAMPLES, timeout_s: float = 30.0) -> ClockOffset:
    """Exchange ``samples`` stamps with ``python -m emulator.net.servers clock-echo`` on ``dest``."""
    cmd = ssh.argv(dest) + [remote_command([sys.executable, "-u", "-m", "emulator.net.servers", "clock-echo"],
                                           cwd=str(REPO))]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    got: list[ClockSample] = []
    try:
        line = _readline(proc, timeout_s)
        if line.strip() != "ready":
            err = (proc.stderr.read() if proc.poll() is not None else "") or line
            raise EmulatorError(f"{dest}: clock echo did not start over ssh: "
                                f"{(err.strip().splitlines() or ['no output'])[-1]}")
        for _ in range(samples):
            r0, t0 = time.time_ns(), time.monotonic_ns()
            proc.stdin.write("t\n")
            proc.stdin.flush()
            reply = _readline(proc, timeout_s)
            t3, r3 = time.monotonic_ns(), time.time_ns()
            t1, r1 = (int(x) for x in reply.split())
            got.append(ClockSample(t0=t0, t1=t1, t3=t3, r0=r0, r1=r1, r3=r3))
            time.sleep(0.002)
    finally:
        if proc.stdin:
            proc.stdin.close()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return offset_from_samples(got)


def _readline(proc: subprocess.Popen, timeout_s: float) -> str:
    import select

    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    if not ready:
        raise EmulatorError(f"clock echo: no answer in {timeout_s:g} s")
    return proc.stdout.readline()


def clock_echo() -> int:
    """Server side of :func:`measure_offset`: one line in, ``MONOTONIC_NS REALTIME_NS`` out."""
    print("ready", flush=True)
    for _line in sys.stdin:
        sys.stdout.write(f"{time.monotonic_ns()} {time.time_ns()}\n")
        sys.stdout.flush()
    return 0


@dataclass
class ServerSet:
    """The servers of one emulation and how to reach them (not frozen: offsets are filled in)."""

    names: tuple[str, ...]
    ssh: Ssh = field(default_factory=Ssh)
    tunnel: str = "ssh"  # what carries a WAN link between two servers: ssh | vxlan
    offsets: dict[str, ClockOffset] = field(default_factory=dict)

    @property
    def first(self) -> str:
        return self.names[0]

    @property
    def remote(self) -> tuple[str, ...]:
        return self.names[1:]


def server_set(args: Any) -> ServerSet | None:
    """The ``--servers``/``--ssh-config``/``--ssh-key`` options as a ServerSet (None: one machine)."""
    names = parse_servers(getattr(args, "servers", None))
    if not names:
        return None
    for flag, value in (("--ssh-config", getattr(args, "ssh_config", None)),
                        ("--ssh-key", getattr(args, "ssh_key", None))):
        if value is not None and not os.path.isfile(value):
            raise ConfigError(f"{flag}: no such file {value!r}; give an existing file or leave the flag out")
    return ServerSet(names=names, ssh=Ssh(config=getattr(args, "ssh_config", None), key=getattr(args, "ssh_key", None)),
                     tunnel=getattr(args, "tunnel", None) or "ssh")


def add_server_arguments(parser) -> None:
    parser.add_argument("--servers", metavar="HOST[,HOST...]", help=SERVERS_HELP)
    parser.add_argument("--ssh-config", metavar="FILE", help="ssh -F FILE to reach the other --servers")
    parser.add_argument("--ssh-key", metavar="FILE", help="ssh -i FILE to reach the other --servers")
    parser.add_argument("--tunnel", choices=TUNNELS, default="ssh",
                        help="what carries a WAN link between two servers: ssh (Mininet's RemoteLink, encrypted, "
                             "a process per link) or vxlan (kernel VXLAN, UDP 4789 between the servers; "
                             "docs/multihost.md) (default %(default)s)")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["clock-echo"]:
        return clock_echo()
    print("usage: python -m emulator.net.servers clock-echo", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
