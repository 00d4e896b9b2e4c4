"""Per-stage costs of a plan: compute, tensor-parallel traffic, p2p, gradient sync.

Formulas (DESIGN.md, "The physics"):

- compute of a stage for one micro-batch: FLOPs / (peak x efficiency x tp);
  backward = 2 x forward (Narayanan et al., SC'21), + 1 forward with recomputation.
- tensor parallelism (Megatron, Shoeybi et al. 2019): 2 all-reduces of the
  ``b*s*h`` activation per layer in the forward pass and 2 in the backward,
  over the node's NVLink: ring cost ``2(t-1)/t * n / beta`` each.
- p2p between consecutive stages: ``alpha + dp * n / beta`` where n is the
  boundary activation (or its gradient) of one micro-batch; the stage's ``dp``
  groups send at once through the same path.
- gradient sync of a stage (bf16 gradients of its parameters / tp per GPU):
  ring all-reduce over ``p`` ranks ``2(p-1) alpha + 2(p-1)/p * n / beta``;
  across N clusters of g ranks, hierarchical: intra reduce-scatter (half a
  ring all-reduce), inter ring all-reduce of n/g, intra all-gather. The g
  shards' rings and the stage's tp shards all cross the same WAN ring, so the
  WAN carries ``2(N-1)/N x`` the stage's *whole* gradient. Stages whose syncs
  use the same ring of clusters share it: the schedule serialises them.
"""

from __future__ import annotations

from dataclasses import dataclass

from spiderflow.costmodel.calibration import Calibration
from spiderflow.costmodel.network import Channel, TopologyView
from spiderflow.plan import Plan, Stage
from spiderflow.topology import Topology
from spiderflow.workload import GRAD_BYTES_PER_PARAM


@dataclass(frozen=True)
class StageCost:
    forward_s: float  # one micro-batch, compute + TP traffic
    backward_s: float
    send_forward_s: float  # activation to the next stage (0 for the last)
    send_backward_s: float  # gradient to the previous stage (0 for the first)
    sync_s: float  # this stage's gradient all-reduce inside clusters (parallel per stage)
    sync_wan_s: float = 0.0  # its inter-cluster phase, on the ring ``sync_ring``
    sync_ring: tuple[str, ...] = ()
    # the latency (alpha) part of send_forward_s / send_backward_s: it overlaps the next message
    # on the same boundary, which only waits for the previous one's n / beta
    send_forward_latency_s: float = 0.0
    send_backward_latency_s: float = 0.0


def ring_allreduce_s(nbytes: float, ranks: int, chan: Channel) -> float:
    if ranks <= 1:
        return 0.0
    return 2 * (ranks - 1) * chan.alpha_s + 2 * (ranks - 1) / ranks * nbytes / chan.bytes_per_s


def stage_params(plan: Plan, stage: Stage) -> int:
    spec = plan.job.spec
    params = stage.layers * spec.layer_params
    if stage.layer_start == 0:
        params += spec.embedding_params
    if stage.layer_end == spec.layers and (stage.layer_start > 0 or not spec.tied_embeddings):
        # the output layer: untied (Llama), or a tied copy kept on the last stage (Megatron)
        params += spec.embedding_params
    return params


def stage_compute_s(plan: Plan, stage: Stage, topology: Topology, calibration: Calibration) -> tuple[float, float]:
    """(forward, backward) seconds for one micro-batch on this stage."""
    spec, job = plan.job.spec, plan.job
    cluster = topology.cluster(stage.cluster)
    prof = cluster.profile
    eff = calibration.gpu_efficiency.get(prof.name, prof.efficiency)
    flops_per_s = prof.peak_tflops * 1e12 * eff * stage.tp
    b, s = plan.micro_batch_size, job.seq_len
    fwd_flops = stage.layers * spec.layer_forward_flops(b, s)
    if stage.layer_end == spec.layers:
        fwd_flops += spec.head_forward_flops(b, s)
    fwd = fwd_flops / flops_per_s
    bwd = 2 * fwd + (fwd if plan.recompute else 0.0)
    if stage.tp > 1:
        nvlink = Channel(0.0, cluster.intra_node_bandwidth_gbps * 1e9 / 8)
        per_layer = 2 * ring_allreduce_s(spec.boundary_bytes(b, s), stage.tp, nvlink)
        fwd += stage.layers * per_layer
        bwd += stage.layers * per_layer * (2 if plan.recompute else 1)
    return fwd, bwd


def intra_sync_s(plan: Plan, stage_index: int, view: TopologyView, params: int | None = None) -> float:
    """The intra-cluster part of stage ``stage_index``'s gradient all-reduce (seconds).

    One cluster: a ring over its ``g`` ranks. Several: hierarchical, each cluster's ranks
    reduce-scatter before and all-gather after the inter-cluster rings (= one all-reduce);
    clusters may hold different replica counts, the slowest counts. ``params``: the stage's
    parameter count, if the caller has it."""
    stage = plan.stages[stage_index]
    nbytes = (stage_params(plan, stage) if params is None else params) / stage.tp * GRAD_BYTES_PER_PARAM
    clusters: list[str] = []
    for rep in plan.replicas:
        c = rep[stage_index].cluster
        if c not in clusters:
            clusters.append(c)
    topo = view.topology
    if len(clusters) == 1:
        g = plan.dp * len(plan.replicas)
        spans = g * stage.tp > topo.cluster(clusters[0]).gpus_per_node
        return ring_allreduce_s(nbytes, g, view.intra(clusters[0], spans_nodes=spans))
    per_cluster = [plan.dp * sum(1 for rep in plan.replicas if rep[stage_index].cluster == c)
                   for c in clusters]
    return max(ring_allreduce_s(nbytes, gc, view.intra(c, spans_nodes=gc * stage.tp >
                                                        topo.cluster(c).gpus_per_node))
               for c, gc in zip(clusters, per_cluster))


def wan_sync_s(grad_bytes: float, clusters: tuple[str, ...], view: TopologyView) -> float:
    """The inter-cluster phase of a gradient sync over ``clusters`` (in ring order): the g shards'
    rings and every tp shard cross the same WAN ring, so it carries ``2(N-1)/N x`` the stage's
    whole gradient ``grad_bytes``."""
    n = len(clusters)
    if n <= 1:
        return 0.0
    ring = view.ring(clusters)
    return 2 * (n - 1) * ring.alpha_s + 2 * (n - 1) / n * grad_bytes / ring.bytes_per_s


def sync_s(plan: Plan, stage_index: int, view: TopologyView) -> tuple[float, float, tuple[str, ...]]:
    """Gradient all-reduce of stage ``stage_index``: (intra-cluster s, inter-cluster s, ring key)."""
    clusters = tuple(dict.fromkeys(rep[stage_index].cluster for rep in plan.replicas))
    grads = stage_params(plan, plan.stages[stage_index]) * GRAD_BYTES_PER_PARAM
    wan = wan_sync_s(grads, clusters, view)
    return intra_sync_s(plan, stage_index, view), wan, tuple(sorted(clusters)) if wan else ()
