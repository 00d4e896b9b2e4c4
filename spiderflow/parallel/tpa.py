"""TPA, inter-cluster level: turn a placement into the fastest plan found.

For every shape the placement admits (:mod:`spiderflow.parallel.shapes`):

1. **Layer split** in proportion to each stage's compute (``tp x peak x
   efficiency``; for replicas, the slowest replica's stage at each position),
   at least one layer per stage; then, while a stage does not fit in memory,
   move a layer from it to its lighter neighbour.
2. **Micro-batching**: micro-batch size b in 1, 2, 4, 8 (only the smallest for
   one-stage shapes, where no bubble makes b matter); the micro-batch count
   ``m = global_batch / (replicas x dp x b)`` (shapes that do not divide the
   batch are skipped unless none does; then m is rounded up and the plan's
   ``global_batch`` says so).
3. **Memory** levers when a stage still does not fit: ZeRO-1, then full
   recomputation.

Candidates are ranked with the cost model's closed-form ``estimate``; the
best ``EXACT_CHECKS`` are re-ranked with the exact 1F1B ``predict``. The
winner is set beside its intra-cluster refinement (:func:`finalize`, the
ILP of :mod:`spiderflow.parallel.intra_ilp`: per cluster, TP / PP and the
layer split under memory), and the faster under the exact schedule is kept.
SpinSearch then moves layers across its best plan's stage boundaries (and
its near ties') while the estimate falls (:func:`rebalance`, its step 8:
step 1's split suits a pipeline its compute paces, not one a thin WAN link
paces).
Cost: O(shapes x 4 x S) estimates at most; shapes are capped by
``MAX_ENUMERATED_SEGMENTS``. In practice a handful: candidates are taken in
order of an admissible floor under their estimate and the search stops when
the floor passes the best found (:mod:`spiderflow.parallel.bounds`), which
returns exactly the plan scoring every candidate would.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import replace

from spiderflow.costmodel import (CHEAP_SCHEDULE_WORK, LayerMoves, TopologyView, estimate, fits_memory,
                                  known_estimate, known_prediction, note_estimate, note_prediction, predict,
                                  schedule_bounds)
from spiderflow.errors import InfeasiblePlan
from spiderflow.costmodel.network import Crowded, crowded_route
from spiderflow.costmodel.work import chains_crowd_of
from spiderflow.parallel.bounds import MemoryFit, QuickBound, ShapeBound, shape_channels, split_floors
from spiderflow.parallel.intra_ilp import IntraProblem, solve_intra
from spiderflow.parallel.shapes import Shape, enumerate_shapes, replica_runs
from spiderflow.plan import Plan, Stage
from spiderflow.workload import Job

MICRO_BATCH_SIZES = (1, 2, 4, 8)
EXACT_CHECKS = 3
ILP_COMPUTE_SHARE = 0.5
# rebalance: a split whose estimate is this much lower is taken as faster; closer, the exact schedules judge
# (on 178 moved splits of 2,000 simulated jobs at load 0.9, each whose estimate fell by 0.5% or more ran
# faster on the exact schedule; 10 of the 21 that fell by less did not)
REBALANCE_SURE = 0.02
# ... when the plan's schedule is cheap to run (CHEAP_SCHEDULE_WORK, step 7's bound too); larger plans run
# hundreds of micro-batches, whose steady state the estimate prices closely: on the 30 such splits of that
# run the exact schedule's gain was within 0.5% of the estimate's and none ran slower (one alike), while
# their schedules took 1.2 s, a tenth of the run's CPU
REBALANCE_STEP = 1e-3  # rebalance stops at a move that lowers the estimate by less than this share


def split_layers(layers: int, weights: Sequence[float]) -> list[int]:
    """Largest-remainder apportionment of ``layers`` by ``weights``, each >= 1."""
    n = len(weights)
    if n > layers:
        raise ValueError(f"{n} stages for {layers} layers")
    total = sum(weights)
    raw = [x if x > 1.0 else 1.0 for x in (layers * w / total for w in weights)]  # max(1.0, x), no call
    counts = [int(x) for x in raw]  # each >= 1: raw is
    while sum(counts) > layers:
        i = max((j for j in range(n) if counts[j] > 1), key=lambda j: counts[j] - raw[j])
        counts[i] -= 1
    short = layers - sum(counts)
    if 0 < short <= n:
        # Each layer short goes to the largest remainder raw - count (the first of equals); once
        # given, a stage's remainder is below every other's (remainders are in [0, 1) here: the
        # counts are raw's integer parts), so the ``short`` largest take one each, at once.
        remainder = [r - c for r, c in zip(raw, counts)]
        if min(remainder) >= 0.0:  # (a stable sort keeps the first of equals first)
            for j in sorted(range(n), key=remainder.__getitem__, reverse=True)[:short]:
                counts[j] += 1
            return counts
    while sum(counts) < layers:
        i = max(range(n), key=lambda j: raw[j] - counts[j])
        counts[i] += 1
    return counts


def _stage_speeds(shape: Shape, view: TopologyView) -> list[float]:
    cal = view.calibration
    speeds = None
    for rep in shape.replicas:
        s = []
        for cluster, tp, pp in rep:
            prof = view.topology.cluster(cluster).profile
            s.extend([tp * prof.peak_tflops * cal.gpu_efficiency.get(prof.name, prof.efficiency)] * pp)
        speeds = s if speeds is None else [min(a, b) for a, b in zip(speeds, s)]
    return speeds


def _build(job: Job, shape: Shape, counts: list[int], b: int, m: int, *, zero1: bool,
           recompute: bool) -> Plan:
    bounds = list(itertools.accumulate(counts, initial=0))
    replicas = []
    for rep in shape.replicas:
        stages, i = [], 0
        for cluster, tp, pp in rep:
            for _ in range(pp):
                stages.append(Stage(cluster=cluster, layer_start=bounds[i], layer_end=bounds[i + 1], tp=tp))
                i += 1
        replicas.append(tuple(stages))
    return Plan(job=job, replicas=tuple(replicas), dp=shape.dp, micro_batch_size=b, micro_batches=m,
                zero1=zero1, recompute=recompute)


def micro_batchings(job: Job, data_parallel: int) -> list[tuple[int, int]]:
    exact = [(b, job.global_batch // (data_parallel * b)) for b in MICRO_BATCH_SIZES
             if job.global_batch % (data_parallel * b) == 0]
    if exact:
        return exact
    return [(b, -(-job.global_batch // (data_parallel * b))) for b in MICRO_BATCH_SIZES[:2]]


_MEMO: OrderedDict = OrderedDict()
MEMO_SIZE = 50_000


def _memo_key(job: Job, segments: Sequence[tuple[str, int]], view: TopologyView, flags: tuple) -> tuple:
    """Everything TPA's answer depends on: the job's shape, the chain, and the network figures
    among the chain's clusters (pairwise channels; on one topology these also fix ring rates),
    with the load of every link a crowded send reads (:func:`_crowded_links`)."""
    # every ordered pair of the chain's clusters, as (rate, -alpha) floats (compared and hashed in C on
    # every lookup), of the sorted set: the view memoises them, and SpinSearch's orders made them already
    chans = view.figures(tuple(sorted({c for c, _ in segments})))
    return (id(view.topology), id(view.calibration), view.shares_links, job.model, job.gpus,
            job.global_batch, job.seq_len, tuple(segments), chans,
            _crowded_links(tuple(c for c, _ in segments), view), flags)


def _crowded_links(names: tuple[str, ...], view: TopologyView) -> tuple:
    """The links whose load a plan on the chain ``names`` reads beyond the pairs' figures, with their
    imposed rate and load on ``view`` (memoised on it). A send between two consecutive clusters of a
    replica whose route crosses a hop the plan's own transfers crowd is priced link by link
    (:meth:`~spiderflow.costmodel.network.Crowded.get`: each link's share, divided among the
    transfers on it), not by the route's narrowest link alone: two states with the same figures
    between the clusters but another load on such a link price such plans differently (a chain
    a-b-c routed through x, where load on x-b moved no pair's figure, got the plan and the estimate,
    3.0 s, of the unloaded state from the memo, where that plan takes 4.9 s and a search finds one of
    3.7 s). Which links those are is the topology's business alone (:func:`_links_read`)."""
    if not view.shares_links or len(names) < 2:
        return ()
    key = ("crowded links", names)
    hit = view._memo.get(key)
    if hit is None:
        gbps, load = view.link_gbps, view.link_load
        hit = view._memo[key] = tuple((link, gbps.get(link), load.get(link)) for link in _links_read(names, view))
    return hit


def _links_read(names: tuple[str, ...], view: TopologyView) -> tuple[tuple[str, str], ...]:
    """The links (sorted) whose load a plan on the chain ``names`` reads beyond the pairs' figures, on a
    view that shares links: the replicas of every split of the chain into equal runs are the chains
    TPA's shapes, floors and estimates crowd (:func:`~spiderflow.parallel.bounds.shape_channels`),
    and :func:`~spiderflow.costmodel.network.crowded_route` says which sends' prices read their
    routes' links. Both follow the topology's routes alone, never a link's load: memoised on the
    topology, for every network state on it."""
    def make() -> tuple[tuple[str, str], ...]:
        topology, links = view.topology, set()
        for runs in replica_runs(names):
            hops = {hop for hop, _ in chains_crowd_of(runs, view)}
            if not hops:
                continue
            for run in runs:
                for a, b in zip(run, run[1:]):
                    if a != b:
                        for path in (crowded_route(topology, hops, a, b), crowded_route(topology, hops, b, a)):
                            if path is not None:
                                links.update(link.key for link in path.links)
        return tuple(sorted(links))

    return view.topology.derived(("links read", names), make)


def plan_placement(job: Job, segments: Sequence[tuple[str, int]], view: TopologyView, *,
                   intra_ilp: bool = True, exact_checks: int = EXACT_CHECKS,
                   beat: float = math.inf) -> Plan | None:
    """The fastest plan TPA finds for ``segments`` (ordered (cluster, gpus)); InfeasiblePlan if none fits.

    Memoised (LRU, ``MEMO_SIZE`` entries) on the job's shape, the chain and the network figures
    among its clusters, so a trace's recurring job shapes are planned once per network state.
    ``beat`` (with ``exact_checks=1`` and no ILP): the caller only wants a plan whose estimate is
    below it; the search skips every candidate whose floor is not, and returns None (or a plan that
    does not beat it) when no plan beats it, else the same plan as without ``beat``.
    """
    if beat < math.inf and (intra_ilp or exact_checks != 1):
        raise ValueError("beat needs exact_checks=1 and intra_ilp=False")
    key = _memo_key(job, segments, view, (intra_ilp, exact_checks))
    hit = _MEMO.get(key)
    if isinstance(hit, _NoneBelow):
        if beat <= hit.beat:
            _MEMO.move_to_end(key)
            return None
        hit = None  # asked to beat more than that: search again
    if hit is not None:
        _MEMO.move_to_end(key)
        if isinstance(hit, InfeasiblePlan):
            raise InfeasiblePlan(str(hit).replace(hit.job_id, job.job_id, 1)) from None
        plan = hit[0].for_job(job)
        if hit[1] is not None:
            note_estimate(plan, view, hit[1])
        return plan
    try:
        plan = _plan_placement(job, segments, view, intra_ilp=intra_ilp, exact_checks=exact_checks, beat=beat)
    except InfeasiblePlan as exc:
        exc.job_id = job.job_id
        _remember(key, exc)
        raise
    if plan is not None:
        _remember(key, (plan, known_estimate(plan, view)))
    elif beat < math.inf:
        _remember(key, _NoneBelow(beat))
    return plan


class _NoneBelow:
    """Memo entry: no plan of this key has an estimate below ``beat`` (a search asked to beat it
    returned None). Asked to beat that or less, the search returns None again, or a plan that
    does not beat it, which the caller passes over alike; SpinSearch asks the same chains on the
    same network figures to beat the same best again and again as admission looks ahead (on
    1,000 jobs at load 0.9, half of TPA's calls)."""

    __slots__ = ("beat",)

    def __init__(self, beat: float) -> None:
        self.beat = beat


def finalize_memo(job: Job, segments: Sequence[tuple[str, int]], plan: Plan, view: TopologyView) -> Plan:
    """:func:`finalize` of ``plan_placement(job, segments, view, intra_ilp=False, ...)``'s plan,
    memoised with its exact prediction (when finalize made one) under the same key as
    ``plan_placement`` (both depend on the view only through the network figures among
    ``segments``' clusters); a hit puts the prediction in the view's memo, so predicting the plan
    again costs nothing."""
    key = _memo_key(job, segments, view, ("finalize", *_plan_fields(plan)))
    hit = _MEMO.get(key)
    if hit is not None:
        _MEMO.move_to_end(key)
        final = hit[0].for_job(job)
        if hit[1] is not None:
            note_prediction(final, view, hit[1])
        return final
    final = finalize(plan, view)
    _remember(key, (final, known_prediction(final, view)))
    return final


def rebalance(plan: Plan, view: TopologyView) -> Plan:
    """``plan`` with its layers moved between adjacent stages, one at a time, while that lowers the
    closed-form estimate: each step the best such move that keeps every stage in memory, until none
    lowers it by ``REBALANCE_STEP``. The layer split of the search (step 1) is in proportion to each
    stage's compute, which balances a pipeline whose pace its compute sets; across a thin WAN boundary
    the round trip of the micro-batches in flight sets it, and another split shortens that (a 32-GPU
    gpt3-13b job on an a100-80gb and an h100 cluster, 16 generated clusters: 4 of 40 layers on the a100
    stage, 16.8 s an iteration; 1 there and the h100 stages' 36 spread 9/18/12, 13.3 s). Replicas keep
    one split (their stages share layer boundaries). Each move is priced on the two stages it changes
    (:class:`~spiderflow.costmodel.LayerMoves`), every move of a step at once; a split whose estimate
    fell by less than ``REBALANCE_SURE`` is kept only if the exact schedule agrees, where that schedule
    is cheap to run (``CHEAP_SCHEDULE_WORK``)."""
    if plan.depth < 2:
        return plan
    moves = LayerMoves(plan, view)
    bounds = [0, *itertools.accumulate(s.layers for s in plan.replicas[0])]  # stage i: [bounds[i], bounds[i + 1])
    best_t = start_t = moves.estimate(bounds)
    moved = False
    for _ in range(plan.job.spec.layers):  # each step lowers the estimate; a bound, never reached
        # boundary i, between stages i - 1 and i, a layer down or up
        cands = [(i, at) for i in range(1, plan.depth) for at in (bounds[i] - 1, bounds[i] + 1)
                 if bounds[i - 1] < at < bounds[i + 1]
                 and moves.fits(i - 1, bounds[i - 1], at) and moves.fits(i, at, bounds[i + 1])]
        ts = moves.estimates(bounds, cands)
        if not ts or min(ts) > best_t * (1 - REBALANCE_STEP):
            break
        best_t = min(ts)
        i, at = cands[ts.index(best_t)]  # the first of the lowest
        bounds[i], moved = at, True
    if not moved:
        return plan
    best = _split(plan, [b - a for a, b in zip(bounds, bounds[1:])])
    if (best_t > start_t * (1 - REBALANCE_SURE) and plan.depth * plan.micro_batches <= CHEAP_SCHEDULE_WORK
            and predict(best, view).iteration_s >= predict(plan, view).iteration_s):
        return plan
    note_estimate(best, view, best_t)
    return best


def _split(plan: Plan, counts: Sequence[int]) -> Plan:
    """``plan`` with ``counts`` layers on its stages, in order (every replica alike)."""
    bounds = list(itertools.accumulate(counts, initial=0))
    return replace(plan, replicas=tuple(
        tuple(replace(s, layer_start=bounds[i], layer_end=bounds[i + 1]) for i, s in enumerate(rep))
        for rep in plan.replicas))


def rebalance_memo(job: Job, segments: Sequence[tuple[str, int]], plan: Plan, view: TopologyView) -> Plan:
    """:func:`rebalance` of ``plan`` (TPA's for ``segments``), memoised as :func:`finalize_memo` is."""
    key = _memo_key(job, segments, view, ("rebalance", *_plan_fields(plan)))
    hit = _MEMO.get(key)
    if hit is not None:
        _MEMO.move_to_end(key)
        return hit.for_job(job)
    out = rebalance(plan, view)
    _remember(key, out)
    return out


def _plan_fields(plan: Plan) -> tuple:
    """What a plan is, for a memo key: its micro-batching, data parallelism, stages and levers."""
    return (plan.micro_batch_size, plan.micro_batches, plan.dp,
            tuple((s.cluster, s.layer_start, s.tp) for r in plan.replicas for s in r), plan.zero1, plan.recompute)


def clear_memo() -> None:
    """Forget every plan memoised by :func:`plan_placement`, :func:`finalize_memo` and :func:`rebalance_memo`."""
    _MEMO.clear()


def _remember(key: tuple, value) -> None:
    _MEMO[key] = value
    if len(_MEMO) > MEMO_SIZE:
        _MEMO.popitem(last=False)


def _plan_placement(job: Job, segments: Sequence[tuple[str, int]], view: TopologyView, *,
                    intra_ilp: bool, exact_checks: int, beat: float = math.inf) -> Plan | None:
    # Every (shape, micro-batching) candidate with a floor under its estimate, taken best floor
    # first: once the floor passes the k-th best estimate found, no later candidate can enter the
    # best k (the floors are admissible: :mod:`spiderflow.parallel.bounds`). A candidate starts with
    # its split's floor (one per number of replicas, before any shape is bounded), is put back with
    # its shape's quick floor (with pipeline replicas, their rings priced on the shape's layer
    # split), then, once its layer split and the memory levers that split needs
    # are known (none fits: no plan, dropped), with the quick floor on that split and the tighter
    # ones of the split (the steady period from adjacent stages, then from every window of
    # stages), each counting the forward a plan that recomputes runs again, before it is built
    # and estimated. The enumeration index breaks ties, so the finalists are exactly those of
    # scoring every candidate. (Before the levers came first, half the candidates whose split
    # was bounded turned out to recompute, and the floors without it were about 6% under their
    # estimates: on the 2,769 calls of a simulated 3,000-job trace, 29,453 splits were bounded
    # and 1,971 plans estimated, now 11,001 and 1,783, for the same answers.)
    floors = split_floors(job, segments, view)
    if beat < math.inf and min(floors.values()) >= beat:
        return None  # no shape of the chain can beat it
    k = max(1, exact_checks)
    # candidates: (floor, enumeration index, level, shape number, b, m); the per-shape state below is
    # keyed on the shape's number (Shape's own hash is a Python call: 830,000 of them on 2,749 calls)
    heap: list[tuple[float, int, int, int, int, int]] = []
    shapes = enumerate_shapes(segments, view.topology, job.spec)
    for number, shape in enumerate(shapes):
        options = micro_batchings(job, len(shape.replicas) * shape.dp)
        if shape.depth == 1:  # one stage: no bubble, compute linear in b -> every b takes the same time
            options = options[:1]
        for b, m in options:
            heap.append((floors[len(shape.replicas)], len(heap), 0, number, b, m))
    heapq.heapify(heap)
    quick: dict[int, QuickBound] = {}
    split_quick: dict[tuple[int, bool], QuickBound] = {}
    counts_of: dict[int, list[int]] = {}  # per shape: the layer split every plan of it takes
    memory_of: dict[int, MemoryFit] = {}
    floors_of: dict[int, ShapeBound] = {}
    levers: dict[int, tuple[bool, bool]] = {}  # per candidate: (ZeRO-1, recomputation)
    # every shape with R replicas has the same runs of the chain's clusters, so the same channels
    channels: dict[int, Crowded] = {}

    def channel(shape: Shape) -> Crowded:
        hit = channels.get(len(shape.replicas))
        if hit is None:
            hit = channels[len(shape.replicas)] = shape_channels(shape, view)
        return hit

    scored: list[tuple[float, int, Plan]] = []  # max-heap of the best k: (-estimate, -index, plan)
    cut = False
    while heap:
        bound, index, level, number, b, m = heapq.heappop(heap)
        shape = shapes[number]
        if bound >= beat:
            cut = True
            break
        if len(scored) == k and bound > -scored[0][0]:
            break
        counts = counts_of.get(number)
        if counts is None and (level or len(shape.replicas) > 1):
            counts = counts_of[number] = split_layers(job.spec.layers, _stage_speeds(shape, view))
        if level == 0:
            if number not in quick:
                # pipeline replicas: their rings' syncs priced on the split every plan of the shape
                # takes (4,000 admission calls at load 0.9: with a layer per stage these floors sat at
                # 0.72x what they had to beat, and most were cut only by the shape's own bound)
                quick[number] = QuickBound(job, shape, view, channel(shape), rings_on=counts)
            floor = quick[number].bound(b, m)
            heapq.heappush(heap, (floor if floor > bound else bound, index, 1, number, b, m))
            continue
        if level == 1:  # the memory levers its split needs, from the split alone: none fit, no plan
            memory = memory_of.get(number)
            if memory is None:
                memory = memory_of[number] = MemoryFit(job, shape, counts, view)
            variant = levers[index] = memory.variant(b, m)
            if variant is None:
                continue
            # the quick floor on its split (a plan that recomputes runs each forward again in its
            # backward: its floors count it)
            key = number, variant[1]
            if key not in split_quick:
                split_quick[key] = quick[number].split(counts, recompute=variant[1])
            floor = split_quick[key].bound(b, m)
            heapq.heappush(heap, (floor if floor > bound else bound, index, 2, number, b, m))
            continue
        zero1, recompute = levers[index]
        if number not in floors_of:
            floors_of[number] = ShapeBound(job, shape, counts, view, channel(shape))
        if level < 4:  # its split's floor with the adjacent windows of stages, then with every window
            floor = floors_of[number].bound(b, m, recompute=recompute, every_window=level == 3)
            heapq.heappush(heap, (floor if floor > bound else bound, index, level + 1, number, b, m))
            continue
        plan = _build(job, shape, counts, b, m, zero1=zero1, recompute=recompute)
        item = (-estimate(plan, view), -index, plan)
        if len(scored) < k:
            heapq.heappush(scored, item)
        elif item[:2] > scored[0][:2]:
            heapq.heapreplace(scored, item)
    if cut and (not scored or -scored[0][0] >= beat):
        return None  # nothing beats ``beat``: every candidate left has a floor at or above it
    if not scored:
        where = ", ".join(f"{c}:{g}" for c, g in segments)
        if not shapes:
            raise InfeasiblePlan(f"{job.job_id}: no parallel shape fits {where} "
                                 f"(GPU counts must factor as tp x pp x dp with tp dividing "
                                 f"{job.spec.heads} heads)")
        raise InfeasiblePlan(f"{job.job_id}: {job.model} does not fit in GPU memory on {where} "
                             f"even with ZeRO-1 and recomputation; it needs more GPUs or larger ones")
    finalists = [p for _, _, p in sorted(scored, key=lambda x: (-x[0], -x[1]))]
    best = finalists[0] if len(finalists) == 1 else min(finalists, key=lambda p: predict(p, view).iteration_s)
    if len(finalists) == 1 and not intra_ilp:
        note_estimate(best, view, -scored[0][0])
    return finalize(best, view) if intra_ilp else best


def finalize(plan: Plan, view: TopologyView) -> Plan:
    """The plan or its intra-cluster ILP refinement, whichever the exact schedule finds faster.

    The ILP balances stage compute under memory, so it is only asked where compute is at least
    ``ILP_COMPUTE_SHARE`` of the iteration; on WAN-bound plans it cannot pay for its ~30 ms solve.
    """
    if len(plan.replicas) > 1:
        return plan  # refine_intra keeps replicas' shared layer boundaries: nothing to refine
    # Bounds first (O(S)): they settle most plans without simulating the schedule, and give the
    # same answer as the exact figures would.
    compute_cap, floor = schedule_bounds(plan, view)
    if compute_cap < ILP_COMPUTE_SHARE * floor:  # compute_s <= cap, iteration_s >= floor
        return plan
    # The ILP (a memoised greedy solve) before the exact schedule: a refinement that splits every
    # cluster's layers as the plan does keeps the plan whatever its schedule (on the 64-cluster
    # synthetic trace, 426 of 680 refinements: a third of SpinSearch's exact schedules)
    refined = refine_intra(plan, view)
    if refined is None or refined.replicas == plan.replicas:
        return plan
    base = predict(plan, view)
    if base.compute_s < ILP_COMPUTE_SHARE * base.iteration_s:
        return plan
    if schedule_bounds(refined, view)[1] >= base.iteration_s:
        return plan
    if predict(refined, view).iteration_s < base.iteration_s:
        return refined
    return plan


def refine_intra(plan: Plan, view: TopologyView) -> Plan | None:
    """Re-plan each cluster's block of a single-replica plan with the intra-cluster ILP."""
    if len(plan.replicas) > 1:
        return None  # replicas must share layer boundaries; keep the inter-level split
    blocks: list[list[Stage]] = []
    for st in plan.stages:
        if blocks and blocks[-1][0].cluster == st.cluster:
            blocks[-1].append(st)
        else:
            blocks.append([st])
    stages, before = [], 0
    for block in blocks:
        cluster = view.topology.cluster(block[0].cluster)
        prof = cluster.profile
        layers = block[-1].layer_end - block[0].layer_start
        after = plan.depth - before - len(block)
        # Fields the ILP cannot tell apart are normalised, so its memo serves more plans: a stage
        # holds min(S - i, m) micro-batches with S <= before + layers + after, and ZeRO-1's group
        # size matters only with ZeRO-1.
        problem = IntraProblem(
            model=plan.job.model, gpu=prof.name, gpus_per_node=cluster.gpus_per_node,
            nvlink_gbps=cluster.intra_node_bandwidth_gbps, gpus=sum(s.tp for s in block) * plan.dp,
            dp=plan.dp, dp_total=plan.data_parallel if plan.zero1 else 1, layers=layers,
            first=block[0].layer_start == 0, last=block[-1].layer_end == plan.job.spec.layers,
            stages_before=before, stages_after=after, micro_batch_size=plan.micro_batch_size,
            micro_batches=min(plan.micro_batches, before + layers + after),
            seq_len=plan.job.seq_len, recompute=plan.recompute, zero1=plan.zero1,
            efficiency=view.calibration.gpu_efficiency.get(prof.name, prof.efficiency))
        sol = solve_intra(problem)
        if sol is None:
            return None
        start = block[0].layer_start
        for n in sol.layers:
            stages.append(Stage(cluster=cluster.name, layer_start=start, layer_end=start + n, tp=sol.tp))
            start += n
        before += len(block)
    refined = replace(plan, replicas=(tuple(stages),))
    return refined if fits_memory(refined, view) else None
