"""SpinSearch's step 8 (``tpa.rebalance``): a plan's layers moved across its stage boundaries while the
closed-form estimate falls. Moves are priced a stage at a time (``LayerMoves``), exactly as the whole
plan would be, and the split they reach runs faster than TPA's split in proportion to compute where a
thin link paces the pipeline."""

import random

from spiderflow.costmodel import BATCH_MOVES, LayerMoves, TopologyView, estimate, fits_memory, predict
from spiderflow.parallel import tpa
from spiderflow.parallel.shapes import Shape
from spiderflow.placement import PlacementRequest, clear_memos, run_planner
from spiderflow.topology import parse_topology
from spiderflow.topology.generate import generate_topology
from spiderflow.workload import Job

# an a100-80gb cluster of 8 GPUs and an h100 one of 24, one 10 Gbit/s link between them
SLOW_FAST = parse_topology({"name": "slow-fast", "clusters": [
    {"name": "slow", "gpu": "a100-80gb", "nodes": 1, "gpus_per_node": 8},
    {"name": "fast", "gpu": "h100", "nodes": 3, "gpus_per_node": 8}],
    "links": [{"a": "slow", "b": "fast", "bandwidth_gbps": 10.0, "latency_ms": 5.0}]})
JOB = Job(job_id="j", arrival_s=0.0, model="gpt3-13b", gpus=32, iterations=1, global_batch=512, seq_len=2048)


def _proportional(view: TopologyView):
    """TPA's plan of shape slow:1x1 + fast:1x3 (dp 8): its layers in proportion to each stage's compute."""
    shape = Shape(replicas=((("slow", 1, 1), ("fast", 1, 3)),), dp=8)
    counts = tpa.split_layers(JOB.spec.layers, tpa._stage_speeds(shape, view))
    return tpa._build(JOB, shape, counts, 1, 64, zero1=True, recompute=False)


def test_fewer_layers_before_a_thin_link_than_compute_alone_gives_run_faster():
    view = TopologyView(topology=SLOW_FAST)
    plan = _proportional(view)
    assert [s.layers for s in plan.stages] == [4, 12, 12, 12] and fits_memory(plan, view)
    better = tpa.rebalance(plan, view)
    layers = [s.layers for s in better.stages]
    assert sum(layers) == JOB.spec.layers and layers[0] < 4, layers  # the a100 stage gives layers away
    assert predict(better, view).iteration_s < 0.9 * predict(plan, view).iteration_s
    assert fits_memory(better, view)
    assert tpa.rebalance(better, view) is better  # a local optimum: no move lowers the estimate further


def test_a_one_stage_plan_comes_back_as_it_is():
    view = TopologyView(topology=SLOW_FAST)
    single_stage = tpa._build(JOB, Shape(replicas=((("fast", 8, 1),),), dp=3), [JOB.spec.layers], 1, 8,
                              zero1=True, recompute=True)
    assert tpa.rebalance(single_stage, view) is single_stage


def test_layer_moves_price_any_split_as_the_whole_plan_is_priced():
    """Per stage and layer range, ``LayerMoves`` gives the estimate and the memory verdict of the plan
    split so (pipeline replicas included, which share one split), on a loaded generated topology."""
    topo = generate_topology(12, 3)
    rng = random.Random(3)
    view = TopologyView(topology=topo, link_load={l.key: 2.0 for l in topo.links if rng.random() < 0.4})
    names = [c.name for c in topo.clusters]
    checked = batched = 0
    for _ in range(12):
        chain = [(c, 16) for c in rng.sample(names, rng.choice((2, 3, 4)))]
        job = Job(job_id="j", arrival_s=0.0, model=rng.choice(("gpt3-1.3b", "llama2-7b")), gpus=16 * len(chain),
                  iterations=1, global_batch=256, seq_len=1024)
        try:
            plan = tpa.plan_placement(job, chain, view, intra_ilp=False, exact_checks=1)
        except Exception:
            continue
        if plan.depth < 2:
            continue
        moves = LayerMoves(plan, view)
        for _ in range(5):
            cuts = sorted(rng.sample(range(1, job.spec.layers), plan.depth - 1))
            bounds = [0, *cuts, job.spec.layers]
            split = tpa._split(plan, [b - a for a, b in zip(bounds, bounds[1:])])
            assert moves.estimate(bounds) == estimate(split, view)
            # every move of a layer across a boundary, priced together (from BATCH_MOVES moves) or alone
            steps = [(i, at) for i in range(1, plan.depth) for at in (bounds[i] - 1, bounds[i] + 1)
                     if bounds[i - 1] < at < bounds[i + 1]]
            moved = [tpa._split(plan, [b - a for a, b in zip(nb, nb[1:])])
                     for nb in ([*bounds[:i], at, *bounds[i + 1:]] for i, at in steps)]
            assert moves.estimates(bounds, steps) == [estimate(p, view) for p in moved]
            batched += len(steps) >= BATCH_MOVES
            assert all(moves.fits(i, bounds[i], bounds[i + 1]) for i in range(plan.depth)) == fits_memory(split, view)
            checked += 1
    assert checked >= 20 and batched >= 10, (checked, batched)


def test_spinsearch_returns_the_rebalanced_plan():
    """Step 8 runs on SpinSearch's final plan: on the two clusters above it plans the 32-GPU job with
    fewer layers before the thin link than in proportion to compute, and faster than TPA's own split
    of the same placement and shape."""
    clear_memos()
    req = PlacementRequest(job=JOB, topology=SLOW_FAST, free_gpus={"slow": 8, "fast": 24}, link_load={})
    res = run_planner("spinsearch", req)
    plan, view = res.placement.plan, req.topology_view()
    unbalanced = tpa._split(plan, tpa.split_layers(JOB.spec.layers, tpa._stage_speeds(
        Shape(replicas=tuple(tuple((s.cluster, s.tp, 1) for s in rep) for rep in plan.replicas), dp=plan.dp), view)))
    assert res.prediction.iteration_s < predict(unbalanced, view).iteration_s
    on_slow = [sum(s.layers for s in p.stages if s.cluster == "slow") for p in (plan, unbalanced)]
    assert on_slow[0] < on_slow[1], on_slow  # fewer layers before the thin link
