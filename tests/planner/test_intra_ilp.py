"""The intra-cluster ILP finds the optimum of its own model, solved exactly by greedy allocation
(``solve_intra``) and by PuLP + HiGHS without its sub-MIP heuristics (``solve_intra_milp``,
``spiderflow.solver``): the least slowest-stage time over every TP option and every split of
the block's layers that fits memory, found here by enumerating them all."""

import itertools
import random

import pytest

from spiderflow.costmodel.memory import GB, USABLE_FRACTION
from spiderflow.hardware import gpu_profile
from spiderflow.parallel.intra_ilp import IntraProblem, _coefficients, solve_intra, solve_intra_milp
from spiderflow.parallel.shapes import segment_options
from spiderflow.workload import MODELS

GPUS = {"h100": 3600.0, "a100-40gb": 2400.0, "v100": 1200.0, "rtx4090": 256.0, "l40s": 256.0}


def _problems(n: int):
    """Blocks of 4-24 layers on 2-8 GPUs per data-parallel group (at most 4 stages: every split is
    enumerable), at any place in a deeper pipeline, memory-bound ones included (big models on
    small GPUs, many micro-batches in flight)."""
    rng = random.Random(3)
    while n:
        model = rng.choice(("gpt3-1.3b", "gpt3-2.7b", "llama2-7b", "llama2-13b", "gpt3-13b"))
        gpu = rng.choice(sorted(GPUS))
        dp = rng.choice((1, 2, 4))
        layers = rng.randint(4, min(24, MODELS[model].layers))
        first, last = rng.random() < 0.5, rng.random() < 0.5
        before = 0 if first else rng.randint(1, 3)
        zero1 = rng.random() < 0.3
        yield IntraProblem(model=model, gpu=gpu, gpus_per_node=8, nvlink_gbps=GPUS[gpu],
                           gpus=dp * rng.choice((2, 4)), dp=dp, dp_total=dp * rng.choice((1, 2)) if zero1 else 1,
                           layers=layers, first=first, last=last, stages_before=before,
                           stages_after=0 if last else rng.randint(1, 3), micro_batch_size=rng.choice((1, 2)),
                           micro_batches=rng.choice((4, 8, 16)), seq_len=rng.choice((1024, 2048)),
                           recompute=rng.random() < 0.3, zero1=zero1, efficiency=0.45)
        n -= 1


def _brute_force(p: IntraProblem) -> float | None:
    spec = MODELS[p.model]
    cap = gpu_profile(p.gpu).memory_gb * USABLE_FRACTION * GB
    best = None
    for tp, pp in segment_options(p.gpus, p.dp, p.gpus_per_node, spec):
        if pp > p.layers:
            continue
        per_layer, rows = _coefficients(p, tp, pp)
        for cuts in itertools.combinations(range(1, p.layers), pp - 1):
            split = [b - a for a, b in zip((0, *cuts), (*cuts, p.layers))]
            if all(n * mem / GB + fixed / GB <= cap / GB for n, (mem, fixed, _) in zip(split, rows)):
                slowest = max(n * per_layer + extra for n, (_, _, extra) in zip(split, rows))
                best = slowest if best is None else min(best, slowest)
    return best


@pytest.mark.parametrize("solve", [solve_intra.__wrapped__, solve_intra_milp], ids=["exact", "pulp"])
def test_the_intra_cluster_ilp_finds_its_models_optimum(solve):
    solved = infeasible = 0
    for p in _problems(60):
        want, got = _brute_force(p), solve(p)
        if want is None:
            assert got is None
            infeasible += 1
            continue
        # the allocation is exact; HiGHS stops within its default relative gap
        assert got is not None and got.stage_s == pytest.approx(want, rel=1e-12 if solve is not solve_intra_milp else 1e-4)
        spec = MODELS[p.model]
        pp = len(got.layers)
        assert sum(got.layers) == p.layers and min(got.layers) >= 1 and got.tp * pp * p.dp == p.gpus
        per_layer, rows = _coefficients(p, got.tp, pp)  # the split it returns runs at that time
        assert max(n * per_layer + extra for n, (_, _, extra) in zip(got.layers, rows)) == \
            pytest.approx(got.stage_s, rel=1e-6)
        cap = gpu_profile(p.gpu).memory_gb * USABLE_FRACTION * GB
        assert all(n * mem / GB + fixed / GB <= cap / GB * (1 + 1e-9) for n, (mem, fixed, _) in zip(got.layers, rows))
        assert got.tp in {tp for tp, _ in segment_options(p.gpus, p.dp, p.gpus_per_node, spec)}
        solved += 1
    assert solved >= 30 and infeasible >= 3
