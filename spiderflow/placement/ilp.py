"""``ilp`` and ``ilp-topo``: the exact-optimisation placement baseline (a MILP in PuLP).

What published cross-cluster ILP planners do: choose the clusters, the GPUs
taken in each and their pipeline order in one MILP over a pairwise network
matrix. ``ilp`` sees exactly that (``req.matrix_view()``: pairwise bandwidth
and latency, no load, no shared links); ``ilp-topo`` solves the same MILP with
SpinSearch's knowledge (``req.topology_view()``): its p2p coefficients carry
the current load (a new flow's max-min fair share on every link of the route).
Shared links between boundaries of one chain are not expressible here (the cost
model charges them only to cross-cluster rings, which this pipeline MILP does
not build), so the loaded p2p figures are the whole of its extra knowledge.

Formulation (positions ``p < K``, candidate clusters ``c``, ``N`` of them;
skeleton in :mod:`.milp_common`):

- ``x[p,c,g]`` binary: position p is cluster c with g GPUs, g from the cluster's
  menu (powers of two or multiples of 8 that TPA can factor as tp*pp, see
  :func:`.milp_common.gpu_menu`); ``z[p,c,g]`` its share of the layers, continuous
  (TPA apportions whole layers afterwards), ``1 <= z <= cap[c,g] x``: cap is the
  layers whose weights, gradients and Adam state (16 B/param) fit in the g GPUs'
  usable memory (a necessary memory condition: activations are left to TPA,
  which may add ZeRO-1/recomputation).
- ``y[p,a,b]`` continuous: boundary p runs a -> b (position-pair linearisation).
- Per-iteration busy time of position p, GPUs ideally parallel:
  ``T_p = sum z[p,c,g] * B * f / (g * speed_c)`` (B sequences, f = F+B FLOPs of
  one layer for one sequence, speed = peak x efficiency).
- Period ``tau >= T_p`` and, 1F1B's two-micro-batch window across a boundary
  (the cost model's ``estimate``), ``tau >= (T_p + T_{p+1})/2 + sum_ab y[p,a,b] *
  (m alpha_ab + B s_b / beta_ab)`` with ``s_b`` one sequence's boundary bytes.
- Objective: ``(1 - 1/m) tau + (1/m) sum_p T_p + 2 sum_p sum_ab y[p,a,b]
  (alpha_ab + b s_b / beta_ab)``, i.e. 1F1B's ``(m-1) period + fill/drain + 2 x
  p2p``, with a reference micro-batch b (the largest of TPA's 1,2,4,8 that divides
  B) and m = B / b micro-batches.

It approximates the cost model's iteration time of a single pipeline with
ideal intra-cluster parallelism: it ignores tensor-parallel traffic, the
output layer, in-stage data-parallel gradient sync, pipeline replicas and the
micro-batch choice (TPA decides those afterwards). To make up for that, the
MILP is re-solved with no-good cuts (on each chain and its reverse) for a pool
of up to ``POOL_SIZE`` distinct chains within ``POOL_GAP`` of the first
solution's objective, within the decision's time limit (a pool bounded by
count, not by a share of the wall clock: a decision whose solves end within
the limit is the same on a fast machine and a slow one); each chain and its
reverse (the MILP cannot tell them apart) is planned by TPA with the
strategy's view and scored with the exact ``predict``; the best is returned.
The status is the first (main) solve's: "optimal" when the MILP optimum was
proven; ``detail["first_plan_s"]`` is the wall time until that solve's chain
was planned, the rest of the overhead is the pool.

Size: ``K N M`` binaries and ``K N M`` continuous layer shares (M = menu options
per cluster, <= ~10), ``(K-1) N (N-1)`` continuous position pairs and ``tau``:
O(N^2 K) variables; about ``2 K N M + 2 K N + N + 2 K`` constraints, the
``K - 1`` boundary rows having ``N^2`` terms each. K = min(N, layers, G / smallest
count, max(8, fewest clusters that can gather G)).
"""

from __future__ import annotations

import time

import pulp

from spiderflow.costmodel import TopologyView, predict
from spiderflow.errors import InfeasiblePlan
from spiderflow.parallel.tpa import MICRO_BATCH_SIZES, plan_placement
from spiderflow.placement.base import Placement, PlacementRequest
from spiderflow.placement.milp_common import (STATE_BYTES_PER_PARAM, STATUS_INFEASIBLE, STATUS_NO_SOLUTION,
                                              build_chain, check_fits, gpu_menu, greedy_start, lin,
                                              max_positions, no_good_cut, new_var, problem_size, solves,
                                              usable_bytes)

POOL_SIZE = 8  # distinct MILP chains re-scored by TPA + predict
POOL_GAP = 0.25  # ... whose MILP objective is within this fraction of the optimum's


def gpu_speed(req: PlacementRequest, view: TopologyView, cluster: str) -> float:
    """Achieved FLOP/s of one GPU of ``cluster`` (calibrated efficiency when known)."""
    prof = req.topology.cluster(cluster).profile
    return prof.peak_tflops * 1e12 * view.calibration.gpu_efficiency.get(prof.name, prof.efficiency)


def reference_micro_batch(global_batch: int) -> int:
    return max((b for b in MICRO_BATCH_SIZES if global_batch % b == 0), default=1)


def build_model(req: PlacementRequest, view: TopologyView, name: str):
    """The MILP for ``req`` with coefficients from ``view``; returns (problem, chain, start)."""
    job, spec = req.job, req.job.spec
    menu = gpu_menu(req)
    K = max_positions(req, menu)
    check_fits(req, menu, K)
    layer_state = spec.layer_params * STATE_BYTES_PER_PARAM
    B, L = job.global_batch, spec.layers
    b = reference_micro_batch(B)
    m = B // b
    f_seq = 3.0 * spec.layer_forward_flops(1, job.seq_len)
    s_bytes = spec.boundary_bytes(1, job.seq_len)
    speed = {c: gpu_speed(req, view, c) for c in menu}
    opts = {c: [(g, g, min(L, int(g * usable_bytes(req, c) // layer_state))) for g in counts]
            for c, counts in menu.items()}

    prob = pulp.LpProblem(name, pulp.LpMinimize)
    ch = build_chain(prob, opts, K, job.gpus, L)
    T = [lin((ch.z[p, c, o], B * f_seq / (g * speed[c])) for c in ch.clusters for o, g, _ in opts[c])
         for p in range(K)]
    tau = new_var(prob, "tau", 0)
    fill = []
    for p in range(K):
        prob += tau >= T[p], f"period_stage_{p}"
    chans = {(a, c): view.p2p(a, c) for a in ch.clusters for c in ch.clusters if a != c}
    round_trip = {k: m * ch_.alpha_s + B * s_bytes / ch_.bytes_per_s for k, ch_ in chans.items()}
    two_sends = {k: 2 * (ch_.alpha_s + b * s_bytes / ch_.bytes_per_s) for k, ch_ in chans.items()}
    for p in range(K - 1):
        window = lin((ch.y[p, *k], round_trip[k]) for k in chans)
        prob += tau >= 0.5 * T[p] + 0.5 * T[p + 1] + window, f"period_boundary_{p}"
        fill.append(lin((ch.y[p, *k], two_sends[k]) for k in chans))
    prob += (1 - 1 / m) * tau + (1 / m) * pulp.lpSum(T) + pulp.lpSum(fill), "iteration_time"

    start = None
    walk = greedy_start(req, opts, K, speed)
    if walk:
        start = {v: 0.0 for v in ch.x.values()} | {v: 0.0 for v in ch.z.values()}
        for p, c, o, n in walk:
            start[ch.x[p, c, o]] = 1.0
            start[ch.z[p, c, o]] = float(n)
    return prob, ch, start


def solve_and_plan(req: PlacementRequest, view: TopologyView, name: str) -> Placement:
    t0 = time.perf_counter()
    prob, ch, start = build_model(req, view, name)
    n_vars, n_cons = problem_size(prob)
    build_s = time.perf_counter() - t0
    main, pool, best, error, incumbent, first_plan_s = None, [], None, None, "solver", 0.0
    for k, res, incumbent in solves(prob, req, start, POOL_SIZE, t0, build_s):
        main = main or res
        if res.status in (STATUS_INFEASIBLE, STATUS_NO_SOLUTION):
            break
        chain = ch.segments()
        segments = tuple((c, g) for c, _, g, _ in chain)
        entry = {"segments": [list(s) for s in segments], "layers": [n for *_, n in chain],
                 "milp_objective": res.objective, "status": res.status, "solve_s": res.seconds}
        for order in dict.fromkeys((segments, segments[::-1])):  # the MILP cannot tell a chain from its reverse
            try:
                plan = plan_placement(req.job, order, view)
            except InfeasiblePlan as exc:
                entry.setdefault("infeasible", str(exc))
                error = exc
                continue
            score = predict(plan, view).iteration_s
            entry["predicted_s"] = min(score, entry.get("predicted_s", score))
            if best is None or score < best[0]:
                best = (score, order, plan)
        pool.append(entry)
        first_plan_s = first_plan_s or time.perf_counter() - t0
        no_good_cut(prob, ch.chosen(), 2 * k)
        if len(segments) > 1:
            no_good_cut(prob, ch.chosen_reversed(), 2 * k + 1)  # already scored above
        if k == 0 and res.objective is not None:
            prob += prob.objective <= (1 + POOL_GAP) * res.objective, "pool_within_gap"
    if best is None:
        if error is not None:
            raise error
        if main.status == STATUS_INFEASIBLE:
            raise InfeasiblePlan(
                f"{req.job.job_id}: no chain of at most {ch.positions} clusters holds {req.job.model}'s "
                f"{req.job.spec.layers} layers within GPU memory on {req.job.gpus} GPUs: short of memory")
        raise InfeasiblePlan(f"{req.job.job_id}: {main.solver} found no placement within the "
                             f"{req.time_limit_s:g} s time limit")
    _, segments, plan = best
    detail = {"solver": main.solver, "variables": n_vars, "constraints": n_cons,
              "objective": main.objective, "positions": ch.positions, "clusters": len(ch.clusters),
              "build_s": build_s, "first_plan_s": first_plan_s, "view": view.name, "incumbent": incumbent,
              "pool": pool}
    return Placement(segments=segments, plan=plan, status=main.status, detail=detail)


def place_ilp(req: PlacementRequest) -> Placement:
    """The published-planner baseline: pairwise matrix, no load, no shared links."""
    return solve_and_plan(req, req.matrix_view(), "ilp")


def place_ilp_topo(req: PlacementRequest) -> Placement:
    """The same MILP with SpinSearch's knowledge (routes and current link load)."""
    return solve_and_plan(req, req.topology_view(), "ilp_topo")
