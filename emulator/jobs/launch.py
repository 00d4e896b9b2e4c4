"""A plan's work items -> its emulated ranks' specs. Pure data.

The cost model owns what each rank does (:mod:`spiderflow.costmodel.work`:
layout, compute per micro-batch, bytes per neighbour, gradient bytes, sync
groups, the slept intra-cluster sync), in real-equivalent units; ``predict``
prices exactly those items. This module only converts them for the wire:

- every byte count is divided by the emulation's scale, as the wire
  bandwidths are (transfer times kept);
- every time (compute sleeps, the slept sync, the rank's timeout) is
  multiplied by the dilation K, as the wire delays are and the wire rates
  divided (DESIGN.md, "Time dilation"): the whole emulated world runs K times
  slower, and measured times are divided by K (:mod:`emulator.jobs.replay`).

With ``compute="real"`` a rank runs a CPU proxy of its stage whose forward
FLOPs are its dilated forward time x ``cpu_flops_per_s``
(:func:`emulator.jobs.compute.proxy_shape`). How a rank folds the stage's ``dp``
groups and ``tp`` GPUs: docs/emulator-run.md, "Rank mapping".
"""

from __future__ import annotations

import dataclasses

from emulator.jobs.compute import COMPUTE_MODES, proxy_shape
from emulator.net.layout import NetConfig, emulated_intra_gbps
from emulator.jobs.worker import RankSpec
from spiderflow.costmodel import Calibration, PlanWork, TopologyView, plan_work, predict
from spiderflow.plan import Plan
from spiderflow.topology import Topology


def emulated_topology(topology: Topology, config: NetConfig) -> Topology:
    """The topology as the emulator shapes it, in real-equivalent units.

    WAN links are as in the topology (bytes and bandwidth are scaled alike, and the dilation
    slows rate and delay alike); intra-cluster bandwidth is capped
    (:func:`emulator.net.layout.emulated_intra_gbps`).
    """
    clusters = tuple(dataclasses.replace(c, intra_cluster_bandwidth_gbps=emulated_intra_gbps(c, config))
                     for c in topology.clusters)
    return dataclasses.replace(topology, clusters=clusters)


def emulated_view(topology: Topology, config: NetConfig, *, link_load=None,
                  calibration: Calibration | None = None) -> TopologyView:
    kwargs = {"calibration": calibration} if calibration is not None else {}
    return TopologyView(topology=emulated_topology(topology, config), link_load=dict(link_load or {}), **kwargs)


def predict_emulated(plan: Plan, view: TopologyView) -> float:
    """The cost model's iteration time of ``plan`` on the emulated network (real-equivalent seconds)."""
    return predict(plan, view, check_memory=False).iteration_s


def scaled(nbytes: float, scale: float) -> int:
    return max(4, int(round(nbytes / scale)))


def rank_specs(work: PlanWork, *, master_addr: str, master_port: int, scale: float, dilation: float = 1.0,
               iterations: int, out_dir: str, timeout_s: float = 60.0, compute: str = "emulated",
               cpu_flops_per_s: float | None = None) -> list[RankSpec]:
    """The RankSpec of every work item (in rank order): bytes / ``scale``, times x ``dilation``.

    ``timeout_s`` is real-equivalent (x ``dilation`` too). ``compute="real"`` gives each spec the
    proxy of its stage, sized by ``cpu_flops_per_s`` (:func:`emulator.jobs.compute.cpu_flops_per_s`).
    """
    if compute not in COMPUTE_MODES:
        raise ValueError(f"compute must be one of {', '.join(COMPUTE_MODES)} (got {compute!r})")
    if compute == "real" and not (cpu_flops_per_s is not None and cpu_flops_per_s > 0):
        raise ValueError(f"compute 'real' needs cpu_flops_per_s > 0 (got {cpu_flops_per_s!r})")
    k = dilation
    groups = [[list(ranks) for ranks in stage] for stage in work.sync_groups]
    specs = []
    for w in work.ranks:
        proxy = None
        if compute == "real":  # the head of the last stage is part of forward_s, hence of the target
            proxy = dataclasses.asdict(proxy_shape(w.forward_s * k * cpu_flops_per_s, w.layers,
                                                   work.micro_batch_size, work.seq_len))
        specs.append(RankSpec(
            job_id=work.job_id, rank=w.rank, replica=w.replica, world_size=work.world_size,
            master_addr=master_addr, master_port=master_port, stage=w.stage, depth=work.depth,
            micro_batches=work.micro_batches, iterations=iterations,
            forward_s=w.forward_s * k, backward_s=w.backward_s * k,
            activation_bytes=scaled(w.next_bytes, scale) if w.next_rank is not None else 4,
            prev_activation_bytes=scaled(w.prev_bytes, scale) if w.prev_rank is not None else None,
            grad_bytes=scaled(w.grad_bytes, scale),
            prev_rank=w.prev_rank, next_rank=w.next_rank,
            sync_groups=groups, sync_intra_s=w.sync_intra_s * k,
            compute=compute, proxy=proxy, recompute=work.recompute,
            out=f"{out_dir}/{work.job_id}-r{w.rank}.jsonl", timeout_s=timeout_s * k))
    return specs


def ranks_per_cluster(plan: Plan, view: TopologyView) -> dict[str, int]:
    """Ranks the plan puts in each cluster (one per (replica, stage): its work items)."""
    return plan_work(plan, view).ranks_per_cluster()


def describe_plan(plan: Plan) -> str:
    """``oregon[0:12 tp1] -> tokyo[12:24 tp1] x2 replicas, dp 4, mbs 1 x 8``."""
    reps = [" -> ".join(f"{s.cluster}[{s.layer_start}:{s.layer_end} tp{s.tp}]" for s in rep)
            for rep in plan.replicas]
    uniq = list(dict.fromkeys(reps))
    body = " | ".join(uniq)
    return f"{body} ({len(plan.replicas)} replica(s), dp {plan.dp}, mbs {plan.micro_batch_size} x {plan.micro_batches})"
