"""The one scheduler both replays drive: the simulator's event loop and the emulator's rank pool.

Pure bookkeeping and decisions, no clock of its own: the driver hands it the
jobs that have arrived and are queued, in arrival order, with its own time,
whenever something changed (an arrival, a completion), and runs the jobs it
starts (:meth:`Scheduler.schedule`: decisions one at a time, with hooks between
them). It releases a job's GPUs and hosts when the driver says it stopped.

- Queue policy: FIFO (default): the first job that cannot start blocks the
  ones behind it; with ``backfill`` a later job may start when an earlier
  one cannot (first fit, no reservation). With admission (below), a job too
  big for the GPUs free now does not block: it reserves the GPUs it is
  expected to get (EASY backfill, below).
- A job may start when its GPUs are free somewhere: the planner
  (:data:`spiderflow.placement.PLANNERS` by name, or any strategy, e.g.
  :func:`fixed_plan`) places and plans it against the free GPUs per cluster
  and the link load (WAN routes of the running jobs, one per flow), with
  the configured seed, ILP time limit and search budget. Its wall time is
  the job's scheduling overhead (summed over attempts).
- With ``hosts_per_cluster`` (the emulator, and a simulation of an emulator
  replay) each rank of the plan (:func:`ranks_needed`) also needs a free
  host in its cluster: the job waits for them.
- A job is rejected, with its reason, when no empty topology could host it:
  more GPUs than the topology has, no plan fitting memory on the empty
  topology, or more ranks in a cluster than it has hosts.
- Topology-aware admission (``wait``, SpinSearch only; the baselines start
  at once, as their published systems do): before starting a job on what is
  free now, the scheduler also plans it on what will be free when running
  jobs end (their expected ends, which the driver keeps in
  ``expected_end_s``: the simulator's completion events, the emulator's
  predictions; both set it as a job starts, so the decisions after it in
  the same pass can wait for it), at the next :data:`LOOKAHEAD` distinct end times (and at the
  end it chose to wait for before, while those jobs run, and at the first end
  from which the GPUs of its plan with the whole topology are all free), and waits
  when one of those costs less by more than :data:`WAIT_MARGIN` of its run time
  now. An option's cost is when it finishes the job plus its run time weighted
  by the other jobs queued behind it: ``finish + q * gpus / G * run`` for q
  other queued jobs, a job of ``gpus`` GPUs and G GPUs in the topology. A plan
  that holds the job's GPUs longer takes ``gpus * (extra run)`` GPU-seconds
  from the queue, about ``gpus / G * (extra run)`` of delay to each queued job;
  with nobody queued the cost is the job's own finish. (Without that weight a
  big job on a deep queue started at once on scattered GPUs that finished it a
  little sooner than waiting, and held them 1.5x as long: the jobs behind it
  queued longer; 1,000-job 64-cluster traces, simulator_speed.md.) Its plan
  with the whole topology to itself (once per job and topology) bounds what
  waiting can buy: a job already that fast now starts at once, and the
  look-ahead stops at the first end from which even that plan could not cost
  less. A waiting job reserves the GPUs of that placement: a
  later job may start meanwhile (it does not block the queue) unless it would
  still hold GPUs the reservation needs at its time. A waiting job keeps its
  decision, unplanned, until what it waits for happens: the time it expects
  to start comes, the network changes, the reserved GPUs are no longer
  expected free, or one of the jobs it waits for ends other than as weighed.
  An end it weighed as a start time and passed over by more than the margin
  leaves the decision standing when met within :data:`END_SLACK` of its wait,
  with no more GPUs free and no link lighter than it weighed there, no link
  heavier at its own start than it weighed, and that option still dearer by
  the margin under the queue's weight now (a decision then would weigh the
  same options); any other end of a job it waits for decides it again.
  A job that wants more GPUs than are free
  reserves, unplanned, the GPUs of its plan with the whole topology from the
  first expected end that frees them all, and waits so, instead of holding
  the queue until enough GPUs are free (EASY backfill, Lifka 1995, with
  topology-aware reservations: in the golden 40-job paper8 replay an 8-GPU
  job had queued 11 days behind such a head; on 1,000-job 64-cluster traces
  avg JCT 0.64-0.82x, worse on none of 30). Each decision and its reason is
  kept in the record's ``admission``.
- SpinSearch's answers are memoised per scheduler on the job's shape and the
  state asked about (topology, free GPUs, link load): admission asks about the
  same states again and again, and a hit costs no planner time (the baselines,
  time-limited or randomised, are always asked). A hit's plan is that of the job
  first asked about (the same plan and estimate), the job's own once it starts.

- A changing network (the simulator's WAN and capacity events, docs/wan-events.md):
  :meth:`Scheduler.set_network` swaps in the topology with the links' current
  figures; a plan whose routes cross a link that is down is refused
  (:class:`RouteDown`: the job waits), and while ``impaired`` (a link down or
  GPUs withdrawn) a job that fits nowhere waits instead of being rejected,
  since the full topology may host it again. :meth:`Scheduler.replan` and
  :meth:`Scheduler.move` re-plan a running job on its own GPUs plus the free ones.

Defaults (:class:`SchedulerConfig`) are the same in ``spiderflow simulate``,
``compare``, ``emulator run`` and ``emulator compare``.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import chain

from spiderflow.costmodel import NO_CALIBRATION, Calibration, estimate, estimate_memo
from spiderflow.errors import InfeasiblePlan
from spiderflow.placement import PLANNERS, Placement, PlacementRequest
from spiderflow.placement.base import Strategy, shared_view
from spiderflow.plan import Plan, placement_text
from spiderflow.simulate.flows import plan_routes
from spiderflow.topology import Topology
from spiderflow.workload import Job

DEFAULT_TIME_LIMIT_S = 10.0  # ILP solver limit per decision (the planner library's own default is 60 s)
LOOKAHEAD = 3  # expected end times of running jobs a waiting decision looks at
WAIT_MARGIN = 0.05  # wait only when that costs less by more than this share of its run now
END_SLACK = 0.05  # a weighed end met within this share of the wait leaves a waiting decision standing
ADMITTING = ("spinsearch",)  # planners that decide between starting now and waiting
DETERMINISTIC = ("spinsearch",)  # planners whose answer is a function of the request (memoised per state)
MEMO_SIZE = 4096  # planner answers kept per scheduler (LRU)


@dataclass(frozen=True, kw_only=True)
class SchedulerConfig:
    planner: str | Strategy = "spinsearch"  # a name in PLANNERS, or a strategy (fixed_plan)
    backfill: bool = False
    seed: int = 0
    time_limit_s: float = DEFAULT_TIME_LIMIT_S
    search_budget: int | None = None  # genetic trials per decision; None: the planner's default
    calibration: Calibration = NO_CALIBRATION
    wait: bool = True  # topology-aware admission (module docstring); only SpinSearch uses it

    @property
    def admits(self) -> bool:
        return self.wait and self.planner in ADMITTING

    @property
    def planner_name(self) -> str:
        return self.planner if isinstance(self.planner, str) else getattr(self.planner, "name", "fixed")

    def __post_init__(self) -> None:
        if isinstance(self.planner, str) and self.planner not in PLANNERS:
            raise ValueError(f"unknown planner {self.planner!r}; known: {', '.join(PLANNERS)}")


@dataclass(kw_only=True, eq=False)
class JobRecord:
    """One job of a replay. ``arrival_s`` is the replay's clock (the trace's, or the emulator's
    compressed one); ``start_s``/``end_s`` are set by the driver that runs the job. A record is
    itself alone (``eq=False``: compared and hashed by identity): queues and the running list
    remove a record by it, where field-by-field equality cost a Python call per record passed
    (0.7% of a 10,000-job replay at load 0.9)."""

    job: Job
    arrival_s: float
    status: str = "queued"  # queued | running | done | rejected (the emulator ends jobs ok | failed | interrupted)
    reason: str = ""
    overhead_s: float = 0.0  # planner wall time, every attempt
    overhead_cpu_s: float = 0.0  # the CPU time of those calls (less than the wall time on a busy machine)
    placement: dict[str, int] = field(default_factory=dict)  # GPUs per cluster
    segments: tuple = ()  # the planner's (cluster, GPUs) in its order
    plan: Plan | None = None
    routes: list = field(default_factory=list)  # the plan's WAN flows, each a list of link keys
    hosts: dict[str, int] = field(default_factory=dict)  # hosts taken per cluster (with hosts_per_cluster)
    start_s: float | None = None
    end_s: float | None = None
    expected_end_s: float | None = None  # kept by the driver while the job runs (admission)
    admission: str = ""  # the last admission decision and why (SpinSearch with wait)
    waits_for: tuple[str, ...] = ()  # the running jobs whose ends it last chose to wait for (admission)
    reservation: _Reservation | None = None  # while it waits by choice: the GPUs it expects, and when
    alone: tuple[Topology, float, dict] | None = None  # (topology, run time and GPUs of its plan with all free)
    placed_impaired: bool = False  # (re)placed while a link was down or GPUs withdrawn (re-planning once lifted)

    @property
    def completed(self) -> bool:
        return self.status == "done"

    @property
    def jct_s(self) -> float | None:
        return None if self.end_s is None or not self.completed else self.end_s - self.arrival_s

    @property
    def queue_s(self) -> float | None:
        return None if self.start_s is None else self.start_s - self.arrival_s


def link_load(records: Iterable[JobRecord]) -> dict[tuple[str, str], float]:
    """Flows per link of these jobs' routes (a running job's WAN load, as the planner is told it)."""
    # every route's links counted in C, in the order the loops over jobs, routes and links meet them
    return dict(Counter(chain.from_iterable(chain.from_iterable(rec.routes for rec in records))))


def fixed_plan(plan: Plan, name: str = "fixed") -> Strategy:
    """A strategy that always answers ``plan`` (calibration runs chosen plans through the replay)."""

    def place(req: PlacementRequest) -> Placement:
        for c, g in plan.placement.items():
            if req.free_gpus.get(c, 0) < g:
                raise InfeasiblePlan(f"{req.job.job_id}: the fixed plan needs {g} GPUs in {c}, "
                                     f"{req.free_gpus.get(c, 0)} free")
        return Placement(segments=tuple(plan.placement.items()), plan=plan)

    place.name = name  # type: ignore[attr-defined]
    return place


def ranks_needed(plan: Plan) -> dict[str, int]:
    """Emulated ranks the plan puts in each cluster: one per (replica, stage), as
    :meth:`spiderflow.costmodel.PlanWork.ranks_per_cluster` lays them out."""
    return dict(Counter(s.cluster for rep in plan.replicas for s in rep))


class RouteDown(InfeasiblePlan):
    """The plan's traffic would cross a link that is down (the job waits; it is not rejected)."""


def crosses(routes: Iterable[Iterable[tuple[str, str]]], down: frozenset) -> tuple[str, str] | None:
    """The first link of ``routes`` that is in ``down``, or None."""
    return next((key for route in routes for key in route if key in down), None)


@dataclass(frozen=True)
class _Reservation:
    """GPUs per cluster a waiting job expects to take at ``at_s`` (decided on ``topology``)."""

    holder: str
    at_s: float
    gpus: dict[str, int]
    topology: Topology | None = None
    # admission's decision to wait (Scheduler._passed): the jobs it waits for whose expected ends it weighed as
    # start times and passed over (id: that end, what it weighed there, and the option's run time or None), how
    # near those ends they may end for the decision to stand (END_SLACK of the wait), its run time from at_s and
    # what it weighed at at_s (the others' link load then)
    passed: dict[str, tuple[float, _Moment, float | None]] = field(default_factory=dict)
    slack_s: float = 0.0
    run_s: float = 0.0
    weighed: _Moment | None = None


def _waiting_pays(wait_cost: float, start_cost: float, start_run_s: float) -> bool:
    """Admission's rule: waiting is chosen over a start costing ``start_cost`` (running ``start_run_s``)
    only when it costs less by more than :data:`WAIT_MARGIN` of that run time (module docstring)."""
    return wait_cost < start_cost - WAIT_MARGIN * start_run_s


def _state_key(free: dict[str, int], load: dict[tuple[str, str], float]) -> tuple:
    """The planner memo's key of a state: free GPUs per cluster and link load."""
    return tuple(free.items()), frozenset(load.items())


class _Moment:
    """What is free and loaded at one moment (:meth:`Scheduler._moment`): the running jobs gone by
    then, the free GPUs per cluster and the others' link load (read-only), with the planner memo's
    key of that state and its shared view made once, when first asked. Every state the planner is
    asked about is one (also the empty topology, and a running job's GPUs for a re-plan)."""

    __slots__ = ("gone", "free", "load", "_key", "_view")

    def __init__(self, gone: list[JobRecord], free: dict[str, int], load: dict[tuple[str, str], float]) -> None:
        self.gone, self.free, self.load, self._key, self._view = gone, free, load, None, None

    def key(self) -> tuple:
        if self._key is None:
            self._key = _state_key(self.free, self.load)
        return self._key

    def view(self, topology: Topology, calibration: Calibration):
        """``shared_view`` of this state (its topology and calibration are the scheduler's until
        ``set_network``, which forgets every moment)."""
        if self._view is None:
            self._view = shared_view(topology, calibration, self.load)
        return self._view


class Scheduler:
    def __init__(self, topology: Topology, config: SchedulerConfig,
                 hosts_per_cluster: dict[str, int] | None = None) -> None:
        self.topo, self.cfg = topology, config
        self.free = {c.name: c.total_gpus for c in topology.clusters}
        self.hosts_per_cluster = dict(hosts_per_cluster) if hosts_per_cluster is not None else None
        self.free_hosts = dict(hosts_per_cluster) if hosts_per_cluster is not None else None
        self.running: list[JobRecord] = []
        self._reservations: list[_Reservation] = []
        self._pass: list[JobRecord] = []  # the current pass's queue (schedule)
        self._pass_changed: list[JobRecord] = []  # those whose status it has changed so far
        self._pass_queued: int | None = None  # how many of them were queued at its start, once asked
        self._strategy = PLANNERS[config.planner] if isinstance(config.planner, str) else config.planner
        self.down: frozenset = frozenset()  # keys of links that are down (set_network)
        self.impaired = False  # links down or GPUs withdrawn: the empty topology is not all there
        self._memo: OrderedDict | None = OrderedDict() if config.planner in DETERMINISTIC else None
        # What is free and loaded at a moment (:meth:`_moment`), until the running jobs or free GPUs
        # change: the moments, the free GPUs they were counted on, the running jobs' ids
        self._moments: dict[float | None, _Moment] = {}
        self._moments_free: tuple[int, ...] | None = None
        self._ids: set[str] | None = None
        self._verdicts: dict = {}  # _passes' comparisons of moments, kept as the moments are
        self._ended: dict[str, float | None] = {}  # when each job that stopped running ended (None: stopped)

    def set_network(self, topology: Topology, down: Iterable[tuple[str, str]] = ()) -> None:
        """Plan on ``topology`` (the links' current figures) from now on; no route may cross ``down``."""
        if topology is not self.topo and self._memo is not None:
            self._memo.clear()  # keyed on the topology's identity
        self.topo, self.down = topology, frozenset(down)
        self._forget_moments()

    # ------------------------------------------------------------------ state
    def link_load(self) -> dict[tuple[str, str], float]:
        """Flows per link of the running jobs (what the planner is told)."""
        return link_load(self.running)

    def release(self, rec: JobRecord, ended_s: float | None = None) -> None:
        """``rec`` stopped running (done, failed, interrupted): its GPUs and hosts are free again.
        ``ended_s``: when it ended, if it did (default its ``end_s``; None for a job stopped to be
        placed again), which a job waiting for it compares with what it expected."""
        self.running.remove(rec)
        self._ended[rec.job.job_id] = rec.end_s if ended_s is None else ended_s
        self._forget_moments()
        for c, g in rec.placement.items():
            self.free[c] += g
        if self.free_hosts is not None:
            for c, k in rec.hosts.items():
                self.free_hosts[c] += k

    # ------------------------------------------------------------------ decisions
    def schedule(self, queued: Iterable[JobRecord], now: float = 0.0,
                 on_start: Callable[[JobRecord], None] | None = None,
                 on_decided: Callable[[JobRecord, float], None] | None = None,
                 stop: Callable[[], bool] | None = None) -> list[JobRecord]:
        """Decide for the arrived, queued jobs (in arrival order) at time ``now`` under the queue
        policy; return those whose status changed (now ``running`` with their plan, or
        ``rejected`` with a reason). A job that chose to wait does not block the ones behind it.
        Decisions are made one at a time, as one scheduler process makes them: ``on_decided`` is
        called after each with the job and the planner seconds it just spent (the simulator moves
        its scheduler's clock; the emulator looks at its running jobs), ``on_start`` with each job
        it started (the emulator launches it before the next decision), and ``stop`` before each:
        True ends the pass, leaving the rest queued (the simulator stops where its scheduler's
        clock passes the next event)."""
        changed = self._pass_changed = []
        self._reservations: list[_Reservation] = []
        self._forget_moments()  # the driver may have moved expected ends or free GPUs since the last pass
        queued = self._pass = list(queued)
        self._pass_queued = None  # counted only if admission asks (on a deep queue, 7% of a --no-wait run)
        for rec in queued:
            if rec.status != "queued":
                continue
            if stop is not None and stop():
                break
            spent = rec.overhead_s
            if self._keeps_waiting(rec, now):
                self._reservations.append(rec.reservation)
                continue
            waited = self._try_start(rec, now)
            if on_start is not None and rec.status == "running":
                on_start(rec)
            if on_decided is not None:
                on_decided(rec, rec.overhead_s - spent)
            if rec.status != "queued":
                changed.append(rec)
            elif not (self.cfg.backfill or waited):
                break
        return changed

    def _queued_at_pass_start(self) -> int:
        """Jobs queued when the current pass began: admission's weight on run time. Only the pass
        changes statuses, and it lists each job it changed, so those are added back."""
        if self._pass_queued is None:
            self._pass_queued = sum(r.status == "queued" for r in self._pass) + len(self._pass_changed)
        return self._pass_queued

    def _keeps_waiting(self, rec: JobRecord, now: float) -> bool:
        """A job that chose to wait keeps that decision, unplanned, until what it waits for happens
        (module docstring; :meth:`_passes` for an end of a job it waits for). Meanwhile arrivals
        cannot improve its options and jobs that passed it did not delay it, so planning it again
        would weigh the same options: on a deep queue that re-planning at every event made the
        simulator quadratic (300 jobs of the 64-cluster synthetic trace: over 100 s of CPU, 25 s
        without it). Re-planning at every end of a job it waits for, also one it had weighed and
        that came as weighed, took 413.5 s of CPU on 10,000 jobs of the 600 s-gap trace against
        313.4 s, run at once (simulator_speed.md, "Waiting decisions that stand")."""
        res = rec.reservation
        if res is None:
            return False
        running = self._running_ids()
        free = self._moment(res.at_s).free
        ended = [j for j in rec.waits_for if j not in running]
        if (now < res.at_s and res.topology is self.topo and (not ended or self._passes(rec, res, ended, now))
                and all(free[c] >= g for c, g in res.gpus.items())):
            return True
        rec.reservation = None
        return False

    def _passes(self, rec: JobRecord, res: _Reservation, ended: list[str], now: float) -> bool:
        """Does ``rec``'s decision to wait stand now that the jobs ``ended`` of those it waits for have
        ended? Only at ends it weighed and passed over (:meth:`_passed`), each met within its slack,
        with no more GPUs free and no link lighter now than it weighed at the last of them, no link
        heavier at its start than it weighed then, and the option it weighed at that end still
        dearer by the margin under the queue's weight now: a decision now would weigh the same options."""
        entries = []
        for j in ended:
            entry, end = res.passed.get(j), self._ended.get(j)
            if entry is None or end is None or abs(end - entry[0]) > res.slack_s:
                return False
            entries.append(entry)
        _, then, run_s = max(entries, key=lambda e: e[0])
        if not (self._no_better_than(then) and self._no_heavier(res)):
            return False
        if run_s is None:
            return True
        weight = self._weight(rec)
        return _waiting_pays(res.at_s + (1 + weight) * res.run_s, now + (1 + weight) * run_s, run_s)

    def _no_better_than(self, then: _Moment) -> bool:
        """No cluster has more GPUs free and no link is lighter now than at ``then``. Kept with the
        moments: waiting jobs decided in one pass share what they weighed, and on a deep queue each
        such moment was compared about five times with one state now (2,000 jobs of the 600 s-gap
        trace: 84,251 comparisons, 16,112 distinct; simulator_speed.md)."""
        now = self._moment(None)  # first: it forgets the moments, and these verdicts, if the free GPUs changed
        verdict = self._verdicts.get(then)
        if verdict is None:
            verdict = self._verdicts[then] = not (any(now.free[c] > g for c, g in then.free.items())
                                                  or any(now.load.get(k, 0) < v for k, v in then.load.items()))
        return verdict

    def _no_heavier(self, res: _Reservation) -> bool:
        """No link is heavier at ``res``'s start than it weighed there (kept as :meth:`_no_better_than`'s)."""
        at, then = self._moment(res.at_s), res.weighed
        verdict = self._verdicts.get((at, then))
        if verdict is None:
            verdict = self._verdicts[at, then] = not any(v > then.load.get(k, 0) for k, v in at.load.items())
        return verdict

    def _reject(self, rec: JobRecord, reason: str) -> None:
        rec.status, rec.reason = "rejected", reason

    def _all_free(self) -> bool:
        return not self.running and not self.impaired

    def _request(self, job: Job, state: _Moment) -> PlacementRequest:
        """What the strategy is asked: ``job`` on the free GPUs and link load of ``state``."""
        cfg = self.cfg
        req = PlacementRequest(job=job, topology=self.topo, free_gpus=dict(state.free), link_load=state.load,
                               calibration=cfg.calibration, seed=cfg.seed, time_limit_s=cfg.time_limit_s,
                               search_budget=cfg.search_budget)
        req.__dict__["_topology_view"] = self._view(state)  # what its topology_view() would return
        return req

    def _view(self, state: _Moment):
        """The shared view of ``state`` (its load hashed once)."""
        return state.view(self.topo, self.cfg.calibration)

    def _place(self, rec: JobRecord, state: _Moment) -> Placement:
        """The strategy's placement of ``rec`` on what is free and loaded in ``state``, its wall time
        added to the job's overhead (InfeasiblePlan passes). Its plan may be another job's of the
        same shape, from the memo (the same plan and estimate): :meth:`_commit` makes it the job's own."""
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            placement = self._planned(rec.job, state)
            if self.down:
                dead = crosses(plan_routes(placement.plan, self.topo), self.down)
                if dead is not None:
                    raise RouteDown(f"{rec.job.job_id}: its plan would cross link {'-'.join(dead)}, which is down")
            return placement
        finally:
            rec.overhead_s += time.perf_counter() - t0
            rec.overhead_cpu_s += time.thread_time() - c0

    def _planned(self, job: Job, state: _Moment) -> Placement:
        """The strategy's answer for ``job`` in ``state``; a deterministic planner's is memoised on the
        job's shape and the state (topology, free GPUs, link load), and a hit is neither asked nor
        re-made for this job: its plan stays the first job's (admission asks about the same states
        again and again, for each job of a shape queued together: on the 64-cluster synthetic trace
        about half of its calls; on its deep queue, making the request and the job's own copy of
        the plan, with its estimate, for each hit was about a seventh of the run)."""
        if self._memo is None:
            return self._strategy(self._request(job, state))
        key = (self._strategy, job.model, job.gpus, job.global_batch, job.seq_len, id(self.topo), *state.key())
        hit = self._memo.get(key)
        if hit is None:
            try:
                hit = self._strategy(self._request(job, state))
            except InfeasiblePlan as exc:
                hit = (exc, job.job_id)
            self._memo[key] = hit
            if len(self._memo) > MEMO_SIZE:
                self._memo.popitem(last=False)
        else:
            self._memo.move_to_end(key)
        if isinstance(hit, tuple):
            exc, asked = hit
            raise InfeasiblePlan(str(exc).replace(asked, job.job_id, 1))
        return hit

    def _run_s(self, rec: JobRecord, placement: Placement, state: _Moment) -> float:
        """Predicted run time of ``rec`` on ``placement`` (the cost model's closed form, under the load
        of ``state``; memoised on its shared view; a plan of another job of the shape prices alike)."""
        return rec.job.iterations * estimate_memo(placement.plan, self._view(state))

    def _try_start(self, rec: JobRecord, now: float) -> bool:
        """Start ``rec`` if it can and should; True when it waits by choice (admission or a
        reservation), so that it does not block the queue."""
        job = rec.job
        if job.gpus > self.topo.total_gpus:
            self._reject(rec, f"{job.job_id}: wants {job.gpus} GPUs, the topology has {self.topo.total_gpus}")
            return False
        if job.gpus > sum(self.free.values()):
            return self._reserves_first_fit(rec)
        moment = self._moment(None)
        try:
            placement = self._place(rec, moment)
        except InfeasiblePlan as exc:
            if self._all_free() and not isinstance(exc, RouteDown):
                self._reject(rec, str(exc))
            return False
        plan = placement.plan
        need = self._hosts_needed(plan)
        for c, k in need.items():
            if k > self.hosts_per_cluster[c]:
                self._reject(rec, f"{job.job_id}: its plan needs {k} ranks in {c}, the emulation has "
                                  f"{self.hosts_per_cluster[c]} hosts per cluster (raise --hosts-per-cluster)")
                return False
        if any(k > self.free_hosts[c] for c, k in need.items()):
            return False  # wait for hosts
        if self.cfg.admits:
            if self.running:
                if self._waits(rec, placement, moment, now):
                    return True
            else:
                rec.admission = (f"started now on {placement_text(placement.segments)}: "
                                 "no running job to wait for")
        if self._reservations and self._delays_a_reservation(rec, placement, moment, now):
            return True
        self._commit(rec, placement, need)
        return False

    def _reserves_first_fit(self, rec: JobRecord) -> bool:
        """``rec`` wants more GPUs than are free. With admission it does not hold the queue (FIFO)
        until enough are: it reserves the GPUs of its plan with the whole topology at the first
        expected end from which they are all free, and later jobs start meanwhile only where they
        would not delay it (:meth:`_delays_a_reservation`: EASY backfill). No planner call beyond
        that plan (once per job). True when it reserved (it waits by choice); False, holding the
        queue, without admission, with nothing running, or when no expected end frees those GPUs."""
        if not (self.cfg.admits and self.running):
            return False
        self._alone_run_s(rec)
        gpus = rec.alone[2]
        at = self._first_fit_end(gpus) if gpus else None
        if at is None:
            return False
        self._reserve(rec, at, gpus, [r.job.job_id for r in self._moment(at).gone])
        rec.admission = (f"waits: wants {rec.job.gpus} GPUs, {sum(self.free.values())} free; reserves those of its "
                         f"plan with the whole topology ({placement_text(gpus.items())}), expected free at {at:.6g} s")
        return True

    def _reserve(self, rec: JobRecord, at: float, gpus: dict[str, int], waits_for: list[str],
                 passed: dict | None = None, slack_s: float = 0.0, run_s: float = 0.0,
                 weighed: _Moment | None = None) -> None:
        """``rec`` waits by choice for ``gpus`` (per cluster), expected free at ``at`` once the running
        jobs ``waits_for`` have ended: its reservation, which later jobs of this pass must not delay
        (the rest: :class:`_Reservation`)."""
        rec.reservation = _Reservation(rec.job.job_id, at, dict(gpus), self.topo, passed or {}, slack_s, run_s,
                                       weighed)
        self._reservations.append(rec.reservation)
        rec.waits_for = tuple(waits_for)

    def _ending_by(self, t: float) -> list[JobRecord]:
        return [r for r in self.running if r.expected_end_s is not None and r.expected_end_s <= t]

    def _free_after(self, gone: list[JobRecord]) -> dict[str, int]:
        """Free GPUs per cluster once the jobs ``gone`` have ended."""
        free = dict(self.free)
        for r in gone:
            for c, g in r.placement.items():
                free[c] += g
        return free

    def _moment(self, t: float | None) -> _Moment:
        """The running jobs expected to have ended by ``t``, the free GPUs per cluster and the link
        load of the others then (None: now, with every running job's load). Kept until the running
        jobs change or the next pass: each look-ahead, kept reservation and reservation check asks
        about the same few moments, and on a deep queue counting the load again for each was an
        eighth of the run (10,000 jobs of the 600 s-gap trace, its later half). Read-only. (A driver
        that changes the free GPUs itself, as capacity events do, is seen: the snapshot is checked.)"""
        free = tuple(self.free.values())
        if free != self._moments_free:
            self._forget_moments()
            self._moments_free = free
        hit = self._moments.get(t)
        if hit is None:
            if t is None:
                gone, staying = [], self.running
            else:
                gone = self._ending_by(t)
                staying = [r for r in self.running if r.expected_end_s is None or r.expected_end_s > t]
            hit = self._moments[t] = _Moment(gone, self._free_after(gone), link_load(staying))
        return hit

    def _running_ids(self) -> set[str]:
        """The running jobs' ids (kept as :meth:`_moment`'s moments are)."""
        if self._ids is None:
            self._ids = {r.job.job_id for r in self.running}
        return self._ids

    def _forget_moments(self) -> None:
        self._moments.clear()
        self._verdicts.clear()
        self._moments_free = self._ids = None

    def _alone_run_s(self, rec: JobRecord) -> float:
        """Predicted run time of ``rec`` planned on the current topology with every GPU free and no
        other job's traffic (once per job and topology; infinite when no plan fits)."""
        if rec.alone is None or rec.alone[0] is not self.topo:
            empty = _Moment([], {c.name: c.total_gpus for c in self.topo.clusters}, {})
            try:
                placement = self._place(rec, empty)
                run_s, gpus = self._run_s(rec, placement, empty), dict(placement.plan.placement)
            except InfeasiblePlan:
                run_s, gpus = float("inf"), {}
            rec.alone = (self.topo, run_s, gpus)
        return rec.alone[1]

    def _first_fit_end(self, gpus: dict[str, int]) -> float | None:
        """The first expected end of a running job from which ``gpus`` (per cluster) are all free."""
        short = {c: g - self.free[c] for c, g in gpus.items() if g > self.free[c]}  # GPUs still to free
        for r in sorted((r for r in self.running if r.expected_end_s is not None), key=lambda r: r.expected_end_s):
            for c, g in r.placement.items():
                if c in short:
                    short[c] -= g
                    if short[c] <= 0:
                        del short[c]
            if not short:
                return r.expected_end_s  # jobs ending at the same moment: the last of them
        return None

    def _waits(self, rec: JobRecord, placement: Placement, moment_now: _Moment, now: float) -> bool:
        """Admission: plan ``rec`` on what the next running jobs to end will leave free; wait (and
        reserve) when that finishes it sooner (module docstring). A job whose plan now is as fast
        as its plan with the whole topology to itself starts at once: waiting cannot finish it
        sooner, so the look-ahead is skipped (on the 64-cluster synthetic trace, three decisions in
        four, each saving up to four planner calls)."""
        where = placement_text(placement.segments)
        run_now = self._run_s(rec, placement, moment_now)
        finish_now = now + run_now
        alone = self._alone_run_s(rec)
        if run_now <= alone:
            rec.admission = (f"started now on {where}: finishes at {finish_now:.6g} s, as soon as it could "
                             "with the whole topology to itself")
            return False
        # an option's cost: its finish, plus its run time's delay to the other queued jobs (module docstring)
        others = self._queued_at_pass_start() - 1
        weight = self._weight(rec)
        cost_now = finish_now + weight * run_now
        ends = sorted({r.expected_end_s for r in self.running if r.expected_end_s is not None})
        candidates = ends[:LOOKAHEAD]
        # what it chose to wait for at an earlier decision stays a candidate while those jobs run, though
        # jobs started since (small ones passing it) may now end sooner: else it forgets what it waits for
        waited = [r.expected_end_s for r in self.running
                  if r.job.job_id in rec.waits_for and r.expected_end_s is not None]
        if waited and max(waited) not in candidates:
            candidates.append(max(waited))
        # and the first end from which its plan with the whole topology fits: when the next ends free
        # only scattered GPUs, every nearer option can be many times slower than that one
        fit = self._first_fit_end(rec.alone[2]) if rec.alone[2] else None
        if fit is not None and fit not in candidates:
            candidates.append(fit)
        best = None
        # the start times weighed: what it weighed there and its option's (cost, run time), or None (no plan or
        # no hosts); past the break below (as every later one is) not there
        weighed: dict[float, tuple[_Moment, tuple[float, float] | None]] = {}
        for t in sorted(candidates):
            t = max(t, now)
            if t + (1 + weight) * alone >= min(best[0] if best else cost_now, cost_now - WAIT_MARGIN * run_now):
                break  # it cannot cost less than that from here on, even with the topology to itself
            moment = self._moment(t)  # (the rest's load)
            weighed[t] = (moment, None)
            gone = moment.gone
            try:
                later = self._place(rec, moment)
            except InfeasiblePlan:
                continue
            if not self._hosts_fit(later.plan, gone):
                continue
            run_later = self._run_s(rec, later, moment)
            cost = t + (1 + weight) * run_later
            weighed[t] = (moment, (cost, run_later))
            if best is None or cost < best[0]:
                best = (cost, t, run_later, later, [r.job.job_id for r in gone])
        if best is not None and _waiting_pays(best[0], cost_now, run_now):
            _, t, run_later, later, names = best
            finish = t + run_later
            rec.admission = (f"waits for {', '.join(names)} to end (expected at {t:.6g} s): finishes at "
                             f"{finish:.6g} s on {placement_text(later.segments)} vs "
                             f"{finish_now:.6g} s if started now on {where}"
                             + (f" (runs {run_later:.6g} s vs {run_now:.6g} s, {others} jobs queued)"
                                if weight and finish >= finish_now else ""))
            self._reserve(rec, t, later.plan.placement, names, self._passed(best[0], t, weighed),
                          END_SLACK * (t - now), run_later, weighed[t][0])
            return True
        rec.admission = f"started now on {where}: finishes at {finish_now:.6g} s" + (
            f" (waiting: {best[1] + best[2]:.6g} s)" if best is not None else "")
        return False

    def _passed(self, cost: float, at: float, weighed: dict) -> dict[str, tuple[float, _Moment, float | None]]:
        """The running jobs ending before ``at`` at a start time weighed whose option, started then,
        would not have been taken over waiting for ``at`` at ``cost`` (by :data:`WAIT_MARGIN`, as a
        decision then would have it): a job waiting for ``at`` passes their ends (:meth:`_passes`).
        Each with its expected end, what was weighed there, and the option's run time (None: none)."""
        passed = {}
        for r in self.running:
            end = r.expected_end_s
            if end is not None and end < at and end in weighed:
                moment, option = weighed[end]
                if option is None or _waiting_pays(cost, *option):
                    passed[r.job.job_id] = (end, moment, None if option is None else option[1])
        return passed

    def _weight(self, rec: JobRecord) -> float:
        """Admission's weight on ``rec``'s run time: the other jobs queued at the pass's start, times
        its share of the topology's GPUs (module docstring)."""
        return max(0, self._queued_at_pass_start() - 1) * rec.job.gpus / self.topo.total_gpus

    def _delays_a_reservation(self, rec: JobRecord, placement: Placement, moment_now: _Moment,
                              now: float) -> bool:
        """Would starting ``rec`` now keep GPUs that a waiting job expects at its time?"""
        end = now + self._run_s(rec, placement, moment_now)
        use = placement.plan.placement
        for res in self._reservations:
            if end <= res.at_s:
                continue  # done before the waiting job's expected start
            free = self._moment(res.at_s).free
            if any(free[c] - use.get(c, 0) < g for c, g in res.gpus.items()):
                rec.admission = (f"waits: starting now would delay {res.holder}, which waits for GPUs "
                                 f"expected free at {res.at_s:.6g} s")
                return True
        return False

    def replan(self, rec: JobRecord) -> tuple[Placement, float] | None:
        """A new placement for running ``rec`` on its own GPUs plus the free ones, with the other jobs'
        link load, and its predicted iteration time there (closed form); None when none is found, or
        when hosts are counted and its plan needs more ranks in a cluster than the job's own hosts
        there plus the free ones. The planner's wall time is added to the job's overhead."""
        state = _Moment([rec], self._free_after([rec]), link_load(r for r in self.running if r is not rec))
        try:
            placement = self._own(self._place(rec, state), rec.job)
        except InfeasiblePlan:
            return None
        if not self._hosts_fit(placement.plan, [rec]):
            return None
        return placement, estimate(placement.plan, self._view(state))

    def move(self, rec: JobRecord, placement: Placement) -> None:
        """Running ``rec`` leaves its GPUs (and hosts) for ``placement`` (found by :meth:`replan`)."""
        self.release(rec)
        self._commit(rec, placement, self._hosts_needed(placement.plan))

    def _hosts_needed(self, plan: Plan) -> dict[str, int]:
        """The hosts ``plan`` takes per cluster: one per rank when hosts are counted, else none."""
        return ranks_needed(plan) if self.hosts_per_cluster is not None else {}

    def _hosts_fit(self, plan: Plan, gone: Iterable[JobRecord] = ()) -> bool:
        """Whether ``plan``'s ranks find hosts among the free ones and those of the jobs ``gone``."""
        need = self._hosts_needed(plan)
        if not need:
            return True
        hosts = dict(self.free_hosts)
        for r in gone:
            for c, k in r.hosts.items():
                hosts[c] += k
        return all(k <= hosts[c] for c, k in need.items())

    @staticmethod
    def _own(placement: Placement, job: Job) -> Placement:
        """``placement`` with ``job`` in its plan (a memoised answer carries the job first asked about)."""
        if placement.plan.job is job:
            return placement
        return dataclasses.replace(placement, plan=placement.plan.for_job(job))

    def _commit(self, rec: JobRecord, placement: Placement, need: dict[str, int]) -> None:
        plan = self._own(placement, rec.job).plan
        self._forget_moments()
        for c, g in plan.placement.items():
            self.free[c] -= g
        for c, k in need.items():
            self.free_hosts[c] -= k
        rec.plan, rec.placement, rec.segments, rec.hosts = plan, plan.placement, tuple(placement.segments), need
        rec.routes = plan_routes(plan, self.topo)
        rec.placed_impaired = self.impaired
        rec.status = "running"
        self.running.append(rec)


def records(jobs: Iterable[Job], factory: Callable[..., JobRecord] = JobRecord, *,
            time_scale: float = 1.0) -> list[JobRecord]:
    """One record per job, arrivals divided by ``time_scale`` (the emulator's compression)."""
    return [factory(job=j, arrival_s=j.arrival_s / time_scale) for j in jobs]
