"""Replay a trace on an emulated network: place, plan, launch ranks, measure, tear down.

``Runner(topology, jobs, config, emu).run()`` runs one event loop in the
calling (main) thread; the :class:`~emulator.net.emulation.Emulation` that ``emu``
is owns the network and every rank process (it kills them on exit, error or
Ctrl-C). Arrivals are compressed by ``time_scale``: a job that arrives at
``t`` s in the trace arrives ``t / time_scale`` s after the network is up.

Time dilation K (``config.net.dilation``, DESIGN.md): the network runs K
times slower (rates / K, delays x K) and so do the ranks (compute sleeps and
timeouts x K, :mod:`emulator.jobs.launch`) and the arrivals (x K); every time this
module reports (iteration times, JCT, queueing) is wall time / K, i.e.
real-equivalent. Job start-up (specs handed over -> the job's first op) is
reported in wall seconds: it is the emulator's own cost, not the job's.

Jobs are scheduled by the simulator's own :class:`~spiderflow.scheduling.Scheduler`
(queue policy, planner call with its seed and time limit, rejection with a
reason): a job starts when the planner places it on the free emulated GPUs
(with the current link load: the WAN routes of running jobs) and each
cluster of its plan has a free host per rank there. It ends after
``iterations`` iterations; its measured iteration time is the median, over
the iterations after ``warmup``, of the interval between consecutive
iteration ends (the last rank's end of each iteration). A rank that exits
non-zero (a crash, a kill, a collective timeout) fails its job only: the
job's other ranks are ended, its hosts and GPUs return to the pool, and
what it measured so far stays on disk. So does a rank whose log (its stdout
and stderr, ``ranks/JOB-rN.log``) grows past :data:`RANK_LOG_CAP_BYTES`: the
size is checked at every poll, and the log is cut back to the cap once the
job's ranks are ended. When a job times out, or its ranks give up at their
rendezvous, while a rank never reached its process group (it has no JSON
lines file, see :mod:`emulator.jobs.worker`), that rank is the one named.

Over several servers (``emulator run --servers``, :mod:`emulator.jobs.remotepool`) a rank
starts from the pool of its host's server; its files live there while it runs (the runner
asks their sizes) and are copied into ``ranks/`` here when its job ends, and its ``mono``
stamps are put on this machine's clock with the server's measured offset before the
ranks' iteration ends are compared (:func:`rank_ends`).

With ``--wan-events`` / ``--capacity-events`` the network and the GPU pool
change during the replay (:mod:`emulator.jobs.wanplay`, :mod:`emulator.jobs.changes`,
docs/wan-events.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import signal
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from emulator.jobs.compute import COMPUTE_MODES, cpu_flops_per_s
from emulator.jobs.launch import describe_plan, emulated_view, predict_emulated, rank_specs
from emulator.jobs.pool import PooledProcess
from emulator.jobs.ranklog import read_lines
from emulator.jobs.remotepool import ask_sizes, collect, copy_lines
from emulator.jobs.changes import ReplayChanges
from emulator.jobs.startup import startup_s
from emulator.jobs.wanplay import WanPlayer
from emulator.net.hoststeal import StealLog
from emulator.net.live import LiveNetwork
from emulator.net.layout import HostPlan, NetConfig
from emulator.net.servers import to_local_ns
from emulator.net.state import MARKER_ENV, how_it_ended
from emulator.jobs.worker import STARTUP_NICE_ENV, RankSpec, rank_env
from spiderflow.errors import EmulatorError
from spiderflow.costmodel import NO_CALIBRATION, Calibration, plan_work
from spiderflow.placement.base import Strategy
from spiderflow.scheduling import DEFAULT_TIME_LIMIT_S, JobRecord, Scheduler, SchedulerConfig, link_load
from spiderflow.topology import Topology
from spiderflow.wan import CapacityEvent, WanEvent
from spiderflow.workload import Job

REPO = Path(__file__).resolve().parents[2]
POLL_S = 0.1
COPY_EVERY_S = 1.0  # wall seconds between copies of remote ranks' JSON lines (one request per server)
SETTLE_S = 2.0  # wall seconds a failure waits for its echoes in other ranks (see Runner._settle)
BASE_PORT = 29500
# Ranks start niced (torch import, joining) and return to 0 once their job's ranks have all
# joined, so a burst of starting ranks does not slow the schedules of running jobs.
STARTUP_NICE = 10
# The replay's own process (the scheduler and its planner calls) runs ahead of the ranks: a real
# scheduler does not share its CPU with the jobs it places, and the replay's clock counts the
# planner's wall time as scheduling overhead. (Even so, genetic's decisions beside 34 ranks on
# 2 cores took 1.4x their time in the simulation: the delay daemons run at real-time priority.)
PLANNER_NICE = -10
# A rank's log holds tracebacks and library warnings (kilobytes); one that floods it must not fill
# the disk. Checked every poll (POLL_S), so a rank may write what it manages between two checks
# more; the log is then cut back to this size. Not RLIMIT_FSIZE in the rank: that caps every file
# it writes, its JSON lines too, which a long run grows past any small cap.
RANK_LOG_CAP_BYTES = 8 * 2**20


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    # the scheduler's settings: the same defaults as the simulator's (spiderflow.scheduling)
    planner: str | Strategy = "spinsearch"
    backfill: bool = False
    seed: int = 0
    time_limit_s: float = DEFAULT_TIME_LIMIT_S
    search_budget: int | None = None
    wait: bool = True  # SpinSearch's topology-aware admission (spiderflow.scheduling)
    replan: bool = True  # SpinSearch may move a job a WAN change slowed, or placed while impaired (--no-replan)
    iterations: int = 6
    warmup: int = 2
    time_scale: float = 10.0
    job_timeout_s: float = 300.0  # from a job's launch to its last rank's exit
    # torch.distributed timeout inside each rank, joining included (30+ ranks importing torch
    # at once on 2 cores took over 60 s)
    rank_timeout_s: float = 120.0
    # Keep TCP's congestion window across idle gaps (net.ipv4.tcp_slow_start_after_idle=0 in every
    # host namespace), as the cost model's alpha + n / beta assumes; see docs/emulator-run.md.
    warm_tcp: bool = True
    net: NetConfig = field(default_factory=NetConfig)
    # "emulated": ranks sleep the predicted compute; "real": they run CPU proxies (emulator.jobs.compute)
    compute: str = "emulated"
    # fitted by `emulator calibrate`; the planner and every prediction use it
    calibration: Calibration = NO_CALIBRATION

    @property
    def dilation(self) -> float:
        return self.net.dilation

    @property
    def scheduler(self) -> SchedulerConfig:
        return SchedulerConfig(planner=self.planner, backfill=self.backfill, seed=self.seed,
                               time_limit_s=self.time_limit_s, search_budget=self.search_budget,
                               calibration=self.calibration, wait=self.wait)

    def __post_init__(self) -> None:
        if self.iterations < 2:
            raise ValueError(f"iterations must be >= 2 (got {self.iterations})")
        if not 0 <= self.warmup <= self.iterations - 2:
            raise ValueError(f"warmup must be in 0..iterations-2 = 0..{self.iterations - 2} (got {self.warmup}); "
                             "an iteration time needs two measured iteration ends")
        if not self.time_scale > 0:
            raise ValueError(f"time_scale must be > 0 (got {self.time_scale})")
        if self.compute not in COMPUTE_MODES:
            raise ValueError(f"compute must be one of {', '.join(COMPUTE_MODES)} (got {self.compute!r})")


def warm_tcp(emu) -> None:
    """``net.ipv4.tcp_slow_start_after_idle=0`` in every host of ``emu`` (see RunConfig.warm_tcp)."""
    from emulator.net.linkcmds import sysctl_command

    argv = sysctl_command({"net.ipv4.tcp_slow_start_after_idle": "0"})
    for hosts in emu.hosts.values():
        for h in hosts:
            emu.run(h.name, argv)  # on the host's server


def local_mono_s(mono_s: float, offset_ns: int) -> float:
    """A rank's CLOCK_MONOTONIC stamp (seconds) from a server whose clock is ``offset_ns`` ahead of ours,
    on our clock."""
    return to_local_ns(mono_s * 1e9, offset_ns) / 1e9


def rank_ends(lines: list[dict], offset_ns: int = 0) -> tuple[list[float], list[tuple[int, float]]]:
    """A rank's ``start`` stamps and its iteration ends ``(iteration, end)``, on this machine's
    monotonic clock: its lines' times are relative to its ``mono`` origin, read on the clock of its
    own server, which runs ``offset_ns`` ahead of ours (0: this machine)."""
    mono, starts, ends = None, [], []
    for line in lines:
        if line.get("event") == "start":
            mono = line.get("mono")
            if mono is not None:
                if offset_ns:
                    mono = local_mono_s(mono, offset_ns)
                starts.append(mono)
        elif line.get("event") == "iteration" and mono is not None:
            ends.append((line["it"], mono + line["end"]))
    return starts, ends


@dataclass(kw_only=True)
class Rank:
    spec: RankSpec
    host: HostPlan
    proc: PooledProcess  # from its server's pool (subprocess.Popen's interface)
    log: Path | None = None  # the rank's stdout and stderr (here; a remote rank's once fetched)
    exit: int | None = None
    # a rank on another server: its pool, and its JSON lines and log there (spec.out is that path)
    pool: object | None = None
    remote_log: str | None = None
    remote_sizes: dict = field(default_factory=dict)  # path -> bytes (-1: none), as last asked
    copied: int = 0  # bytes of its JSON lines copied here so far (remotepool.copy_lines)

    @property
    def clock_offset_ns(self) -> int:
        return self.pool.clock_offset_ns if self.pool is not None else 0

    def log_bytes(self) -> int:
        if self.pool is not None:
            return max(0, self.remote_sizes.get(self.remote_log, 0))
        try:
            return os.stat(self.log).st_size if self.log else 0
        except FileNotFoundError:  # a pooled rank opens its log itself
            return 0

    def joined(self) -> bool:
        """Has it reached its rendezvous (its JSON lines file exists, see emulator.jobs.worker)?"""
        if self.pool is not None:
            return self.remote_sizes.get(self.spec.out, -1) >= 0
        return Path(self.spec.out).exists()


@dataclass(kw_only=True, eq=False)
class JobRun(JobRecord):
    """A job's record (``arrival_s`` compressed, since the network came up; ends ok | failed |
    interrupted, or is rejected by the scheduler) plus its ranks and measurements."""

    predicted_s: float | None = None  # emulated view, link load at launch
    predicted_alone_s: float | None = None  # emulated view, no other job
    # emulated view, loaded by every job that ran at some time during this one (launched later too)
    predicted_shared_s: float | None = None
    overlapped: set = field(default_factory=set)  # job ids that ran while this one ran
    ranks: list[Rank] = field(default_factory=list)
    iteration_s: list[float] = field(default_factory=list)  # measured intervals after warm-up (real-equivalent)
    iterations_done: int = 0
    startup_wall_s: float | None = None  # specs handed over -> the job's first op, wall seconds
    host_steal_pct: float | None = None  # CPU the host stole while its measured iterations ran
    # WAN events (emulator run --wan-events): the last change in force while the job ran (the
    # replay's clock), the prediction on the network from then on, the intervals measured after it.
    # Such a job's iteration_s and predictions are those of the network at its launch (intervals
    # that ended before the first change), so each prediction meets the intervals it describes.
    launch_topology: Topology | None = None
    first_segments: tuple = ()  # its first placement and ranks: what predicted_s and iteration_s describe
    first_ranks: int = 0
    first_changed_t: float | None = None
    changed_t: float | None = None
    predicted_after_s: float | None = None
    placed_s: float | None = None  # the prediction on the network of its (re)placement, at that moment
    iteration_after_s: list[float] = field(default_factory=list)
    # stopped by a change (emulator/jobs/changes.py) and placed again: attempt n's ranks write
    # JOB.n-rR files and run the iterations left; they start launch_at (the restart cost) after
    # the new placement, which holds the GPUs and hosts meanwhile
    attempt: int = 0
    done_before: int = 0  # iterations completed by earlier attempts
    replanned: int = 0
    rerouted: int = 0
    copied_at: float = 0.0  # monotonic time its remote ranks' lines were last copied here
    lost_s: float = 0.0  # sum over its stops of (its new ranks' launch - the stop), real-equivalent
    stopped_s: float | None = None
    restart_s: float = 0.0
    launch_at: float | None = None
    pending: tuple | None = None  # (specs, hosts, port) of ranks waiting for launch_at
    launched_t: float | None = None  # when this attempt's ranks were started (the replay's clock)

    @property
    def files(self) -> str:
        """The prefix of this attempt's rank files."""
        return self.job.job_id if self.attempt == 0 else f"{self.job.job_id}.{self.attempt}"

    def collect_exits(self) -> None:
        """Record the exit status of every rank that has ended since the last look."""
        for r in self.ranks:
            if r.exit is None:
                r.exit = r.proc.poll()

    @property
    def completed(self) -> bool:
        return self.status == "ok"

    @property
    def measured_s(self) -> float | None:
        return statistics.median(self.iteration_s) if self.iteration_s else None

    @property
    def error_pct(self) -> float | None:
        m = self.measured_s
        return None if m is None or self.predicted_s is None else 100.0 * (self.predicted_s - m) / m

    @property
    def jct_s(self) -> float | None:  # a failed job's too: when it ended
        return None if self.end_s is None else self.end_s - self.arrival_s

    def as_json(self) -> dict:
        m = self.measured_s
        out = {"job_id": self.job.job_id, "placement": dict(self.segments),
               "plan": describe_plan(self.plan) if self.plan else None,
               "ranks": len(self.ranks),
               "predicted_iteration_s": self.predicted_s, "predicted_alone_iteration_s": self.predicted_alone_s,
               "predicted_shared_iteration_s": self.predicted_shared_s,
               "measured_iteration_s": m,
               "measured_spread_s": [min(self.iteration_s), max(self.iteration_s)] if self.iteration_s else None,
               "measured_iterations": len(self.iteration_s),
               "error_pct": self.error_pct, "jct_s": self.jct_s, "queue_s":
                   None if self.start_s is None else self.start_s - self.arrival_s,
               "startup_wall_s": self.startup_wall_s, "admission": self.admission, "status": self.status,
               "host_steal_pct": None if self.host_steal_pct is None else round(self.host_steal_pct, 2)}
        if self.attempt or self.rerouted:
            out.update(replanned=self.replanned, rerouted=self.rerouted, lost_s=self.lost_s)
        if self.changed_t is not None:
            after = statistics.median(self.iteration_after_s) if self.iteration_after_s else None
            out["after_change"] = {
                "t": self.changed_t, "placement": dict(self.segments), "predicted_iteration_s": self.predicted_after_s,
                "measured_iteration_s": after, "measured_iterations": len(self.iteration_after_s),
                "error_pct": None if after is None or self.predicted_after_s is None
                else 100.0 * (self.predicted_after_s - after) / after}
        if self.status != "ok":
            out["reason"] = self.reason
        return out


class Runner:
    def __init__(self, topology: Topology, jobs: Sequence[Job], config: RunConfig, emu, *, out_dir: Path,
                 log: Callable[[str], None] = lambda _m: None, pool=None, first_port: int = BASE_PORT,
                 wan_events: Sequence[WanEvent] = (), capacity_events: Sequence[CapacityEvent] = ()) -> None:
        """``pool``: the rank pool(s) that start the ranks (:func:`emulator.run.rank_pools`: a
        :class:`emulator.jobs.pool.RankPool` on ``emu``, warm or cold, or one per server); a runner
        without one cannot start a rank.
        ``first_port``: each job's rendezvous takes the next port from here (a later replay on the same
        network starts after the ports of the one before). ``wan_events``: put in force on the live
        network at their (compressed, dilated) times, and planned on from then (emulator/jobs/wanplay.py);
        with ``capacity_events`` too, jobs left without a route or GPUs are stopped and placed again
        (emulator/jobs/changes.py)."""
        self.topo, self.cfg, self.emu, self.out, self.log = topology, config, emu, Path(out_dir), log
        self.pool = pool
        self.rank_dir = self.out / "ranks"
        self.rank_dir.mkdir(parents=True, exist_ok=True)
        self.k = config.dilation
        # JobRun times are real-equivalent: wall seconds since t0 / K
        # each job runs config.iterations (what the scheduler's admission and the summaries count)
        self.jobs = [JobRun(job=dataclasses.replace(j, iterations=config.iterations),
                            arrival_s=j.arrival_s / config.time_scale) for j in jobs]
        self.free_hosts: dict[str, list[HostPlan]] = {c: list(hs) for c, hs in emu.hosts.items()}
        self.sched = Scheduler(topology, config.scheduler, {c: len(hs) for c, hs in emu.hosts.items()})
        self.next_port = first_port
        self.peak_ranks = 0  # most ranks running at once
        self.t0 = time.monotonic()
        self._launched = open(self.out / "launched.jsonl", "a", buffering=1)
        # real compute: proxies are sized by this CPU's single-thread matmul rate (same CPU in every host)
        self.cpu_flops_per_s: float | None = None
        if config.compute == "real":
            self.cpu_flops_per_s = cpu_flops_per_s()
            log(f"real compute: CPU matmul rate {self.cpu_flops_per_s / 1e9:.1f} GFLOP/s per core")
        if config.warm_tcp:
            warm_tcp(emu)
        self.player = (WanPlayer(LiveNetwork(emu, topology), wan_events, time_scale=config.time_scale,
                                 dilation=self.k, log=log) if wan_events else None)
        self.changes = ReplayChanges(self, capacity_events) if wan_events or capacity_events else None
        self.steal = StealLog()  # sampled every pass: what the host stole while a job was measured

    def now(self) -> float:
        """Real-equivalent seconds since the run started (wall / dilation)."""
        return (time.monotonic() - self.t0) / self.k

    # ------------------------------------------------------------------ loop
    def run(self) -> list[JobRun]:
        """Replay the trace; on any exception (Ctrl-C too) mark what was running or queued
        (:meth:`interrupt`), with the player stopped and the WAN restored first, and raise it."""
        try:
            return self._replay()
        except BaseException:
            self.interrupt()
            raise

    def _replay(self) -> list[JobRun]:
        self.t0 = time.monotonic()
        before = os.getpriority(os.PRIO_PROCESS, 0)
        try:
            os.setpriority(os.PRIO_PROCESS, 0, PLANNER_NICE)
        except PermissionError:  # not root: the scheduler shares the CPU with the ranks
            pass
        try:
            if self.player is not None:  # after the nice: the thread inherits it
                self.player.start(self.t0)
            self._loop()
        finally:
            if self.player is not None:
                self.player.stop()
                if self.player.applied:
                    try:
                        self.player.live.restore()
                    except EmulatorError as exc:  # the network is torn down next anyway
                        self.log(f"could not restore the WAN after the replay: {exc}")
            os.setpriority(os.PRIO_PROCESS, 0, before)
            self._launched.close()
        return self.jobs

    def _loop(self) -> None:
        self._dirty = True
        arrived = 0
        while any(j.status in ("queued", "running") for j in self.jobs):
            self.emu.check_daemons()  # a dead delay daemon's links drop every packet: the run cannot go on
            if self.pool is not None:
                self.pool.check()  # nor can it without its rank pool
            self.steal.sample()
            now = self.now()
            n = sum(1 for j in self.jobs if j.arrival_s <= now)
            if n != arrived:
                arrived, self._dirty = n, True
            if self.player is not None:
                for applied in self.player.take():
                    self.changes.network_changed(applied)
            if self.changes is not None:
                self.changes.due(now)
            self._start_due()
            self._poll_running()
            if self._dirty:
                self._dirty = False
                queued = [j for j in self.jobs if j.status == "queued" and j.arrival_s <= now]
                said = {id(j): j.admission for j in queued}
                # between two decisions, ended jobs are seen and release their GPUs and hosts (a
                # planner taking seconds would otherwise hold them for the whole pass)
                for j in self.sched.schedule(queued, self.now(), on_start=self._launch,
                                             on_decided=lambda _rec, _spent: self._poll_running()):
                    if j.status == "rejected":
                        j.end_s = self.now()
                        self.log(f"{j.job.job_id}: REJECTED: {j.reason}")
                for j in queued:
                    if j.status == "queued" and j.admission and j.admission != said[id(j)]:
                        self.log(f"{j.job.job_id}: {j.admission}")
                if self.changes is not None:
                    self.changes.replan()
            time.sleep(POLL_S)

    def predict_now(self, j: JobRun) -> float:
        """``j``'s plan on the network as it is now, with the other running jobs' load."""
        return self.predict_on(j.plan, j)

    def predict_on(self, plan, j: JobRun) -> float:
        """``plan`` (one for ``j``) on the network as it is now, with the other running jobs' load."""
        return predict_emulated(plan, self._view(self._load_without(j)))

    def iterations_left(self, j: JobRun) -> int:
        """The iterations running ``j`` has still to run: the run's, less those its earlier attempts and
        every rank of this one completed (by the JSON lines here: a remote rank's as last copied)."""
        _, ends = self._stamps(j)
        return self.cfg.iterations - j.done_before - sum(len(v) == len(j.ranks) for v in ends.values())

    def stop(self, j: JobRun, restart_s: float, *, why: str) -> None:
        """A change stops running ``j``: its ranks are ended, what they did is kept, its GPUs and hosts
        go back, and it waits in the queue to be placed again (emulator/jobs/changes.py)."""
        self._halt(j)
        self._release(j)
        self._next_attempt(j, restart_s)
        j.status = "queued"
        self.log(f"{j.job.job_id}: stopped after {j.done_before} of {self.cfg.iterations} iterations: {why}; "
                 f"re-queued (restart cost {restart_s:.1f} s)")

    def move(self, j: JobRun, placement, restart_s: float, *, why: str) -> None:
        """SpinSearch moves running ``j`` to ``placement`` (``Scheduler.replan``, by choice): its ranks
        are ended, what they did is kept, and its new ranks start there after the restart cost, as
        those of a stopped job placed again do (emulator/jobs/changes.py)."""
        self._halt(j)
        self._hosts_back(j)
        self.sched.move(j, placement)
        self._next_attempt(j, restart_s)
        self.log(f"{j.job.job_id}: moved after {j.done_before} of {self.cfg.iterations} iterations: {why}")
        self._launch(j)

    def _halt(self, j: JobRun) -> None:
        """End ``j``'s ranks, if they started, and keep what they did (a stop or a move)."""
        if j.pending is None:
            self._end_ranks(j)
            self._collect(j)
            self._measure(j)
            j.done_before += j.iterations_done
        else:  # its ranks were waiting out a restart cost: the launch lost_s counted will not come
            j.lost_s -= max(0.0, j.launch_at - self.now())

    def _next_attempt(self, j: JobRun, restart_s: float) -> None:
        """``j``'s next ranks, not yet placed or launched, start after ``restart_s`` from now."""
        j.stopped_s, j.restart_s = self.now(), restart_s
        j.attempt, j.ranks, j.pending, j.launch_at = j.attempt + 1, [], None, None
        self._dirty = True

    def _start_due(self) -> None:
        for j in self.jobs:
            if j.pending is not None and j.launch_at <= self.now():
                specs, hosts, port = j.pending
                j.pending = None
                self._start_ranks(j, specs, hosts, port)

    def _poll_running(self) -> None:
        for j in self.jobs:
            if j.status == "running" and self._poll(j):
                self._dirty = True

    def interrupt(self) -> None:
        """Mark what is still running or queued (on Ctrl-C); measure what the ranks wrote."""
        for j in self.jobs:
            if j.status in ("queued", "running"):
                if j.status == "running":
                    with contextlib.suppress(EmulatorError):
                        self._collect(j)
                    self._measure(j)
                j.status, j.reason = "interrupted", "the run was interrupted"

    # ------------------------------------------------------------------ start
    def _view(self, link_load: dict | None = None, topology: Topology | None = None):
        """The cost model's view of the emulated network (with the run's calibration, if any): as it
        is now, or ``topology`` (the network a job was launched on)."""
        return emulated_view(topology or self.topo, self.cfg.net, link_load=link_load,
                             calibration=self.cfg.calibration)

    def _load_without(self, j: JobRun) -> dict:
        """Flows per link of the running jobs other than ``j`` (what the planner saw for ``j``)."""
        return link_load(o for o in self.sched.running if o is not j)

    def _fail(self, j: JobRun, reason: str) -> None:
        j.status, j.reason = "failed", reason
        j.end_s = self.now()
        self.log(f"{j.job.job_id}: FAILED: {reason}")

    def _launch(self, j: JobRun) -> None:
        """Start the ranks of ``j``, which the scheduler has just planned (its GPUs and hosts counted)."""
        job, plan, segments = j.job, j.plan, j.segments
        net = self.cfg.net
        view = self._view(self._load_without(j))
        if j.attempt:  # placed again after a change: its new plan on the changed network
            j.predicted_after_s, j.changed_t = predict_emulated(plan, view), self.now() + j.restart_s
            j.placed_s = j.predicted_after_s
        else:
            j.predicted_s = j.placed_s = predict_emulated(plan, view)
            j.predicted_alone_s = predict_emulated(plan, self._view())
            j.launch_topology = self.topo
        work = dataclasses.replace(plan_work(plan, view), job_id=j.files)
        specs = rank_specs(work, master_addr="0.0.0.0", master_port=0, scale=net.scale, dilation=net.dilation,
                           iterations=self.cfg.iterations - j.done_before, out_dir=str(self.rank_dir),
                           timeout_s=self.cfg.rank_timeout_s, compute=self.cfg.compute,
                           cpu_flops_per_s=self.cpu_flops_per_s)
        hosts = [self.free_hosts[w.cluster].pop(0) for w in work.ranks]
        if not j.attempt:
            j.first_segments, j.first_ranks = tuple(segments), len(specs)
        port, self.next_port = self.next_port, self.next_port + 1
        if j.stopped_s is None:
            j.start_s = self.now()
        others = [o for o in self.sched.running if o is not j]
        for o in others:
            o.overlapped.add(job.job_id)
        j.overlapped.update(o.job.job_id for o in others)
        running = sum(len(o.ranks) for o in others) + len(specs)
        self.peak_ranks = max(self.peak_ranks, running)
        where = ", ".join(f"{c}:{g}" for c, g in segments)
        j.expected_end_s = (self.now() + j.restart_s + startup_s(plan, self.topo, self.k)
                            + (self.cfg.iterations - j.done_before) * (j.predicted_after_s if j.attempt
                                                                      else j.predicted_s))
        if j.stopped_s is not None:  # placed again after a change: the ranks start after the restart cost
            j.replanned += 1
            j.launch_at = self.now() + j.restart_s
            j.lost_s += j.launch_at - j.stopped_s
            j.stopped_s = None
            j.pending = (specs, hosts, port)
            self.log(f"{job.job_id}: placed again on {where}, {len(specs)} rank(s); {describe_plan(plan)}; "
                     f"{self.cfg.iterations - j.done_before} iterations left, ranks start after the restart "
                     f"cost ({j.restart_s:.1f} s); predicted {j.predicted_after_s:.3f} s/iteration")
            return
        self._start_ranks(j, specs, hosts, port)
        self.log(f"{job.job_id}: started on {where}, {len(specs)} rank(s); {describe_plan(plan)}; "
                 f"predicted {j.predicted_s:.3f} s/iteration")

    def _start_ranks(self, j: JobRun, specs: list, hosts: list, port: int) -> None:
        job = j.job
        if self.pool is None:
            raise ValueError("ranks start from a rank pool (emulator.run.rank_pools); this runner has none")
        for spec, host in zip(specs, hosts):
            spec = RankSpec(**{**spec.__dict__, "master_addr": hosts[0].ip, "master_port": port})
            pool = self.pool.for_host(host.name)
            if pool.remote:
                self._start_remote(j, spec, host, pool)
                continue
            path = self.rank_dir / f"{j.files}-r{spec.rank}.json"
            spec.dump(path)
            for stale in (Path(spec.out), self.rank_dir / f"{j.files}-r{spec.rank}.log"):
                stale.unlink(missing_ok=True)  # a reused --out: ranks append, measurement reads all lines
            env = self._rank_env(spec, host)
            log_path = self.rank_dir / f"{j.files}-r{spec.rank}.log"
            role = f"{j.files}/r{spec.rank}"
            proc = pool.start(module="emulator.jobs.worker", args=[str(path)],
                              env={**env, MARKER_ENV: self.emu.run_id}, log_path=str(log_path),
                              ns_pid=self.emu.node(host.name).pid, nice=STARTUP_NICE, cwd=str(REPO),
                              role=f"{role}@{host.name}")
            j.ranks.append(Rank(spec=spec, host=host, proc=proc, log=log_path))
            self._launched.write(json.dumps({"job_id": job.job_id, "attempt": j.attempt, "rank": spec.rank,
                                             "pid": proc.pid, "host": host.name, "ip": host.ip,
                                             "t": self.now()}) + "\n")
        j.launched_t = self.now()

    @staticmethod
    def _rank_env(spec: RankSpec, host: HostPlan) -> dict[str, str]:
        """A rank's whole environment: ours, its host's interface and backend, the start-up nice, the repo."""
        return {**os.environ, **rank_env(host.intf, host.name, spec.backend), STARTUP_NICE_ENV: "1",
                "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}

    def _start_remote(self, j: JobRun, spec: RankSpec, host: HostPlan, pool) -> None:
        """Start a rank from the pool of its host's server: its spec travels in the request, its
        files stay there until :meth:`_collect` (a copy of the spec is kept here, as for a local rank)."""
        name = f"{j.files}-r{spec.rank}"
        there = f"{pool.files_dir}/{name}"
        spec = RankSpec(**{**spec.__dict__, "out": f"{there}.jsonl"})
        path = self.rank_dir / f"{name}.json"
        spec.dump(path)
        for stale in (self.rank_dir / f"{name}.jsonl", self.rank_dir / f"{name}.log"):
            stale.unlink(missing_ok=True)  # a reused --out: the copies come back at the job's end
        env = {**self._rank_env(spec, host), MARKER_ENV: pool.marker}
        proc = pool.start(module="emulator.jobs.worker", args=[f"{there}.json"], env=env,
                          log_path=f"{there}.log", ns_pid=self.emu.node(host.name).pid, nice=STARTUP_NICE,
                          cwd=str(REPO), role=f"{j.files}/r{spec.rank}@{host.name}",
                          files={f"{there}.json": path.read_text()}, unlink=[spec.out, f"{there}.log"])
        j.ranks.append(Rank(spec=spec, host=host, proc=proc, log=self.rank_dir / f"{name}.log", pool=pool,
                            remote_log=f"{there}.log"))
        self._launched.write(json.dumps({"job_id": j.job.job_id, "attempt": j.attempt, "rank": spec.rank,
                                         "pid": proc.pid, "server": pool.server, "host": host.name,
                                         "ip": host.ip, "t": self.now()}) + "\n")

    def _ask_sizes(self, j: JobRun) -> None:
        """The sizes of the job's remote ranks' files (the log cap; did each reach its rendezvous); at
        most every ``COPY_EVERY_S``, what their JSON lines gained is appended to the copies here, so a
        crash of this server leaves in ``ranks/`` what they wrote until then, as a local rank's does."""
        log = lambda msg: self.log(f"{j.job.job_id}: {msg}")  # noqa: E731
        ask_sizes(j.ranks, log=log)
        if time.monotonic() - j.copied_at >= COPY_EVERY_S:
            j.copied_at = time.monotonic()
            copy_lines(j.ranks, self.rank_dir, prefix=j.files, log=log)

    def _collect(self, j: JobRun) -> None:
        """The job's remote ranks' JSON lines and logs, copied into ``ranks/`` here: what measurement,
        failure reasons and the run's results read."""
        collect(j.ranks, self.rank_dir, prefix=j.files, max_log_bytes=RANK_LOG_CAP_BYTES + 2**20,
                log=lambda msg: self.log(f"{j.job.job_id}: {msg}"))

    # ------------------------------------------------------------------ progress and end
    def _poll(self, j: JobRun) -> bool:
        """True when the job ended (ok or failed) in this poll."""
        if j.pending is not None:  # placed again, paying its restart cost: no ranks yet
            return False
        j.collect_exits()
        self._ask_sizes(j)
        bad = [r for r in j.ranks if r.exit not in (None, 0)]
        timed_out = self.now() - j.launched_t > self.cfg.job_timeout_s  # both real-equivalent
        flooded = next((r for r in j.ranks if r.log_bytes() > RANK_LOG_CAP_BYTES), None)
        if not bad and not timed_out and not flooded and any(r.exit is None for r in j.ranks):
            return False
        if bad and self.pool is not None:
            self.pool.check()  # ranks that died with their pool: the run stops here, not the job alone
        if bad and not flooded:
            bad = self._settle(j)
        absent = self._not_joined(j, timed_out) if bad or timed_out else []
        if bad or timed_out or flooded:
            self._end_ranks(j)
        self._collect(j)
        self._measure(j)
        self._predict_shared(j)
        self._release(j, ended_s=self.now())  # (its end_s is set below, with its status)
        if flooded:
            self._cut_log(flooded)
            self._fail(j, f"rank {flooded.spec.rank} on {flooded.host.name} wrote over "
                          f"{RANK_LOG_CAP_BYTES / 2**20:g} MiB to its log {flooded.log.name} (the cap per rank "
                          "log, RANK_LOG_CAP_BYTES); its job was ended and the log cut to the cap")
        elif absent:
            who = ", ".join(f"rank {r.spec.rank} on {r.host.name}" for r in absent)
            why = (f"the job hit --job-timeout ({self.cfg.job_timeout_s:g} s)" if timed_out else
                   "its other ranks gave up at their process-group timeout")
            self._fail(j, f"{who} never joined the job's process group (did not reach the rendezvous "
                          f"in {self._wall_since_launch(j):.0f} s wall; {why})")
        elif bad:
            self._fail(j, self._reason(j, self._cause(bad)))
        elif timed_out:
            self._fail(j, f"still running after {self.cfg.job_timeout_s:g} s (--job-timeout)")
        else:
            j.status, j.end_s = "ok", self.now()
            m = j.measured_s
            self.log(f"{j.job.job_id}: done; measured {m:.3f} s/iteration vs predicted {j.predicted_s:.3f} "
                     f"({j.error_pct:+.1f}%)" if m else f"{j.job.job_id}: done, nothing measured")
        return True

    def _settle(self, j: JobRun) -> list[Rank]:
        """The failed ranks once the first failure's echoes are in.

        A rank that dies takes its peers down within moments (their gloo pairs
        close), and exit statuses arrive in any order: from the pool server's
        reports or from one poll over all ranks. Waiting briefly for the rest
        lets ``_cause`` see the rank that failed first rather than the first in
        rank order."""
        deadline = time.monotonic() + SETTLE_S
        while True:
            j.collect_exits()
            if all(r.exit is not None for r in j.ranks) or time.monotonic() >= deadline:
                return [r for r in j.ranks if r.exit not in (None, 0)]
            time.sleep(0.05)

    def _wall_since_launch(self, j: JobRun) -> float:
        return time.monotonic() - (self.t0 + j.launched_t * self.k)

    def _not_joined(self, j: JobRun, timed_out: bool) -> list[Rank]:
        """Live ranks that never reached their rendezvous (no JSON lines file yet, see
        :mod:`emulator.jobs.worker`), if that is what failed the job: it timed out, or the ranks that
        did reach it have waited out their process-group timeout (``spec.timeout_s``, wall)."""
        absent = [r for r in j.ranks if r.exit is None and not r.joined()]
        if absent and (timed_out or self._wall_since_launch(j) >= min(r.spec.timeout_s for r in j.ranks)):
            return absent
        return []

    @staticmethod
    def _cut_log(r: Rank) -> None:
        """Cut a flooded rank log back to the cap (its writer is ended), with a note at the end."""
        with open(r.log, "r+b") as fh:
            fh.truncate(RANK_LOG_CAP_BYTES)
            fh.seek(RANK_LOG_CAP_BYTES)
            fh.write(f"\n[emulator: log cut at {RANK_LOG_CAP_BYTES / 2**20:g} MiB; the rank wrote more "
                     "and its job was ended]\n".encode())

    @staticmethod
    def _cause(bad: list[Rank]) -> Rank:
        """The rank to blame: one killed by a signal (we send none before this
        point), else the first in rank order. A rank whose peer vanished fails
        with gloo's "Connection closed by peer", so it is an echo, not a cause."""
        return next((r for r in bad if r.exit < 0), bad[0])

    def _reason(self, j: JobRun, r: Rank) -> str:
        where = f"rank {r.spec.rank} on {r.host.name}"
        if r.exit is not None and r.exit < 0:
            return f"{where} {how_it_ended(r.exit)}"
        for line in reversed(self._lines(j.files, r.spec.rank)):
            if line.get("event") == "failed":
                return f"{where} failed: {line.get('reason')}"
        log = self.rank_dir / f"{j.files}-r{r.spec.rank}.log"
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] if log.exists() else []
        return f"{where} exited with status {r.exit}" + (f": {tail[0][:200]}" if tail else "")

    def _end_ranks(self, j: JobRun) -> None:
        """End the job's live ranks (each its own session: ``mnexec -d``), SIGTERM then SIGKILL."""
        live = [r for r in j.ranks if r.proc.poll() is None]
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for r in live:
                try:
                    if r.pool is not None:  # another machine's pid: its pool's server signals it
                        r.proc.killpg(sig)
                    else:
                        os.killpg(r.proc.pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + 3.0
            for r in live:
                try:
                    r.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
            live = [r for r in live if r.proc.poll() is None]
            if not live:
                break
        j.collect_exits()

    def _predict_shared(self, j: JobRun) -> None:
        """The prediction with the link load of every job that overlapped this one (an upper bound
        on the sharing it saw: the planner only knew the jobs running at its launch)."""
        if j.attempt:  # its plan now is not the one its first intervals ran
            return
        load = link_load(o for o in self.jobs if o.job.job_id in j.overlapped)
        j.predicted_shared_s = predict_emulated(j.plan, self._view(load, j.launch_topology))

    def _release(self, j: JobRun, ended_s: float | None = None) -> None:
        self.sched.release(j, ended_s)
        if self.changes is not None:
            self.changes.released()
        self._hosts_back(j)

    def _hosts_back(self, j: JobRun) -> None:
        """``j``'s hosts are free again: its ranks', or those its ranks waiting for the restart cost hold."""
        for host in [r.host for r in j.ranks] if j.pending is None else j.pending[1]:
            self.free_hosts[host.cluster].append(host)
        for hs in self.free_hosts.values():
            hs.sort(key=lambda h: h.index)

    def _lines(self, job_id: str, rank: int) -> list[dict]:
        return read_lines(self.rank_dir / f"{job_id}-r{rank}.jsonl")

    def _stamps(self, j: JobRun) -> tuple[list[float], dict[int, list[float]]]:
        """Every rank's ``start`` stamps and, per iteration, its ranks' ends so far, on this machine's
        clock (:func:`rank_ends`); an iteration is complete when every rank has ended it."""
        ends: dict[int, list[float]] = {}
        starts = []
        for r in j.ranks:
            rank_starts, rank_it = rank_ends(self._lines(j.files, r.spec.rank), r.clock_offset_ns)
            starts += rank_starts
            for it, end in rank_it:
                ends.setdefault(it, []).append(end)
        return starts, ends

    def _measure(self, j: JobRun) -> None:
        """Iteration intervals after warm-up (wall / K), from every rank's JSON lines (absolute
        monotonic times), and the job's start-up: its launch to its earliest ``start`` line."""
        starts, ends = self._stamps(j)
        if starts and j.start_s is not None and j.attempt == 0:
            j.startup_wall_s = max(0.0, min(starts) - (self.t0 + j.start_s * self.k))
        complete = sorted(it for it, v in ends.items() if len(v) == len(j.ranks))
        last = {it: max(ends[it]) for it in complete}
        j.iterations_done = len(complete)
        if j.attempt == 0:  # a later attempt's intervals are all after a change (below)
            first = math.inf if j.first_changed_t is None else self.t0 + j.first_changed_t * self.k
            measured = [it for it in complete if it >= max(1, self.cfg.warmup) and it - 1 in last and last[it] < first]
            j.iteration_s = [(last[it] - last[it - 1]) / self.k for it in measured]
            if measured:
                self.steal.sample()  # now, after the last of them
                stolen = self.steal.share(last[measured[0] - 1], last[measured[-1]])
                j.host_steal_pct = None if stolen is None else 100 * stolen
        if j.changed_t is not None:  # intervals that began once the last change was in force
            changed = self.t0 + j.changed_t * self.k
            j.iteration_after_s = [(last[it] - last[it - 1]) / self.k for it in complete
                                   if it >= 1 and it - 1 in last and last[it - 1] >= changed]
