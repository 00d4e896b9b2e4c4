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


def sync_s(plan: Plan, stage_index: int, view: TopologyView) -> tuple[float, float, tuple[str, ...]]:
    """Gradient all-reduce of stage ``stage_index``: (intra-cluster s, inter-cluster s, ring)."""
    stage = plan.stages[stage_index]
    nbytes = stage_params(plan, stage) / stage.tp * GRAD_BYTES_PER_PARAM
    clusters: list[str] = []
    for rep in plan.replicas:
        c = rep[stage_index].cluster
        if c not in clusters:
            clusters.append(c)
    g = plan.dp * sum(1 for rep in plan.replicas if rep[stage_index].cluster == clusters[0])
    topo = view.topology
    if len(clusters) == 1:
        spans = plan.dp * len(plan.replicas) * stage.tp > topo.cluster(clusters[0]).gpus_per_node
        return ring_allreduce_s(nbytes, g, view.intra(clusters[0], spans_nodes=spans)), 0.0, ()
    # Hierarchical: each cluster's g ranks reduce-scatter, g parallel inter-cluster rings on
    # n/g shards, then all-gather. Clusters may hold different replica counts; use the largest.
    per_cluster = [plan.dp * sum(1 for rep in plan.replicas if rep[stage_index].cluster == c)
                   for c in clusters]
    g = max(per_cluster)
    intra = max(ring_allreduce_s(nbytes, gc, view.intra(c, spans_nodes=gc * stage.tp >
                                                         topo.cluster(c).gpus_per_node))
                for c, gc in zip(clusters, per_cluster))  # RS + AG = one all-reduce
    n = len(clusters)
    ring = view.ring(clusters)
    wan_bytes = nbytes * stage.tp  # every tp shard's gradient crosses the WAN
    inter = 2 * (n - 1) * ring.alpha_s + 2 * (n - 1) / n * wan_bytes / ring.bytes_per_s
    return intra, inter, tuple(sorted(clusters))


def stage_costs(plan: Plan, view: TopologyView, replica: int = 0,
                syncs: list[tuple] | None = None) -> list[StageCost]:
    """Costs of one replica's stages; ``syncs`` (shared by all replicas) may be passed in."""
    spec, topo = plan.job.spec, view.topology
    if syncs is None:
        syncs = [sync_s(plan, i, view) for i in range(plan.depth)]
    stages = plan.replicas[replica]
    per_rank = spec.boundary_bytes(plan.micro_batch_size, plan.job.seq_len)

    def send(a: str, b: str) -> tuple[float, float]:
        """(transfer time, its latency part) of one micro-batch's boundary tensor from a to b.
        Inside a cluster each DP group has its own NIC; across clusters all ``dp`` groups'
        transfers squeeze through the same WAN path."""
        chan = view.p2p(a, b)
        return chan.time(per_rank if a == b else plan.dp * per_rank), chan.alpha_s

    out = []
    for i, st in enumerate(stages):
        fwd, bwd = stage_compute_s(plan, st, topo, view.calibration)
        send_f, lat_f = send(st.cluster, stages[i + 1].cluster) if i + 1 < len(stages) else (0.0, 0.0)
        send_b, lat_b = send(st.cluster, stages[i - 1].cluster) if i > 0 else (0.0, 0.0)
        out.append(StageCost(fwd, bwd, send_f, send_b, *syncs[i], send_forward_latency_s=lat_f,
                             send_backward_latency_s=lat_b))
    return out
