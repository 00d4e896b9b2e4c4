"""Enumerate the parallel shapes a placement admits (TPA's inter-cluster level).

A *placement* is an ordered list of ``(cluster, gpus)`` segments. A shape
fixes, for that placement:

- how many pipeline **replicas** (data parallelism across clusters) the
  segments form: ``r`` groups of consecutive segments, each group one
  pipeline; all groups must reach the same pipeline depth;
- the in-stage data-parallel width ``dp`` (a power of two dividing every
  segment's GPU count);
- per segment, the tensor-parallel degree ``tp`` (a power of two, at most a
  node, dividing the heads) and hence the number of stages it hosts
  ``pp = gpus / (tp * dp)``.

The layer split and micro-batching are chosen later (:mod:`spiderflow.parallel.tpa`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache

from spiderflow.topology import Topology
from spiderflow.workload import ModelSpec

MAX_ENUMERATED_SEGMENTS = 2  # beyond this, one tp level for all segments (search-space cap)


@dataclass(frozen=True)
class Shape:
    replicas: tuple[tuple[tuple[str, int, int], ...], ...]  # per replica: (cluster, tp, pp) per segment
    dp: int

    @property
    def depth(self) -> int:
        return sum(pp for _, _, pp in self.replicas[0])

    def __hash__(self) -> int:
        # TPA keys its per-shape floors on shapes: their nested tuples hashed once, not per look-up
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.replicas, self.dp))
            object.__setattr__(self, "_hash", h)
        return h

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}  # string hashes differ per process


def powers_of_two(limit: int) -> list[int]:
    out, p = [], 1
    while p <= limit:
        out.append(p)
        p *= 2
    return out


def segment_options(gpus: int, dp: int, gpus_per_node: int, spec: ModelSpec) -> tuple[tuple[int, int], ...]:
    """(tp, pp) pairs with tp * pp * dp == gpus."""
    return _options(gpus, dp, gpus_per_node, spec.heads, spec.layers)


@lru_cache(maxsize=4096)
def _options(gpus: int, dp: int, gpus_per_node: int, heads: int, layers: int) -> tuple[tuple[int, int], ...]:
    # (memoised: a few hundred distinct arguments in a 10,000-job replay, asked per segment and dp of
    # every chain enumerated)
    if gpus % dp:
        return ()
    per_dp = gpus // dp
    return tuple((tp, per_dp // tp) for tp in powers_of_two(min(gpus_per_node, per_dp))
                 if per_dp % tp == 0 and heads % tp == 0 and per_dp // tp <= layers)


def replica_groupings(k: int) -> Iterator[tuple[tuple[int, ...], ...]]:
    """Split k ordered segments into r equal consecutive groups, for each r dividing k."""
    for r in range(1, k + 1):
        if k % r == 0:
            size = k // r
            yield tuple(tuple(range(g * size, (g + 1) * size)) for g in range(r))


def replica_runs(items: Sequence) -> Iterator[tuple[tuple, ...]]:
    """``items`` (a chain's clusters, in order) cut into r equal consecutive runs, for each r
    dividing their number (:func:`replica_groupings`): the replicas of every split of the chain."""
    for groups in replica_groupings(len(items)):
        yield tuple(tuple(items[j] for j in group) for group in groups)


def enumerate_shapes(segments: Sequence[tuple[str, int]], topology: Topology,
                     spec: ModelSpec) -> tuple[Shape, ...]:
    """Every shape of ``segments``, memoised on all the enumeration reads: the segments, their
    clusters' node sizes and the model's heads and layers (on the 64-cluster synthetic trace a
    quarter of TPA's searches ask about segments it enumerated before)."""
    nodes = tuple(topology.cluster(c).gpus_per_node for c, _ in segments)
    return _shapes(tuple((c, g) for c, g in segments), nodes, spec.heads, spec.layers)


@lru_cache(maxsize=20_000)
def _shapes(segments: tuple[tuple[str, int], ...], nodes: tuple[int, ...], heads: int,
            layers: int) -> tuple[Shape, ...]:
    return tuple(_enumerate(segments, nodes, heads, layers))


def _enumerate(segments: tuple[tuple[str, int], ...], nodes: tuple[int, ...], heads: int,
               layers: int) -> Iterator[Shape]:
    k = len(segments)
    gcd_pow = min(g & -g for _, g in segments)  # largest power of two dividing every count
    sizes = [len(groups[0]) for groups in replica_groupings(k)]  # each split's group size: slices of the segments
    for dp in powers_of_two(gcd_pow):
        options = [_options(g, dp, node, heads, layers) for (_, g), node in zip(segments, nodes)]
        if any(not o for o in options):
            continue
        if k <= MAX_ENUMERATED_SEGMENTS:
            combos = itertools.product(*options)
        else:
            # one tp level for all segments: the i-th smallest tp each admits
            combos = (tuple(o[min(i, len(o) - 1)] for o in options) for i in range(max(map(len, options))))
        for combo in combos:
            segs = [(c, tp, pp) for (c, _), (tp, pp) in zip(segments, combo)]
            before = list(itertools.accumulate((pp for _, pp in combo), initial=0))  # stages before segment j
            for size in sizes:  # every replica the same depth, at most a stage per layer
                depth = before[size]
                if depth <= layers and all(before[i + size] - before[i] == depth for i in range(size, k, size)):
                    yield Shape(replicas=tuple(tuple(segs[i:i + size]) for i in range(0, k, size)), dp=dp)
