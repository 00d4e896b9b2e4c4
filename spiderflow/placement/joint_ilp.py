"""``joint-ilp``: one MILP over placement *and* every parallel degree at once.

The "naive optimisation in the cross-cluster setting" the SpiderFlow paper
says explodes: instead of TPA's two levels it decides, in a single PuLP
model, the clusters, the GPUs taken in each, their pipeline order, per
segment the tensor-parallel degree and the layers (hence the stages it hosts),
and globally the in-stage data-parallel width and the micro-batch size. It
sees what published planners see (``req.matrix_view()``) and builds the
:class:`~spiderflow.plan.Plan` itself from its solution (one pipeline, no
cross-cluster replicas); the plan is checked with the cost model's memory
model and, when it does not fit, given TPA's levers (ZeRO-1, then full
recomputation); if it still does not fit, a no-good cut excludes the chain and
the MILP is solved again within the time limit. ``detail["predicted_s"]`` is
``predict`` on that plan.

Formulation (skeleton ``x, z, y`` of :mod:`.milp_common`, here with
options ``o = (g, t)``: g GPUs of the cluster's menu, tensor-parallel t a
power of two within a node that divides the heads; ``z`` integer layers):

- ``q[d,b]`` one-hot: in-stage data-parallel width d and micro-batch b, with
  ``m = B / (d b)`` micro-batches; segment (g, t) then hosts ``pp = g / (t d)``
  stages: ``sum_o x <= 1 - sum_b q[d,b]`` over the options d does not divide,
  and ``z >= pp x`` (one layer per stage at least).
- Busy time per iteration of every stage of position p (each stage runs
  ``B/d`` sequences through ``z t d / g`` layers on t GPUs):
  ``T_p = sum_o z B / g (f / speed_c + t c_t)`` with f the F+B FLOPs of a layer
  for one sequence and c_t Megatron's four NVLink all-reduces per layer and
  sequence; ``tau >= T_p``; across boundary p, 1F1B's two-micro-batch window
  ``tau >= (T_p + T_{p+1})/2 + B s / beta_p + m alpha_p`` (``alpha_p``,
  ``1/beta_p`` linear in the position pairs y; ``m alpha_p`` by big-M on q).
- Objective ``J >= (1 - 1/m) tau + b sum_p W_p + 2 sum_p (alpha_p + d b s /
  beta_p) + sync_0`` for the chosen (d, b) (big-M), with ``W_p = sum_o z (f /
  (t speed_c) + c_t)`` the fill/drain work of one sequence and ``sync_0`` the
  first stage's in-cluster gradient ring all-reduce, which nothing hides.
- Memory per GPU, per position and (d, b) by big-M: static ``16 B/param x
  z d P / g`` plus one micro-batch of activations ``z t d / g x act(b, t)``,
  the embedding on position 0 and the output layer + logits on the last
  position. 1F1B keeps up to ``S - i`` micro-batches in flight on stage i
  (bilinear here), so one is a necessary condition only: the plan check
  above handles the rest.

It approximates the exact 1F1B prediction the way ``ilp`` does (ideal
compute, a two-micro-batch window, the output layer's FLOPs left out) and
never builds pipeline replicas. Per-position sums (layers, busy time, memory
terms, ...) are named variables defined once, so the (d, b) rows stay short.
Size, with T <= 4 tensor-parallel options, |D| data-parallel widths and |b| = 4
micro-batch sizes: ``K N M T`` binaries and as many integer layer counts,
``(K-1) N (N-1)`` continuous position pairs, ``|D| |b|`` global binaries and
~``K (10 + M T) + |D|`` defined sums: O(N^2 K + K N M T) variables; about
``2 K N M T + 2 K N + N`` skeleton rows plus ``K (10 + M T) + 2 K |D| +
(3 K - 1) |D| |b|`` rows of its own.
"""

from __future__ import annotations

import dataclasses
import time

import pulp

from spiderflow.costmodel import TopologyView, fits_memory, predict
from spiderflow.costmodel.memory import GB
from spiderflow.costmodel.network import Channel
from spiderflow.costmodel.stages import ring_allreduce_s
from spiderflow.errors import InfeasiblePlan
from spiderflow.parallel.shapes import powers_of_two
from spiderflow.parallel.tpa import MICRO_BATCH_SIZES
from spiderflow.placement.base import Placement, PlacementRequest
from spiderflow.placement.ilp import gpu_speed
from spiderflow.placement.milp_common import (STATE_BYTES_PER_PARAM, STATUS_INFEASIBLE, STATUS_NO_SOLUTION,
                                              build_chain, check_fits, gpu_menu, greedy_start, lin,
                                              max_positions, no_good_cut, new_var, problem_size, solves,
                                              usable_bytes)
from spiderflow.plan import Plan, Stage
from spiderflow.workload import GRAD_BYTES_PER_PARAM

MAX_ATTEMPTS = 8  # solves (with no-good cuts) until a plan fits memory


def global_options(job) -> list[tuple[int, int, int]]:
    """(d, b, m): in-stage DP, micro-batch size, micro-batch count (m rounded up as TPA does)."""
    B = job.global_batch
    ds = powers_of_two(job.gpus)
    exact = [(d, b, B // (d * b)) for d in ds for b in MICRO_BATCH_SIZES if B % (d * b) == 0]
    return exact or [(d, b, -(-B // (d * b))) for d in ds for b in MICRO_BATCH_SIZES[:2]]


def build_model(req: PlacementRequest, view: TopologyView):
    job, spec = req.job, req.job.spec
    menu = gpu_menu(req)
    K = max_positions(req, menu)
    check_fits(req, menu, K)
    B, L, s = job.global_batch, spec.layers, job.seq_len
    dbm = global_options(job)
    f_seq = 3.0 * spec.layer_forward_flops(1, s)
    s_bytes = spec.boundary_bytes(1, s)
    state = STATE_BYTES_PER_PARAM
    speed = {c: gpu_speed(req, view, c) for c in menu}

    opts, coef = {}, {}
    for c, counts in menu.items():
        clu = req.topology.cluster(c)
        nvlink = Channel(0.0, clu.intra_node_bandwidth_gbps * 1e9 / 8)
        opts[c] = []
        for g in counts:
            for t in powers_of_two(min(clu.gpus_per_node, g)):
                if g % t or spec.heads % t or not any(g % (t * d) == 0 and g // (t * d) <= L
                                                      for d, _, _ in dbm):
                    continue
                c_t = 4 * ring_allreduce_s(s_bytes, t, nvlink)
                opts[c].append(((g, t), g, L))
                coef[c, g, t] = {"T": B / g * (f_seq / speed[c] + t * c_t), "W": f_seq / (t * speed[c]) + c_t}
        if not opts[c]:
            del opts[c]

    prob = pulp.LpProblem("joint_ilp", pulp.LpMinimize)
    ch = build_chain(prob, opts, K, job.gpus, L, integer_layers=True)
    P, names = range(K), ch.clusters
    q = {(d, b): new_var(prob, f"q_d{d}_b{b}", 0, 1, pulp.LpBinary) for d, b, _ in dbm}
    prob += pulp.lpSum(q.values()) == 1, "one_dp_and_micro_batch"
    Q = {d: pulp.lpSum(q[d, b] for dd, b, _ in dbm if dd == d) for d in sorted({d for d, _, _ in dbm})}

    def define(name, terms):  # a named variable equal to sum(coef * var): keeps the (d, b) rows short
        v = new_var(prob, name, 0)
        prob.addConstraint(lin([(v, -1.0), *terms]) == 0, f"define_{name}")
        return v

    def over(p):  # (c, g, t, x, z) of position p
        return [(c, g, t, ch.x[p, c, (g, t)], ch.z[p, c, (g, t)]) for c in names for (g, t), _, _ in opts[c]]

    gts = sorted({o for c in names for o, _, _ in opts[c]})
    act1 = {t: spec.layer_activation_bytes(1, s, tp=t) for _, t in gts}  # linear in the micro-batch
    have = {c: usable_bytes(req, c) / GB for c in names}
    agg = {}  # per position: layers, stage units (sum g/t x), GB per unit d (and d b), memory held, ...
    for p in P:
        o = over(p)
        use = {gt: define(f"option_use_{p}_g{gt[0]}_t{gt[1]}", [(x, 1) for _, g, t, x, _ in o if (g, t) == gt])
               for gt in gts}
        agg[p] = {
            "layers": define(f"layers_{p}", [(z, 1) for *_, z in o]),
            "units": define(f"stage_units_{p}", [(x, g // t) for _, g, t, x, _ in o]),
            "state": define(f"state_gb_{p}", [(z, spec.layer_params * state / GB / g) for _, g, _, _, z in o]),
            "act": define(f"activation_gb_{p}", [(z, t * act1[t] / GB / g) for _, g, t, _, z in o]),
            "have": define(f"memory_have_gb_{p}", [(x, have[c]) for c, _, _, x, _ in o]),
            "emb": define(f"embedding_gb_{p}", [(x, spec.embedding_params * state / GB / t) for _, _, t, x, _ in o]),
            "logits": define(f"logit_gb_{p}", [(x, s * spec.vocab * 2 / GB / t) for _, _, t, x, _ in o]),
            "busy": define(f"busy_{p}", [(z, coef[c, g, t]["T"]) for c, g, t, _, z in o]),
            "work": define(f"fill_work_{p}", [(z, coef[c, g, t]["W"]) for c, g, t, _, z in o]),
            "used": define(f"position_used_{p}", [(x, 1) for *_, x, _ in o]),
        }
        for d in Q:
            bad = [use[g, t] for g, t in gts if g % (t * d) or g // (t * d) > L]
            if bad:
                prob += pulp.lpSum(bad) <= 1 - Q[d], f"dp_divides_{p}_d{d}"
            prob += agg[p]["layers"] >= (1 / d) * agg[p]["units"] - L * (1 - Q[d]), f"stage_layers_{p}_d{d}"

    T = [agg[p]["busy"] for p in P]
    tau = new_var(prob, "tau", 0)
    alpha, transfer, lat = [], [], []  # per boundary: latency, one iteration's activations (seconds)
    m_max = max(m for *_, m in dbm)
    chans = {(a, b): view.p2p(a, b) for a in names for b in names if a != b}
    a_max = max((c_.alpha_s for c_ in chans.values()), default=0.0)
    for p in P[:-1]:
        alpha.append(define(f"boundary_latency_{p}", [(ch.y[p, *k], c_.alpha_s) for k, c_ in chans.items()]))
        transfer.append(define(f"boundary_transfer_{p}",
                               [(ch.y[p, *k], B * s_bytes / c_.bytes_per_s) for k, c_ in chans.items()]))
        lat.append(new_var(prob, f"window_latency_{p}", 0))
        for d, b, m in dbm:
            prob += lat[p] >= m * alpha[p] - m * a_max * (1 - q[d, b]), f"window_latency_{p}_d{d}_b{b}"
        prob += tau >= 0.5 * T[p] + 0.5 * T[p + 1] + transfer[p] + lat[p], f"period_boundary_{p}"
    for p in P:
        prob += tau >= T[p], f"period_stage_{p}"

    # Big-M bounds: each term at its largest (slowest option, worst boundary) in any optimal solution.
    transfer_max = max((B * s_bytes / c_.bytes_per_s for c_ in chans.values()), default=0.0)
    tau_max = L * max(v["T"] for v in coef.values()) + transfer_max + m_max * a_max
    work_max = L * max(v["W"] for v in coef.values())
    J = new_var(prob, "iteration_time", 0)
    work = pulp.lpSum(agg[p]["work"] for p in P)
    for d in Q:
        terms, sync_max = [], 0.0
        for c, g, t, x, z in over(0):
            if g % (t * d):
                continue
            clu = req.topology.cluster(c)
            intra = view.intra(c, spans_nodes=d * t > clu.gpus_per_node)
            per_layer = ring_allreduce_s(spec.layer_params * GRAD_BYTES_PER_PARAM / t, d, intra)
            emb = ring_allreduce_s(spec.embedding_params * GRAD_BYTES_PER_PARAM / t, d, intra)
            terms += [(z, per_layer * t * d / g), (x, emb)]
            sync_max = max(sync_max, L * per_layer * t * d / g + emb)
        sync0 = define(f"first_stage_sync_d{d}", terms)
        for dd, b, m in dbm:
            if dd != d:
                continue
            rhs = ((1 - 1 / m) * tau + b * work + 2 * pulp.lpSum(alpha)
                   + 2 * d * b / B * pulp.lpSum(transfer) + sync0)
            big = tau_max + b * work_max + 2 * (K - 1) * (a_max + d * b / B * transfer_max) + sync_max
            prob += J >= rhs - big * (1 - q[d, b]), f"objective_d{d}_b{b}"
    prob += J, "iteration_time"

    state_ub = L * max(spec.layer_params * state / GB / g for g, _ in gts)
    act_ub = L * max(t * act1[t] / GB / g for g, t in gts)
    emb_ub = (spec.embedding_params * state + s * spec.vocab * 2 * max(MICRO_BATCH_SIZES)) / GB
    for p in P:
        a, last = agg[p], (agg[p]["used"] - agg[p + 1]["used"] if p + 1 < K else agg[p]["used"])
        for d, b, m in dbm:
            need = d * a["state"] + d * b * a["act"]
            big = d * (state_ub + b * act_ub) + emb_ub
            first = a["emb"] if p == 0 else 0
            prob += need + first - a["have"] <= big * (1 - q[d, b]), f"memory_{p}_d{d}_b{b}"
            prob += (need + a["emb"] + b * a["logits"] - a["have"]
                     <= big * (1 - q[d, b]) + big * (1 - last)), f"memory_last_{p}_d{d}_b{b}"

    start = None
    walk = greedy_start(req, opts, K, speed, least=lambda o: o[0] // o[1])  # d = 1: pp = g / t stages
    if walk:
        d0, b0, _ = next((o for o in dbm if o[0] == 1), dbm[0])
        start = ({v: 0.0 for v in ch.x.values()} | {v: 0.0 for v in ch.z.values()}
                 | {v: 0.0 for v in q.values()} | {q[d0, b0]: 1.0})
        for p, c, o, n in walk:
            start[ch.x[p, c, o]] = 1.0
            start[ch.z[p, c, o]] = float(n)
    return prob, ch, q, dbm, start


def decode(req: PlacementRequest, ch, q, dbm) -> tuple[tuple[tuple[str, int], ...], Plan]:
    d, b, m = next(o for o in dbm if q[o[0], o[1]].value() > 0.5)
    stages, at = [], 0
    chain = ch.segments()
    for c, (g, t), _, z in chain:
        pp, n = g // (t * d), round(z)
        counts = [n // pp + (1 if i >= pp - n % pp else 0) for i in range(pp)]  # remainder to later stages
        for k in counts:
            stages.append(Stage(cluster=c, layer_start=at, layer_end=at + k, tp=t))
            at += k
    plan = Plan(job=req.job, replicas=(tuple(stages),), dp=d, micro_batch_size=b, micro_batches=m)
    return tuple((c, g) for c, _, g, _ in chain), plan


def place_joint_ilp(req: PlacementRequest) -> Placement:
    """Placement and parallelisation in one MILP; the Plan comes from its solution."""
    t0 = time.perf_counter()
    view = req.matrix_view()
    prob, ch, q, dbm, start = build_model(req, view)
    n_vars, n_cons = problem_size(prob)
    build_s = time.perf_counter() - t0
    attempts, misfit, incumbent = [], None, "solver"
    for k, res, incumbent in solves(prob, req, start, MAX_ATTEMPTS, t0, build_s):
        if res.status in (STATUS_INFEASIBLE, STATUS_NO_SOLUTION):
            attempts.append({"status": res.status, "solve_s": res.seconds})
            break
        segments, plan = decode(req, ch, q, dbm)
        for zero1, recompute in ((False, False), (True, False), (True, True)):
            fitted = dataclasses.replace(plan, zero1=zero1, recompute=recompute)
            if fits_memory(fitted, view):
                break
        else:
            attempts.append({"segments": [list(s) for s in segments], "status": res.status,
                             "solve_s": res.seconds, "fits_memory": False})
            misfit = fitted
            no_good_cut(prob, ch.chosen() + [v for v in q.values() if v.value() > 0.5], k)
            continue
        attempts.append({"segments": [list(s) for s in segments], "status": res.status, "solve_s": res.seconds})
        detail = {"solver": res.solver, "variables": n_vars, "constraints": n_cons,
                  "objective": res.objective, "predicted_s": predict(fitted, view).iteration_s,
                  "positions": ch.positions, "clusters": len(ch.clusters), "build_s": build_s,
                  "view": view.name, "incumbent": incumbent, "attempts": attempts,
                  "dp": fitted.dp, "micro_batch_size": fitted.micro_batch_size}
        return Placement(segments=segments, plan=fitted, status=res.status, detail=detail)
    if misfit is not None:
        predict(misfit, view)  # raises InfeasiblePlan naming the stage that does not fit
    last = attempts[-1]["status"] if attempts else STATUS_NO_SOLUTION
    if last == STATUS_INFEASIBLE:
        raise InfeasiblePlan(f"{req.job.job_id}: no chain of at most {ch.positions} clusters with its parallel "
                             f"degrees holds {req.job.model} within GPU memory on {req.job.gpus} GPUs: "
                             f"short of memory")
    raise InfeasiblePlan(f"{req.job.job_id}: joint ILP found no placement that fits within the "
                         f"{req.time_limit_s:g} s time limit")
