"""``Emulation``: a Mininet network shaped like a topology, owned by a context manager.

    from emulator.net.emulation import Emulation
    from emulator.net.layout import NetConfig
    with Emulation(load_topology("topologies/default.yaml"), NetConfig(hosts_per_cluster=2)) as emu:
        emu.hosts["oregon"]              # [HostPlan(name="oregon-h0", ip="10.1.0.10", intf="eth0"), ...]
        proc = emu.popen("oregon-h0", ["python", "-m", "worker"], env={...})
        emu.scale, emu.mechanism         # 10.0, "nfqueue"

Each cluster is K Mininet hosts (one per emulated rank) and a gateway router
host; the router's namespace holds the cluster's Linux bridge (so nothing of
ours exists in the root namespace), its WAN interfaces and, on kernels without
``sch_netem``, a delay daemon (:mod:`emulator.net.delayd`) fed by iptables NFQUEUE
rules in its FORWARD chain. See :mod:`emulator.net.layout` for names, addresses,
scaling and routing, :mod:`emulator.net.linkcmds` for the exact shaping.

Ownership: ``__exit__`` tears down exactly what ``__enter__`` made, on normal
exit, on an exception, on SIGINT (KeyboardInterrupt), on SIGTERM and on SIGHUP
(a terminal or SSH session that closes; turned into ``SystemExit(128 + signal)``,
143 and 129, while the emulation is up; signals are ignored during teardown so
a second Ctrl-C cannot interrupt it). Every process we start gets
``PR_SET_PDEATHSIG=SIGKILL``, so even if the owner is SIGKILLed the kernel
kills the shells and daemons and the namespaces collapse; the state file
(:mod:`emulator.net.state`) lets ``python -m emulator clean`` finish any rest.
Build and use an Emulation from one thread (normally the main one): the
death signal follows the thread that started each process.

We do not call Mininet's global cleanup (``mn -c``): it kills every ``ping``
on the machine and deletes /tmp/*.log. We also skip ``Mininet.init()``'s
``fixLimits()``, which rewrites machine-wide sysctls.
"""

from __future__ import annotations

import ctypes
import datetime as dt
import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from mininet.link import Link as MnLink
from mininet.net import Mininet
from mininet.node import Host

from emulator.net import linkcmds as cmd
from emulator.net.capability import choose_mechanism, kernel_has_netem, require_root, require_tools
from emulator.net.delayd import QueueSpec
from spiderflow.cliutil import write_nowhere
from spiderflow.errors import EmulatorError, EndedBySignal
from emulator.net.executor import Executor
from emulator.net.layout import HostPlan, NetConfig, NetPlan, build_plan, wan_dev
from emulator.net.state import MARKER_ENV, RUN_DIR_PREFIX, ProcRecord, StateStore, end_processes, \
    how_it_ended, proc_starttime, remove_leftovers
from spiderflow.topology import Topology

PR_SET_PDEATHSIG = 1
ENDING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)  # tear down, then exit 128 + the signal
DAEMON_READY_TIMEOUT_S = 15.0
_libc = ctypes.CDLL(None, use_errno=True)


def _die_with(parent_pid: int) -> Callable[[], None]:
    """preexec_fn: SIGKILL this child when its parent (thread) dies."""

    def preexec() -> None:
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent_pid:  # parent already gone
            os._exit(1)

    return preexec


class EmuHost(Host):
    """A Mininet host whose shell carries our marker and dies with us."""

    def __init__(self, name: str, *, emu_env: dict[str, str], **params) -> None:
        self._emu_env = emu_env
        super().__init__(name, **params)

    def _popen(self, cmd_argv, **params):
        params.setdefault("env", self._emu_env)
        params.setdefault("preexec_fn", _die_with(os.getpid()))
        return super()._popen(cmd_argv, **params)


class Emulation:
    def __init__(self, topology: Topology, config: NetConfig | None = None, *,
                 log: Callable[[str], None] | None = None, state_dir: str | Path | None = None,
                 trace: bool = False) -> None:
        self.topology = topology
        self.config = config or NetConfig()
        self.plan: NetPlan = build_plan(topology, self.config)
        self.scale = self.config.scale
        self.mechanism: str | None = None
        self.log = log or (lambda _msg: None)
        self.executor = Executor(trace=self.log if trace else None)
        self.run_id = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.env = {**os.environ, MARKER_ENV: self.run_id}
        self.build_s = self.teardown_s = self.up_at = None
        self._store = StateStore(state_dir)
        self._state: dict = {}
        self._records: list[ProcRecord] = []
        self._procs: list[tuple[subprocess.Popen, str]] = []
        self._nodes: dict[str, Host] = {}
        self._net: Mininet | None = None
        self._run_dir: Path | None = None
        self._old_handlers: dict[int, object] = {}
        self._entered = self._torn_down = False

    # ------------------------------------------------------------------ public API
    @property
    def hosts(self) -> dict[str, list[HostPlan]]:
        """Cluster name -> its hosts (name, ip, intf, ...), in rank order."""
        return {c.name: list(c.hosts) for c in self.plan.clusters}

    def is_remote(self, node: str) -> bool:
        """Whether ``node`` (a host or router) runs on another server: never on one server
        (:class:`~emulator.net.multihost.ClusterEmulation` says for its servers)."""
        return False

    def node(self, name: str) -> Host:
        try:
            return self._nodes[name]
        except KeyError:
            raise EmulatorError(f"no node named {name!r}; known: {', '.join(self._nodes)}") from None

    def popen(self, host: str, argv: list[str], *, env: dict[str, str] | None = None,
              role: str = "worker", **popen_kwargs) -> subprocess.Popen:
        """Start ``argv`` inside ``host`` (a host or router name); tracked and ended at teardown.

        The process gets its own session (``mnexec -d``), ``env`` (default: ours)
        plus the emulation marker, and dies with this process.
        """
        node = self.node(host)
        full_env = dict(os.environ if env is None else env)
        full_env[MARKER_ENV] = self.run_id
        proc = subprocess.Popen(["mnexec", "-da", str(node.pid), *argv], env=full_env,
                                preexec_fn=_die_with(os.getpid()), **popen_kwargs)
        self.register(proc, role=f"{role}@{host}")
        return proc

    def register(self, proc: subprocess.Popen, *, role: str = "worker") -> None:
        """Track a process started some other way, so teardown ends it."""
        # forget finished ones (a long trace replay starts thousands of workers)
        self._procs = [(p, r) for p, r in self._procs if p.poll() is None or r.startswith("delayd@")]
        self._records = [r for r in self._records if r.role == "shell" or r.alive()]
        self._procs.append((proc, role))
        start = proc_starttime(proc.pid)
        if start is not None:
            self._record(ProcRecord(pid=proc.pid, starttime=start, role=role))

    def run(self, host: str, argv: list[str], *, check: bool = True,
            timeout_s: float | None = None) -> subprocess.CompletedProcess:
        """Run a short command inside ``host`` and return its output (text)."""
        return self.executor.run(host, self.node(host).pid, argv, check=check, timeout_s=timeout_s)

    def delay_stats(self) -> dict[str, list[dict]]:
        """Router -> per-queue counters of its delay daemon (NFQUEUE mechanism only)."""
        out = {}
        for proc, role in self._procs:
            if role.startswith("delayd@") and proc.poll() is None:
                proc.send_signal(signal.SIGUSR1)
        time.sleep(0.2)
        for c in self.plan.clusters:
            path = self._run_dir / f"delayd-{c.name}.json" if self._run_dir else None
            if path and path.exists():
                out[c.router.name] = json.loads(path.read_text())["queues"]
        return out

    def delay_control(self, cluster: str) -> Path:
        """The control file of ``cluster``'s delay daemon (``delayd --control``; live changes)."""
        return self._daemon_dir(self.plan.cluster(cluster).router.name) / f"delayd-{cluster}.ctl"

    def delay_daemons(self) -> dict[str, subprocess.Popen]:
        """Router name -> its delay daemon process (empty with netem)."""
        return {role.split("@", 1)[1]: proc for proc, role in self._procs if role.startswith("delayd@")}

    def check_daemons(self) -> None:
        """Raise if a delay daemon died: its NFQUEUE rules stay, so its links drop every packet."""
        for router, proc in self.delay_daemons().items():
            if proc.poll() is not None:
                raise EmulatorError(f"{router}: the delay daemon {how_it_ended(proc.returncode)}, so its WAN "
                                    f"links drop every packet ({self._daemon_log_tail(router)})")

    def _daemon_log_tail(self, router: str) -> str:
        try:
            lines = (self._run_dir / f"{router}.log").read_text(errors="replace").strip().splitlines()
        except (OSError, TypeError):
            return "no log"
        return lines[-1] if lines else "no output"

    # ------------------------------------------------------------------ context manager
    def __enter__(self) -> "Emulation":
        require_root()
        require_tools()
        self._store.acquire()
        self._entered = True
        try:
            self._install_signal_handlers()
            stale = self._store.read()
            if stale:
                self.log(f"an earlier emulation (pid {stale.get('owner_pid')}) did not tear down; "
                         "removing what its state file lists")
                remove_leftovers(stale, log=self.log)
                self._store.remove()
            self._build()
        except BaseException:
            self._teardown()
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self._teardown()
        return False

    # ------------------------------------------------------------------ build
    def _build(self) -> None:
        t0 = time.monotonic()
        self.mechanism = choose_mechanism(self.config.delay, kernel_has_netem(self.executor))
        self._state = {"run_id": self.run_id, "owner_pid": os.getpid(), "topology": self.plan.topology,
                       "source": self.plan.source, "started": dt.datetime.now().isoformat(timespec="seconds"),
                       "scale": self.scale, "dilation": self.config.dilation, "mechanism": self.mechanism, "files": [],
                       "processes": [], "made": self._inventory()}
        self._store.write(self._state)  # first: a kill from here on leaves a state file that clean reads
        self._run_dir = Path(tempfile.mkdtemp(prefix=f"{RUN_DIR_PREFIX}{self.run_id}-"))
        self._state["files"] = [str(self._run_dir)]
        self._store.write(self._state)
        for warning in self._rate_warnings():
            self.log(warning)
        Mininet.inited = True  # skip Mininet.init()'s fixLimits(): it rewrites machine-wide sysctls
        self._net = Mininet(topo=None, build=False, controller=None, link=MnLink)
        host_cls = functools.partial(EmuHost, emu_env=self.env)
        for c in self.plan.clusters:
            for name, router in [(c.router.name, True)] + [(h.name, False) for h in c.hosts]:
                node = self._net.addHost(name, cls=host_cls, ip=None)
                self._nodes[name] = node
                self._record(ProcRecord(pid=node.pid, starttime=proc_starttime(node.pid) or 0, role="shell"))
                # before any interface exists, so none ever gets an IPv6 address
                self.executor.run(name, node.pid, cmd.sysctl_command(
                    cmd.namespace_sysctls(c.tcp_max_bytes, router=router)))
        self.log(f"{len(self._nodes)} nodes started ({time.monotonic() - t0:.1f} s)")
        self._add_links()
        self._local_resolver()
        netem = self.mechanism == "netem"
        for name, commands in cmd.plan_commands(self.plan, netem=netem).items():
            self.executor.run_all(name, self._nodes[name].pid, commands)
        self.log(f"links shaped, routes set ({self.executor.count} commands, {time.monotonic() - t0:.1f} s)")
        if not netem:
            self._start_delay_daemons()
        self.build_s = time.monotonic() - t0
        self.up_at = time.monotonic()  # the run's clock starts here (live changes report against it)
        self.log(f"network up: {len(self.plan.clusters)} clusters x {self.config.hosts_per_cluster} hosts, "
                 f"{len(self.plan.links)} WAN links, delay by {self.mechanism}, scale {self.scale:g}, "
                 f"dilation {self.config.dilation:g} "
                 f"({self.build_s:.1f} s)")

    def _add_links(self) -> None:
        """Each host to its cluster's router, and each WAN link between two routers (Mininet picks
        the link class: a veth pair here, a tunnel between two servers in ClusterEmulation)."""
        for c in self.plan.clusters:
            for h in c.hosts:
                self._net.addLink(self._nodes[h.name], self._nodes[c.router.name],
                                  intfName1=h.intf, intfName2=h.port)
        for link in self.plan.links:
            self._net.addLink(self._nodes[self.plan.cluster(link.a).router.name],
                              self._nodes[self.plan.cluster(link.b).router.name],
                              intfName1=wan_dev(link.b), intfName2=wan_dev(link.a))

    def _local_resolver(self) -> None:
        """Every host gets a resolv.conf of its own (:func:`emulator.net.linkcmds.local_resolver_commands`),
        bind-mounted in its own mount namespace; refused if a host shares ours."""
        resolv = self._run_dir / "resolv.conf"
        resolv.write_text("# emulated host: no DNS server (a lookup fails at once)\nnameserver 127.0.0.1\n")
        ours = os.readlink("/proc/self/ns/mnt")
        for c in self.plan.clusters:
            for h in c.hosts:
                pid = self._nodes[h.name].pid
                if os.readlink(f"/proc/{pid}/ns/mnt") == ours:
                    raise EmulatorError(f"{h.name}: shares the machine's mount namespace; not binding "
                                        "/etc/resolv.conf there")
                self.executor.run_all(h.name, pid, cmd.local_resolver_commands(str(resolv)))

    def _daemon_dir(self, router: str) -> Path:
        """Where ``router``'s delay daemon keeps its statistics and control file (on its machine)."""
        return self._run_dir

    def _start_delay_daemons(self) -> None:
        started = []
        for c in self.plan.clusters:
            if not c.router.wan:
                continue
            specs = [QueueSpec(num=p.queue, delay_ms=p.shape.delay_ms, jitter_ms=p.shape.jitter_ms,
                               loss_pct=p.shape.loss_pct) for p in c.router.wan]
            base = self._daemon_dir(c.router.name)
            argv = [sys.executable, "-m", "emulator.net.delayd", "--stats",
                    str(base / f"delayd-{c.name}.json"), "--control", str(self.delay_control(c.name))]
            for spec in specs:
                argv += ["--queue", spec.arg()]
            logfile = open(self._run_dir / f"{c.router.name}.log", "wb")
            proc = self.popen(c.router.name, argv, role="delayd", stdout=subprocess.PIPE,
                              stderr=logfile, cwd=str(Path(__file__).resolve().parents[2]))
            logfile.close()
            started.append((c.router.name, proc))
        deadline = time.monotonic() + DAEMON_READY_TIMEOUT_S
        for name, proc in started:
            line = _readline_until(proc, deadline)
            if line.strip() != b"ready":
                proc.poll()
                raise EmulatorError(f"{name}: delay daemon did not start (exit {proc.returncode}): "
                                    f"{self._daemon_log_tail(name)}")
        self.log(f"{len(started)} delay daemons ready")

    def _inventory(self) -> dict:
        made: dict[str, list[str]] = {"namespaces": [], "veths": [], "bridges": [], "iptables": []}
        netem = self.mechanism == "netem"
        for c in self.plan.clusters:
            made["namespaces"] += [c.router.name] + [h.name for h in c.hosts]
            made["veths"] += [f"{h.name}:{h.intf}<->{c.router.name}:{h.port}" for h in c.hosts]
            made["bridges"].append(f"{c.router.name}:lan")
            if not netem:
                made["iptables"] += [f"{c.router.name}: " + " ".join(argv[2:])
                                     for argv in cmd.nfqueue_commands(c.router.wan)]
        for link in self.plan.links:
            a, b = self.plan.cluster(link.a).router.name, self.plan.cluster(link.b).router.name
            made["veths"].append(f"{a}:{wan_dev(link.b)}<->{b}:{wan_dev(link.a)}")
        return made

    def _rate_warnings(self) -> list[str]:
        worst = max((p.shape.wire_mbps for c in self.plan.clusters for p in c.router.wan), default=0.0)
        if worst > 1000:
            return [f"warning: a WAN link runs at {worst:.0f} Mbit/s on the wire; on a small machine "
                    f"raise --scale (now {self.scale:g}) so links stay near 100 Mbit/s"]
        return []

    def _record(self, record: ProcRecord) -> None:
        self._records.append(record)
        if self._state:
            self._state["processes"] = [vars(r) for r in self._records]
            self._store.write(self._state)

    # ------------------------------------------------------------------ teardown
    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        terminal = [fd for fd in (1, 2) if os.isatty(fd)]  # asked now: a terminal that hung up answers EIO

        def on_ending(signum, _frame):
            for sig in ENDING_SIGNALS:
                signal.signal(sig, signal.SIG_IGN)
            if signum == signal.SIGHUP:  # the terminal is gone: writing to it would fail the teardown's logging
                write_nowhere(*terminal)
            raise EndedBySignal(signum)

        self._old_handlers = {signal.SIGINT: signal.getsignal(signal.SIGINT)}
        for sig in ENDING_SIGNALS:
            if sig == signal.SIGHUP and signal.getsignal(sig) == signal.SIG_IGN:
                continue  # started under nohup: the run is to outlive its terminal, and does
            self._old_handlers[sig] = signal.signal(sig, on_ending)

    def _teardown(self) -> None:
        if self._torn_down or not self._entered:
            return
        self._torn_down = True
        t0 = time.monotonic()
        main = threading.current_thread() is threading.main_thread()
        if main:
            for sig in (signal.SIGINT, *ENDING_SIGNALS):
                signal.signal(sig, signal.SIG_IGN)
        try:
            self._end_tracked()
            self._end_shells()
            if self._state:  # ours was written: end what it lists, then forget it
                remove_leftovers(dict(self._state, processes=[vars(r) for r in self._records]), log=self.log)
                self._store.remove()
        finally:
            self._store.release()
            if main:
                for sig, handler in self._old_handlers.items():
                    signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
            self.teardown_s = time.monotonic() - t0
        self.log(f"torn down ({self.teardown_s:.1f} s)")

    def _end_tracked(self) -> None:
        """SIGTERM each tracked process group (workers, daemons), then SIGKILL what is left."""
        live = {}
        for proc, _role in self._procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except (ProcessLookupError, PermissionError):
                    proc.terminate()
                start = proc_starttime(proc.pid)
                if start is not None:
                    live[proc.pid] = start
        end_processes(live, grace_s=3.0)
        for proc, _role in self._procs:
            try:
                proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                pass
            if proc.stdout:
                proc.stdout.close()

    def _end_shells(self) -> None:
        """Kill each host shell (the last process in its namespace) and reap it.

        We do not delete the links one by one through the shells (Mininet's
        ``stop()``): a dead or busy shell would hang that; the kernel removes
        every interface of a namespace when the namespace goes.
        """
        for node in self._nodes.values():
            shell = node.shell
            if shell is None:
                continue
            if shell.poll() is None:
                try:
                    os.killpg(shell.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    shell.kill()
        for node in self._nodes.values():
            if node.shell is not None:
                try:
                    node.shell.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    continue
                node.cleanup()


def _readline_until(proc: subprocess.Popen, deadline: float) -> bytes:
    import select

    fd = proc.stdout.fileno()
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if ready:
            return proc.stdout.readline()
    return b""
