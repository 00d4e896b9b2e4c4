"""Shared pieces of the MILP placement baselines (``ilp``, ``ilp-topo``, ``joint-ilp``).

- **GPU-count menu** per cluster: the counts a segment may take, powers of two,
  multiples of 8, or all it can give (``min(free, G)``, as ``blind`` takes), at least
  ``min(gpus_per_node, ceil(G / MIN_SEGMENT_SHARE))`` (smaller fragments add a
  WAN boundary for little compute; on 4-cluster cases they multiplied solve
  time by ~10 and never won in a brute-force check), kept only when TPA can
  factor them as ``tp * pp`` (:func:`spiderflow.parallel.shapes.segment_options`
  with ``dp = 1``) and they hold at least one layer's weights, gradients and
  Adam state (16 bytes per parameter, ZeRO paper sec. 3.1) spread over the segment.
  At most ``K = min(N, layers, G / smallest count, max(MAX_POSITIONS, fewest
  clusters that can gather G))`` segments.
- **Chain skeleton** over positions ``p < K`` and candidate clusters: binaries
  ``x[p,c,o]`` (position p holds cluster c with option o), layers ``z[p,c,o]``
  (continuous shares or integers), and position-pair variables ``y[p,a,b]`` (boundary p runs
  a -> b), linked by a transportation-style linearisation (``sum_b y[p,a,b] <=
  u[p,a]``, ``sum_a y[p,a,b] = u[p+1,b]`` with ``u[p,c] = sum_o x[p,c,o]``),
  exact for integral ``x``. Size: ``K N |o|`` binaries and as many integers,
  ``(K-1) N (N-1)`` continuous ``y``; about ``2 K N + N + 2 K |o| N`` rows.
- **Solving**: HiGHS (PuLP's ``HiGHS``, with a greedy MIP start: most-free
  clusters first) or CBC when highspy is missing; time limit, threads and seed
  from the request; PuLP's solution status mapped to "optimal", "feasible at
  time limit" or "infeasible". A solve stopped before reporting any solution
  falls back to the greedy start (``detail["incumbent"]`` says so).
- **Pre-checks** that name what is short (GPUs in usable counts, memory)
  before any solve.
"""

from __future__ import annotations

import dataclasses

import math
import time
import warnings
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pulp

from spiderflow.costmodel.memory import GB, USABLE_FRACTION
from spiderflow.errors import InfeasiblePlan
from spiderflow.parallel.shapes import powers_of_two, segment_options
from spiderflow.placement.base import STATUS_OPTIMAL, STATUS_TIME_LIMIT, PlacementRequest
from spiderflow.solver import highs_available
from spiderflow.workload import (GRAD_BYTES_PER_PARAM, OPTIMIZER_BYTES_PER_PARAM,
                                 WEIGHT_BYTES_PER_PARAM)

STATUS_INFEASIBLE = "infeasible"
STATUS_NO_SOLUTION = "no solution at time limit"
MAX_POSITIONS = 8  # cap on pipeline segments per chain (each one more WAN boundary), unless the job needs more
MIN_SEGMENT_SHARE = 4  # a segment takes >= min(a node, 1/4 of the job): smaller fragments only add boundaries
STATE_BYTES_PER_PARAM = WEIGHT_BYTES_PER_PARAM + GRAD_BYTES_PER_PARAM + OPTIMIZER_BYTES_PER_PARAM
MIN_SOLVE_S = 0.2  # a solve gets at least this (enough to load the MIP start); re-solves need it left


def new_var(prob: pulp.LpProblem, name: str, low: float | None = None, up: float | None = None,
            cat: str = pulp.LpContinuous) -> pulp.LpVariable:
    """A variable of ``prob`` (PuLP >= 3.3 owns it through ``add_variable``; older PuLP has none)."""
    if hasattr(prob, "add_variable"):
        return prob.add_variable(name, low, up, cat=cat)
    return pulp.LpVariable(name, low, up, cat=cat)


def usable_bytes(req: PlacementRequest, cluster: str) -> float:
    return req.topology.cluster(cluster).profile.memory_gb * USABLE_FRACTION * GB


def gpu_menu(req: PlacementRequest) -> dict[str, tuple[int, ...]]:
    """Per candidate cluster: the GPU counts a segment there may take (ascending)."""
    spec, want = req.job.spec, req.job.gpus
    layer_state = spec.layer_params * STATE_BYTES_PER_PARAM
    menu = {}
    for c in req.candidates:
        top = min(req.free_gpus[c], want)
        gpn = req.topology.cluster(c).gpus_per_node
        least = min(gpn, -(-want // MIN_SEGMENT_SHARE))
        counts = sorted(set(powers_of_two(top)) | set(range(8, top + 1, 8)) | {top})
        counts = [g for g in counts if g >= least and segment_options(g, 1, gpn, spec)
                  and g * usable_bytes(req, c) >= layer_state]
        if counts:
            menu[c] = tuple(counts)
    return menu


def max_positions(req: PlacementRequest, menu: Mapping[str, Sequence[int]]) -> int:
    """K: at most MAX_POSITIONS segments, or as few as can gather the job's GPUs when that is more."""
    want = req.job.gpus
    smallest = min((g for counts in menu.values() for g in counts), default=want)
    biggest = sorted((max(counts) for counts in menu.values()), reverse=True)
    fewest = next((k + 1 for k in range(len(biggest)) if sum(biggest[:k + 1]) >= want), len(biggest))
    return max(1, min(len(menu), req.job.spec.layers, want // smallest, max(MAX_POSITIONS, fewest)))


def check_fits(req: PlacementRequest, menu: Mapping[str, Sequence[int]], positions: int) -> None:
    """Raise InfeasiblePlan naming what is short: GPUs in usable counts, or memory."""
    job, spec = req.job, req.job.spec
    want = job.gpus
    reach = {(0, 0)}  # (segments used, GPUs gathered), each cluster at most once
    for c, counts in menu.items():
        reach |= {(k + 1, s + g) for k, s in reach for g in counts if k < positions and s + g <= want}
    if not any(s == want for _, s in reach):
        free = sum(req.free_gpus.get(c, 0) for c in req.candidates)
        raise InfeasiblePlan(
            f"{job.job_id}: wants {job.gpus} GPUs; {free} are free but no chain of at most {positions} "
            f"clusters gives exactly {job.gpus} in segments TPA can factor (powers of two, multiples of 8 or "
            f"all a cluster has free; each at least a node or a quarter of the job, and holding a layer of "
            f"{job.model})")
    need = spec.params * STATE_BYTES_PER_PARAM
    per_gpu = sorted((usable_bytes(req, c) for c in req.candidates for _ in range(req.free_gpus[c])),
                     reverse=True)
    have = sum(per_gpu[:want])
    if need > have:
        raise InfeasiblePlan(
            f"{job.job_id}: {job.model} needs {need / GB:.0f} GB for weights, gradients and Adam state; "
            f"the {want} largest free GPUs hold {have / GB:.0f} GB usable: short of memory, it needs "
            f"more GPUs or larger ones")


@dataclass
class Chain:
    """The chain skeleton's variables; ``opts[c]`` lists ``(option key, gpus, layer cap)``."""

    positions: int
    clusters: tuple[str, ...]
    opts: dict[str, list[tuple[Hashable, int, int]]]
    x: dict[tuple[int, str, Hashable], pulp.LpVariable] = field(default_factory=dict)
    z: dict[tuple[int, str, Hashable], pulp.LpVariable] = field(default_factory=dict)
    y: dict[tuple[int, str, str], pulp.LpVariable] = field(default_factory=dict)
    u: dict[tuple[int, str], pulp.LpAffineExpression] = field(default_factory=dict)

    def segments(self) -> tuple[tuple[tuple[str, Hashable, int, int], ...], ...]:
        """Per used position: (cluster, option key, gpus, layers) from the current solution."""
        out = []
        for p in range(self.positions):
            hit = [(c, o, g, round(self.z[p, c, o].value(), 2))
                   for c in self.clusters for o, g, _ in self.opts[c] if self.x[p, c, o].value() > 0.5]
            if hit:
                out.append(hit[0])
        return tuple(out)

    def chosen(self) -> list[pulp.LpVariable]:
        return [v for v in self.x.values() if v.value() > 0.5]

    def chosen_reversed(self) -> list[pulp.LpVariable]:
        """The binaries of the current chain in reverse order (same MILP objective in ``ilp``)."""
        used = sorted((p, c, o) for (p, c, o), v in self.x.items() if v.value() > 0.5)
        return [self.x[len(used) - 1 - p, c, o] for p, c, o in used]


def lin(terms) -> pulp.LpAffineExpression:
    """sum(coef * var) over ``(var, coef)`` pairs of distinct variables, without PuLP's per-term objects."""
    return pulp.LpAffineExpression(list(terms))


def build_chain(prob: pulp.LpProblem, opts: dict[str, list[tuple[Hashable, int, int]]], positions: int,
                gpus: int, layers: int, *, integer_layers: bool = False) -> Chain:
    """Add the chain skeleton (positions, clusters, GPU total, layers, boundaries) to ``prob``."""
    layer_cat = pulp.LpInteger if integer_layers else pulp.LpContinuous
    names = tuple(opts)
    ch = Chain(positions=positions, clusters=names, opts=opts)
    P = range(positions)
    for p in P:
        for c in names:
            for o, g, cap in opts[c]:
                tag = f"{p}_{c}_{_tag(o)}"
                x = ch.x[p, c, o] = new_var(prob, f"x_{tag}", 0, 1, pulp.LpBinary)
                z = ch.z[p, c, o] = new_var(prob, f"z_{tag}", 0, cap, layer_cat)
                prob += lin([(z, 1), (x, -1)]) >= 0, f"layers_min_{tag}"
                prob += lin([(z, 1), (x, -cap)]) <= 0, f"layers_cap_{tag}"
            ch.u[p, c] = lin((ch.x[p, c, o], 1) for o, _, _ in opts[c])
    used = [lin((ch.x[p, c, o], 1) for c in names for o, _, _ in opts[c]) for p in P]
    prob += used[0] == 1, "position_0_used"
    for p in P[1:]:
        prob += used[p] - used[p - 1] <= 0, f"position_{p}_after_{p - 1}"
    for c in names:
        prob += lin((ch.x[p, c, o], 1) for p in P for o, _, _ in opts[c]) <= 1, f"cluster_once_{c}"
    prob += lin((ch.x[p, c, o], g) for p in P for c in names for o, g, _ in opts[c]) == gpus, "gpu_total"
    prob += lin((z, 1) for z in ch.z.values()) == layers, "layer_total"
    for p in P[:-1]:
        for a in names:
            for b in names:
                if a != b:
                    ch.y[p, a, b] = new_var(prob, f"y_{p}_{a}_{b}", 0, 1)
        for a in names:
            out = [(ch.y[p, a, b], 1) for b in names if b != a] + [(ch.x[p, a, o], -1) for o, _, _ in opts[a]]
            prob += lin(out) <= 0, f"boundary_{p}_from_{a}"
        for b in names:
            into = [(ch.y[p, a, b], 1) for a in names if a != b] + [(ch.x[p + 1, b, o], -1) for o, _, _ in opts[b]]
            prob += lin(into) == 0, f"boundary_{p}_to_{b}"
    return ch


def _tag(o: Hashable) -> str:
    return "_".join(map(str, o)) if isinstance(o, tuple) else str(o)


def greedy_start(req: PlacementRequest, opts: dict[str, list[tuple[Hashable, int, int]]], positions: int,
                 speed: Mapping[str, float], least: Callable[[Hashable], int] = lambda o: 1,
                 ) -> list[tuple[int, str, Hashable, int]] | None:
    """A MIP start: most-free-first clusters, the largest option that fits, layers by compute.

    Returns (position, cluster, option, layers) or None when the greedy walk fails;
    ``least(option)`` is the fewest layers an option may hold.
    """
    left, chain = req.job.gpus, []
    for c in sorted(opts, key=lambda c: (-req.free_gpus[c], c)):
        if left == 0 or len(chain) == positions:
            break
        fit = [(g, o, cap) for o, g, cap in opts[c] if g <= left and least(o) <= cap]
        if fit:
            g, o, cap = max(fit, key=lambda t: (t[0], t[1]))
            chain.append((c, o, g, cap))
            left -= g
    layers = req.job.spec.layers
    counts = [least(o) for _, o, _, _ in chain]
    if left or not chain or sum(counts) > layers:
        return None
    share = [speed[c] * g for c, _, g, _ in chain]
    while sum(counts) < layers:
        room = [i for i, (*_, cap) in enumerate(chain) if counts[i] < cap]
        if not room:
            return None
        i = max(room, key=lambda i: share[i] * layers / sum(share) - counts[i])
        counts[i] += 1
    return [(p, c, o, n) for p, ((c, o, _, _), n) in enumerate(zip(chain, counts))]


class _HiGHSWithStart(pulp.HiGHS):
    """PuLP's HiGHS plus a (partial) MIP start (``start`` maps variables to values) and a bulk
    model hand-over (PuLP adds columns and rows one Python call at a time: seconds at 64 clusters)."""

    start: dict[pulp.LpVariable, float] | None = None

    def buildSolverModel(self, lp):  # noqa: N802 - PuLP's name
        import highspy

        inf, h = highspy.kHighsInf, lp.solverModel
        sense = -1.0 if lp.sense == pulp.LpMaximize else 1.0
        cols = lp.variables()
        for i, v in enumerate(cols):
            v.index = i
        lower = np.array([-inf if v.lowBound is None else v.lowBound for v in cols], dtype=np.float64)
        upper = np.array([inf if v.upBound is None else v.upBound for v in cols], dtype=np.float64)
        cost = np.array([sense * lp.objective.get(v, 0.0) for v in cols], dtype=np.float64)
        none = np.zeros(0, dtype=np.int32)
        h.addCols(len(cols), cost, lower, upper, 0, none, none, np.zeros(0))
        ints = np.array([i for i, v in enumerate(cols) if v.cat == pulp.LpInteger], dtype=np.int32)
        if len(ints) and self.mip:
            h.changeColsIntegrality(len(ints), ints, np.full(len(ints), 1, dtype=np.uint8))  # kInteger
        starts, index, value, lo, up = [], [], [], [], []
        for i, con in enumerate(lp._constraints.values()):
            con.index = i
            starts.append(len(index))
            for v, coef in con.items():
                if coef:
                    index.append(v.index)
                    value.append(coef)
            lb, ub = con.getLb(), con.getUb()
            lo.append(-inf if lb is None else lb)
            up.append(inf if ub is None else ub)
        h.addRows(len(lo), np.array(lo, dtype=np.float64), np.array(up, dtype=np.float64), len(index),
                  np.array(starts, dtype=np.int32), np.array(index, dtype=np.int32),
                  np.array(value, dtype=np.float64))

    def callSolver(self, lp):  # noqa: N802 - PuLP's name
        if self.start:
            idx = np.array([v.index for v in self.start], dtype=np.int32)
            val = np.array(list(self.start.values()), dtype=np.float64)
            lp.solverModel.setSolution(len(idx), idx, val)
        lp.solverModel.run()


@dataclass
class SolveResult:
    status: str  # STATUS_OPTIMAL | STATUS_TIME_LIMIT | STATUS_INFEASIBLE | STATUS_NO_SOLUTION
    solver: str
    seconds: float  # wall time of the call, model hand-over included
    overhead_s: float  # of which outside the solver's own clock (PuLP -> solver hand-over)
    objective: float | None


def solve(prob: pulp.LpProblem, req: PlacementRequest, time_left_s: float,
          start: Mapping[pulp.LpVariable, float] | None = None) -> SolveResult:
    """Solve once within ``time_left_s`` (at least MIN_SOLVE_S); HiGHS when available, else CBC."""
    limit = max(time_left_s, MIN_SOLVE_S)
    highs = highs_available()
    if highs:
        solver = _HiGHSWithStart(msg=False, timeLimit=limit, threads=req.threads,
                                 random_seed=req.seed % 2**31)
        solver.start = dict(start) if start else None
    else:
        if start:
            for v, value in start.items():
                v.setInitialValue(value)
        with warnings.catch_warnings():  # PuLP 3.3 deprecates its bundled CBC in favour of COIN_CMD
            warnings.simplefilter("ignore", DeprecationWarning)
            solver = pulp.PULP_CBC_CMD(msg=False, timeLimit=max(1, math.ceil(limit)), threads=req.threads,
                                       warmStart=bool(start), options=[f"randomCbcSeed {req.seed % 2**31 + 1}"])
    t0 = time.perf_counter()
    prob.solve(solver)
    seconds = time.perf_counter() - t0
    overhead = seconds - prob.solverModel.getRunTime() if highs else 0.0
    if prob.sol_status == pulp.LpSolutionOptimal:
        status = STATUS_OPTIMAL
    elif prob.sol_status == pulp.LpSolutionIntegerFeasible:
        status = STATUS_TIME_LIMIT
    elif prob.status == pulp.LpStatusInfeasible or prob.sol_status == pulp.LpSolutionInfeasible:
        status = STATUS_INFEASIBLE
    else:
        status = STATUS_NO_SOLUTION
    objective = pulp.value(prob.objective) if status in (STATUS_OPTIMAL, STATUS_TIME_LIMIT) else None
    return SolveResult(status, "HiGHS" if highs else "CBC", seconds, max(overhead, 0.0), objective)


def solve_from_start(prob: pulp.LpProblem, req: PlacementRequest, time_left_s: float,
                     start: Mapping[pulp.LpVariable, float] | None) -> tuple[SolveResult, str]:
    """The first solve, seeded with ``start``, and who found the incumbent ("solver" or
    "greedy start"): if the solver stops before reporting any solution, the start becomes the
    incumbent and the status "feasible at time limit"."""
    res = solve(prob, req, time_left_s, start)
    if res.status == STATUS_NO_SOLUTION and start:
        use_start(start)
        return dataclasses.replace(res, status=STATUS_TIME_LIMIT), "greedy start"
    return res, "solver"


def solves(prob: pulp.LpProblem, req: PlacementRequest, start: Mapping[pulp.LpVariable, float] | None,
           attempts: int, t0: float, build_s: float) -> Iterator[tuple[int, SolveResult, str]]:
    """Solve ``prob`` up to ``attempts`` times within ``req``'s time limit from ``t0``, the caller
    cutting between solves: yields (k, result, who found the first solve's incumbent). The first is
    seeded with ``start``; a later one needs MIN_SOLVE_S left after the PuLP -> solver hand-over
    (guessed as ``build_s``, then measured at each solve). Only the time limit stops it early: how
    many solves run does not depend on how long the first took."""
    deadline = t0 + req.time_limit_s
    hand_over, incumbent = build_s, "solver"
    for k in range(attempts):
        left = deadline - time.perf_counter() - hand_over
        if k and left < MIN_SOLVE_S:
            return
        if k == 0:
            res, incumbent = solve_from_start(prob, req, left, start)
        else:
            res = solve(prob, req, left)
        hand_over = res.overhead_s
        yield k, res, incumbent


def use_start(start: Mapping[pulp.LpVariable, float]) -> None:
    """Make the MIP start the current solution (when the solver stopped before reporting one)."""
    for v, value in start.items():
        v.varValue = value


def no_good_cut(prob: pulp.LpProblem, chosen: Sequence[pulp.LpVariable], index: int) -> None:
    """Exclude the current assignment of ``chosen`` binaries (supersets cannot sum to the GPU total)."""
    prob += pulp.lpSum(chosen) <= len(chosen) - 1, f"no_good_{index}"


def problem_size(prob: pulp.LpProblem) -> tuple[int, int]:
    return len(prob.variables()), prob.numConstraints()
