"""Discrete-event trace replay: queue, place, share the WAN, complete.

Events (a deterministic heap, :mod:`spiderflow.simulate.events`): job
arrivals and job completions. After every event:

1. running jobs advance: ``remaining -= elapsed / iteration_s``;
2. the queue is scheduled: FIFO; with ``backfill`` a later job may start when
   the head cannot (first fit, no reservation). Placement + planning is done
   by the chosen planner against the current free GPUs and link load; its
   wall time is the job's *scheduling overhead*, added to its start with
   ``charge_overhead`` (as the paper does). A job that no empty topology could
   host (too many GPUs, or no plan fits memory) is rejected;
3. if the set of running jobs changed, the WAN is re-shared max-min fairly
   among all running jobs' flows (:mod:`spiderflow.simulate.flows`), each
   affected job's iteration time is recomputed from its shares with the cost
   model's closed form (within 2% of the exact schedule), and its completion
   event is moved (progress-based completion).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from spiderflow.costmodel import NO_CALIBRATION, Calibration, TopologyView, estimate_works, replica_works
from spiderflow.errors import InfeasiblePlan
from spiderflow.placement import PlacementRequest, run_planner
from spiderflow.plan import Plan
from spiderflow.simulate.events import EventQueue
from spiderflow.simulate.fairshare import max_min_fair_share
from spiderflow.simulate.flows import plan_routes
from spiderflow.topology import Topology
from spiderflow.workload import Job

ARRIVAL, COMPLETION = 0, 1


@dataclass
class JobRecord:
    job: Job
    status: str = "queued"  # queued | running | done | rejected
    start_s: float | None = None
    end_s: float | None = None
    overhead_s: float = 0.0
    placement: dict[str, int] = field(default_factory=dict)
    plan: Plan | None = None
    alone_iteration_s: float | None = None
    iteration_s: float | None = None
    remaining: float = 0.0
    updated_s: float = 0.0
    token: int | None = None
    routes: list = field(default_factory=list)
    shares: tuple = ()
    shared_iteration_s: float | None = None
    shared_estimates: dict = field(default_factory=dict, repr=False)  # shares -> iteration_s
    works: list = field(default_factory=list, repr=False)  # the plan's work items (replica_works)
    reason: str = ""

    @property
    def jct_s(self) -> float | None:
        return None if self.end_s is None else self.end_s - self.job.arrival_s

    @property
    def queue_s(self) -> float | None:
        return None if self.start_s is None else self.start_s - self.job.arrival_s


@dataclass(frozen=True, kw_only=True)
class SimConfig:
    planner: str = "spinsearch"
    backfill: bool = False
    charge_overhead: bool = False
    calibration: Calibration = NO_CALIBRATION
    seed: int = 0
    time_limit_s: float = 10.0
    search_budget: int | None = None


class Simulation:
    def __init__(self, topology: Topology, jobs: Sequence[Job], config: SimConfig,
                 progress: Callable[[int], None] | None = None) -> None:
        self.topo, self.cfg, self.progress = topology, config, progress
        self.records = [JobRecord(job=j) for j in jobs]
        self.free = {c.name: c.total_gpus for c in topology.clusters}
        self.queue: list[JobRecord] = []
        self.running: list[JobRecord] = []
        self.events: EventQueue[tuple[int, JobRecord]] = EventQueue()
        self.capacity = {l.key: l.bandwidth_gbps for l in topology.links}
        self.flows_changed = False  # a job with WAN flows started or ended since the last reshare

    def run(self) -> list[JobRecord]:
        for rec in self.records:
            self.events.push(rec.job.arrival_s, (ARRIVAL, rec), priority=ARRIVAL)
        while self.events:
            ev = self.events.pop()
            now = ev.time_s
            kind, rec = ev.payload
            self._advance(now)
            changed = False
            if kind == ARRIVAL:
                self.queue.append(rec)
            else:
                self._finish(rec, now)
                changed = True
            changed |= self._schedule(now)
            if changed:
                self._reshare(now)
        return self.records

    def _advance(self, now: float) -> None:
        for rec in self.running:
            if now > rec.updated_s:  # a start delayed by charged overhead makes no progress before it
                rec.remaining -= (now - rec.updated_s) / rec.iteration_s
                rec.updated_s = now

    def _finish(self, rec: JobRecord, now: float) -> None:
        rec.status, rec.end_s, rec.remaining = "done", now, 0.0
        self.running.remove(rec)
        self.flows_changed |= bool(rec.routes)
        rec.works, rec.shared_estimates = [], {}  # only needed while it runs
        for c, g in rec.placement.items():
            self.free[c] += g
        if self.progress:
            self.progress(1)

    def _link_load(self) -> dict[tuple[str, str], float]:
        load: Counter = Counter()
        for rec in self.running:
            for route in rec.routes:
                for key in route:
                    load[key] += 1
        return dict(load)

    def _try_start(self, rec: JobRecord, now: float) -> bool:
        job = rec.job
        if job.gpus > self.topo.total_gpus:
            return self._reject(rec, f"{job.job_id}: wants {job.gpus} GPUs, the topology has "
                                     f"{self.topo.total_gpus}")
        if job.gpus > sum(self.free.values()):
            return False
        req = PlacementRequest(job=job, topology=self.topo, free_gpus=dict(self.free),
                               link_load=self._link_load(), calibration=self.cfg.calibration,
                               seed=self.cfg.seed, time_limit_s=self.cfg.time_limit_s,
                               search_budget=self.cfg.search_budget)
        t0 = time.perf_counter()
        try:
            res = run_planner(self.cfg.planner, req, judge=False)  # only the plan and its time are used
        except InfeasiblePlan as exc:
            rec.overhead_s += time.perf_counter() - t0
            if all(self.free[c.name] == c.total_gpus for c in self.topo.clusters):
                return self._reject(rec, str(exc))
            return False
        rec.overhead_s += res.overhead_s
        plan = res.placement.plan
        rec.plan, rec.placement = plan, plan.placement
        for c, g in rec.placement.items():
            self.free[c] -= g
        rec.status = "running"
        rec.start_s = now + (rec.overhead_s if self.cfg.charge_overhead else 0.0)
        rec.remaining = float(job.iterations)
        rec.routes = plan_routes(plan, self.topo)
        self.flows_changed |= bool(rec.routes)
        alone = TopologyView(topology=self.topo, calibration=self.cfg.calibration)
        rec.works = replica_works(plan, alone)  # fixed for the job's run; re-priced as its shares move
        rec.alone_iteration_s = estimate_works(rec.works, plan.micro_batches, alone)
        rec.iteration_s = None
        rec.updated_s = rec.start_s
        self.running.append(rec)
        return True

    def _reject(self, rec: JobRecord, reason: str) -> bool:
        rec.status, rec.reason = "rejected", reason
        if self.progress:
            self.progress(1)
        return False

    def _schedule(self, now: float) -> bool:
        started = False
        for rec in list(self.queue):
            if self._try_start(rec, now):
                self.queue.remove(rec)
                started = True
            elif rec.status == "rejected":
                self.queue.remove(rec)
            elif not self.cfg.backfill:
                break
        return started

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
                        view = TopologyView(topology=self.topo, calibration=self.cfg.calibration,
                                            link_gbps=dict(per_link))
                        known = rec.shared_estimates[shares] = estimate_works(rec.works, rec.plan.micro_batches,
                                                                             view)
                    rec.shares, rec.shared_iteration_s = shares, known
                iteration = rec.shared_iteration_s
            else:
                iteration = rec.alone_iteration_s
            self._set_iteration(rec, iteration, now)

    def _set_iteration(self, rec: JobRecord, iteration: float, now: float) -> None:
        """Move ``rec``'s completion to match ``iteration`` (seconds per iteration from now on)."""
        if iteration == rec.iteration_s and rec.token is not None:
            return
        if rec.token is not None:
            self.events.cancel(rec.token)
        rec.updated_s = max(rec.updated_s, now)
        rec.iteration_s = iteration
        rec.token = self.events.push(rec.updated_s + rec.remaining * iteration, (COMPLETION, rec),
                                     priority=COMPLETION)


def simulate(topology: Topology, jobs: Sequence[Job], config: SimConfig,
             progress: Callable[[int], None] | None = None) -> list[JobRecord]:
    return Simulation(topology, jobs, config, progress).run()
