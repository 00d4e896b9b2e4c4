"""The one signature every placement strategy shares.

A strategy takes a :class:`PlacementRequest` (the job, the topology, free
GPUs per cluster, current link load, calibration) and returns a
:class:`Placement`: the ordered pipeline chain of ``(cluster, gpus)``
segments, plus the plan when the strategy also chose the parallelisation
(every strategy here calls TPA for that, with the network view it is
entitled to: see :mod:`spiderflow.costmodel.network`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property

from spiderflow.costmodel import NO_CALIBRATION, Calibration, MatrixView, TopologyView
from spiderflow.errors import InfeasiblePlan
from spiderflow.plan import Plan
from spiderflow.topology import Topology
from spiderflow.workload import Job

STATUS_HEURISTIC = "heuristic"
STATUS_OPTIMAL = "optimal"
STATUS_TIME_LIMIT = "feasible at time limit"


@dataclass(frozen=True, kw_only=True)
class PlacementRequest:
    job: Job
    topology: Topology
    free_gpus: Mapping[str, int]
    link_load: Mapping[tuple[str, str], float] = field(default_factory=dict)
    calibration: Calibration = NO_CALIBRATION
    seed: int = 0
    time_limit_s: float = 60.0
    threads: int = 1
    allowed: tuple[str, ...] | None = None  # restrict to these clusters (in this order)
    search_budget: int | None = None  # trials of search baselines (genetic); None: their defaults

    def __post_init__(self) -> None:
        free = sum(self.free_gpus.get(c, 0) for c in (self.allowed or self.topology.names))
        if self.job.gpus > free:
            raise InfeasiblePlan(f"{self.job.job_id}: wants {self.job.gpus} GPUs, only {free} free"
                                 + (f" in {','.join(self.allowed)}" if self.allowed else ""))

    def topology_view(self) -> TopologyView:
        """Full knowledge: routes, shared links, current load (one memoising view per request)."""
        return self._topology_view

    @cached_property
    def _topology_view(self) -> TopologyView:
        return TopologyView(topology=self.topology, calibration=self.calibration, link_load=self.link_load)

    def matrix_view(self) -> TopologyView:
        """Published-planner knowledge: a pairwise matrix, no sharing, no load."""
        return self._matrix_view

    @cached_property
    def _matrix_view(self) -> TopologyView:
        return MatrixView(self.topology, self.calibration)

    @cached_property
    def candidates(self) -> tuple[str, ...]:
        names = self.allowed or self.topology.names
        return tuple(c for c in names if self.free_gpus.get(c, 0) > 0)


@dataclass(frozen=True, kw_only=True)
class Placement:
    segments: tuple[tuple[str, int], ...]
    plan: Plan
    status: str = STATUS_HEURISTIC
    detail: dict = field(default_factory=dict)

    @property
    def gpus(self) -> dict[str, int]:
        return dict(self.segments)


Strategy = Callable[[PlacementRequest], Placement]
