"""A job's GPU time as the planner would run it: what ``trace generate --load`` sizes arrivals by.

A job's **GPU-seconds** = the GPUs of SpinSearch's plan for it on the *empty*
topology x its iterations x that plan's predicted iteration time (the cost
model on the full-knowledge view, no other load). Communication, pipeline
bubbles and a slow WAN are counted, as they are when the job runs; contention
with other jobs is not (it depends on the schedule), so this is still a lower
bound, but a close one where the compute-only bound
(:func:`spiderflow.traces.generate.gpu_seconds`) was 16x short on paper8.

A job no plan fits on the empty topology (too large for its GPUs' memory, or
more GPUs than the topology has) is rejected by every scheduler; it is
counted at the compute-only bound so the sizing stays defined, and
:attr:`PlannedGpuTime.unplanned` names how many there were.

Plans are cached per job shape (model, GPUs, global batch, sequence length):
iterations only scale the time, and a synthetic trace has few shapes.
"""

from __future__ import annotations

from spiderflow.costmodel import NO_CALIBRATION, Calibration
from spiderflow.errors import InfeasiblePlan
from spiderflow.topology import Topology
from spiderflow.traces.generate import gpu_seconds
from spiderflow.workload import Job


def mean_achieved_flops(topology: Topology) -> float:
    """GPU-weighted mean achieved FLOP/s per GPU (datasheet peak x profile MFU, spiderflow/hardware.py)."""
    return sum(c.total_gpus * c.profile.achieved_flops for c in topology.clusters) / topology.total_gpus


class PlannedGpuTime:
    """``self(job)``: the job's GPU-seconds on ``topology`` as SpinSearch plans it alone (see module doc),
    its links' figures fitted by ``calibration`` when one is given (as the simulator prices them)."""

    def __init__(self, topology: Topology, calibration: Calibration = NO_CALIBRATION) -> None:
        self.topology, self.calibration = topology, calibration
        self.flops_per_gpu = mean_achieved_flops(topology)
        # shape -> (the plan's GPUs, its iteration s, its start-up s), None where no plan fits
        self._plans: dict[tuple, tuple[int, float, float] | None] = {}
        self.unplanned: set[tuple] = set()

    def _alone(self, job: Job) -> tuple[int, float, float] | None:
        shape = (job.model, job.gpus, job.global_batch, job.seq_len)
        if shape not in self._plans:
            self._plans[shape] = self._plan(job)
        return self._plans[shape]

    def gpu_seconds_per_iteration(self, job: Job) -> float | None:
        alone = self._alone(job)
        return None if alone is None else alone[0] * alone[1]

    def run_s(self, job: Job) -> float | None:
        """Seconds ``job`` runs on SpinSearch's plan for it alone on the empty topology, its start-up
        (:meth:`_figures`) included (None: no plan fits)."""
        alone = self._alone(job)
        return None if alone is None else alone[2] + job.iterations * alone[1]

    def _figures(self, result) -> tuple[int, float, float]:
        """A plan's GPUs, iteration time and start-up: as the planner predicts it, with no start-up."""
        return sum(result.placement.gpus.values()), result.prediction.iteration_s, 0.0

    def _plan(self, job: Job) -> tuple[int, float, float] | None:
        from spiderflow.placement import PlacementRequest, run_planner

        free = {c.name: c.total_gpus for c in self.topology.clusters}
        try:
            result = run_planner("spinsearch", PlacementRequest(job=job, topology=self.topology, free_gpus=free,
                                                                calibration=self.calibration))
        except InfeasiblePlan:
            return None
        return self._figures(result)

    def __call__(self, job: Job) -> float:
        per_iteration = self.gpu_seconds_per_iteration(job)
        if per_iteration is None:
            self.unplanned.add((job.model, job.gpus, job.global_batch, job.seq_len))
            return gpu_seconds(job, self.flops_per_gpu)
        return job.iterations * per_iteration
