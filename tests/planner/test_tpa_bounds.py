"""TPA's shortcuts keep its answer: the floors are under every estimate, the arithmetic memory
check agrees with ``fits_memory``, the pruned search returns what scoring every shape returns, the
schedule's floor is under the exact schedule, and ``finalize`` decides as it did with exact figures."""

import heapq
import itertools
import random

import pytest

from spiderflow.costmodel import TopologyView, estimate, fits_memory, known_estimate, predict
from spiderflow.costmodel.schedule import floor_1f1b, simulate_1f1b
from spiderflow.costmodel.stages import StageCost
from spiderflow.costmodel.work import crowd_of, stage_costs
from spiderflow.errors import InfeasiblePlan
from spiderflow.parallel import tpa
from spiderflow.parallel.bounds import (MEMORY_VARIANTS, QuickBound, ShapeBound, chain_floor, memory_variant,
                                        split_floors)
from spiderflow.parallel.shapes import enumerate_shapes
from spiderflow.topology import parse_topology
from spiderflow.topology.generate import generate_topology
from spiderflow.workload import MODELS as MODEL_SPECS, Job

MODELS = ("gpt3-1.3b", "gpt3-13b", "llama2-13b", "llama2-70b")


def _cases(seed: int, n: int):
    topo = generate_topology(12, seed)
    rng = random.Random(seed)
    load = {l.key: float(rng.randint(1, 3)) for l in topo.links if rng.random() < 0.4}
    view = TopologyView(topology=topo, link_load=load)
    names = [c.name for c in topo.clusters]
    for i in range(n):
        k = rng.choice((1, 2, 2, 3, 4))
        chain = [(c, rng.choice((8, 16, 32, 48, 64))) for c in rng.sample(names, k)]
        job = Job(job_id=f"j{i}", arrival_s=0.0, model=rng.choice(MODELS), gpus=sum(g for _, g in chain),
                  iterations=1, global_batch=rng.choice((96, 256, 512)), seq_len=rng.choice((1024, 2048)))
        yield job, chain, view


def _score_all(job, chain, view, k):
    """The search before pruning: every candidate fitted (levers tried in turn) and estimated."""
    scored, tie = [], itertools.count()
    for shape in enumerate_shapes(chain, view.topology, job.spec):
        options = tpa.micro_batchings(job, len(shape.replicas) * shape.dp)
        for b, m in options[:1] if shape.depth == 1 else options:
            counts = tpa.split_layers(job.spec.layers, tpa._stage_speeds(shape, view))
            for zero1, recompute in MEMORY_VARIANTS:
                plan = tpa._build(job, shape, counts, b, m, zero1=zero1, recompute=recompute)
                if fits_memory(plan, view):
                    scored.append((estimate(plan, view), next(tie), plan))
                    break
    return [p for _, _, p in heapq.nsmallest(k, scored)]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_floor_is_under_every_estimate_and_memory_matches(seed):
    checked = tight = quick_r = 0
    for job, segments, view in _cases(seed, 12):
        for shape in enumerate_shapes(segments, view.topology, job.spec):
            counts = tpa.split_layers(job.spec.layers, tpa._stage_speeds(shape, view))
            floor, quick = ShapeBound(job, shape, counts, view), QuickBound(job, shape, view)
            # the quick floor with its rings' syncs priced on the split every plan of the shape takes
            on_split = QuickBound(job, shape, view, rings_on=counts)
            split = split_floors(job, segments, view)[len(shape.replicas)]
            assert chain_floor(job, segments, view) <= split
            for b, m in tpa.micro_batchings(job, len(shape.replicas) * shape.dp):
                first = None
                for zero1, recompute in MEMORY_VARIANTS:
                    plan = tpa._build(job, shape, counts, b, m, zero1=zero1, recompute=recompute)
                    est = estimate(plan, view)
                    assert split <= quick.bound(b, m) <= on_split.bound(b, m) <= est
                    # on the plan's own split, for every lever up to its own (recomputing only adds work)
                    assert quick.split(counts).bound(b, m) <= est
                    if recompute:
                        assert quick.split(counts, recompute=True).bound(b, m) <= est
                        quick_r += quick.split(counts, recompute=True).bound(b, m) > floor.bound(b, m)
                    full = floor.bound(b, m, recompute, every_window=True)
                    assert floor.bound(b, m) <= floor.bound(b, m, recompute) <= full * (1 + 1e-12)  # sums' order
                    assert floor.bound(b, m, every_window=True) <= full <= est
                    if not any(w for rep in floor.replicas for w, _ in rep.wan):  # no ring to order
                        assert full == pytest.approx(est, rel=1e-6)  # estimate's own terms
                        tight += 1
                    if first is None and fits_memory(plan, view):
                        first = (zero1, recompute)
                    checked += 1
                assert memory_variant(job, shape, counts, b, m, view) == first
    assert checked > 300 and tight > 30
    assert quick_r > 30  # recomputation's quick floor is above the split's floor without it


def test_the_quick_floor_of_pipeline_replicas_prices_their_rings_on_the_split():
    """Every plan of a shape takes one layer split, so the quick floor of a shape of pipeline
    replicas prices each ring's syncs on the layers the split gives its stages (the property test
    above checks it under every estimate), not on a layer per stage: a higher floor wherever a
    ring's syncs set it."""
    raised = replicated = 0
    for seed in (0, 1, 2):
        for job, segments, view in _cases(seed, 12):
            for shape in enumerate_shapes(segments, view.topology, job.spec):
                if len(shape.replicas) == 1:
                    continue
                counts = tpa.split_layers(job.spec.layers, tpa._stage_speeds(shape, view))
                plain, on_split = QuickBound(job, shape, view), QuickBound(job, shape, view, rings_on=counts)
                assert on_split.ring_s >= plain.ring_s
                for b, m in tpa.micro_batchings(job, len(shape.replicas) * shape.dp):
                    replicated += 1
                    raised += on_split.bound(b, m) > plain.bound(b, m)
    assert replicated > 500 and raised > 100


def test_floor_prices_every_send_as_estimate_does_also_where_the_plan_crowds_its_own_hops():
    """The floor's p2p terms are estimate's own: on a chain whose routes run through each other,
    the plan's transfers share hops (crowd_of), and a floor priced on uncrowded links was up to
    2.4x under the estimate of 512-GPU plans, so TPA fitted and estimated every one of them."""
    crowded = 0
    for seed in (0, 1, 2):
        for job, chain, view in _cases(seed, 12):
            for shape in enumerate_shapes(chain, view.topology, job.spec):
                counts = tpa.split_layers(job.spec.layers, tpa._stage_speeds(shape, view))
                floor = ShapeBound(job, shape, counts, view)
                b, m = tpa.micro_batchings(job, len(shape.replicas) * shape.dp)[0]
                plan = tpa._build(job, shape, counts, b, m, zero1=False, recompute=False)
                crowded += bool(crowd_of(plan, view))
                costs = stage_costs(plan, view)
                rep = floor.replicas[0]
                assert [a + b * t for a, t in rep.send_f] == pytest.approx([c.send_forward_s for c in costs], rel=1e-12)
                assert [a + b * t for a, t in rep.send_b] == pytest.approx([c.send_backward_s for c in costs], rel=1e-12)
    assert crowded >= 10


@pytest.mark.parametrize("k", [1, 3])
def test_pruned_search_returns_the_unpruned_finalists(k, monkeypatch):
    monkeypatch.setattr(tpa, "_MEMO", type(tpa._MEMO)())
    for job, chain, view in _cases(5, 15):
        try:
            got = tpa._plan_placement(job, chain, view, intra_ilp=False, exact_checks=k)
        except InfeasiblePlan:
            assert not _score_all(job, chain, view, k)
            continue
        want = _score_all(job, chain, view, k)
        best = want[0] if len(want) == 1 else min(want, key=lambda p: tpa.predict(p, view).iteration_s)
        assert got == best


def test_a_search_that_found_nothing_to_beat_a_time_is_not_run_again_for_that_time_or_less(monkeypatch):
    """``plan_placement(..., beat=t)`` remembers that no plan of the chain beats ``t``: asked again
    to beat ``t`` or less on the same figures it answers None without searching; asked to beat
    more, it searches, and returns the same best plan as a search without ``beat``."""
    monkeypatch.setattr(tpa, "_MEMO", type(tpa._MEMO)())
    searched = []
    real = tpa._plan_placement

    def counted(*args, **kwargs):
        searched.append(kwargs.get("beat"))
        return real(*args, **kwargs)

    monkeypatch.setattr(tpa, "_plan_placement", counted)
    checked = 0
    for job, chain, view in _cases(4, 15):
        try:
            want = _score_all(job, chain, view, 1)
        except InfeasiblePlan:
            continue
        if not want:
            continue
        best = estimate(want[0], view)
        searched.clear()
        assert tpa.plan_placement(job, chain, view, intra_ilp=False, exact_checks=1, beat=best * 0.9) is None
        assert tpa.plan_placement(job, chain, view, intra_ilp=False, exact_checks=1, beat=best * 0.8) is None
        assert tpa.plan_placement(job, chain, view, intra_ilp=False, exact_checks=1, beat=best * 0.9) is None
        assert searched == [best * 0.9]
        got = tpa.plan_placement(job, chain, view, intra_ilp=False, exact_checks=1, beat=best * 1.1)
        assert searched == [best * 0.9, best * 1.1]
        assert got == want[0]
        checked += 1
    assert checked >= 10


def test_a_chain_is_answered_from_the_memo_on_another_state_only_where_its_clusters_figures_are_the_same(monkeypatch):
    """TPA's memo keys a chain on the figures between its clusters (the view's, memoised per set and
    shared with SpinSearch's orders): load on a link no route between them crosses leaves the key as
    it was (a hit, the answer a fresh search gives there), load on one of their routes makes it a
    new key (searched again, here for a slower plan)."""
    monkeypatch.setattr(tpa, "_MEMO", type(tpa._MEMO)())
    searched = []
    real = tpa._plan_placement

    def counted(*args, **kwargs):
        searched.append(args[1])
        return real(*args, **kwargs)

    monkeypatch.setattr(tpa, "_plan_placement", counted)
    topo = generate_topology(12, 3)
    names = [c.name for c in topo.clusters]
    checked = 0
    for a, b, c in itertools.combinations(names, 3):
        chain = [(a, 16), (b, 16), (c, 16)]
        routed = {l.key for x in (a, b, c) for y in (a, b, c) if x != y for l in topo.path(x, y).links}
        elsewhere = [l.key for l in topo.links if l.key not in routed]
        if not elsewhere:
            continue
        job = Job(job_id="j", arrival_s=0.0, model="gpt3-13b", gpus=48, iterations=1, global_batch=256,
                  seq_len=2048)
        base = TopologyView(topology=topo)
        first = tpa.plan_placement(job, chain, base, intra_ilp=False, exact_checks=1)
        searched.clear()
        away = TopologyView(topology=topo, link_load={elsewhere[0]: 50.0})
        assert tpa.plan_placement(job, chain, away, intra_ilp=False, exact_checks=1) == first
        assert searched == []  # a hit
        assert real(job, chain, away, intra_ilp=False, exact_checks=1, beat=float("inf")) == first
        on_route = topo.path(a, b).links[0].key
        crowded = TopologyView(topology=topo, link_load={on_route: 50.0})
        slower = tpa.plan_placement(job, chain, crowded, intra_ilp=False, exact_checks=1)
        assert searched == [chain]  # searched again
        assert estimate(slower, crowded) > estimate(first, base)
        checked += 1
        if checked == 3:
            break
    assert checked == 3


def test_a_chain_whose_floor_is_not_under_the_time_to_beat_is_settled_without_enumerating_its_shapes(monkeypatch):
    """No plan of a chain is faster than its ``chain_floor`` (the property test above checks it
    under every candidate's estimate), so a search asked to beat that floor or less returns None
    before any shape is enumerated or bounded; asked to beat more, it searches as before."""
    monkeypatch.setattr(tpa, "_MEMO", type(tpa._MEMO)())
    real = tpa.QuickBound

    def refuse(*args):
        raise AssertionError("a shape was bounded")

    checked = 0
    for job, chain, view in _cases(6, 15):
        want = _score_all(job, chain, view, 1)
        if not want:
            continue
        floor = chain_floor(job, chain, view)
        assert floor <= estimate(want[0], view)
        monkeypatch.setattr(tpa, "QuickBound", refuse)
        assert tpa._plan_placement(job, chain, view, intra_ilp=False, exact_checks=1, beat=floor) is None
        monkeypatch.setattr(tpa, "QuickBound", real)
        got = tpa._plan_placement(job, chain, view, intra_ilp=False, exact_checks=1, beat=floor * 1.001)
        assert got is None or got == want[0]
        checked += 1
    assert checked >= 10


def test_a_chain_whose_sends_crowd_a_link_is_answered_from_the_memo_only_on_that_links_own_load(monkeypatch):
    """A send whose route crosses a hop the plan's own transfers crowd is priced link by link, not by
    the route's narrowest link: here a, b and c reach each other only through x, every pair's
    narrowest link is 10 Gbit/s, and load on the wider x-b link moves no pair's figure but halves
    what the two transfers into b that share x -> b get. The memo must not hand the unloaded
    state's plan and estimate to the loaded one: its answer is a fresh search's."""
    topo = parse_topology({
        "name": "star",
        "clusters": [{"name": n, "gpu": "a100-80gb", "nodes": 2, "gpus_per_node": 8} for n in "abcx"],
        "links": [{"a": "a", "b": "x", "bandwidth_gbps": 10.0, "latency_ms": 5.0},
                  {"a": "x", "b": "b", "bandwidth_gbps": 100.0, "latency_ms": 5.0},
                  {"a": "x", "b": "c", "bandwidth_gbps": 10.0, "latency_ms": 5.0}]})
    job = Job(job_id="j", arrival_s=0.0, model="gpt3-1.3b", gpus=48, iterations=1, global_batch=256, seq_len=2048)
    chain = [("a", 16), ("b", 16), ("c", 16)]
    xb = topo.link("x", "b").key

    def loaded():
        return TopologyView(topology=topo, link_load={xb: 9.0})

    free = TopologyView(topology=topo)
    assert free.figures(("a", "b", "c")) == loaded().figures(("a", "b", "c"))
    monkeypatch.setattr(tpa, "_MEMO", type(tpa._MEMO)())
    first = tpa.plan_placement(job, chain, free, intra_ilp=False, exact_checks=1)
    view = loaded()
    answer = tpa.plan_placement(job, chain, view, intra_ilp=False, exact_checks=1)
    assert known_estimate(answer, view) == estimate(answer, loaded())
    tpa.clear_memo()
    fresh = tpa.plan_placement(job, chain, loaded(), intra_ilp=False, exact_checks=1)
    assert answer.replicas == fresh.replicas and answer.micro_batch_size == fresh.micro_batch_size
    assert estimate(answer, loaded()) > 1.1 * estimate(first, free)  # the load matters here


def test_a_split_whose_floor_passes_the_best_plan_is_never_bounded(monkeypatch):
    """Shapes start from their split's floor (split_floors, one per number of replicas): the
    search bounds a shape only once its split could still beat the best plan found, so a chain
    whose pipelines cannot compete with its replicas (or the reverse) never bounds those shapes."""
    monkeypatch.setattr(tpa, "_MEMO", type(tpa._MEMO)())
    real, bounded = tpa.QuickBound, []

    def recorded(job, shape, view, channel=None, rings_on=None):
        bounded.append(shape)
        return real(job, shape, view, channel, rings_on)

    monkeypatch.setattr(tpa, "QuickBound", recorded)
    skipped = 0
    for job, chain, view in _cases(8, 20):
        bounded.clear()
        try:
            plan = tpa._plan_placement(job, chain, view, intra_ilp=False, exact_checks=1)
        except InfeasiblePlan:
            continue
        best = estimate(plan, view)
        floors = split_floors(job, chain, view)
        assert all(floors[len(shape.replicas)] <= best for shape in bounded)
        hopeless = [s for s in enumerate_shapes(chain, view.topology, job.spec) if floors[len(s.replicas)] > best]
        skipped += len(hopeless)
        assert not set(hopeless) & set(bounded)
    assert skipped >= 5


def test_shapes_are_remembered_per_node_size_and_model():
    """The shapes of one chain are memoised on what the enumeration reads: the same cluster names
    and GPU counts with smaller nodes, or a model with fewer heads, give their own shapes."""
    def topo(gpus_per_node):
        return parse_topology({
            "name": "two", "links": [{"a": "a", "b": "b", "bandwidth_gbps": 1.0, "latency_ms": 10.0}],
            "clusters": [{"name": n, "gpu": "a100-80gb", "nodes": 16 // gpus_per_node,
                          "gpus_per_node": gpus_per_node} for n in "ab"]})

    def tps(shapes):
        return {tp for shape in shapes for rep in shape.replicas for _, tp, _ in rep}

    chain = [("a", 16), ("b", 16)]
    wide = enumerate_shapes(chain, topo(8), MODEL_SPECS["gpt3-13b"])
    narrow = enumerate_shapes(chain, topo(2), MODEL_SPECS["gpt3-13b"])
    assert 8 in tps(wide) and max(tps(narrow)) == 2
    assert enumerate_shapes(chain, topo(8), MODEL_SPECS["gpt3-13b"]) == wide
    # llama2-70b's 64 heads and gpt3-1.3b's 32 both take tp 8; the layer counts differ (80 vs 24)
    deep = enumerate_shapes(chain, topo(8), MODEL_SPECS["llama2-70b"])
    shallow = enumerate_shapes(chain, topo(8), MODEL_SPECS["gpt3-1.3b"])
    assert max(shape.depth for shape in deep) == 32 and max(shape.depth for shape in shallow) == 24


def test_schedule_floor_is_under_the_exact_schedule():
    rng = random.Random(3)
    for _ in range(300):
        S, m = rng.randint(1, 12), rng.choice((1, 2, 3, 8, 40))
        costs = [StageCost(rng.random(), 2 * rng.random(), rng.random() * rng.choice((0, 0.1, 3)),
                           rng.random() * rng.choice((0, 0.1, 3)), rng.random(), 0.0,
                           send_forward_latency_s=0.01, send_backward_latency_s=0.02) for _ in range(S)]
        assert floor_1f1b(costs, m) <= simulate_1f1b(costs, m).pipeline_s * (1 + 1e-12)


def _finalize_exact(plan, view):
    """``finalize`` as it was before its bounds: exact figures only."""
    base = predict(plan, view)
    if base.compute_s < tpa.ILP_COMPUTE_SHARE * base.iteration_s:
        return plan
    refined = tpa.refine_intra(plan, view)
    if refined is not None and predict(refined, view).iteration_s < base.iteration_s:
        return refined
    return plan


def test_finalize_decides_as_with_exact_figures(monkeypatch):
    monkeypatch.setattr(tpa, "_MEMO", type(tpa._MEMO)())
    refined = same = 0
    cases = list(_cases(7, 10))
    topo = cases[0][2].topology
    for i, c in enumerate(topo.clusters[:6]):  # one cluster each: compute-bound, where the ILP is asked
        job = Job(job_id=f"one{i}", arrival_s=0.0, model=MODELS[i % len(MODELS)], gpus=c.total_gpus,
                  iterations=1, global_batch=256, seq_len=2048)
        cases.append((job, [(c.name, c.total_gpus)], TopologyView(topology=topo)))
    for job, chain, view in cases:
        try:
            plan = tpa.plan_placement(job, chain, view, intra_ilp=False, exact_checks=1)
        except InfeasiblePlan:
            continue
        want = _finalize_exact(plan, TopologyView(topology=view.topology, link_load=view.link_load))
        assert tpa.finalize(plan, view) == want
        refined += want != plan
        again = tpa.refine_intra(plan, view)
        same += again is not None and again.replicas == plan.replicas
    assert refined  # the cases include plans the ILP improves
    assert same  # and plans it splits as they are (finalize keeps them without the exact schedule)


def _split_one_at_a_time(layers, weights):
    """Largest-remainder apportionment as defined: one layer at a time to the largest remainder."""
    n, total = len(weights), sum(weights)
    raw = [max(1.0, layers * w / total) for w in weights]
    counts = [max(1, int(x)) for x in raw]
    while sum(counts) > layers:
        counts[max((j for j in range(n) if counts[j] > 1), key=lambda j: counts[j] - raw[j])] -= 1
    while sum(counts) < layers:
        counts[max(range(n), key=lambda j: raw[j] - counts[j])] += 1
    return counts


def test_the_layer_split_gives_the_layers_short_at_once_as_one_at_a_time_would():
    """``split_layers`` gives every layer short to the largest remainders in one sort; that is the
    one-at-a-time definition's answer (ties to the first stage), on weights with many equal
    remainders and ones so small that the one-layer minimum takes layers back."""
    rng = random.Random(5)
    at_once = 0
    for _ in range(5000):
        n = rng.randint(1, 64)
        layers = rng.randint(n, 128)
        weights = [rng.choice((1.0, 2.0, 3.3, 0.7, 5.0, 1e-3)) * rng.choice((1, 1, 1.0000001)) for _ in range(n)]
        raw_short = layers - sum(max(1, int(max(1.0, layers * w / sum(weights)))) for w in weights)
        at_once += raw_short > 1
        assert tpa.split_layers(layers, weights) == _split_one_at_a_time(layers, weights)
    assert at_once > 2000
