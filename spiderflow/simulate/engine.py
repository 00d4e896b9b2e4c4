"""Discrete-event trace replay: queue, place, share the WAN, complete.

Events (a deterministic heap, :mod:`spiderflow.simulate.events`): job
arrivals and job completions. After every event:

1. running jobs advance: ``remaining -= elapsed / iteration_s``;
2. the queue is scheduled by the shared :class:`~spiderflow.scheduling.Scheduler`
   (the emulator's replay drives the same one): queue policy, placement and
   planning against the free GPUs and the link load, rejection with a reason.
   The planner's wall time is the job's *scheduling overhead*, added to its
   start with ``charge_overhead`` (as the paper does; x ``overhead_scale``).
   The scheduler decides one job at a time, as one scheduler process does:
   with ``charge_overhead`` a decision starts when the one before it ended,
   so a slow planner also delays the jobs queued behind the one it plans;
   a job then needs ``startup_s`` before its first iteration (0 by default;
   a simulation of an emulator replay sets its ranks' start-up allowance);
3. if the set of running jobs changed, the WAN is re-shared max-min fairly
   among all running jobs' flows (:mod:`spiderflow.simulate.flows`), each
   affected job's iteration time is recomputed from its shares with the cost
   model's closed form (within 2% of the exact schedule on all but 7 of 1,494
   SpinSearch plans, 5.5% at worst: benchmarks/results/estimate_gap.md), and
   its completion event is moved (progress-based completion).

Jobs are planned on ``topology``; their iterations are priced on
``SimConfig.priced_topology`` when given (the emulator's network, whose
intra-cluster links are capped) and on ``topology`` otherwise; with
``SimConfig.exact`` by the cost model's exact schedule (what the emulator's
predictions use) instead of its closed form.

With ``SimConfig.wan_events`` / ``capacity_events`` the network and the GPU pool change during the
replay (:mod:`spiderflow.simulate.changes`, docs/wan-events.md): each change is an event applied
after the arrivals and completions of its instant; a job stopped by one keeps its progress, pays a
restart cost and is re-planned through the same scheduler. Without them nothing of this runs.
"""

from __future__ import annotations

import gc
import math
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from spiderflow.costmodel import (NO_CALIBRATION, Calibration, Repricer, TopologyView, estimate_memo,
                                  estimate_repriced, predict, repricer)
from spiderflow.placement.base import Strategy, shared_view
from spiderflow.plan import Plan
from spiderflow.scheduling import DEFAULT_TIME_LIMIT_S, JobRecord, Scheduler, SchedulerConfig, link_load
from spiderflow.simulate.changes import CHECKPOINT_LOAD_GBPS, CHECKPOINT_SAVE_GBPS, REPLAN_THRESHOLD, Changes
from spiderflow.simulate.events import EventQueue
from spiderflow.simulate.fairshare import max_min_fair_share
from spiderflow.topology import Topology
from spiderflow.wan import CapacityEvent, WanEvent
from spiderflow.workload import Job

ARRIVAL, COMPLETION, CHANGE = 0, 1, 2  # event priorities at one instant: a change applies last


@dataclass(kw_only=True, eq=False)
class SimRecord(JobRecord):
    """A job's record plus the simulator's progress state."""

    alone_iteration_s: float | None = None
    iteration_s: float | None = None
    remaining: float = 0.0
    updated_s: float = 0.0
    token: int | None = None
    shares: tuple = ()
    shared_iteration_s: float | None = None
    shared_estimates: dict = field(default_factory=dict, repr=False)  # shares -> iteration_s
    pricer: Repricer | None = field(default=None, repr=False)  # re-prices its plan as its shares move
    # a changing network (spiderflow.simulate.changes): re-plans, re-routes, time lost to them
    replanned: int = 0  # times the job was placed again after being stopped or moved
    rerouted: int = 0  # times its traffic took other routes because a link it used went down
    lost_s: float = 0.0  # sum over its stops of (iterations resumed - stopped): queue, restart cost, start-up
    stopped_s: float | None = None  # when a change stopped it (until it starts again)
    restart_s: float = 0.0  # the restart cost it pays at its next start
    restart_until_s: float = 0.0  # when the restart cost of its latest start is paid (the cost of a move before)
    iterating_s: float = 0.0  # when its iterations begin after its latest start (restart cost and start-up paid)
    placed_iteration_s: float | None = None  # its iteration time when (re)placed (re-planning threshold)
    # with SimConfig.record_paces: (from when, seconds per iteration) as they changed, and when a change
    # first reached it (a WAN change while it ran, a stop or a move): iteration_times
    paces: list[tuple[float, float]] = field(default_factory=list, repr=False)
    first_changed_s: float | None = None

    def iteration_times(self) -> list[float]:
        """Its iterations' durations in order (the first from its first iteration's start), from
        :attr:`paces`, up to the first change that reached it: the intervals ``emulator run``
        measures of a job (docs/emulator-run.md), so that a simulated replay's figure can be the
        same statistic. Empty without ``SimConfig.record_paces``."""
        until = self.first_changed_s if self.first_changed_s is not None else self.end_s
        if until is None or not self.paces:
            return []
        ends: list[float] = []
        done = 0.0  # iterations done, fractional
        bounds = [at for at, _ in self.paces[1:]] + [until]
        for (at, pace), stop in zip(self.paces, bounds):
            stop = min(stop, until)
            if stop <= at:
                continue
            while (end := at + (math.floor(done) + 1 - done) * pace) <= stop * (1 + 1e-9):
                ends.append(end)
                at, done = end, math.floor(done) + 1.0
            done += (stop - at) / pace
        first = self.paces[0][0]
        return [b - a for a, b in zip([first, *ends], ends)]


def startup_seconds(startup: float | Callable[[Plan], float], plan: Plan) -> float:
    """A start-up given as seconds, or as a function of the plan (``SimConfig.startup_s``), for ``plan``."""
    return startup(plan) if callable(startup) else startup


@dataclass(frozen=True, kw_only=True)
class SimConfig:
    planner: str | Strategy = "spinsearch"
    backfill: bool = False
    charge_overhead: bool = False
    overhead_scale: float = 1.0  # charged overhead x this (1 / the dilation when replaying an emulator run)
    # from a job's start to its first iteration: seconds, or a function of its plan
    startup_s: float | Callable[[Plan], float] = 0.0
    calibration: Calibration = NO_CALIBRATION
    seed: int = 0
    time_limit_s: float = DEFAULT_TIME_LIMIT_S
    search_budget: int | None = None
    wait: bool = True  # SpinSearch's topology-aware admission (spiderflow.scheduling)
    hosts_per_cluster: dict[str, int] | None = None  # emulated hosts: one per rank (Scheduler)
    priced_topology: Topology | None = None
    # price iterations with the cost model's exact 1F1B schedule (as the emulator's predictions are)
    # instead of its closed form (faster; within a few % of it)
    exact: bool = False
    # a changing network (docs/wan-events.md); empty: a static one, and the run is as without them
    wan_events: tuple[WanEvent, ...] = ()
    capacity_events: tuple[CapacityEvent, ...] = ()
    replan: bool = True  # SpinSearch may move a job a change slowed, or placed while impaired (--no-replan)
    replan_threshold: float = REPLAN_THRESHOLD  # ... when its iteration time grew past this multiple
    checkpoint_save_gbps: float = CHECKPOINT_SAVE_GBPS  # restart cost (changes.restart_cost_s)
    checkpoint_load_gbps: float = CHECKPOINT_LOAD_GBPS
    record_paces: bool = False  # keep each job's paces (SimRecord.iteration_times; memory grows with the run)

    @property
    def scheduler(self) -> SchedulerConfig:
        return SchedulerConfig(planner=self.planner, backfill=self.backfill, seed=self.seed,
                               time_limit_s=self.time_limit_s, search_budget=self.search_budget,
                               calibration=self.calibration, wait=self.wait)


class Simulation:
    def __init__(self, topology: Topology, jobs: Sequence[Job], config: SimConfig,
                 progress: Callable[[int], None] | None = None) -> None:
        self.topo, self.cfg, self.progress = topology, config, progress
        self.priced = config.priced_topology or topology
        self.records = [SimRecord(job=j, arrival_s=j.arrival_s) for j in jobs]
        self.sched = Scheduler(topology, config.scheduler, config.hosts_per_cluster)
        self.queue: list[SimRecord] = []
        self.events: EventQueue[tuple[int, SimRecord]] = EventQueue()
        self.capacity = {l.key: l.bandwidth_gbps for l in self.priced.links}
        self.flows_changed = False  # a job with WAN flows started or ended since the last reshare
        self.decider_free_s = 0.0  # with charge_overhead: when the scheduler's last decision ended
        self.decider_s = 0.0  # the scheduler's clock during a pass
        self.changes = Changes(self) if config.wan_events or config.capacity_events else None

    @property
    def running(self) -> list[SimRecord]:
        return self.sched.running

    def run(self) -> list[SimRecord]:
        with few_full_collections():
            return self._run()

    def _run(self) -> list[SimRecord]:
        for rec in self.records:
            self.events.push(rec.arrival_s, (ARRIVAL, rec), priority=ARRIVAL)
        if self.changes:
            self.changes.push_all(self.events, CHANGE)
        while self.events:
            ev = self.events.pop()
            now = ev.time_s
            kind, rec = ev.payload
            self._advance(now)
            changed = False
            if kind == ARRIVAL:
                self.queue.append(rec)
            elif kind == COMPLETION:
                self._finish(rec, now)
                changed = True
            else:
                changed = self.changes.apply(kind, rec, now)
            changed |= self._schedule(now)
            if changed:
                self._reshare(now)
            if self.changes and self.changes.replan(kind, now):
                self._schedule(now)  # the GPUs a move left go to the queue now, as the emulator's next pass has them
                self._reshare(now)
        return self.records

    def _advance(self, now: float) -> None:
        for rec in self.running:
            if now > rec.updated_s:  # a start delayed by charged overhead makes no progress before it
                rec.remaining -= (now - rec.updated_s) / rec.iteration_s
                rec.updated_s = now

    def _finish(self, rec: SimRecord, now: float) -> None:
        rec.status, rec.end_s, rec.remaining = "done", now, 0.0
        self.sched.release(rec)
        if self.changes:
            self.changes.pool.settle(self.sched.free)  # GPUs announced as withdrawn go first
        self.flows_changed |= bool(rec.routes)
        rec.pricer, rec.shared_estimates = None, {}  # only needed while it runs
        if self.progress:
            self.progress(1)

    def _schedule(self, now: float) -> bool:
        """One scheduling pass. With ``charge_overhead`` the scheduler has a clock of its own: each
        decision takes the planner's time (x ``overhead_scale``) after the one before, a job starts
        when its decision ends, and the pass stops once that clock passes the next event (the
        jobs not yet decided are decided after it, as a scheduler busy planning sees a completion
        only once it is done with the decision at hand)."""
        charge, scale = self.cfg.charge_overhead, self.cfg.overhead_scale
        self.decider_s = max(now, self.decider_free_s) if charge else now
        started: list[tuple[SimRecord, float]] = []
        admits = self.sched.cfg.admits

        def decided(rec: SimRecord, spent: float) -> None:
            if charge:
                self.decider_s += spent * scale
            if rec.status == "running":
                started.append((rec, self.decider_s))
                if admits:  # the pass's later decisions may wait for it
                    rec.expected_end_s = self._expected_end(rec, self.decider_s)

        def stop() -> bool:
            upcoming = self.events.peek_time()
            return charge and upcoming is not None and self.decider_s > upcoming

        changed = self.sched.schedule(self.queue, self.decider_s, on_decided=decided, stop=stop)
        if charge:
            self.decider_free_s = self.decider_s
        for rec in changed:
            self.queue.remove(rec)
            if rec.status == "rejected" and self.progress:
                self.progress(1)
        for rec, start_s in started:
            self._start(rec, start_s)
        return bool(started)

    def _expected_end(self, rec: SimRecord, start_s: float) -> float:
        """When ``rec``, started at ``start_s`` in the pass under way, is expected to end, until the
        pass is over and the WAN's shares price it (:meth:`_reshare`): after its start-up (and
        restart cost), its iterations at its plan's price under the other running jobs' link load,
        as the emulator expects of a job it launches. Admission's later decisions in the pass can
        then wait for it; before, such a job had no expected end until the pass was over, so they
        could not (a simulated replay of paper8-16 started a 20-GPU job at once on two slower
        clusters, 13.6 s, where the emulated one waited for the job started just before it on the
        cluster it wanted, 8.7 s)."""
        cfg = self.cfg
        delay, remaining = self.startup_of(rec.plan), float(rec.job.iterations)
        if rec.stopped_s is not None:  # placed again after a change: progress kept, the restart cost first
            delay, remaining = delay + rec.restart_s, rec.remaining
        view = shared_view(self.priced, cfg.calibration, link_load(r for r in self.running if r is not rec))
        iteration = (predict(rec.plan, view, check_memory=False).iteration_s if cfg.exact
                     else estimate_memo(rec.plan, view))
        return start_s + delay + remaining * iteration

    def startup_of(self, plan: Plan) -> float:
        """Seconds from a job's start on ``plan`` to its first iteration (``SimConfig.startup_s``)."""
        return startup_seconds(self.cfg.startup_s, plan)

    def _start(self, rec: SimRecord, start_s: float) -> None:
        """``rec`` was planned; it starts at ``start_s`` (its decision's end, see _schedule)."""
        cfg = self.cfg
        delay = self.startup_of(rec.plan)
        if rec.stopped_s is None:
            rec.start_s = start_s
            rec.remaining = float(rec.job.iterations)
        else:  # a restart after a change: progress kept, the restart cost paid first
            delay += rec.restart_s
            rec.restart_until_s = start_s + rec.restart_s
            rec.replanned += 1
            rec.lost_s += start_s + delay - rec.stopped_s
            rec.stopped_s, rec.restart_s, rec.placed_iteration_s = None, 0.0, None
        self.flows_changed |= bool(rec.routes)
        alone = TopologyView(topology=self.priced, calibration=cfg.calibration)
        rec.pricer = self._repricer(rec.plan, alone)  # fixed for the job's run; re-prices it as its shares move
        rec.alone_iteration_s = self._price(rec, alone)
        rec.iteration_s = None
        rec.updated_s = rec.iterating_s = start_s + delay

    def _reshare(self, now: float) -> None:
        if not self.flows_changed:
            # Only jobs without WAN flows came or went: every running job's shares, hence its
            # iteration time, are what they were; only the newly started ones need their completion.
            for rec in self.running:
                if rec.token is None:  # started now, and without flows (else flows changed)
                    self._set_iteration(rec, rec.alone_iteration_s, now)
            return
        self.flows_changed = False
        flows = {(id(rec), i): route for rec in self.running for i, route in enumerate(rec.routes)}
        rates = max_min_fair_share(self.capacity, flows) if flows else {}
        total: Counter = Counter()
        own: dict[int, Counter] = {id(rec): Counter() for rec in self.running}
        for (job, i), route in flows.items():
            for key in route:
                total[key] += rates[(job, i)]
                own[job][key] += rates[(job, i)]
        for rec in self.running:
            if rec.routes:
                # What the other jobs' max-min rates leave of each link: alone, a job has every
                # link whole (its own transfers take turns, as the cost model's schedule has them).
                per_link = {key: self.capacity[key] - (total[key] - own[id(rec)][key])
                            for key in own[id(rec)]}
                shares = tuple(sorted(per_link.items()))
                if shares != rec.shares:  # re-estimate only when this job's shares moved
                    known = rec.shared_estimates.get(shares)  # shares seen before: same estimate
                    if known is None:
                        view = TopologyView(topology=self.priced, calibration=self.cfg.calibration,
                                            link_gbps=dict(per_link))
                        known = rec.shared_estimates[shares] = self._price(rec, view)
                    rec.shares, rec.shared_iteration_s = shares, known
                iteration = rec.shared_iteration_s
            else:
                iteration = rec.alone_iteration_s
            self._set_iteration(rec, iteration, now)

    def _repricer(self, plan: Plan, view: TopologyView) -> Repricer | None:
        """What re-prices ``plan`` as its shares move; none in exact mode, which predicts it instead."""
        return None if self.cfg.exact else repricer(plan, view)

    def _price(self, rec: SimRecord, view: TopologyView) -> float:
        if self.cfg.exact:
            return predict(rec.plan, view, check_memory=False).iteration_s
        return estimate_repriced(rec.pricer, rec.plan, view)

    def _set_iteration(self, rec: SimRecord, iteration: float, now: float) -> None:
        """Move ``rec``'s completion to match ``iteration`` (seconds per iteration from now on)."""
        if iteration == rec.iteration_s and rec.token is not None:
            return
        if rec.token is not None:
            self.events.cancel(rec.token)
        rec.updated_s = max(rec.updated_s, now)
        rec.iteration_s = iteration
        if self.cfg.record_paces:
            rec.paces.append((rec.updated_s, iteration))
        if rec.placed_iteration_s is None:
            rec.placed_iteration_s = iteration
        rec.expected_end_s = rec.updated_s + rec.remaining * iteration
        rec.token = self.events.push(rec.expected_end_s, (COMPLETION, rec), priority=COMPLETION)


    def stop(self, rec: SimRecord, now: float, restart_s: float) -> None:
        """A change stops running ``rec``: it keeps its progress, gives its GPUs back and waits in
        the queue (in arrival order) to be placed again, paying ``restart_s`` when it starts."""
        self.sched.release(rec)
        if rec.token is not None:
            self.events.cancel(rec.token)
        self._resume_cancelled(rec, now)
        self.changed(rec, now)
        self.flows_changed |= bool(rec.routes)
        rec.status, rec.stopped_s, rec.restart_s = "queued", now, restart_s
        rec.token = rec.iteration_s = rec.expected_end_s = None
        rec.shares, rec.shared_estimates, rec.pricer, rec.routes = (), {}, None, []
        at = next((i for i, q in enumerate(self.queue) if q.arrival_s > rec.arrival_s), len(self.queue))
        self.queue.insert(at, rec)

    def moved(self, rec: SimRecord, now: float, restart_s: float) -> None:
        """``rec`` was moved to a new plan (Scheduler.move) at ``now``: it restarts there."""
        if rec.token is not None:
            self.events.cancel(rec.token)
        self._resume_cancelled(rec, now)
        self.changed(rec, now)
        self.flows_changed = True
        rec.stopped_s, rec.restart_s, rec.token = now, restart_s, None
        rec.shares, rec.shared_estimates = (), {}
        self._start(rec, now)

    def changed(self, rec: SimRecord, now: float) -> None:
        """A change reached running ``rec`` at ``now`` (a WAN change, a stop or a move): its
        :meth:`SimRecord.iteration_times` end there, so what it runs after needs no pace of its own."""
        if self.cfg.record_paces and rec.first_changed_s is None:
            rec.first_changed_s = now

    @staticmethod
    def _resume_cancelled(rec: SimRecord, now: float) -> None:
        """``rec`` is stopped or moved at ``now``: if that is before the first iteration of its latest
        restart, the resume its ``lost_s`` counted (at its placement) does not come; only the time up to
        now is lost to that stop (the next placement counts from now)."""
        if rec.replanned and now < rec.updated_s:
            rec.lost_s -= rec.updated_s - now


FULL_COLLECTION_EVERY = 1_000  # collections of the middle generation between full ones, at most


@contextmanager
def few_full_collections() -> Iterator[None]:
    """Python's full (oldest-generation) garbage collections made rare while a replay runs.

    A replay keeps growing a large heap (the planners' memos, every job's record and plan) and
    turns much of it over (each running job's re-pricing figures, the memos' evictions); the
    default thresholds then run a full collection, which walks the whole heap, whenever a quarter
    of it is new: 27 of them took 4.7 s in a 10,000-job 64-cluster replay (``simulator_speed.py
    --no-wait``, about 8% of its CPU); with at most one per 1,000 middle-generation collections it
    ran two (0.4 s), at the same peak memory (its garbage is freed by reference counting, and the
    young generations still collect its short-lived cycles). The thresholds are restored after.
    """
    old = gc.get_threshold()
    gc.set_threshold(old[0], old[1], max(old[2], FULL_COLLECTION_EVERY))
    try:
        yield
    finally:
        gc.set_threshold(*old)


def simulate(topology: Topology, jobs: Sequence[Job], config: SimConfig,
             progress: Callable[[int], None] | None = None) -> list[SimRecord]:
    return Simulation(topology, jobs, config, progress).run()
