"""A plan -> the work of each of its ranks: the contract between the cost model and the emulator.

One rank per (replica, stage) of a plan, rank ``replica * depth + stage``
(docs/emulator-run.md). The stage's ``dp`` in-stage data-parallel groups and
their ``tp`` GPUs sit in one cluster and are folded into that rank. Per rank,
in real-equivalent units (seconds on the real GPUs, bytes of the real job):

- ``forward_s`` / ``backward_s``: the stage's compute for one micro-batch
  (:func:`~spiderflow.costmodel.stages.stage_compute_s`, TP traffic included);
  the ``dp`` groups run in parallel, so that is the stage's time too;
- ``next_bytes`` / ``prev_bytes``: one micro-batch's boundary tensor with the
  next / previous stage (activations one way, their gradient the other, the
  same size). Across clusters all ``dp`` groups' tensors squeeze through the
  same WAN path, so the rank moves ``dp x`` one group's bytes; inside a
  cluster each group has its own NIC, so the rank moves one group's bytes;
- ``grad_bytes``: the stage's whole gradient (every tp shard, bf16): what its
  inter-cluster all-reduce carries over the ring of ``sync_clusters``;
- ``sync_intra_s``: the intra-cluster part of the gradient sync.

``predict`` and ``estimate`` price exactly these items (:func:`price`), and
``emulator`` launches exactly these (dividing bytes by its scale, multiplying
times by its dilation): neither side derives a byte count or a rank layout
of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from spiderflow.costmodel.network import TopologyView
from spiderflow.costmodel.schedule import estimate_1f1b, estimate_columns
from spiderflow.costmodel.stages import StageCost, intra_sync_s, stage_compute_s, stage_params, wan_sync_s
from spiderflow.plan import Plan, Stage
from spiderflow.topology import Topology
from spiderflow.workload import GRAD_BYTES_PER_PARAM


class RankWork(NamedTuple):
    """One rank's work per iteration (see the module docstring). Immutable; a NamedTuple rather than a
    frozen dataclass because the search loops build one per stage per estimate (0.8 vs 2.7 us each)."""

    rank: int
    replica: int
    stage: int
    cluster: str
    layers: int  # transformer layers of the stage
    forward_s: float  # one micro-batch
    backward_s: float
    prev_rank: int | None
    next_rank: int | None
    prev_cluster: str | None
    next_cluster: str | None
    prev_bytes: float  # per micro-batch, each way, with the previous stage (0 for the first)
    next_bytes: float  # per micro-batch, each way, with the next stage (0 for the last)
    grad_bytes: float  # the stage's gradient, every tp shard
    sync_clusters: tuple[str, ...]  # the stage's replicas' clusters, in ring order; one: no WAN sync
    sync_intra_s: float


@dataclass(frozen=True, kw_only=True)
class PlanWork:
    job_id: str
    depth: int
    micro_batches: int
    micro_batch_size: int
    seq_len: int
    recompute: bool
    ranks: tuple[RankWork, ...]  # in rank order
    # per stage: its replicas' ranks grouped by cluster (order of first appearance); () where every
    # replica of the stage sits in one cluster (that sync is intra-cluster only)
    sync_groups: tuple[tuple[tuple[int, ...], ...], ...]

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    def ranks_per_cluster(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for w in self.ranks:
            out[w.cluster] = out.get(w.cluster, 0) + 1
        return out


def stage_syncs(plan: Plan, view: TopologyView) -> list[tuple[float, tuple[str, ...], float]]:
    """Per stage: (intra-cluster sync seconds, its replicas' clusters in order of first appearance,
    its gradient bytes)."""
    shared = _sync_shared(plan)
    return [_stage_sync(plan, view, i, stage, shared) for i, stage in enumerate(plan.stages)]


def stage_sync(plan: Plan, view: TopologyView, i: int, stage: Stage) -> tuple[float, tuple[str, ...], float]:
    """:func:`stage_syncs`' entry of stage ``i`` were it ``stage`` (its layer range may differ from the
    plan's: :func:`~spiderflow.parallel.tpa.rebalance` prices moved layers so)."""
    return _stage_sync(plan, view, i, stage, _sync_shared(plan))


def _sync_shared(plan: Plan) -> tuple:
    """What every stage's sync entry of ``plan`` shares: its memo key's prefix and the model's layers."""
    return ("syncs", plan.job.model, plan.dp), plan.job.spec.layers


def _stage_sync(plan: Plan, view: TopologyView, i: int, stage: Stage,
                shared: tuple) -> tuple[float, tuple[str, ...], float]:
    # it depends on the stage's tp, layer range and its replicas' clusters only (memoised on the
    # view: the search loops price many plans of one job that repeat stages)
    prefix, last = shared
    at = tuple(rep[i].cluster for rep in plan.replicas)
    key = (prefix, stage.tp, stage.layer_start == 0, stage.layer_end - stage.layer_start, stage.layer_end == last, at)
    memo = view._memo
    hit = memo.get(key)
    if hit is None:
        params = stage_params(plan, stage)
        hit = memo[key] = (intra_sync_s(plan, i, view, params), tuple(dict.fromkeys(at)),
                           float(params * GRAD_BYTES_PER_PARAM))
    return hit


def replica_work(plan: Plan, view: TopologyView, replica: int,
                 syncs: list[tuple[float, tuple[str, ...], float]] | None = None) -> list[RankWork]:
    """The work items of one replica's ranks (stage order)."""
    syncs = stage_syncs(plan, view) if syncs is None else syncs
    shared = _work_shared(plan)
    return [_stage_work(plan, view, replica, i, st, syncs[i], shared) for i, st in enumerate(plan.replicas[replica])]


def stage_work(plan: Plan, view: TopologyView, replica: int, i: int, st: Stage,
               sync: tuple[float, tuple[str, ...], float]) -> RankWork:
    """The work item of stage ``i`` of ``replica`` were it ``st`` (its layer range may differ from the
    plan's), with its :func:`stage_sync` entry ``sync``."""
    return _stage_work(plan, view, replica, i, st, sync, _work_shared(plan))


def _work_shared(plan: Plan) -> tuple:
    """What every stage's work item of ``plan`` shares: its compute memo key's prefix, the model's
    layers and one micro-batch's boundary bytes."""
    job = plan.job
    return (("compute", job.model, job.seq_len, plan.micro_batch_size, plan.recompute), job.spec.layers,
            job.spec.boundary_bytes(plan.micro_batch_size, job.seq_len))


def _stage_work(plan: Plan, view: TopologyView, replica: int, i: int, st: Stage,
                sync: tuple[float, tuple[str, ...], float], shared: tuple) -> RankWork:
    # a stage's compute depends on these and its (cluster, tp, layers, last) only: the search
    # loops price many plans of one job whose stages repeat them (memoised on the view)
    prefix, last, group = shared
    key = (prefix, st.cluster, st.tp, st.layer_end - st.layer_start, st.layer_end == last)
    memo = view._memo
    hit = memo.get(key)
    if hit is None:
        hit = memo[key] = stage_compute_s(plan, st, view.topology, view.calibration)
    fwd, bwd = hit
    stages = plan.replicas[replica]
    depth = len(stages)
    prev_c = stages[i - 1].cluster if i > 0 else None
    next_c = stages[i + 1].cluster if i + 1 < depth else None
    rank = replica * depth + i
    return RankWork(
        rank=rank, replica=replica, stage=i, cluster=st.cluster, layers=st.layers,
        forward_s=fwd, backward_s=bwd,
        prev_rank=rank - 1 if prev_c else None, next_rank=rank + 1 if next_c else None,
        prev_cluster=prev_c, next_cluster=next_c,
        # across clusters the stage's dp groups share the path (module docstring)
        prev_bytes=(group if prev_c == st.cluster else plan.dp * group) if prev_c else 0.0,
        next_bytes=(group if next_c == st.cluster else plan.dp * group) if next_c else 0.0,
        grad_bytes=sync[2], sync_clusters=sync[1], sync_intra_s=sync[0])


def _sync_groups(plan: Plan) -> tuple[tuple[tuple[int, ...], ...], ...]:
    groups = []
    for i in range(plan.depth):
        by_cluster: dict[str, list[int]] = {}
        for r, rep in enumerate(plan.replicas):
            by_cluster.setdefault(rep[i].cluster, []).append(r * plan.depth + i)
        groups.append(tuple(tuple(v) for v in by_cluster.values()) if len(by_cluster) > 1 else ())
    return tuple(groups)


def plan_work(plan: Plan, view: TopologyView) -> PlanWork:
    """Every rank's work item (memoised on the view)."""
    key = ("work", plan)
    if key not in view._memo:
        syncs = stage_syncs(plan, view)
        ranks = tuple(w for r in range(len(plan.replicas)) for w in replica_work(plan, view, r, syncs))
        view._memo[key] = PlanWork(job_id=plan.job.job_id, depth=plan.depth, micro_batches=plan.micro_batches,
                                   micro_batch_size=plan.micro_batch_size, seq_len=plan.job.seq_len,
                                   recompute=plan.recompute, ranks=ranks, sync_groups=_sync_groups(plan))
    return view._memo[key]


def self_crowd(plan: Plan, topology: Topology) -> tuple[tuple[tuple[str, str], int], ...]:
    """Directed WAN hops ``(from, to)`` that more than one of the plan's own pipeline transfers
    cross in the same direction (activations down and gradients up every replica's pipeline,
    along the topology's routes), with how many: a 3-stage pipeline a -> c -> b whose a -> c
    route runs through b sends c's input and b's gradient for c over b -> c at once. Those
    transfers share the hop (:meth:`~spiderflow.costmodel.network.TopologyView.p2p_crowded`)."""
    return chains_crowd([[s.cluster for s in rep] for rep in plan.replicas], topology)


def chains_crowd(chains: Sequence[Sequence[str]], topology: Topology) -> tuple[tuple[tuple[str, str], int], ...]:
    """:func:`self_crowd` of pipelines whose stages sit in these clusters (one list per replica)."""
    counts: dict[tuple[str, str], int] = {}
    for rep in chains:
        for s, t in zip(rep, rep[1:]):
            if s == t:
                continue
            for a, b in ((s, t), (t, s)):
                path = topology.path(a, b)
                for hop in path.hop_pairs:
                    counts[hop] = counts.get(hop, 0) + 1
    return tuple(sorted((h, k) for h, k in counts.items() if k > 1))


def price(items: list[RankWork], view: TopologyView,
          crowd: tuple[tuple[tuple[str, str], int], ...] = ()) -> list[StageCost]:
    """The cost of one replica's work items (stage order) on ``view``: p2p ``alpha + n / beta`` over
    each boundary's path (sharing hops the plan's own transfers crowd, ``crowd`` from
    :func:`self_crowd`), the WAN sync a ring over the stage's clusters (DESIGN.md)."""
    channels = view.crowded(crowd)
    return [_cost(w, view, channels) for w in items]


def _cost(w: RankWork, view: TopologyView, channels) -> StageCost:
    """One work item's :class:`StageCost` on ``view`` (``channels``: its crowded channels)."""
    send_f, lat_f, send_b, lat_b, wan, ring = _figures(w, view, channels)
    return StageCost(w.forward_s, w.backward_s, send_f, send_b, w.sync_intra_s, wan, ring,
                     send_forward_latency_s=lat_f, send_backward_latency_s=lat_b)


def _figures(w: RankWork, view: TopologyView, channels) -> tuple[float, float, float, float, float, tuple[str, ...]]:
    """What of a work item's cost the network decides: its sends either way and their latencies,
    and its inter-cluster sync and that sync's ring."""
    send_f = lat_f = send_b = lat_b = 0.0
    if w.next_cluster is not None:
        chan = channels.get(view, w.cluster, w.next_cluster)
        send_f, lat_f = chan.time(w.next_bytes), chan.alpha_s
    if w.prev_cluster is not None:
        chan = channels.get(view, w.cluster, w.prev_cluster)
        send_b, lat_b = chan.time(w.prev_bytes), chan.alpha_s
    wan = wan_sync_s(w.grad_bytes, w.sync_clusters, view) if len(w.sync_clusters) > 1 else 0.0
    return send_f, lat_f, send_b, lat_b, wan, tuple(sorted(w.sync_clusters)) if wan else ()


def _local(w: RankWork) -> bool:
    """The item's sends and gradient sync stay inside its cluster: its cost does not depend on
    the WAN (intra-cluster channels come from the topology and calibration alone)."""
    return (w.next_cluster in (None, w.cluster) and w.prev_cluster in (None, w.cluster)
            and len(w.sync_clusters) <= 1)


class Repricer:
    """The costs of one plan's work items (:func:`replica_work` of each distinct replica) as the
    bandwidth of its WAN links changes: the simulator re-prices a running job whenever its max-min
    shares move. The items whose sends and syncs stay inside a cluster are priced once, on the
    view it was made on; on a view of the same topology and calibration (only link load and
    bandwidths differ) only the others are priced again, on another every item is, under that
    topology's crowd of the plan's ``chains`` (its replicas' stage clusters). Either way
    :meth:`price` returns the same floats as :func:`price` on that view, and :meth:`estimate`
    the same float as ``estimate`` (:func:`~spiderflow.costmodel.schedule.estimate_1f1b` of them),
    from columns of figures kept per replica, without a :class:`StageCost` per item."""

    def __init__(self, works: list[list[RankWork]], view: TopologyView, chains: tuple[tuple[str, ...], ...]) -> None:
        self.works, self.chains = works, chains
        self.topology, self.calibration = view.topology, view.calibration
        self.crowd = chains_crowd_of(chains, view)
        channels = view.crowded(self.crowd)
        self._fixed = [[_cost(w, view, channels) if _local(w) else None for w in items] for items in works]
        # per replica: every item's figures, those of the items priced again left at 0, and those items
        self._columns = []
        for items, fixed in zip(works, self._fixed):
            fwd, bwd = [w.forward_s for w in items], [w.backward_s for w in items]
            # the items priced again, grouped by what their figures depend on (a long pipeline's
            # stages in one cluster share neighbours and, but for their layer counts, gradients)
            groups: dict[tuple, list] = {}
            for i, (w, c) in enumerate(zip(items, fixed)):
                if c is None:
                    key = (w.cluster, w.next_cluster, w.prev_cluster, w.next_bytes, w.prev_bytes, w.grad_bytes,
                           w.sync_clusters)
                    groups.setdefault(key, [w, []])[1].append(i)
            moving = [(w, tuple(at)) for w, at in groups.values()]
            none = StageCost(0.0, 0.0, 0.0, 0.0, 0.0)
            columns = [[(c or none).send_forward_s for c in fixed], [(c or none).send_forward_latency_s for c in fixed],
                       [(c or none).send_backward_s for c in fixed], [(c or none).send_backward_latency_s for c in fixed],
                       [(c or none).sync_wan_s for c in fixed], [(c or none).sync_ring for c in fixed]]
            self._columns.append((fwd, bwd, [f + b for f, b in zip(fwd, bwd)], [w.sync_intra_s for w in items],
                                  columns, moving))

    def price(self, view: TopologyView) -> list[list[StageCost]]:
        """Each distinct replica's stage costs on ``view``."""
        if view.topology is not self.topology or view.calibration is not self.calibration:
            return [price(items, view, chains_crowd_of(self.chains, view)) for items in self.works]
        channels = view.crowded(self.crowd)
        return [[c if c is not None else _cost(w, view, channels) for w, c in zip(items, fixed)]
                for items, fixed in zip(self.works, self._fixed)]

    def estimate(self, view: TopologyView, micro_batches: int) -> float:
        """``estimate`` of the plan on ``view`` (the same float)."""
        if view.topology is not self.topology or view.calibration is not self.calibration:
            return max(estimate_1f1b(costs, micro_batches) for costs in self.price(view))
        channels = view.crowded(self.crowd)
        m, best = micro_batches, None
        for fwd, bwd, work, sync, columns, moving in self._columns:
            send_f, lat_f, send_b, lat_b, wan, rings = (list(c) for c in columns)
            for w, at in moving:
                figures = _figures(w, view, channels)
                for i in at:
                    send_f[i], lat_f[i], send_b[i], lat_b[i], wan[i], rings[i] = figures
            t = estimate_columns(fwd, bwd, work, send_f, lat_f, send_b, lat_b, sync, wan, rings, m)
            if best is None or t > best:
                best = t
        return best


def stage_costs(plan: Plan, view: TopologyView, replica: int = 0,
                syncs: list[tuple[float, tuple[str, ...], float]] | None = None) -> list[StageCost]:
    """Costs of one replica's stages: its work items, priced (``syncs`` may be shared by replicas)."""
    return price(replica_work(plan, view, replica, syncs), view, crowd_of(plan, view))


def crowd_of(plan: Plan, view: TopologyView) -> tuple:
    """:func:`self_crowd` of ``plan`` on ``view``'s topology (memoised on the view); none on a view
    that does not see shared links."""
    return chains_crowd_of(plan_chains(plan), view)


def plan_chains(plan: Plan) -> tuple[tuple[str, ...], ...]:
    """Each replica's stage clusters, in stage order (what the plan's own transfers crowd)."""
    return tuple(tuple(s.cluster for s in rep) for rep in plan.replicas)


def chains_crowd_of(chains: tuple[tuple[str, ...], ...], view: TopologyView) -> tuple:
    """:func:`chains_crowd` on ``view``'s topology, memoised on the view by the chains (the search's
    floors ask it per chain of segments, ``estimate`` per plan's chains of stages); none on a
    view that does not see shared links."""
    if not view.shares_links:
        return ()
    key = ("crowd", chains)
    hit = view._memo.get(key)
    if hit is None:  # (the topology's routes alone decide it: every network state on it shares it)
        topology = view.topology
        hit = view._memo[key] = topology.derived(key, lambda: chains_crowd(chains, topology))
    return hit
