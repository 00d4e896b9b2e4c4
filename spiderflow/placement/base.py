"""The one signature every placement strategy shares.

A strategy takes a :class:`PlacementRequest` (the job, the topology, free
GPUs per cluster, current link load, calibration) and returns a
:class:`Placement`: the ordered pipeline chain of ``(cluster, gpus)``
segments, plus the plan when the strategy also chose the parallelisation
(every strategy here calls TPA for that, with the network view it is
entitled to: see :mod:`spiderflow.costmodel.network`).
"""

from __future__ import annotations

from collections import OrderedDict
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


_VIEWS: OrderedDict = OrderedDict()  # (topology, calibration, link load) -> its view, most recent last
VIEWS_KEPT = 16
VIEW_MEMO_CAP = 10_000


def shared_view(topology: Topology, calibration: Calibration, link_load: Mapping) -> TopologyView:
    """The :class:`TopologyView` of this network state, shared by every request that sees it.

    Everything a view memoises (channels, rings, crowds, stage work, estimates of plans) is a
    function of its topology, calibration and link load and of the memo's key, so requests that
    differ only in the job or the free GPUs can share one view's memo: a scheduling pass asks about
    every queued job under the same load, and admission about the same future loads for each of
    them. The last ``VIEWS_KEPT`` states are kept; a kept view holds its topology and calibration,
    so their ids in the key cannot be reused while it is kept. A view whose memo passes
    ``VIEW_MEMO_CAP`` entries is replaced by a fresh one (the state every job's plan with the whole
    topology to itself is asked on would otherwise grow for the whole run)."""
    key = (id(topology), id(calibration), frozenset(link_load.items()))
    view = _VIEWS.get(key)
    if view is None or len(view._memo) > VIEW_MEMO_CAP:
        view = _VIEWS[key] = TopologyView(topology=topology, calibration=calibration, link_load=dict(link_load))
    _VIEWS.move_to_end(key)
    if len(_VIEWS) > VIEWS_KEPT:
        _VIEWS.popitem(last=False)
    return view


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
        """Full knowledge: routes, shared links, current load. One memoising view per network state:
        requests on the same topology, calibration and link load share it (:func:`shared_view`)."""
        return self._topology_view

    @cached_property
    def _topology_view(self) -> TopologyView:
        return shared_view(self.topology, self.calibration, self.link_load)

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
