"""``blind``: topology-oblivious placement, the floor any planner must beat.

Clusters with the most free GPUs first (ties by name), each giving all it
can until the job has its GPUs; pipeline order is that same order. TPA
then plans the chain. O(V log V).
"""

from __future__ import annotations

from spiderflow.parallel.tpa import plan_placement
from spiderflow.placement.base import Placement, PlacementRequest


def greedy_segments(order, free, wanted: int) -> tuple[tuple[str, int], ...]:
    segments, left = [], wanted
    for name in order:
        if left == 0:
            break
        take = min(free.get(name, 0), left)
        if take:
            segments.append((name, take))
            left -= take
    return tuple(segments)


def place(req: PlacementRequest) -> Placement:
    order = req.allowed or sorted(req.candidates, key=lambda c: (-req.free_gpus[c], c))
    segments = greedy_segments(order, req.free_gpus, req.job.gpus)
    return Placement(segments=segments, plan=plan_placement(req.job, segments, req.matrix_view()))
