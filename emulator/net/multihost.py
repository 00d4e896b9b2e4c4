"""``ClusterEmulation``: one emulated network over several servers, with Mininet's cluster mode.

    servers = ServerSet(names=("localhost", "gpu2"), ssh=Ssh(config="ssh_config"))
    assignment = assign_clusters(topo.names, servers.names)      # emulator.net.servers
    with ClusterEmulation(topo, NetConfig(), servers=servers, assignment=assignment) as emu:
        ...                                                      # the Emulation API

Each cluster's hosts, bridge and gateway router live on its server (``assignment``). Nodes on
another server are Mininet's ``RemoteHost`` (:class:`emulator.net.remote.ServerHost`: a shell
started over SSH in a new namespace there); links between two nodes of one server are veth pairs
made there; a WAN link between routers on two servers is Mininet's ``RemoteLink`` SSH tunnel (``ssh -w N:N`` with
``Tunnel=ethernet``: a tap device on each side, moved into its router's namespace and renamed to
the link's ``w-<peer>``) or, with ``ServerSet.tunnel == "vxlan"``, a kernel VXLAN device on each
side, made and moved the way Mininet's ``RemoteGRELink`` makes gretap devices (this kernel has no
GRE). The device is then configured exactly as a local WAN veth is: the same
:func:`emulator.net.linkcmds.plan_commands` (htb at the wire rate, the bfifo buffer, and the netem
leaf or the NFQUEUE rule and the gateway's delay daemon), so a tunnelled link is shaped like a
local one; only its unshaped base delay and ceiling differ (``emulator check`` reports them).

Why not ``MininetCluster`` itself: its pre-check and ``RemoteMixin``'s commands go through ``sudo``
(we are root on every server, and sudo may be absent), its placers place single nodes, not a
cluster's hosts with their router, and it creates ``~/.ssh/mn``. Like cluster.py's own
``testNsTunnels``, we use plain ``Mininet`` with the cluster-mode node and link classes.

Per other server, at build: one SSH master connection (every later command shares it), a preflight
(the project at the same path, its venv, the tools), the agent (:mod:`emulator.net.agent`: the
server's lock and state file, and its teardown when our connection closes, also after a crash of
this machine), and the clock offset (:func:`emulator.net.servers.measure_offset`), which the delay
probes use to put both ends' stamps on one clock. Teardown: local processes (tunnels, the SSH
clients of remote processes), every node's shell, then each agent (it ends every process marked
``<run id>@<server>`` there and confirms), then the master connections.

Live link changes (``--wan-events``, ``check --step``) on remote routers: :mod:`emulator.net.liveremote`
(the step test's flow runs towards this machine's end of the link, whose bytes it reads here).
Not yet: a WAN link between two servers neither of which is the first (the tunnel is made from
here), delay daemon statistics from remote routers.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import select
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mininet.net import Mininet

from emulator.net import linkcmds as cmd
from emulator.net.agent import label_of, remote_state_dir
from emulator.net.capability import choose_mechanism, kernel_has_netem
from emulator.net.emulation import EmuHost, Emulation, _die_with, _readline_until
from emulator.net.layout import NetConfig
from emulator.net.measure import _wait_listening
from emulator.net.remote import ClusterLink, RemotePopen, ServerHost
from emulator.net.servers import REPO, ServerSet, measure_offset, remote_command, run_ssh, server_address
from emulator.net.state import MARKER_ENV, RUN_DIR_PREFIX, STATE_DIR_ENV, ProcRecord, end_processes, proc_starttime
from spiderflow.errors import EmulatorError
from spiderflow.topology import Topology

AGENT_TIMEOUT_S = 30.0
TUNNEL_TIMEOUT_S = 20.0
FIRST_TAP = 9  # Mininet's RemoteLink uses tap9; we take the first index free on both sides from there
TOOLS = ("mnexec", "ip", "tc", "iptables", "sysctl", "iperf3", "ss")
VXLAN_PORT = 4789  # IANA's VXLAN port (RFC 7348)
VXLAN_VNI_BASE = 0x5F0000  # one VNI per tunnelled link from here


def check_assignment(topo: Topology, assignment: dict[str, str], first: str) -> None:
    """Refuse what this version cannot build: a WAN link between two servers other than the first."""
    for link in topo.links:
        sa, sb = assignment[link.a], assignment[link.b]
        if sa != sb and first not in (sa, sb):
            raise EmulatorError(f"{topo.source}: link {link.a}-{link.b} joins servers {sa} and {sb}; a tunnel "
                                f"must have the first server ({first}) at one end in this version: put "
                                f"{link.a} or {link.b} on {first} (`server:` in the topology) or use fewer servers")


def crossing_links(topo: Topology, assignment: dict[str, str]) -> list[tuple[str, str]]:
    return [(link.a, link.b) for link in topo.links if assignment[link.a] != assignment[link.b]]


class ClusterEmulation(Emulation):
    def __init__(self, topology: Topology, config: NetConfig | None = None, *, servers: ServerSet,
                 assignment: dict[str, str], **kwargs) -> None:
        super().__init__(topology, config, **kwargs)
        if len(servers.names) < 2:
            raise ValueError("ClusterEmulation needs two servers or more; use Emulation for one")
        check_assignment(topology, assignment, servers.first)
        self.servers = servers
        self.assignment = dict(assignment)
        self._server_of = {}
        for c in self.plan.clusters:
            for name in [c.router.name] + [h.name for h in c.hosts]:
                self._server_of[name] = self.assignment[c.name]
        self._agents: dict[str, subprocess.Popen] = {}
        self._masters: dict[str, subprocess.Popen] = {}
        self._remote_dirs: dict[str, str] = {}
        self._addresses: dict[str, str] = {}
        self._remote_links: dict[str, set[str]] = {}
        self.tunnels: list[dict] = []
        self._seq = 0

    # ------------------------------------------------------------------ where things are
    def server_of(self, node: str) -> str:
        return self._server_of.get(node, self.servers.first)

    def is_remote(self, node: str) -> bool:
        return self.server_of(node) != self.servers.first

    def marker(self, server: str) -> str:
        return f"{self.run_id}@{label_of(server)}"

    def remote_dir(self, server: str) -> str:
        """The scratch directory of this emulation on another ``server`` (its agent removes it)."""
        return self._remote_dirs[server]

    def local_dir(self) -> Path:
        """The scratch directory of this emulation here (removed at teardown)."""
        return self._run_dir

    def clock_offset_ms(self, src: str, dst: str) -> float:
        """``dst``'s server's monotonic clock minus ``src``'s, in ms (0 on one server)."""
        def off(node):
            o = self.servers.offsets.get(self.server_of(node))
            return 0.0 if o is None else o.monotonic_ns / 1e6
        return off(dst) - off(src)

    # ------------------------------------------------------------------ Emulation API, remote-aware
    def popen(self, host: str, argv: list[str], *, env: dict[str, str] | None = None,
              role: str = "worker", **popen_kwargs) -> subprocess.Popen:
        if not self.is_remote(host):
            return super().popen(host, argv, env=env, role=role, **popen_kwargs)
        node, server = self.node(host), self.server_of(host)
        extra = {} if env is None else {k: v for k, v in env.items() if os.environ.get(k) != v}
        extra[MARKER_ENV] = self.marker(server)
        cwd = popen_kwargs.pop("cwd", None)
        popen_kwargs.setdefault("stdin", subprocess.DEVNULL)
        self._seq += 1
        pidfile = f"{self._remote_dirs[server]}/pid-{self._seq}"
        # sshd starts the command in a session of its own: `exec` keeps that pid (and process group)
        # down to argv, so signals reach it through the pid file (RemotePopen.send_signal)
        inner = remote_command(["mnexec", "-a", str(node.pid), *argv], env=extra, cwd=cwd and str(cwd))
        remote = shlex.join(["sh", "-c", 'echo $$ > "$0"; exec "$@"', pidfile, *shlex.split(inner)])
        proc = RemotePopen(self.servers.ssh.argv(server) + [remote], env=self.env, preexec_fn=_die_with(os.getpid()),
                           start_new_session=True, **popen_kwargs)
        proc.remote = (self.servers.ssh, server, pidfile)
        self.register(proc, role=f"{role}@{host}")
        return proc

    def run(self, host: str, argv: list[str], *, check: bool = True,
            timeout_s: float | None = None) -> subprocess.CompletedProcess:
        if not self.is_remote(host):
            return super().run(host, argv, check=check, timeout_s=timeout_s)
        if self.executor.trace:
            self.executor.trace(f"{host}@{self.server_of(host)}: {shlex.join(argv)}")
        return run_ssh(self.servers.ssh, self.server_of(host), ["mnexec", "-a", str(self.node(host).pid), *argv],
                       check=check, timeout_s=timeout_s or 30.0)

    def wait_listening(self, host: str, proc: subprocess.Popen, port: int, timeout_s: float, what: str) -> None:
        """Until ``host`` listens on TCP ``port`` (a remote host: asked with ``ss`` over SSH)."""
        if not self.is_remote(host):
            return _wait_listening(proc, port, timeout_s, what)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and proc.poll() is None:
            done = self.run(host, ["ss", "-Hltn", f"sport = :{port}"], check=False)
            if done.returncode == 0 and done.stdout.strip():
                return
            time.sleep(0.05)
        raise EmulatorError(f"{what} did not start (exit {proc.poll()})")

    def delay_stats(self) -> dict[str, list[dict]]:
        local = {c.router.name for c in self.plan.clusters if not self.is_remote(c.router.name)}
        return {k: v for k, v in super().delay_stats().items() if k in local}

    # ------------------------------------------------------------------ build
    def _build(self) -> None:
        t0 = time.monotonic()
        ssh = self.servers.ssh
        self._state = {"run_id": self.run_id, "owner_pid": os.getpid(), "topology": self.plan.topology,
                       "source": self.plan.source, "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
                       "scale": self.scale, "dilation": self.config.dilation, "mechanism": None, "files": [],
                       "processes": [], "servers": list(self.servers.names), "assignment": self.assignment,
                       "ssh": {"config": ssh.config, "key": ssh.key}, "root_links": [],
                       "remote_state": {s: str(remote_state_dir(s, self._store.dir if os.environ.get(STATE_DIR_ENV)
                                                                else None)) for s in self.servers.remote}}
        self._store.write(self._state)
        self._run_dir = Path(tempfile.mkdtemp(prefix=f"{RUN_DIR_PREFIX}{self.run_id}-"))
        self._state["files"] = [str(self._run_dir)]
        self._store.write(self._state)
        self.servers.ssh = dataclasses.replace(ssh, control_dir=str(self._run_dir))
        for server in self.servers.remote:
            self._connect(server)
        netem = kernel_has_netem(self.executor) and all(self._remote_netem(s) for s in self.servers.remote)
        self.mechanism = choose_mechanism(self.config.delay, netem)
        self._state.update(mechanism=self.mechanism, made=self._inventory())
        self._store.write(self._state)
        for warning in self._rate_warnings():
            self.log(warning)
        Mininet.inited = True  # skip Mininet.init()'s fixLimits(): it rewrites machine-wide sysctls
        link_cls = type("EmuClusterLink", (ClusterLink,), {"emu": self})
        self._net = Mininet(topo=None, build=False, controller=None, link=link_cls)
        host_cls = functools.partial(EmuHost, emu_env=self.env)
        batches: dict[str, list] = {s: [] for s in self.servers.remote}
        for c in self.plan.clusters:
            server = self.assignment[c.name]
            sysctls = {True: cmd.sysctl_command(cmd.namespace_sysctls(c.tcp_max_bytes, router=True)),
                       False: cmd.sysctl_command(cmd.namespace_sysctls(c.tcp_max_bytes, router=False))}
            for name, router in [(c.router.name, True)] + [(h.name, False) for h in c.hosts]:
                if server == self.servers.first:
                    node = self._net.addHost(name, cls=host_cls, ip=None)
                    self._nodes[name] = node
                    self._record(ProcRecord(pid=node.pid, starttime=proc_starttime(node.pid) or 0, role="shell"))
                    self.executor.run(name, node.pid, sysctls[router])
                    continue
                node = self._net.addHost(name, cls=ServerHost, ip=None, dest=server, ssh=self.servers.ssh,
                                         marker=self.marker(server), serverIP=self._addresses[server])
                self._nodes[name] = node
                self._agent_say(server, {"shell": node.pid})
                self._record(ProcRecord(pid=node.shell.pid, starttime=proc_starttime(node.shell.pid) or 0,
                                        role=f"ssh-shell@{name}"))
                batches[server].append((name, node.pid, sysctls[router]))
        for server, batch in batches.items():  # before any interface exists: none gets an IPv6 address
            self._remote_exec(server, batch)
        self.log(f"{len(self._nodes)} nodes started on {len(self.servers.names)} servers "
                 f"({time.monotonic() - t0:.1f} s)")
        self._add_links()
        self._cluster_resolver()
        netem = self.mechanism == "netem"
        batches = {s: [] for s in self.servers.remote}
        for name, commands in cmd.plan_commands(self.plan, netem=netem).items():
            if self.is_remote(name):
                batches[self.server_of(name)] += [(name, self._nodes[name].pid, argv) for argv in commands]
            else:
                self.executor.run_all(name, self._nodes[name].pid, commands)
        for server, batch in batches.items():
            self._remote_exec(server, batch)
        self.log(f"links shaped, routes set ({self.executor.count} commands, {time.monotonic() - t0:.1f} s)")
        if not netem:
            self._start_delay_daemons()
        self.build_s = time.monotonic() - t0
        self.up_at = time.monotonic()
        crossing = crossing_links(self.topology, self.assignment)
        self.log(f"network up: {len(self.plan.clusters)} clusters x {self.config.hosts_per_cluster} hosts on "
                 f"{len(self.servers.names)} servers ({self.describe_assignment()}), {len(self.plan.links)} WAN "
                 f"links ({len(crossing)} through {self.servers.tunnel} tunnels), delay by {self.mechanism}, "
                 f"scale {self.scale:g}, dilation {self.config.dilation:g} ({self.build_s:.1f} s)")

    def describe_assignment(self) -> str:
        return "; ".join(f"{s}: {', '.join(c for c, srv in self.assignment.items() if srv == s) or '-'}"
                         for s in self.servers.names)

    def _connect(self, server: str) -> None:
        """Master connection, preflight, agent and clock offset of one other server."""
        ssh = self.servers.ssh
        self._addresses[server] = server_address(ssh, server)
        master = subprocess.Popen(ssh.master_argv(server), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, env=self.env, preexec_fn=_die_with(os.getpid()),
                                  start_new_session=True)
        self._masters[server] = master
        self._record(ProcRecord(pid=master.pid, starttime=proc_starttime(master.pid) or 0, role=f"ssh-master@{server}"))
        deadline = time.monotonic() + ssh.connect_timeout_s + 10
        while not os.path.exists(ssh.control_path(server)):
            if master.poll() is not None or time.monotonic() > deadline:
                why = (master.stderr.read().decode(errors="replace").strip().splitlines() or ["no error output"])[-1] \
                    if master.poll() is not None else "timed out"
                raise EmulatorError(f"{server}: ssh failed ({why}); check that `ssh root@{server}` works without a "
                                    "password (BatchMode), or pass --ssh-config / --ssh-key (docs/multihost.md)")
            time.sleep(0.05)
        need = " && ".join([f"test -x {shlex.quote(sys.executable)}",
                            f"test -f {shlex.quote(str(REPO / 'emulator/net/agent.py'))}"]
                           + [f"command -v {t} >/dev/null" for t in TOOLS] + ["test \"$(id -u)\" = 0"])
        if run_ssh(ssh, server, ["sh", "-c", need], check=False).returncode != 0:
            raise EmulatorError(f"{server}: needs root, this project at {REPO} with its venv ({sys.executable}) "
                                f"and {', '.join(TOOLS)} (run scripts/setup.sh there; docs/multihost.md)")
        log_file = open(self._run_dir / f"agent-{label_of(server)}.log", "wb")
        argv = [sys.executable, "-u", "-m", "emulator.net.agent", "hold", "--label", server, "--run-id", self.run_id]
        if os.environ.get(STATE_DIR_ENV):  # a private state directory (tests) is used on every server
            argv += ["--state-dir", os.environ[STATE_DIR_ENV]]
        agent = subprocess.Popen(ssh.argv(server) + [remote_command(argv, cwd=str(REPO))], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=log_file, env=self.env,
                                 preexec_fn=_die_with(os.getpid()), start_new_session=True)
        log_file.close()
        self._agents[server] = agent
        self._record(ProcRecord(pid=agent.pid, starttime=proc_starttime(agent.pid) or 0, role=f"agent@{server}"))
        line = _readline_until(agent, time.monotonic() + AGENT_TIMEOUT_S).decode(errors="replace").strip()
        if not line.startswith("ready "):
            raise EmulatorError(f"{server}: the emulation's agent did not start: "
                                f"{line or self._agent_log_tail(server)}")
        self._remote_dirs[server] = line.split(" ", 1)[1]
        offset = measure_offset(ssh, server)
        self.servers.offsets[server] = offset
        self._state.setdefault("clock_offsets", {})[server] = offset.as_json()
        self._store.write(self._state)
        self.log(f"{server} ({self._addresses[server]}): agent ready; clock offset monotonic "
                 f"{offset.monotonic_ns / 1e6:+.3f} ms, wall {offset.realtime_ns / 1e6:+.3f} ms "
                 f"(+-{offset.error_ns / 1e6:.3f} ms)")

    def _agent_log_tail(self, server: str) -> str:
        try:
            lines = (self._run_dir / f"agent-{label_of(server)}.log").read_text(errors="replace").strip().splitlines()
        except OSError:
            return "no log"
        return lines[-1] if lines else "no output"

    def _agent_say(self, server: str, message: dict) -> None:
        agent = self._agents[server]
        try:
            agent.stdin.write((json.dumps(message) + "\n").encode())
            agent.stdin.flush()
        except OSError:
            raise EmulatorError(f"{server}: the emulation's agent is gone: {self._agent_log_tail(server)}") from None
        line = _readline_until(agent, time.monotonic() + AGENT_TIMEOUT_S).strip()
        if line != b"ok":
            raise EmulatorError(f"{server}: the emulation's agent did not answer: {self._agent_log_tail(server)}")

    def _remote_netem(self, server: str) -> bool:
        code = "from emulator.net.capability import kernel_has_netem; print(kernel_has_netem())"
        done = run_ssh(self.servers.ssh, server, [sys.executable, "-c", code], cwd=str(REPO))
        return done.stdout.strip() == "True"

    def _remote_exec(self, server: str, batch: list) -> None:
        """Run ``[(label, pid, argv)]`` on ``server`` in order, in one SSH call; raise on the first failure."""
        if not batch:
            return
        if self.executor.trace:
            for label, _pid, argv in batch:
                self.executor.trace(f"{label}@{server}: {shlex.join(argv)}")
        self.executor.count += len(batch)
        done = run_ssh(self.servers.ssh, server, [sys.executable, "-m", "emulator.net.agent", "exec"],
                       input=json.dumps([[label, pid, argv] for label, pid, argv in batch]), cwd=str(REPO),
                       check=False, timeout_s=120.0)
        try:
            rep = json.loads(done.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            why = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise EmulatorError(f"{server}: configuration commands failed ({why})") from None
        if "failed" in rep:
            label, _pid, argv = batch[rep["failed"]]
            raise EmulatorError(f"{label}@{server}: `{shlex.join(argv)}` failed with exit {rep['rc']}: {rep['why']}")

    def _root_links(self, server: str | None) -> set[str]:
        if server is None:
            out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
        else:
            out = run_ssh(self.servers.ssh, server, ["ip", "-o", "link", "show"]).stdout
        return set(re.findall(r"^\d+: ([^:@\s]+)", out, flags=re.M))

    def make_tunnel(self, node1, node2, name1: str, name2: str, mac1: str | None, mac2: str | None):
        """A tunnel from local ``node1``'s ``name1`` to remote ``node2``'s ``name2``: SSH (Mininet's
        ``RemoteLink``) or, with ``--tunnel vxlan``, a kernel VXLAN device on each side (as Mininet's
        ``RemoteGRELink`` does with gretap, which this kernel lacks)."""
        if self.servers.tunnel == "vxlan":
            return self._make_vxlan(node1, node2, name1, name2, mac1, mac2)
        return self._make_ssh_tunnel(node1, node2, name1, name2, mac1, mac2)

    def _free_root_name(self, server: str, prefix: str, first: int) -> str:
        """A device name free in this root namespace and ``server``'s, recorded (here and by its agent)
        before the device is made."""
        taken = self._root_links(None) | self._remote_links.setdefault(server, self._root_links(server))
        n = first
        while f"{prefix}{n}" in taken:
            n += 1
        name = f"{prefix}{n}"
        self._remote_links[server].add(name)
        self._state["root_links"].append(name)
        self._store.write(self._state)
        self._agent_say(server, {"root_link": name})
        return name

    def _make_vxlan(self, node1, node2, name1: str, name2: str, mac1: str | None, mac2: str | None) -> int:
        """Kernel VXLAN (RFC 7348) between the two servers' addresses, one VNI per link: no process
        carries it, and its underlay socket stays in each server's root namespace once the device
        moves into its router. MTU 1500 like every other emulated link (the outer UDP packets are
        fragmented on a 1500-byte underlay; docs/multihost.md)."""
        server = node2.ssh_dest
        remote_ip = self._addresses[server]
        route = subprocess.run(["ip", "-o", "route", "get", remote_ip], capture_output=True, text=True).stdout
        match = re.search(r" src (\S+)", route)
        if not match:
            raise EmulatorError(f"{server}: no route to {remote_ip} from this machine for the VXLAN tunnels")
        local_ip = match.group(1)
        dev = self._free_root_name(server, "sfvx", 0)
        vni = str(VXLAN_VNI_BASE + len(self.tunnels))

        def add(local: str, remote: str) -> list[str]:
            return ["ip", "link", "add", dev, "mtu", "1500", "type", "vxlan", "id", vni, "local", local,
                    "remote", remote, "dstport", str(VXLAN_PORT), "nolearning"]

        self.executor.run("root namespace", None, add(local_ip, remote_ip))
        self._remote_exec(server, [("root namespace", None, add(remote_ip, local_ip))])
        self._place_ends(server, dev, node1, node2, name1, name2, mac1, mac2)
        self.tunnels.append({"a": node1.name, "b": node2.name, "server": server, "kind": "vxlan", "vni": int(vni),
                             "local": local_ip, "remote": remote_ip})
        return 1  # as RemoteGRELink: a kernel tunnel, no process

    def _place_ends(self, server: str, dev: str, node1, node2, name1: str, name2: str,
                    mac1: str | None, mac2: str | None) -> None:
        """Move a tunnel's device ``dev`` (made in the root namespace here and on ``server``) into its
        two routers, named ``name1`` / ``name2`` there, with their MAC addresses if given."""
        self.executor.run("root namespace", None, ["ip", "link", "set", dev, "netns", str(node1.pid)])
        self.executor.run(node1.name, node1.pid, ["ip", "link", "set", dev, "name", name1]
                          + (["address", mac1] if mac1 else []))
        self._remote_exec(server, [("root namespace", None, ["ip", "link", "set", dev, "netns", str(node2.pid)]),
                                   (node2.name, node2.pid, ["ip", "link", "set", dev, "name", name2]
                                    + (["address", mac2] if mac2 else []))])

    def _make_ssh_tunnel(self, node1, node2, name1: str, name2: str, mac1: str | None, mac2: str | None):
        """An SSH Ethernet tunnel (the steps of Mininet's ``RemoteLink.makeTunnel``, each checked,
        with our SSH options)."""
        server = node2.ssh_dest
        tap = self._free_root_name(server, "tap", FIRST_TAP)
        n = int(tap[3:])
        add = ["ip", "tuntap", "add", "dev", tap, "mode", "tap"]
        self.executor.run("root namespace", None, add)
        self._remote_exec(server, [("root namespace", None, add)])
        argv = self.servers.ssh.argv(server, mux=False, options=(
            "-o", "Tunnel=ethernet", "-w", f"{n}:{n}", "-o", "ExitOnForwardFailure=yes"))
        argv.append(remote_command(["sh", "-c", "echo @; exec cat"], env={MARKER_ENV: self.marker(server)}))
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=self.env, preexec_fn=_die_with(os.getpid()), start_new_session=True)
        self.register(proc, role=f"tunnel@{node1.name}")
        ready, _, _ = select.select([proc.stdout], [], [], TUNNEL_TIMEOUT_S)
        if not ready or proc.stdout.read(1) != b"@":
            proc.kill()
            why = (proc.stderr.read().decode(errors="replace").strip().splitlines() or ["no output"])[-1]
            raise EmulatorError(f"{node1.name}-{node2.name}: SSH tunnel to {server} did not come up ({why}); the "
                                "server's sshd needs `PermitTunnel ethernet` (or yes) and /dev/net/tun")
        self._place_ends(server, tap, node1, node2, name1, name2, mac1, mac2)
        self.tunnels.append({"a": node1.name, "b": node2.name, "server": server, "kind": "ssh", "tap": tap,
                             "pid": proc.pid})
        return proc

    def _cluster_resolver(self) -> None:
        """:meth:`Emulation._local_resolver` on every server (checked there: a host's own mount namespace)."""
        resolv_text = "# emulated host: no DNS server (a lookup fails at once)\nnameserver 127.0.0.1\n"
        resolv = self._run_dir / "resolv.conf"
        resolv.write_text(resolv_text)
        ours = os.readlink("/proc/self/ns/mnt")
        batches: dict[str, list] = {s: [] for s in self.servers.remote}
        for c in self.plan.clusters:
            for h in c.hosts:
                pid = self._nodes[h.name].pid
                if not self.is_remote(h.name):
                    if os.readlink(f"/proc/{pid}/ns/mnt") == ours:
                        raise EmulatorError(f"{h.name}: shares the machine's mount namespace; not binding "
                                            "/etc/resolv.conf there")
                    self.executor.run_all(h.name, pid, cmd.local_resolver_commands(str(resolv)))
                    continue
                server = self.server_of(h.name)
                remote_resolv = f"{self._remote_dirs[server]}/resolv.conf"
                b = batches[server]
                if not b:
                    b.append(("resolv.conf", None, ["sh", "-c", f"printf '%s' {shlex.quote(resolv_text)} > "
                                                                 f"{shlex.quote(remote_resolv)}"]))
                b.append((h.name, None, ["sh", "-c", f'test "$(readlink /proc/{pid}/ns/mnt)" != '
                                                     '"$(readlink /proc/self/ns/mnt)"']))
                b += [(h.name, pid, argv) for argv in cmd.local_resolver_commands(remote_resolv)]
        for server, batch in batches.items():
            self._remote_exec(server, batch)

    def _daemon_dir(self, router: str) -> Path:
        """Each delay daemon keeps its files on its router's server."""
        if self.is_remote(router):
            return Path(self._remote_dirs[self.server_of(router)])
        return super()._daemon_dir(router)

    def _inventory(self) -> dict:
        made = super()._inventory()
        made["servers"] = {s: sorted(c for c, srv in self.assignment.items() if srv == s) for s in self.servers.names}
        made["tunnels"] = [f"{a}-{b}" for a, b in crossing_links(self.topology, self.assignment)]
        return made

    # ------------------------------------------------------------------ teardown
    def _end_shells(self) -> None:
        """Every node's shell, then each agent (it ends what runs for us on its server), then the
        master connections; then the tunnels' taps, if one never left this root namespace."""
        try:
            super()._end_shells()
        finally:
            try:
                self._stop_agents()
            finally:
                self._stop_masters()
                for tap in self._state.get("root_links", []):
                    if subprocess.run(["ip", "link", "show", "dev", tap], capture_output=True).returncode == 0:
                        subprocess.run(["ip", "link", "del", "dev", tap], capture_output=True)

    def _stop_agents(self) -> None:
        for server, agent in self._agents.items():
            try:
                agent.stdin.close()
            except OSError:
                pass
        for server, agent in self._agents.items():
            line = _readline_until(agent, time.monotonic() + AGENT_TIMEOUT_S).decode(errors="replace").strip()
            if line.startswith("done"):
                self.log(f"{server}: agent tore down its part ({line.split()[-1]} processes ended)")
            else:
                self.log(f"{server}: the agent did not confirm its teardown ({line or self._agent_log_tail(server)}); "
                         f"run `python -m emulator clean` there")
            try:
                agent.wait(timeout=5)
            except subprocess.TimeoutExpired:
                agent.kill()
                agent.wait()
            agent.stdout.close()

    def _stop_masters(self) -> None:
        live = {}
        for master in self._masters.values():
            if master.poll() is None:
                master.terminate()
                start = proc_starttime(master.pid)
                if start is not None:
                    live[master.pid] = start
        end_processes(live, grace_s=2.0)
        for master in self._masters.values():
            try:
                master.wait(timeout=2)
            except subprocess.TimeoutExpired:
                pass
            if master.stderr:
                master.stderr.close()
