"""Iteration time and memory of a plan (DESIGN.md, "The physics").

``predict`` runs the exact 1F1B schedule of every replica; ``estimate`` is the
closed form used inside search loops. Both take a network *view* (what the
caller knows of the network; see :mod:`spiderflow.costmodel.network`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property

import numpy as np

from spiderflow.costmodel.batch import FIELDS, estimate_batch
from spiderflow.costmodel.calibration import (NO_CALIBRATION, AlphaBeta, Calibration,
                                              load_calibration)
from spiderflow.costmodel.memory import StageMemory, stage_memory, stage_memory_of
from spiderflow.costmodel.network import GBPS, Channel, MatrixView, TopologyView
from spiderflow.costmodel.schedule import Timeline, estimate_1f1b, floor_1f1b, simulate_1f1b
from spiderflow.costmodel.stages import StageCost
from spiderflow.costmodel.work import (PlanWork, RankWork, Repricer, crowd_of, plan_chains, plan_work, price,
                                       replica_work, stage_costs, stage_sync, stage_syncs, stage_work)
from spiderflow.errors import InfeasiblePlan
from spiderflow.plan import Plan

BATCH_MOVES = 8  # LayerMoves.estimates: from this many moves, priced in one batch
# stages x micro-batches up to which a search runs a plan's exact schedule (predict) beside the closed form:
# SpinSearch's near ties (step 7) and the check of a layer split rebalanced by a small gain (step 8)
CHEAP_SCHEDULE_WORK = 4096
FLOOR_SAFETY = 1e-9  # relative margin for float rounding between a bound's sums and the schedule's


@dataclass(frozen=True)
class Prediction:
    iteration_s: float
    compute_s: float  # per micro-batch F+B summed over the slowest replica's stages, x m
    p2p_s: float  # busiest stage boundary's transfer time per iteration (one direction)
    dp_sync_s: float  # gradient sync not hidden behind the pipeline
    bubble_s: float  # pipeline time not spent computing on the busiest stage
    memory_gb_per_gpu: float  # the largest stage's need
    memory: tuple[StageMemory, ...]
    timeline: Timeline
    # the slowest replica's stage costs and its busiest stage: what the breakdown below walks
    costs: tuple[StageCost, ...] = field(default=(), repr=False, compare=False)
    busiest: int = field(default=0, repr=False, compare=False)

    # bubble_s split by what the busiest stage waits on (from the exact timeline, see _exposed_p2p):
    # iteration_s = compute_s + exposed_p2p_s + compute_wait_s + dp_sync_s. Computed when first
    # read: the planner compares plans by iteration_s alone (the walk was a third of a prediction).
    @cached_property
    def exposed_p2p_s(self) -> float:
        """Waiting while a transfer it needs is on a link (or queued for one)."""
        return min(_exposed_p2p(list(self.costs), self.timeline, self.busiest), self.bubble_s) if self.costs else 0.0

    @property
    def compute_wait_s(self) -> float:
        """Waiting on other stages' compute: pipeline fill, drain, slower stages."""
        return max(self.bubble_s - self.exposed_p2p_s, 0.0)

    @cached_property
    def dp_sync_total_s(self) -> float:
        """The longest stage's gradient sync, hidden or not (dp_sync_s is the exposed part)."""
        return max((op[3] - op[2] for ops in self.timeline.ops for op in ops if op[0] == "S"), default=0.0)

    def as_dict(self) -> dict:
        return {"iteration_s": self.iteration_s, "compute_s": self.compute_s, "p2p_s": self.p2p_s,
                "dp_sync_s": self.dp_sync_s, "bubble_s": self.bubble_s, "exposed_p2p_s": self.exposed_p2p_s,
                "compute_wait_s": self.compute_wait_s, "dp_sync_total_s": self.dp_sync_total_s}


def predict(plan: Plan, view: TopologyView, *, check_memory: bool = True) -> Prediction:
    """Exact prediction; raises InfeasiblePlan naming the stage that does not fit.

    Memoised on the view: the same plan asked of the same view is simulated once.
    """
    known = known_prediction(plan, view, check_memory=check_memory)
    if known is None:
        known = note_prediction(plan, view, _predict(plan, view, check_memory), check_memory=check_memory)
    return known


def known_prediction(plan: Plan, view: TopologyView, *, check_memory: bool = True) -> Prediction | None:
    """The prediction of ``plan`` memoised on ``view`` (:func:`predict`), if any."""
    return view._memo.get(("predict", plan, check_memory))


def note_prediction(plan: Plan, view: TopologyView, value: Prediction, *, check_memory: bool = True) -> Prediction:
    """Memoise ``value`` as ``predict(plan, view)`` (a prediction another memo kept); returns it."""
    view._memo[("predict", plan, check_memory)] = value
    return value


def _predict(plan: Plan, view: TopologyView, check_memory: bool) -> Prediction:
    mem = stage_memory(plan, view.topology)
    if check_memory:
        worst = max(mem, key=lambda s: s.need_gb - s.have_gb)
        if not worst.fits:
            raise InfeasiblePlan(
                f"stage {worst.stage} of replica {worst.replica} on {worst.cluster} needs "
                f"{worst.need_gb:.1f} GB per GPU, {worst.need_gb - worst.have_gb:.1f} GB more than the "
                f"{worst.have_gb:.1f} GB usable")
    best: tuple[Timeline, list[StageCost]] | None = None
    syncs = _syncs(plan, view)
    for r in _distinct_replicas(plan):
        costs = stage_costs(plan, view, replica=r, syncs=syncs)
        tl = simulate_1f1b(costs, plan.micro_batches)
        if best is None or tl.iteration_s > best[0].iteration_s:
            best = (tl, costs)
    tl, costs = best
    m = plan.micro_batches
    work = [c.forward_s + c.backward_s for c in costs]
    busiest = max(work) * m
    bubble = max(tl.pipeline_s - busiest, 0.0)
    return Prediction(
        iteration_s=tl.iteration_s,
        compute_s=busiest,
        p2p_s=max(max(c.send_forward_s, c.send_backward_s) for c in costs) * m,
        dp_sync_s=tl.iteration_s - tl.pipeline_s,
        bubble_s=bubble,
        memory_gb_per_gpu=max(s.need_gb for s in mem),
        memory=tuple(mem),
        timeline=tl,
        costs=tuple(costs),
        busiest=work.index(max(work)),
    )


def _exposed_p2p(costs: list[StageCost], tl: Timeline, busiest: int) -> float:
    """Of the time stage ``busiest`` is idle before the pipeline ends, the part spent waiting on a transfer.

    Every idle interval of that stage (before an op whose input had not arrived, and after its last op
    until the pipeline ends) is explained by walking the schedule's critical chain back from the op
    that ends it: an op started when its stage became free (then the previous op on that stage
    explains the time before it) or when its input arrived (then the transfer, from its producer's
    end to the arrival, queueing for the link included, explains that span and the producer the time
    before). The chain's transfer spans inside the idle interval are exposed p2p; its compute spans
    (other stages' ops) are waiting on compute. Transfer times are re-derived exactly as
    :func:`~spiderflow.costmodel.schedule.simulate_1f1b` derives them. O(S * m).
    """
    S, last = len(costs), len(costs) - 1
    ops = tl.ops
    index = [{(kind, k): n for n, (kind, k, _, _) in enumerate(stage) if kind != "S"} for stage in ops]
    arrival: dict[tuple[int, str, int], float] = {}  # (receiving stage, kind, micro-batch) -> input arrival
    for i in range(S):
        for kind, send, lat, to in (("F", costs[i].send_forward_s, costs[i].send_forward_latency_s, i + 1),
                                    ("B", costs[i].send_backward_s, costs[i].send_backward_latency_s, i - 1)):
            if not 0 <= to < S:
                continue
            chan = 0.0
            for op_kind, k, _, end in ops[i]:  # each kind's ops run in micro-batch order
                if op_kind == kind:
                    t0 = end if end > chan else chan
                    chan = t0 + send - lat
                    arrival[(to, kind, k)] = t0 + send

    def walk(i: int, n: int, lo: float, hi: float) -> float:
        """Transfer time inside [lo, hi] on the chain that ends with op n of stage i starting."""
        p2p = 0.0
        while True:
            kind, k, start, _ = ops[i][n]
            if start <= lo:
                return p2p
            if n > 0 and ops[i][n - 1][3] >= start:  # started when its stage became free
                n -= 1
                continue
            if kind == "F" and i > 0:
                j = i - 1
            elif kind == "B" and i < last:
                j = i + 1
            else:  # the first op, or the last stage's backward after its own forward
                return p2p
            producer = index[j][(kind, k)]
            end = ops[j][producer][3]
            p2p += max(0.0, min(arrival[(i, kind, k)], hi) - max(end, lo))
            i, n = j, producer

    mine = [op for op in ops[busiest] if op[0] != "S"]
    exposed, t_free = 0.0, 0.0
    for n, (_, _, start, end) in enumerate(mine):
        if start > t_free:
            exposed += walk(busiest, n, t_free, start)
        t_free = end
    if tl.pipeline_s > t_free:  # the drain after its last op: the chain of the op that ends the pipeline
        i = max(range(S), key=lambda s: max(op[3] for op in ops[s] if op[0] != "S"))
        n = max(index[i].values())
        exposed += walk(i, n, t_free, tl.pipeline_s)
    return exposed


def estimate(plan: Plan, view: TopologyView) -> float:
    """Closed-form iteration time (no memory check): the search loops' fast path."""
    syncs = _syncs(plan, view)
    return max(estimate_1f1b(stage_costs(plan, view, replica=r, syncs=syncs), plan.micro_batches)
               for r in _distinct_replicas(plan))


def estimate_memo(plan: Plan, view: TopologyView) -> float:
    """``estimate(plan, view)``, memoised on the view. TPA's search leaves there the estimate of the
    plan it returns, and the scheduler prices the same plans on the same network states again and
    again as admission looks ahead (those estimates were 5% of a profiled run of 1,500 jobs at
    load 0.9)."""
    known = known_estimate(plan, view)
    if known is None:
        known = note_estimate(plan, view, estimate(plan, view))
    return known


def known_estimate(plan: Plan, view: TopologyView) -> float | None:
    """The estimate of ``plan`` memoised on ``view`` (:func:`estimate_memo`), if any."""
    return view._memo.get(("estimate", plan))


def note_estimate(plan: Plan, view: TopologyView, value: float) -> float:
    """Memoise ``value`` as ``estimate(plan, view)`` (a search that scored the plan already); returns it."""
    view._memo[("estimate", plan)] = value
    return value


class LayerMoves:
    """``plan``'s stages priced with other layer ranges, a stage at a time: what
    :func:`~spiderflow.parallel.tpa.rebalance` needs to judge moving one layer across a stage boundary
    without pricing the whole plan again. A stage's cost and memory depend on its own layer range,
    not on the others' (its neighbours' clusters, the plan's micro-batching and levers stay), and
    on that range only through its length (whether it holds the first or the last layer follows from
    its place in the pipeline), so they are priced once per stage and length; :meth:`estimate` of the
    stages' ranges is the same float as ``estimate`` of the plan split so, and :meth:`fits` of every
    stage is ``fits_memory`` of it."""

    def __init__(self, plan: Plan, view: TopologyView) -> None:
        self.plan, self.view = plan, view
        self.replicas = _distinct_replicas(plan)
        self._crowd = crowd_of(plan, view)
        self._costs: dict[tuple[int, int, int], tuple[StageCost, tuple]] = {}  # the cost, its batch row
        self._fits: dict[tuple[int, int], bool] = {}
        self._rings: dict[tuple[str, ...], int] = {}

    def cost(self, replica: int, i: int, start: int, end: int) -> StageCost:
        """Stage ``i`` of ``replica`` (one of :attr:`replicas`) holding layers ``[start, end)``."""
        return self._priced(replica, i, start, end)[0]

    def _priced(self, replica: int, i: int, start: int, end: int) -> tuple[StageCost, tuple]:
        """:meth:`cost`, and its figures as a row of :func:`estimate_batch`'s input (``FIELDS``, then
        a number for its sync ring)."""
        key = (replica, i, end - start)  # stage i starts at layer 0 or ends at the last only as the first or last
        hit = self._costs.get(key)
        if hit is None:
            plan, view = self.plan, self.view
            st = replace(plan.replicas[replica][i], layer_start=start, layer_end=end)
            item = stage_work(plan, view, replica, i, st, stage_sync(plan, view, i, st))
            c = price([item], view, self._crowd)[0]
            ring = self._rings.setdefault(c.sync_ring, len(self._rings))
            hit = self._costs[key] = (c, (*(getattr(c, f) for f in FIELDS), ring))
        return hit

    def fits(self, i: int, start: int, end: int) -> bool:
        """Stage ``i`` of every replica fits in memory holding layers ``[start, end)``."""
        key = (i, end - start)
        hit = self._fits.get(key)
        if hit is None:
            plan, topology = self.plan, self.view.topology
            hit = self._fits[key] = all(
                stage_memory_of(plan, topology, r, i, replace(rep[i], layer_start=start, layer_end=end)).fits
                for r, rep in enumerate(plan.replicas))
        return hit

    def estimate(self, bounds: Sequence[int]) -> float:
        """``estimate`` of the plan with stage ``i`` holding layers ``[bounds[i], bounds[i + 1])``."""
        return max(estimate_1f1b([self.cost(r, i, bounds[i], bounds[i + 1]) for i in range(len(bounds) - 1)],
                                 self.plan.micro_batches) for r in self.replicas)

    def estimates(self, bounds: Sequence[int], moves: Sequence[tuple[int, int]]) -> list[float]:
        """:meth:`estimate` of each move ``(i, at)`` of ``bounds``: the boundary between stages i - 1
        and i moved to layer ``at``. The same floats; from ``BATCH_MOVES`` moves up computed together
        (:func:`~spiderflow.costmodel.batch.estimate_batch`), below that one by one (faster there)."""
        if len(moves) < BATCH_MOVES:
            return [self.estimate([*bounds[:i], at, *bounds[i + 1:]]) for i, at in moves]
        rows = np.arange(len(moves))
        lo = np.array([i - 1 for i, _ in moves])
        out = None
        for r in self.replicas:
            base = np.array([self._priced(r, i, bounds[i], bounds[i + 1])[1] for i in range(len(bounds) - 1)])
            figures = np.empty((len(FIELDS) + 1, len(moves), len(base)))
            figures[:] = base.T[:, None, :]
            figures[:, rows, lo] = np.array([self._priced(r, i - 1, bounds[i - 1], at)[1] for i, at in moves]).T
            figures[:, rows, lo + 1] = np.array([self._priced(r, i, at, bounds[i + 1])[1] for i, at in moves]).T
            t = estimate_batch(figures[:-1], figures[-1].astype(np.int64), self.plan.micro_batches)
            out = t if out is None else np.maximum(out, t)
        return out.tolist()


def repricer(plan: Plan, view: TopologyView) -> Repricer:
    """What re-prices ``plan`` under changing bandwidths (the simulator, as a running job's shares
    move): the work items of each distinct replica depend on the view's topology and calibration
    only, not on its link load or bandwidths, so they are built once, and so are the costs of
    those that stay inside a cluster (:class:`~spiderflow.costmodel.work.Repricer`)."""
    syncs = _syncs(plan, view)
    return Repricer([replica_work(plan, view, r, syncs) for r in _distinct_replicas(plan)], view,
                    plan_chains(plan))


def estimate_repriced(pricer: Repricer, plan: Plan, view: TopologyView) -> float:
    """``estimate`` of ``plan``, whose :func:`repricer` this is, on ``view`` (the same float)."""
    return pricer.estimate(view, plan.micro_batches)


def schedule_bounds(plan: Plan, view: TopologyView) -> tuple[float, float]:
    """(at least ``predict``'s ``compute_s``, at most its ``iteration_s``) without running the
    schedule: O(S) per distinct replica (:func:`~spiderflow.costmodel.schedule.floor_1f1b`)."""
    syncs = _syncs(plan, view)
    m = plan.micro_batches
    compute = floor = 0.0
    for r in _distinct_replicas(plan):
        costs = stage_costs(plan, view, replica=r, syncs=syncs)
        compute = max(compute, max(c.forward_s + c.backward_s for c in costs) * m)
        floor = max(floor, floor_1f1b(costs, m))
    return compute, floor * (1 - FLOOR_SAFETY)


def _syncs(plan: Plan, view: TopologyView) -> list[tuple]:
    return stage_syncs(plan, view)


def _distinct_replicas(plan: Plan) -> list[int]:
    """One replica index per distinct stage layout (identical replicas cost the same)."""
    seen: dict[tuple, int] = {}
    for r, rep in enumerate(plan.replicas):
        seen.setdefault(tuple((s.cluster, s.tp) for s in rep), r)
    return list(seen.values())


def fits_memory(plan: Plan, view: TopologyView) -> bool:
    return all(s.fits for s in stage_memory(plan, view.topology))


__all__ = ["AlphaBeta", "Calibration", "Channel", "GBPS", "MatrixView", "NO_CALIBRATION", "PlanWork", "Prediction",
           "RankWork", "StageMemory", "Timeline", "TopologyView", "estimate", "fits_memory", "load_calibration",
           "Repricer", "estimate_memo", "estimate_repriced", "known_estimate", "known_prediction", "note_estimate",
           "note_prediction", "plan_work", "predict", "repricer", "schedule_bounds"]
