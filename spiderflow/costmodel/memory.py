"""Per-GPU memory of each stage (DESIGN.md: weights + gradients + optimizer + activations).

- Weights, gradients, optimizer: 16 bytes per parameter for mixed-precision Adam
  (ZeRO paper, Rajbhandari et al. SC'20, sec. 3.1), divided by ``tp``; with
  ZeRO-1 the 12 optimizer bytes are sharded over the stage's data-parallel
  group.
- Activations: 1F1B keeps at most ``min(S - i, m)`` micro-batches in flight on
  stage ``i`` (Narayanan et al., SC'21), each holding the stage's layers'
  activations (Korthikanti et al., MLSys'23); with full recomputation only the
  layer inputs, plus one layer's full activations while it is recomputed.
- ``USABLE_FRACTION`` of the card is available to the model: the rest goes to
  the CUDA context, NCCL buffers, workspace and fragmentation (a common rule of
  thumb; calibrate it on real hardware).
"""

from __future__ import annotations

from dataclasses import dataclass

from spiderflow.costmodel.stages import stage_params
from spiderflow.plan import Plan, Stage
from spiderflow.topology import Topology
from spiderflow.workload import (GRAD_BYTES_PER_PARAM, OPTIMIZER_BYTES_PER_PARAM,
                                 WEIGHT_BYTES_PER_PARAM)

USABLE_FRACTION = 0.9
GB = 1024**3


@dataclass(frozen=True)
class StageMemory:
    replica: int
    stage: int
    cluster: str
    need_gb: float
    have_gb: float

    @property
    def fits(self) -> bool:
        return self.need_gb <= self.have_gb


def stage_memory(plan: Plan, topology: Topology) -> list[StageMemory]:
    return [stage_memory_of(plan, topology, r, i, st)
            for r, rep in enumerate(plan.replicas) for i, st in enumerate(rep)]


def stage_memory_of(plan: Plan, topology: Topology, r: int, i: int, st: Stage) -> StageMemory:
    """:func:`stage_memory`'s entry of stage ``i`` of replica ``r`` were it ``st`` (its layer range may
    differ from the plan's)."""
    spec, job = plan.job.spec, plan.job
    S, m, b = plan.depth, plan.micro_batches, plan.micro_batch_size
    params = stage_params(plan, st) / st.tp
    dp_group = plan.dp * len(plan.replicas)
    opt = OPTIMIZER_BYTES_PER_PARAM / (dp_group if plan.zero1 else 1)
    static = params * (WEIGHT_BYTES_PER_PARAM + GRAD_BYTES_PER_PARAM + opt)
    in_flight = min(S - i, m)
    layer_act = spec.layer_activation_bytes(b, job.seq_len, tp=st.tp, recompute=plan.recompute)
    act = in_flight * st.layers * layer_act
    if plan.recompute:
        act += spec.layer_activation_bytes(b, job.seq_len, tp=st.tp, recompute=False)
    if st.layer_end == spec.layers:  # logits of one micro-batch (bf16) on the last stage
        act += b * job.seq_len * spec.vocab * 2 / st.tp
    have = topology.cluster(st.cluster).profile.memory_gb * USABLE_FRACTION
    return StageMemory(r, i, st.cluster, (static + act) / GB, have)
