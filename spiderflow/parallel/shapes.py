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


def powers_of_two(limit: int) -> list[int]:
    out, p = [], 1
    while p <= limit:
        out.append(p)
        p *= 2
    return out


def segment_options(gpus: int, dp: int, gpus_per_node: int, spec: ModelSpec) -> list[tuple[int, int]]:
    """(tp, pp) pairs with tp * pp * dp == gpus."""
    if gpus % dp:
        return []
    per_dp = gpus // dp
    return [(tp, per_dp // tp) for tp in powers_of_two(min(gpus_per_node, per_dp))
            if per_dp % tp == 0 and spec.heads % tp == 0 and per_dp // tp <= spec.layers]


def replica_groupings(k: int) -> Iterator[tuple[tuple[int, ...], ...]]:
    """Split k ordered segments into r equal consecutive groups, for each r dividing k."""
    for r in range(1, k + 1):
        if k % r == 0:
            size = k // r
            yield tuple(tuple(range(g * size, (g + 1) * size)) for g in range(r))


def enumerate_shapes(segments: Sequence[tuple[str, int]], topology: Topology,
                     spec: ModelSpec) -> Iterator[Shape]:
    k = len(segments)
    gcd_pow = min(g & -g for _, g in segments)  # largest power of two dividing every count
    for dp in powers_of_two(gcd_pow):
        options = [segment_options(g, dp, topology.cluster(c).gpus_per_node, spec) for c, g in segments]
        if any(not o for o in options):
            continue
        if k <= MAX_ENUMERATED_SEGMENTS:
            combos = itertools.product(*options)
        else:
            # one tp level for all segments: the i-th smallest tp each admits
            combos = (tuple(o[min(i, len(o) - 1)] for o in options) for i in range(max(map(len, options))))
        for combo in combos:
            for groups in replica_groupings(k):
                reps = tuple(tuple((segments[j][0], *combo[j]) for j in grp) for grp in groups)
                depths = {sum(pp for _, _, pp in rep) for rep in reps}
                if len(depths) == 1 and next(iter(depths)) <= spec.layers:
                    yield Shape(replicas=reps, dp=dp)
