"""``genetic``: the memetic-GA baseline in the style of Yuan et al., NeurIPS'22.

Yuan et al. ("Decentralized Training of Foundation Models in Heterogeneous
Environments", arXiv:2206.01288, section 3; code: DS3Lab/DT-FM,
``scheduler/heuristic_evolutionary_solver/scheduler.py``, function ``GCMA``)
schedule a tasklet grid of ``way`` pipeline stages x ``width`` data-parallel
replicas onto devices in two levels: a *balanced graph partition* of the
devices into ``way`` data-parallel groups, searched by a hybrid (memetic)
genetic algorithm, and for each candidate partition a bottleneck matching
between groups plus an *open-loop TSP* that orders the groups into a
pipeline. Its cost model (data-parallel all-reduce + 2 x pipeline p2p, over
the pairwise latency/bandwidth matrix) lives in :mod:`.genetic_ops`.

At cluster granularity (this module):

- **Device = unit** of ``unit`` GPUs in one cluster: the largest of 8, 4, 2, 1
  that divides the job's GPUs and of which the free GPUs hold enough (8 = one
  node of every shipped or generated cluster). A cluster with ``f`` free GPUs
  hosts up to ``f // unit`` units, so GPU counts per cluster are multiples of
  the unit: 8 x m, which TPA factors as tp x pp x dp (tp <= 8).
- **Grid**: the job's ``K = gpus / unit`` units as ``way x width`` for every
  divisor ``way`` of K with ``way <= layers``; the paper fixes one grid, here
  the population spreads over all of them and selection picks the grid.
- **Individual**: per stage, the multiset of clusters whose units form that
  stage's data-parallel group (the balanced partition), within each cluster's
  free units; its pipeline order is the TSP solution inside the fitness.
- **GA** (DT-FM's ``GCMA`` loop): ``population`` random individuals, then
  ``trials`` steady-state steps: two parents drawn uniformly; DT-FM's
  five-point crossover (five genes of parent 1 copied into parent 2, then
  repaired to the grid and to free capacity) when they share a grid, else a
  copy of parent 1; a mutation (ours; DT-FM has none) with probability
  ``MUTATION_RATE`` or when the child equals a parent; the memetic local search
  (DT-FM runs a cyclic vertex-moving partition heuristic driven by pairwise
  gains): up to ``LS_STEPS`` rounds; each ranks by a pairwise-gain estimate
  the moves of one unit to a cluster with spare units, swaps of two units
  between stages, and moves of all of a cluster's units to another cluster
  (cluster moves, Hwang, Kim & Yoon 2015), scores the best ``LS_TRIES`` exactly
  and takes the best improving one. Candidate clusters: each used cluster's
  ``NEIGHBOURS`` cheapest partners plus ``LS_RANDOM_CANDIDATES`` random ones.
  The child replaces the worse parent if it is better and not already in the
  population (DT-FM's replacement, minus duplicates).
  Defaults are DT-FM's: ``GCMA(..., population_size=100, trails=4900)``, i.e.
  5,000 candidates; ``generations`` (if given) sets ``trials = generations x
  population``.
- **Result**: the best individuals in fitness order are decoded into a chain
  (replica after replica, each threaded through the groups by the bottleneck
  matchings; a cluster appearing twice is merged at its first position) and
  planned by TPA on the same matrix view; the first that TPA can fit in memory
  wins (``FINAL_TRIES`` at most), else ``InfeasiblePlan``.

Cost: O(trials x LS_STEPS x (K x C + LS_TRIES x fitness)), C the local
search's candidate clusters; a fitness costs O(way^2 x width^2) for the
matrix (memoised per pair of groups) plus Held-Karp (way <= 7) or 2-opt.
Reproducible: all randomness comes from ``random.Random(req.seed)``.
"""

from __future__ import annotations

import random
from collections import Counter

import numpy as np

from spiderflow.errors import InfeasiblePlan
from spiderflow.parallel.tpa import plan_placement
from spiderflow.placement.base import Placement, PlacementRequest
from spiderflow.placement.genetic_ops import GridCost, Groups, Score, bottleneck_assignment, build_tables, grid_cost

UNIT_CHOICES = (8, 4, 2, 1)
CROSSOVER_GENES = 5  # DT-FM's five_point_crossover
MUTATION_RATE = 0.1  # ours: DT-FM relies on the local search alone
LS_STEPS = 4
LS_TRIES = 6
LS_RANDOM_CANDIDATES = 4  # spare clusters added to the neighbour lists each local-search round
FINAL_TRIES = 8


def place_genetic(req: PlacementRequest, *, population: int = 100, generations: int | None = None,
                  trials: int = 4900) -> Placement:
    if req.search_budget is not None:  # reduced settings for long traces (compare --search-budget)
        trials = req.search_budget
    if population < 2:
        raise ValueError(f"population must be >= 2 (got {population})")
    if generations is not None:
        if generations < 0:
            raise ValueError(f"generations must be >= 0 (got {generations})")
        trials = generations * population
    if trials < 0:
        raise ValueError(f"trials must be >= 0 (got {trials})")
    rng = random.Random(req.seed)
    unit = choose_unit(req)
    tables = build_tables(req, unit)
    units = req.job.gpus // unit
    grids = [grid_cost(req, tables, way, units // way)
             for way in range(1, units + 1) if units % way == 0 and way <= req.job.spec.layers]
    if not grids:  # a single stage is always a divisor; unreachable
        raise InfeasiblePlan(f"{req.job.job_id}: no tasklet grid for {units} units of {unit} GPUs")

    pop: list[tuple[int, Groups, Score]] = []
    for i in range(population):
        g = i % len(grids)
        groups = _random_groups(grids[g], rng)
        pop.append((g, groups, grids[g].score(groups)))
    members = Counter((g, groups) for g, groups, _ in pop)

    for _ in range(trials):
        i, j = rng.randrange(population), rng.randrange(population)
        (g1, p1, s1), (g2, p2, s2) = pop[i], pop[j]
        gc = grids[g1]
        child = _crossover(gc, p1, p2, rng) if g1 == g2 and i != j else p1
        if child in (p1, p2) or rng.random() < MUTATION_RATE:
            child = _mutate(gc, child, rng)
        child, score = _local_search(gc, child, rng)
        worse = i if s1.total_s >= s2.total_s else j
        if score.total_s < pop[worse][2].total_s and members[(g1, child)] == 0:
            members[pop[worse][:2]] -= 1
            members[(g1, child)] += 1
            pop[worse] = (g1, child, score)

    ranked = sorted(pop, key=lambda m: (m[2].total_s, m[0], m[1]))
    tried: list[tuple[tuple[str, int], ...]] = []
    error: InfeasiblePlan | None = None
    view = req.matrix_view()
    for g, groups, score in ranked:
        segments = decode(grids[g], groups, score)
        if segments in tried:
            continue
        tried.append(segments)
        try:
            plan = plan_placement(req.job, segments, view)
        except InfeasiblePlan as exc:
            error = exc
            if len(tried) >= FINAL_TRIES:
                break
            continue
        gc = grids[g]
        return Placement(segments=segments, plan=plan, detail={
            "population": population, "trials": trials, "generations": trials / population,
            "evaluations": sum(x.evaluations for x in grids), "best_fitness_s": score.total_s,
            "population_best_s": ranked[0][2].total_s,
            "fitness": {"compute_s": score.compute_s, "dp_s": score.dp_s, "pp_s": 2 * score.pp_s},
            "grid": {"unit_gpus": unit, "stages": gc.way, "replicas": gc.width}, "grids": len(grids),
            "seed": req.seed, "tpa_tries": len(tried)})
    raise InfeasiblePlan(f"{error} (genetic: none of its {len(tried)} best placements fits)")


def choose_unit(req: PlacementRequest) -> int:
    """Largest unit dividing the job's GPUs whose whole units on the free GPUs are enough."""
    for unit in UNIT_CHOICES:
        if req.job.gpus % unit == 0 and \
                sum(req.free_gpus.get(c, 0) // unit for c in req.candidates) >= req.job.gpus // unit:
            return unit
    raise InfeasiblePlan(f"{req.job.job_id}: wants {req.job.gpus} GPUs, fewer are free")


def decode(gc: GridCost, groups: Groups, score: Score) -> tuple[tuple[str, int], ...]:
    """The pipeline chain: replica after replica through the stage order, then merged per cluster."""
    ordered = [groups[i] for i in score.order]
    cur = list(ordered[0])
    replicas = [[c] for c in cur]
    for nxt in ordered[1:]:
        perm = bottleneck_assignment(gc.pp_pair[np.ix_(cur, nxt)])[1] if gc.width > 1 else [0]
        cur = [nxt[perm[r]] for r in range(gc.width)]
        for rep, c in zip(replicas, cur):
            rep.append(c)
    counts = Counter(c for g in groups for c in g)
    names, unit = gc.tables.names, gc.tables.unit
    chain = dict.fromkeys(c for rep in replicas for c in rep)  # first appearance, in order
    return tuple((names[c], counts[c] * unit) for c in chain)


def _canon(groups) -> Groups:
    return tuple(sorted(tuple(sorted(g)) for g in groups))


def _spare(gc: GridCost, used: Counter) -> list[int]:
    cap = gc.tables.capacity
    return [c for c in range(len(cap)) if used[c] < cap[c]]


def _random_groups(gc: GridCost, rng: random.Random) -> Groups:
    pool = [c for c, n in enumerate(gc.tables.capacity) for _ in range(n)]
    picked = rng.sample(pool, gc.units)
    return _canon(picked[s * gc.width:(s + 1) * gc.width] for s in range(gc.way))


def _crossover(gc: GridCost, p1: Groups, p2: Groups, rng: random.Random) -> Groups:
    """DT-FM's five-point crossover: five of parent 1's genes into parent 2, then repair."""
    # Normalise parent 2's group labels to parent 1's by overlap (Bui & Moon, IEEE TC 1996).
    left = list(range(len(p2)))
    aligned = []
    for g in p1:
        best = max(left, key=lambda k: (sum((Counter(g) & Counter(p2[k])).values()), -k))
        left.remove(best)
        aligned.append(list(p2[best]))
    genes = [(s, c) for s, g in enumerate(p1) for c in g]
    for s, c in rng.sample(genes, min(CROSSOVER_GENES, len(genes))):
        child, mine = aligned[s], Counter(p1[s])
        if Counter(child)[c] >= mine[c]:
            continue
        out = [k for k, x in enumerate(child) if Counter(child)[x] > mine[x]]
        child[rng.choice(out)] = c
    # Repair: clusters over their free units give up the copies parent 1 does not have there.
    used = Counter(c for g in aligned for c in g)
    cap = gc.tables.capacity
    p1_clusters = sorted({c for g in p1 for c in g})
    for s, child in enumerate(aligned):
        for k, c in enumerate(child):
            if used[c] > cap[c] and Counter(child)[c] > Counter(p1[s])[c]:
                spare = [x for x in p1_clusters if used[x] < cap[x]] or _spare(gc, used)
                used[c] -= 1
                child[k] = rng.choice(spare)
                used[child[k]] += 1
    for s, child in enumerate(aligned):  # still over (both parents used it): any spare cluster
        for k, c in enumerate(child):
            if used[c] > cap[c]:
                used[c] -= 1
                child[k] = rng.choice(_spare(gc, used))
                used[child[k]] += 1
    return _canon(aligned)


def _mutate(gc: GridCost, groups: Groups, rng: random.Random) -> Groups:
    """Move one unit to a cluster with spare units, or (width > 1) swap two units between stages."""
    child = [list(g) for g in groups]
    used = Counter(c for g in groups for c in g)
    spare = _spare(gc, used)
    if gc.way > 1 and gc.width > 1 and (not spare or rng.random() < 0.5):
        s, t = rng.sample(range(gc.way), 2)
        i, j = rng.randrange(gc.width), rng.randrange(gc.width)
        child[s][i], child[t][j] = child[t][j], child[s][i]
    elif spare:
        s, i = rng.randrange(gc.way), rng.randrange(gc.width)
        options = [c for c in spare if c != child[s][i]]
        if options:
            child[s][i] = rng.choice(options)
    return _canon(child)


def _local_search(gc: GridCost, groups: Groups, rng: random.Random) -> tuple[Groups, Score]:
    score = gc.score(groups)
    for _ in range(LS_STEPS):
        best = None
        for move in _ranked_moves(gc, groups, score, rng):
            cand = _apply(groups, move)
            s = gc.score(cand)
            if s.total_s < (best[1] if best else score).total_s - 1e-12:
                best = (cand, s)
        if best is None:
            break
        groups, score = best
    return groups, score


def _apply(groups: Groups, move: tuple) -> Groups:
    child = [list(g) for g in groups]
    if move[0] == "move":
        _, s, i, w = move
        child[s][i] = w
    elif move[0] == "relabel":
        _, v, w = move
        child = [[w if c == v else c for c in g] for g in child]
    else:
        _, s, i, t, j = move
        child[s][i], child[t][j] = child[t][j], child[s][i]
    return _canon(child)


def _ranked_moves(gc: GridCost, groups: Groups, score: Score, rng: random.Random) -> list[tuple]:
    """The ``LS_TRIES`` moves with the best pairwise-gain estimate (lower = better)."""
    used = Counter(c for g in groups for c in g)
    spare = _spare(gc, used)
    cand = set(used)
    for c in used:
        cand.update(int(x) for x in gc.neighbours[c])
    cand.update(rng.sample(spare, min(LS_RANDOM_CANDIDATES, len(spare))))
    cols = np.array(sorted(cand))
    col_of = {int(c): k for k, c in enumerate(cols)}
    slots = [(s, i, c) for s, g in enumerate(groups) for i, c in enumerate(g)]
    v = np.array([c for _, _, c in slots])
    vcol = np.array([col_of[c] for _, _, c in slots])
    est = _slot_estimates(gc, groups, score, cols, col_of, slots)
    cap = gc.tables.capacity
    room = np.array([cap[c] - used[c] for c in cols.tolist()])

    move = est.copy()  # slot a's unit goes to cluster cols[b]
    move[:, room <= 0] = np.inf
    move[np.arange(len(slots)), vcol] = np.inf
    moves = [(x, ("move", slots[a][0], slots[a][1], int(cols[b]))) for x, a, b in _smallest(move)]
    # Cluster moves (Hwang, Kim & Yoon, Math. Probl. Eng. 2015): all units of v go to w at once,
    # which single-unit moves cannot reach when every intermediate step costs more.
    many = [c for c in sorted(used) if used[c] > 1]
    if many:
        member = np.array([[c == m for c in v.tolist()] for m in many], dtype=float)
        relabel = member @ est
        relabel[np.array([used[c] for c in many])[:, None] > room[None, :]] = np.inf
        relabel[np.arange(len(many)), [col_of[c] for c in many]] = np.inf
        moves += [(x, ("relabel", many[a], int(cols[b]))) for x, a, b in _smallest(relabel)]
    if gc.width > 1 and len(groups) > 1:  # slot a takes b's cluster and b takes a's
        sg = np.array([s for s, _, _ in slots])
        swap = est[:, vcol] + est[:, vcol].T
        swap[(sg[:, None] == sg[None, :]) | (v[:, None] == v[None, :])] = np.inf
        swap[np.tri(len(slots), dtype=bool)] = np.inf  # each pair once
        moves += [(x, ("swap", *slots[a][:2], *slots[b][:2])) for x, a, b in _smallest(swap)]
    moves.sort(key=lambda m: m[0])
    return [m for _, m in moves[:LS_TRIES]]


def _smallest(matrix: np.ndarray) -> list[tuple[float, int, int]]:
    flat = np.argsort(matrix, axis=None, kind="stable")[:LS_TRIES]
    return [(float(matrix[a, b]), int(a), int(b)) for a, b in zip(*np.unravel_index(flat, matrix.shape))
            if np.isfinite(matrix[a, b])]


def _slot_estimates(gc: GridCost, groups: Groups, score: Score, cols: np.ndarray, col_of: dict,
                    slots: list) -> np.ndarray:
    """Estimated fitness change when slot a's unit moves to cluster ``cols[b]``, from pairwise costs.

    Data parallel: change of the unit's summed cost to its group-mates; pipeline:
    change of its mean cost to the adjacent stages' units (both directions);
    compute: change of the slowest unit.
    """
    way = len(groups)
    v = np.array([c for _, _, c in slots])
    sg = np.array([s for s, _, _ in slots])
    vcol = np.array([col_of[c] for c in v.tolist()])
    counts = np.zeros((way, len(cols)))
    for s, i, c in slots:
        counts[s, col_of[c]] += 1
    est = np.zeros((len(slots), len(cols)))
    if gc.width > 1:
        rows = counts @ gc.dp_pair[np.ix_(cols, cols)]  # rows[s, w]: sum over group s of dp_pair[., w]
        est += rows[sg] - gc.dp_pair[np.ix_(v, cols)]
        est -= (rows[sg, vcol] - gc.dp_pair[v, v])[:, None]
    if way > 1:
        pos = {g: p for p, g in enumerate(score.order)}
        adj = np.zeros((way, way))
        for s in range(way):
            for q in (pos[s] - 1, pos[s] + 1):
                if 0 <= q < way:
                    adj[s, score.order[q]] = 1.0 / gc.width
        rows = (adj @ counts) @ gc.pp_pair[np.ix_(cols, cols)]
        est += 2.0 * (rows[sg] - rows[sg, vcol][:, None])
    comp = gc.compute[v]
    top = np.sort(comp)[::-1]
    others = np.where(comp >= top[0], top[1] if len(top) > 1 else 0.0, top[0])
    est += np.maximum(gc.compute[cols][None, :], others[:, None]) - top[0]
    return est
