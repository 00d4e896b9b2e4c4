"""A plan -> its emulated ranks: which host runs what, with which byte counts. Pure data.

Rank mapping (docs/emulator-run.md): one rank per (replica, stage) of a plan,
rank ``replica * depth + stage``. The stage's ``dp`` in-stage data-parallel
groups and their ``tp`` GPUs sit in one cluster and are folded into that rank:

- compute: the rank sleeps the cost model's forward / backward time of its
  stage for one micro-batch (:func:`spiderflow.costmodel.stages.stage_compute_s`);
  the ``dp`` groups run in parallel, so that is the stage's time too. With
  ``compute="real"`` the rank runs a CPU proxy of its stage instead, whose
  forward FLOPs are that forward time x ``cpu_flops_per_s``
  (:func:`emulator.compute.proxy_shape`);
- pipeline p2p: across clusters all ``dp`` groups' boundary tensors squeeze
  through the same WAN path (the cost model's ``dp x n``), so the rank sends
  ``dp x`` one group's boundary bytes; inside a cluster each group has its own
  NIC in the model (time ``n / beta``), so the rank sends one group's bytes;
- gradient sync: the cost model's intra-cluster part (:func:`sync_s`) is
  slept; the inter-cluster part is a real all-reduce of the stage's whole
  gradient (``stage_params x 2`` bytes, every tp shard) among the replicas'
  ranks of that stage, one group per cluster (what crosses the WAN in the model).

Every byte count is divided by the emulation's scale, as the wire bandwidths are.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass

from emulator.compute import COMPUTE_MODES, proxy_shape
from emulator.plan import NetConfig
from emulator.worker import RankSpec
from spiderflow.costmodel import Calibration, TopologyView, predict
from spiderflow.costmodel.stages import stage_compute_s, stage_params, sync_s
from spiderflow.plan import Plan
from spiderflow.topology import Topology
from spiderflow.workload import GRAD_BYTES_PER_PARAM


@dataclass(frozen=True, kw_only=True)
class RankSlot:
    rank: int
    replica: int
    stage: int
    cluster: str


def rank_slots(plan: Plan) -> list[RankSlot]:
    """One rank per (replica, stage), rank = replica * depth + stage."""
    return [RankSlot(rank=r * plan.depth + i, replica=r, stage=i, cluster=st.cluster)
            for r, rep in enumerate(plan.replicas) for i, st in enumerate(rep)]


def ranks_per_cluster(plan: Plan) -> dict[str, int]:
    return dict(Counter(s.cluster for s in rank_slots(plan)))


def emulated_topology(topology: Topology, config: NetConfig) -> Topology:
    """The topology as the emulator shapes it, in real-equivalent units.

    WAN links are as in the topology (bytes and bandwidth are scaled alike);
    intra-cluster bandwidth is capped on the wire at ``intra_cap_mbps``, which is
    ``intra_cap_mbps * scale / 1000`` Gbit/s real-equivalent.
    """
    cap_gbps = config.intra_cap_mbps * config.scale / 1000.0
    clusters = tuple(dataclasses.replace(c, intra_cluster_bandwidth_gbps=min(c.intra_cluster_bandwidth_gbps,
                                                                             cap_gbps))
                     for c in topology.clusters)
    return dataclasses.replace(topology, clusters=clusters)


def emulated_view(topology: Topology, config: NetConfig, *, link_load=None,
                  calibration: Calibration | None = None) -> TopologyView:
    kwargs = {"calibration": calibration} if calibration is not None else {}
    return TopologyView(topology=emulated_topology(topology, config), link_load=dict(link_load or {}), **kwargs)


def predict_emulated(plan: Plan, view: TopologyView) -> float:
    """The cost model's iteration time of ``plan`` on the emulated network (real-equivalent seconds)."""
    return predict(plan, view, check_memory=False).iteration_s


def _sync_groups(plan: Plan) -> list[list[list[int]]]:
    """Per stage: its replicas' ranks grouped by cluster; [] where the stage's replicas share one
    cluster (that sync is all intra-cluster, slept)."""
    groups = []
    for i in range(plan.depth):
        by_cluster: dict[str, list[int]] = {}
        for r, rep in enumerate(plan.replicas):
            by_cluster.setdefault(rep[i].cluster, []).append(r * plan.depth + i)
        groups.append(list(by_cluster.values()) if len(by_cluster) > 1 else [])
    return groups


def scaled(nbytes: float, scale: float) -> int:
    return max(4, int(round(nbytes / scale)))


def rank_specs(plan: Plan, view: TopologyView, *, job_id: str, master_addr: str, master_port: int,
               scale: float, iterations: int, out_dir: str, timeout_s: float = 60.0,
               compute: str = "emulated", cpu_flops_per_s: float | None = None) -> list[RankSpec]:
    """The RankSpec of every rank of ``plan`` (in rank order); ``view`` is the emulated view.

    ``compute="real"`` gives each spec the proxy of its stage, sized by ``cpu_flops_per_s``
    (:func:`emulator.compute.cpu_flops_per_s`).
    """
    if compute not in COMPUTE_MODES:
        raise ValueError(f"compute must be one of {', '.join(COMPUTE_MODES)} (got {compute!r})")
    if compute == "real" and not (cpu_flops_per_s is not None and cpu_flops_per_s > 0):
        raise ValueError(f"compute 'real' needs cpu_flops_per_s > 0 (got {cpu_flops_per_s!r})")
    spec = plan.job.spec
    group_bytes = spec.boundary_bytes(plan.micro_batch_size, plan.job.seq_len)
    syncs = [sync_s(plan, i, view) for i in range(plan.depth)]
    sync_groups = _sync_groups(plan)
    world = len(plan.replicas) * plan.depth

    def boundary(a: str, b: str) -> int:
        return scaled(group_bytes * (1 if a == b else plan.dp), scale)

    specs = []
    for slot in rank_slots(plan):
        rep = plan.replicas[slot.replica]
        st = rep[slot.stage]
        fwd, bwd = stage_compute_s(plan, st, view.topology, view.calibration)
        last, first = slot.stage == plan.depth - 1, slot.stage == 0
        proxy = None
        if compute == "real":  # the head of the last stage is part of fwd, hence of the target
            proxy = dataclasses.asdict(proxy_shape(fwd * cpu_flops_per_s, st.layers, plan.micro_batch_size,
                                                   plan.job.seq_len))
        specs.append(RankSpec(
            job_id=job_id, rank=slot.rank, world_size=world, master_addr=master_addr, master_port=master_port,
            stage=slot.stage, depth=plan.depth, micro_batches=plan.micro_batches, iterations=iterations,
            forward_s=fwd, backward_s=bwd,
            activation_bytes=4 if last else boundary(st.cluster, rep[slot.stage + 1].cluster),
            prev_activation_bytes=None if first else boundary(rep[slot.stage - 1].cluster, st.cluster),
            grad_bytes=scaled(stage_params(plan, st) * GRAD_BYTES_PER_PARAM, scale),
            prev_rank=None if first else slot.rank - 1, next_rank=None if last else slot.rank + 1,
            sync_groups=sync_groups, sync_intra_s=syncs[slot.stage][0],
            compute=compute, proxy=proxy, recompute=plan.recompute,
            out=f"{out_dir}/{job_id}-r{slot.rank}.jsonl", timeout_s=timeout_s))
    return specs


def describe_plan(plan: Plan) -> str:
    """``oregon[0:12 tp1] -> tokyo[12:24 tp1] x2 replicas, dp 4, mbs 1 x 8``."""
    reps = [" -> ".join(f"{s.cluster}[{s.layer_start}:{s.layer_end} tp{s.tp}]" for s in rep)
            for rep in plan.replicas]
    uniq = list(dict.fromkeys(reps))
    body = " | ".join(uniq)
    return f"{body} ({len(plan.replicas)} replica(s), dp {plan.dp}, mbs {plan.micro_batch_size} x {plan.micro_batches})"
