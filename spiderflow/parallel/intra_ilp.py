"""TPA, intra-cluster level: an ILP per cluster for TP / PP and the layer split.

Given one cluster's segment of a pipeline -- its GPUs ``g``, the in-stage
data-parallel width ``dp`` fixed by the inter-cluster level, the block of
``L`` consecutive layers it was given, and where the block sits in the whole
pipeline (stages before it, stages after it) -- choose

- one option ``(tp, pp)`` with ``tp * pp * dp = g`` (binary ``y[t]``), and
- the layers of each of its ``pp`` stages (integers ``l[t, k] >= 1``),

minimising the slowest stage's time per micro-batch ``tau``::

    min tau
    s.t. one_option:        sum_t y[t] = 1
         cover[t]:          sum_k l[t,k] = L * y[t]
         nonempty[t,k]:     l[t,k] >= y[t]
         time[t,k]:         l[t,k] * f[t] + head[t,k] * y[t] <= tau
         memory[t,k]:       l[t,k] * (w[t] + inflight[t,k] * a[t]) + emb[t,k] * y[t] <= cap

with ``f[t]`` the per-layer forward+backward time at TP degree t (compute and
TP all-reduces), ``head``/``emb`` the output layer's time and the embedding's
memory on the block's first/last stage, ``w`` the per-layer weight+gradient+
optimizer bytes per GPU, ``a`` the per-layer activation bytes of one
micro-batch, and ``inflight[t,k] = min(S - i, m)`` the 1F1B micro-batches
stage ``i`` holds (Narayanan et al., SC'21). Size: 1 + T + T*P variables and
about 3*T*P constraints for T <= 4 TP options and P <= L stages.

What it leaves out: p2p between this cluster's own stages (intra-cluster
links are orders of magnitude faster than the WAN) and the bubble, which the
exact schedule judges afterwards. Solutions are memoised per sub-problem.

How it is solved. For one option, a stage's time ``l * f + head`` grows with its
layers and its memory caps them at ``u[t,k]``, so the least ``tau`` is reached
by giving every stage one layer and each further layer to the stage it leaves
fastest (greedy marginal allocation: the ``L - P`` smallest of the values
``l * f + head[t,k]``, ``2 <= l <= u[t,k]``, are the layers any optimum adds;
O(L log P)); ``y`` picks the option with the least ``tau``. :func:`solve_intra`
does that: exact, with the model's own float comparisons, in about 0.1 ms.
:func:`solve_intra_milp` hands the same model to PuLP (HiGHS), which took about
11 ms a model (a 10,000-job simulation solves 263 of them), stops within its
default 1e-4 relative gap, and picks any of the equal optima; the tests hold
both to a brute-force enumeration of every split.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from functools import lru_cache

import pulp

from spiderflow.costmodel.memory import GB, USABLE_FRACTION
from spiderflow.costmodel.network import Channel
from spiderflow.costmodel.stages import ring_allreduce_s
from spiderflow.hardware import gpu_profile
from spiderflow.parallel.shapes import segment_options
from spiderflow.solver import milp_solver
from spiderflow.workload import (GRAD_BYTES_PER_PARAM, MODELS, OPTIMIZER_BYTES_PER_PARAM,
                                 WEIGHT_BYTES_PER_PARAM)


@dataclass(frozen=True)
class IntraProblem:
    model: str
    gpu: str
    gpus_per_node: int
    nvlink_gbps: float
    gpus: int
    dp: int
    dp_total: int  # data-parallel group size for ZeRO-1 sharding
    layers: int
    first: bool  # the block holds layer 0 (embedding)
    last: bool  # the block holds the last layer (output layer)
    stages_before: int
    stages_after: int
    micro_batch_size: int
    micro_batches: int
    seq_len: int
    recompute: bool
    zero1: bool
    efficiency: float


@dataclass(frozen=True)
class IntraSolution:
    tp: int
    layers: tuple[int, ...]
    stage_s: float
    status: str


def _coefficients(p: IntraProblem, tp: int, pp: int):
    spec, prof = MODELS[p.model], gpu_profile(p.gpu)
    b, s = p.micro_batch_size, p.seq_len
    speed = prof.peak_tflops * 1e12 * p.efficiency * tp
    fwd = spec.layer_forward_flops(b, s) / speed
    per_layer = fwd * (4 if p.recompute else 3)
    if tp > 1:
        tp_comm = 2 * ring_allreduce_s(spec.boundary_bytes(b, s), tp, Channel(0.0, p.nvlink_gbps * 1e9 / 8))
        per_layer += tp_comm * (3 if p.recompute else 2)
    head = 3 * spec.head_forward_flops(b, s) / speed
    opt = OPTIMIZER_BYTES_PER_PARAM / (p.dp_total if p.zero1 else 1)
    per_param = WEIGHT_BYTES_PER_PARAM + GRAD_BYTES_PER_PARAM + opt
    weights = spec.layer_params / tp * per_param
    act = spec.layer_activation_bytes(b, s, tp=tp, recompute=p.recompute)
    emb = spec.embedding_params / tp * per_param
    depth = p.stages_before + pp + p.stages_after
    rows = []
    for k in range(pp):
        i = p.stages_before + k
        inflight = min(depth - i, p.micro_batches)
        fixed = 0.0
        extra_t = 0.0
        if p.first and k == 0:
            fixed += emb
        if p.last and k == pp - 1:
            extra_t = head
            fixed += b * s * spec.vocab * 2 / tp  # logits
            if not (p.first and pp == 1 and spec.tied_embeddings):
                fixed += emb
        if p.recompute:
            fixed += spec.layer_activation_bytes(b, s, tp=tp, recompute=False)
        rows.append((weights + inflight * act, fixed, extra_t))
    return per_layer, rows


@lru_cache(maxsize=4096)
def solve_intra(p: IntraProblem) -> IntraSolution | None:
    """Optimal (tp, layer split) for one cluster's block; None when nothing fits. Of equal
    optima: the first TP option in ``segment_options`` order, and the split the greedy
    allocation reaches (each further layer to the lowest-numbered of the stages it leaves
    fastest)."""
    spec = MODELS[p.model]
    # the memory row's right-hand side as solve_intra_milp writes it (cap / GB): the same float
    cap = gpu_profile(p.gpu).memory_gb * USABLE_FRACTION * GB / GB
    best = None
    for tp, pp in segment_options(p.gpus, p.dp, p.gpus_per_node, spec):
        if pp > p.layers:
            continue
        per_layer, rows = _coefficients(p, tp, pp)
        split = _least_slowest(p.layers, per_layer, rows, cap)
        if split is not None and (best is None or split[0] < best.stage_s):
            best = IntraSolution(tp=tp, layers=split[1], stage_s=split[0], status="optimal")
    return best


def _least_slowest(layers: int, per_layer: float, rows, cap: float) -> tuple[float, tuple[int, ...]] | None:
    """(least slowest-stage time, a split reaching it) of ``layers`` over the stages ``rows``
    (memory per layer, fixed memory, extra time) under ``cap`` GB a GPU; None if none fits."""
    ups = []  # the most layers each stage holds: the memory constraint as the model writes it
    for mem, fixed, _ in rows:
        a, c = mem / GB, fixed / GB
        n = min(layers, max(0, int((cap - c) / a)))
        while n >= 1 and not n * a + c <= cap:
            n -= 1
        while n < layers and (n + 1) * a + c <= cap:
            n += 1
        if n < 1:
            return None
        ups.append(n)
    if sum(ups) < layers:
        return None
    split = [1] * len(rows)
    nxt = [(2 * per_layer + extra, k) for k, (_, _, extra) in enumerate(rows) if ups[k] > 1]
    heapq.heapify(nxt)
    for _ in range(layers - len(rows)):
        _, k = heapq.heappop(nxt)
        split[k] += 1
        if split[k] < ups[k]:
            heapq.heappush(nxt, ((split[k] + 1) * per_layer + rows[k][2], k))
    return max(n * per_layer + extra for n, (_, _, extra) in zip(split, rows)), tuple(split)


def solve_intra_milp(p: IntraProblem) -> IntraSolution | None:
    """:func:`solve_intra`'s model solved by PuLP (HiGHS, or CBC without highspy): the reference
    the tests hold the exact allocation to, not memoised."""
    spec = MODELS[p.model]
    options = [(tp, pp) for tp, pp in segment_options(p.gpus, p.dp, p.gpus_per_node, spec) if pp <= p.layers]
    if not options:
        return None
    cap = gpu_profile(p.gpu).memory_gb * USABLE_FRACTION * GB
    prob = pulp.LpProblem("intra_cluster", pulp.LpMinimize)
    tau = prob.add_variable("tau", lowBound=0)
    prob += tau
    y, l = {}, {}
    for tp, pp in options:
        y[tp] = prob.add_variable(f"use_tp{tp}", cat="Binary")
        per_layer, rows = _coefficients(p, tp, pp)
        l[tp] = [prob.add_variable(f"layers_tp{tp}_s{k}", lowBound=0, upBound=p.layers, cat="Integer")
                 for k in range(pp)]
        prob += pulp.lpSum(l[tp]) == p.layers * y[tp], f"cover_tp{tp}"
        for k, (mem_per_layer, fixed, extra_t) in enumerate(rows):
            prob += l[tp][k] >= y[tp], f"nonempty_tp{tp}_s{k}"
            prob += l[tp][k] * per_layer + extra_t * y[tp] <= tau, f"time_tp{tp}_s{k}"
            prob += l[tp][k] * (mem_per_layer / GB) + (fixed / GB) * y[tp] <= cap / GB, f"memory_tp{tp}_s{k}"
    prob += pulp.lpSum(y.values()) == 1, "one_option"
    prob.solve(milp_solver(small=True))
    status = pulp.LpStatus[prob.status]
    if status != "Optimal":
        return None
    tp = max(y, key=lambda t: y[t].value() or 0)
    layers = tuple(int(round(v.value())) for v in l[tp])
    return IntraSolution(tp=tp, layers=layers, stage_s=float(tau.value()), status="optimal")
