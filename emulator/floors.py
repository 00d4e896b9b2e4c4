"""``emulator compare``'s floors: what no planner could beat on the replay's clock.

The same floors as ``spiderflow compare``'s (:func:`spiderflow.simulate.floors.trace_floors`):
every job runs as long as SpinSearch's plan for it alone on the empty topology
takes, with no other job's load and no overhead, queued only behind a job that no
other can run beside. Here that plan is priced as the simulated replay prices a
job alone (:func:`emulator.compare.simulated_replay`): on the network as the
emulator shapes it, by the cost model's exact schedule, plus the ranks' start-up
allowance, for the replay's iterations and compressed arrivals. So the floors
are in the replay's real-equivalent seconds, beside its measured and simulated
columns. Hosts per cluster are left out (dropping a constraint keeps a floor a
floor). Measured times rest on the emulation, not on the cost model, so they may
fall under the floors by as much as the cost model errs (the table's error
columns).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from emulator.jobs.launch import emulated_topology
from emulator.jobs.replay import RunConfig
from spiderflow.costmodel import TopologyView, predict
from spiderflow.plan import Plan
from spiderflow.simulate.engine import startup_seconds
from spiderflow.simulate.floors import trace_floors
from spiderflow.topology import Topology
from spiderflow.traces.planned import PlannedGpuTime
from spiderflow.workload import Job


class ReplayRunTime(PlannedGpuTime):
    """SpinSearch's plan for each job alone on the empty ``topology`` (planned as the replay plans it, with
    ``cfg``'s calibration), priced alone on ``cfg``'s emulated network by the exact schedule, plus
    ``startup`` (seconds, or a function of the plan) before its first iteration."""

    def __init__(self, topology: Topology, cfg: RunConfig, startup: float | Callable[[Plan], float]) -> None:
        super().__init__(topology, cfg.calibration)
        self.view = TopologyView(topology=emulated_topology(topology, cfg.net), calibration=cfg.calibration)
        self.startup = startup

    def _figures(self, result) -> tuple[int, float, float]:
        plan = result.placement.plan
        iteration = predict(plan, self.view, check_memory=False).iteration_s
        return sum(result.placement.gpus.values()), iteration, startup_seconds(self.startup, plan)


def replay_floors(topology: Topology, jobs: Sequence[Job], cfg: RunConfig,
                  startup: float | Callable[[Plan], float]) -> dict | None:
    """The floors of the replay of ``jobs`` (arrivals already on the replay's clock, its iterations each)
    under ``cfg`` (:func:`spiderflow.simulate.floors.trace_floors`' keys; None when no job has a plan)."""
    return trace_floors(jobs, ReplayRunTime(topology, cfg, startup))
