"""``wan spot``: a reproducible capacity events file of spot withdrawals.

A spot (preemptible) allocation is taken back after a short notice and offered again hours later.
``--withdrawals N`` draws N of them: each picks a cluster uniformly, a time ``time_s`` uniformly in
``[notice_s, horizon)`` (so that its notice falls inside the trace) and a duration uniformly in
``[--min-hours, --max-hours]``; it takes ``ceil(share x the cluster's GPUs)`` of the cluster's
GPUs, announced ``notice_s`` before (default 120 s, the two minutes of an EC2 spot interruption
notice) and back at ``time_s`` plus the duration, which may fall past the horizon. Withdrawals of
one cluster that overlap, or whose notice comes before the one ahead has returned, merge into one
(as a cluster's overlapping shares would otherwise add up past its GPUs). The same topology, seed
and options give the same file; its header comment records the command.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from spiderflow.topology import Topology
from spiderflow.wan.capacity import CapacityEvent
from spiderflow.wan.generate import merged_spans

EC2_NOTICE_S = 120.0  # "Spot Instance interruption notices", EC2 user guide


@dataclass(frozen=True, kw_only=True)
class SpotPattern:
    hours: float = 24.0
    withdrawals: int = 4
    notice_s: float = EC2_NOTICE_S
    min_hours: float = 2.0
    max_hours: float = 8.0
    share: float = 1.0  # of the cluster's GPUs each withdrawal takes (rounded up)

    def __post_init__(self) -> None:
        if not (self.hours > 0 and self.withdrawals >= 0 and self.notice_s >= 0
                and 0 < self.min_hours <= self.max_hours and 0 < self.share <= 1):
            raise ValueError(f"a spot pattern out of range: {self}")
        if self.notice_s >= self.hours * 3600:
            raise ValueError(f"notice_s={self.notice_s:g} must be shorter than the horizon ({self.hours:g} h)")


def generate_spot_events(topology: Topology, seed: int, pattern: SpotPattern = SpotPattern()) -> list[CapacityEvent]:
    """The withdrawals (module docstring), sorted by time, then by the topology's cluster order."""
    rng = random.Random(seed)
    horizon = pattern.hours * 3600
    spans: dict[str, list[tuple[float, float]]] = {c.name: [] for c in topology.clusters}
    for _ in range(pattern.withdrawals):
        cluster = rng.choice(topology.clusters)
        # times in ms, the start rounded down (below the horizon, not below the notice), the return up
        start = max(pattern.notice_s, math.floor(rng.uniform(pattern.notice_s, horizon) * 1000) / 1000)
        back = math.ceil((start + rng.uniform(pattern.min_hours, pattern.max_hours) * 3600) * 1000) / 1000
        spans[cluster.name].append((start, back))
    rows = []
    for order, cluster in enumerate(topology.clusters):
        gpus = math.ceil(round(pattern.share * cluster.total_gpus, 9))  # 0.28 x 25 is 7.000000000000001
        rows += [(start, order, CapacityEvent(time_s=start, cluster=cluster.name, gpus=gpus,
                                              notice_s=pattern.notice_s, return_s=end))
                 for start, end in merged_spans(spans[cluster.name], lead=pattern.notice_s)]
    rows.sort(key=lambda r: (r[0], r[1]))
    return [ev for _, _, ev in rows]
