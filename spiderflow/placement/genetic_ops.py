"""The cost model and the combinatorial pieces of the genetic baseline (:mod:`.genetic`).

Yuan et al., NeurIPS'22 ("Decentralized Training of Foundation Models in
Heterogeneous Environments", arXiv:2206.01288, section 3; code: DS3Lab/DT-FM,
``scheduler/heuristic_evolutionary_solver/scheduler.py``) lay the job out as a
grid of tasklets, ``way`` pipeline stages x ``width`` data-parallel replicas,
one tasklet per device, and score an allocation by its communication alone
over a matrix of pairwise latency and bandwidth:

- **data parallel**: the devices of one stage form a data-parallel group; a
  device pays ``sum_j 2 (alpha_ij + grad / (width beta_ij))`` to all-reduce the
  stage's gradient with its peers j (each moves a 1/width shard twice); the
  cost is the worst device of the worst group;
- **pipeline**: between two groups the cost is the bottleneck of a perfect
  matching of their devices on ``alpha + act / beta`` (``act``: the activations
  of one replica's batch); the groups are then ordered by an open-loop TSP on
  those costs, and the pipeline cost is the path's length;
- fitness = ``dp + 2 pp`` (activations forward, their gradients backward).

Here a *device* is a **unit** of ``unit`` GPUs inside one cluster (a cluster
with ``f`` free GPUs offers ``f // unit`` units); two units of the same
cluster talk over its intra-cluster channel. The paper's devices are
homogeneous; ours are not, so fitness adds a compute term (ours): the slowest
unit's share of the iteration, ``3 x forward FLOPs`` (backward = 2 x forward,
Narayanan et al., SC'21) of ``1/way`` of the layers for ``global_batch/width``
sequences, at the unit's ``peak x efficiency``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np

from spiderflow.placement.base import PlacementRequest
from spiderflow.workload import BYTES_PER_ELEMENT, GRAD_BYTES_PER_PARAM

EXACT_TSP_MAX = 7  # Held-Karp up to this many stages (DT-FM solves it exactly); 2-opt beyond
TSP_STARTS = 4  # nearest-neighbour starts before 2-opt, beyond EXACT_TSP_MAX
NEIGHBOURS = 6  # per cluster, its cheapest pipeline partners: the local search's candidate list

Groups = tuple[tuple[int, ...], ...]  # per pipeline stage, the sorted cluster indices of its units


@dataclass(frozen=True)
class Tables:
    """The pairwise matrix over the clusters that can host a unit (what the paper's planner sees)."""

    names: tuple[str, ...]
    capacity: np.ndarray  # units each cluster can host
    alpha_s: np.ndarray  # n x n one-way alpha; diagonal: intra-cluster
    s_per_byte: np.ndarray  # n x n 1 / beta
    s_per_flop: np.ndarray  # per cluster, one unit: 1 / (unit x peak x efficiency)
    unit: int


def build_tables(req: PlacementRequest, unit: int) -> Tables:
    view = req.matrix_view()
    names = tuple(c for c in req.candidates if req.free_gpus[c] >= unit)
    n = len(names)
    alpha = np.empty((n, n))
    inv_beta = np.empty((n, n))
    for i, a in enumerate(names):
        for j, b in enumerate(names):
            ch = view.p2p(a, b)  # a == b: the intra-cluster channel across nodes
            alpha[i, j], inv_beta[i, j] = ch.alpha_s, 1.0 / ch.bytes_per_s
    cal = req.calibration
    rate = []
    for name in names:
        prof = req.topology.cluster(name).profile
        rate.append(unit * prof.peak_tflops * 1e12 * cal.gpu_efficiency.get(prof.name, prof.efficiency))
    return Tables(names=names, capacity=np.array([req.free_gpus[c] // unit for c in names]),
                  alpha_s=alpha, s_per_byte=inv_beta, s_per_flop=1.0 / np.array(rate), unit=unit)


@dataclass(frozen=True)
class Score:
    total_s: float
    compute_s: float
    dp_s: float
    pp_s: float  # one direction; the fitness counts it twice
    order: tuple[int, ...]  # stage order of the groups (indices into the groups tuple)


@dataclass
class GridCost:
    """Fitness of allocations on one tasklet grid (``way`` x ``width`` units), memoised."""

    tables: Tables
    way: int
    width: int
    grad_bytes: float
    act_bytes: float
    flops_per_unit: float
    dp_pair: np.ndarray = field(init=False, repr=False)  # 2 (alpha + grad / (width beta))
    pp_pair: np.ndarray = field(init=False, repr=False)  # alpha + act / beta, symmetrised
    compute: np.ndarray = field(init=False, repr=False)
    neighbours: np.ndarray = field(init=False, repr=False)
    _pp_rows: list = field(init=False, repr=False)  # pp_pair as lists: small look-ups without numpy
    _group_dp: dict = field(default_factory=dict, repr=False)
    _between: dict = field(default_factory=dict, repr=False)
    _scores: dict = field(default_factory=dict, repr=False)
    evaluations: int = 0

    def __post_init__(self) -> None:
        t = self.tables
        self.dp_pair = 2.0 * (t.alpha_s + self.grad_bytes * t.s_per_byte / self.width)
        pp = t.alpha_s + self.act_bytes * t.s_per_byte
        self.pp_pair = (pp + pp.T) / 2.0  # DT-FM uses one symmetric cost per pair
        self._pp_rows = self.pp_pair.tolist()
        self.compute = self.flops_per_unit * t.s_per_flop
        k = min(NEIGHBOURS, len(t.names))
        self.neighbours = np.argsort(self.pp_pair + self.compute[None, :], axis=1, kind="stable")[:, :k]

    @property
    def units(self) -> int:
        return self.way * self.width

    def group_dp(self, group: tuple[int, ...]) -> float:
        """Worst member's all-reduce cost in one data-parallel group (DT-FM's data-parallel cost)."""
        if len(group) < 2:
            return 0.0
        cost = self._group_dp.get(group)
        if cost is None:
            idx = np.asarray(group)
            sub = self.dp_pair[np.ix_(idx, idx)]
            cost = float((sub.sum(axis=1) - np.diag(sub)).max())
            self._group_dp[group] = cost
        return cost

    def between(self, a: tuple[int, ...], b: tuple[int, ...]) -> float:
        """Bottleneck-matching cost between two groups (DT-FM's pipeline edge weight)."""
        if len(a) == 1:
            return self._pp_rows[a[0]][b[0]]
        key = (a, b) if a <= b else (b, a)
        cost = self._between.get(key)
        if cost is None:
            rows = [self._pp_rows[x] for x in key[0]]
            cost = bottleneck_assignment([[row[y] for y in key[1]] for row in rows])[0]
            self._between[key] = cost
        return cost

    def score(self, groups: Groups) -> Score:
        key = tuple(sorted(groups))
        hit = self._scores.get(key)
        if hit is not None:
            return hit
        self.evaluations += 1
        compute = float(max(self.compute[c] for g in key for c in g))
        dp = max(self.group_dp(g) for g in key)
        w = len(key)
        if self.width == 1:
            idx = np.array([g[0] for g in key])
            dist = self.pp_pair[np.ix_(idx, idx)]
        else:
            dist = [[0.0 if i == j else self.between(key[i], key[j]) for j in range(w)] for i in range(w)]
        pp, order = open_path_tsp(dist)
        score = Score(compute + dp + 2.0 * pp, compute, dp, pp, tuple(order))
        self._scores[key] = score
        return score


def bottleneck_assignment(cost) -> tuple[float, list[int]]:
    """Min over perfect matchings of the largest matched cost; ``perm[i]`` = column of row i.

    Binary search on the threshold (from the largest row or column minimum, a
    lower bound), Kuhn's augmenting paths for feasibility; DT-FM gets the same
    value with repeated Hungarian solves.
    """
    m = cost.tolist() if isinstance(cost, np.ndarray) else cost
    lower = max(max(min(row) for row in m), max(min(col) for col in zip(*m)))
    values = sorted({x for row in m for x in row if x >= lower})
    lo, hi, best = 0, len(values) - 1, None
    while lo <= hi:
        mid = (lo + hi) // 2
        perm = _perfect_matching(m, values[mid])
        if perm is None:
            lo = mid + 1
        else:
            best, hi = perm, mid - 1
    return max(m[i][best[i]] for i in range(len(m))), best


def _perfect_matching(m: list[list[float]], limit: float) -> list[int] | None:
    n = len(m)
    adj = [[j for j, x in enumerate(row) if x <= limit] for row in m]
    match_col, match_row = [-1] * n, [-1] * n
    for i, cols in enumerate(adj):  # greedy start, then Kuhn's augmenting paths for the rest
        for j in cols:
            if match_col[j] < 0:
                match_col[j], match_row[i] = i, j
                break

    def augment(i: int, seen: list[bool]) -> bool:
        for j in adj[i]:
            if not seen[j]:
                seen[j] = True
                if match_col[j] < 0 or augment(match_col[j], seen):
                    match_col[j], match_row[i] = i, j
                    return True
        return False

    for i in range(n):
        if match_row[i] < 0 and not augment(i, [False] * n):
            return None
    return match_row


def open_path_tsp(dist) -> tuple[float, list[int]]:
    """Shortest Hamiltonian path, free ends (DT-FM's open-loop TSP over the stage groups).

    Exact (Held-Karp, as DT-FM) up to ``EXACT_TSP_MAX`` groups; beyond, the
    best nearest-neighbour path from ``TSP_STARTS`` evenly spread starts,
    improved by best-improvement 2-opt.
    """
    n = len(dist)
    if n == 1:
        return 0.0, [0]
    if n <= EXACT_TSP_MAX:
        rows = dist.tolist() if isinstance(dist, np.ndarray) else dist
        if n <= 3:
            best = min(itertools.permutations(range(n)), key=lambda p: _path_len(rows, p))
            return _path_len(rows, best), list(best)
        return _held_karp(rows)
    d = np.asarray(dist, dtype=float)
    paths = [_nearest_neighbour(d, start) for start in sorted({k * n // TSP_STARTS for k in range(TSP_STARTS)})]
    path = _two_opt(d, min(paths, key=lambda p: (d[p[:-1], p[1:]].sum(), p)))
    return float(d[path[:-1], path[1:]].sum()), path


def _path_len(dist, path) -> float:
    return sum(dist[a][b] for a, b in zip(path, path[1:]))


def _held_karp(dist: list[list[float]]) -> tuple[float, list[int]]:
    n = len(dist)
    full = (1 << n) - 1
    cost = [[float("inf")] * n for _ in range(1 << n)]
    parent = [[-1] * n for _ in range(1 << n)]
    for i in range(n):
        cost[1 << i][i] = 0.0
    for mask in range(1, full + 1):
        row = cost[mask]
        for last in range(n):
            here = row[last]
            if here == float("inf"):
                continue
            d = dist[last]
            for nxt in range(n):
                if mask >> nxt & 1:
                    continue
                m2 = mask | 1 << nxt
                if here + d[nxt] < cost[m2][nxt]:
                    cost[m2][nxt] = here + d[nxt]
                    parent[m2][nxt] = last
    last = min(range(n), key=lambda i: cost[full][i])
    length, path, mask = cost[full][last], [], full
    while last >= 0:
        path.append(last)
        last, mask = parent[mask][last], mask & ~(1 << last)
    return length, path[::-1]


def _nearest_neighbour(d: np.ndarray, start: int) -> list[int]:
    n = len(d)
    seen = np.zeros(n, dtype=bool)
    path = [start]
    seen[start] = True
    for _ in range(n - 1):
        row = np.where(seen, np.inf, d[path[-1]])
        nxt = int(np.argmin(row))
        path.append(nxt)
        seen[nxt] = True
    return path


def _two_opt(d: np.ndarray, path: list[int]) -> list[int]:
    """Best-improvement 2-opt on an open path (reverse ``path[i..j]``), vectorised per round."""
    n = len(path)
    p = np.array(path)
    i, j = np.triu_indices(n, 1)
    for _ in range(n * n):
        prev_i, next_j = p[np.maximum(i - 1, 0)], p[np.minimum(j + 1, n - 1)]
        before = np.where(i > 0, d[prev_i, p[i]], 0.0) + np.where(j < n - 1, d[p[j], next_j], 0.0)
        after = np.where(i > 0, d[prev_i, p[j]], 0.0) + np.where(j < n - 1, d[p[i], next_j], 0.0)
        gain = before - after
        k = int(np.argmax(gain))
        if gain[k] <= 1e-12:
            break
        p[i[k]:j[k] + 1] = p[i[k]:j[k] + 1][::-1].copy()
    return p.tolist()


def grid_cost(req: PlacementRequest, tables: Tables, way: int, width: int) -> GridCost:
    job = req.job
    spec = job.spec
    seqs = job.global_batch / width  # one replica's share of the batch
    fwd_per_seq = spec.layers * spec.layer_forward_flops(1, job.seq_len) + spec.head_forward_flops(1, job.seq_len)
    return GridCost(
        tables=tables, way=way, width=width,
        grad_bytes=spec.params * GRAD_BYTES_PER_PARAM / way,
        act_bytes=seqs * job.seq_len * spec.hidden * BYTES_PER_ELEMENT,
        flops_per_unit=3.0 * fwd_per_seq * seqs / way)
