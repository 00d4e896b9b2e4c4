"""A fixed set of plans, each run alone on the emulated network, predicted before and after calibration.

The set (:func:`plan_cases`) mixes pipeline-heavy shapes (2 and 3 stages
across WAN links, one multi-hop), data-parallel-heavy ones (replicas in
2 to 4 clusters whose gradient all-reduce crosses the WAN), a mixed one
(replicas x stages) and one inside a single cluster. Plans are built
directly (cluster, tp, dp, micro-batching given; layers split evenly), not
chosen by a planner: the point is to check the cost model on shapes of each
kind, whatever a planner would pick. Clusters come from the topology's
links, so any topology with at least one link gets a set.

Each plan runs as a one-job trace through the same :class:`~emulator.jobs.replay.Runner`
as ``emulator run`` (same rank mapping, worker and measurement), one at a
time so the measurement is the plan's alone. The record (``plans.jsonl``,
docs/calibration.md) has the uncalibrated prediction (what ``emulator run``
reports), the calibrated one (the same cost model with the fitted
calibration) and the measured median iteration time; ``timelines/`` gets
the measured ops of one iteration beside the predicted 1F1B timeline.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from emulator.jobs.launch import emulated_view, predict_emulated, ranks_per_cluster
from emulator.jobs.ranklog import read_lines
from emulator.jobs.replay import JobRun, RunConfig, Runner
from spiderflow.costmodel import Calibration, TopologyView, predict
from spiderflow.parallel.tpa import split_layers
from spiderflow.plan import Plan, Stage
from spiderflow.scheduling import fixed_plan
from spiderflow.topology import Topology
from spiderflow.workload import MODELS, Job

# 1F1B micro-batches per replica: enough for a steady state, few enough for seconds per iteration
MICRO_BATCHES = 8
SEQ_LEN = 2048


@dataclass(frozen=True, kw_only=True)
class PlanCase:
    plan_id: str
    shape: str  # pipeline | data-parallel | mixed | local
    model: str
    replicas: tuple[tuple[str, ...], ...]  # per replica: the cluster of each stage
    dp: int = 2
    tp: int = 1
    micro_batch_size: int = 1
    micro_batches: int = MICRO_BATCHES

    def plan(self, iterations: int) -> Plan:
        depth = len(self.replicas[0])
        counts = split_layers(MODELS[self.model].layers, [1.0] * depth)
        bounds = [sum(counts[:i]) for i in range(depth + 1)]
        reps = tuple(tuple(Stage(cluster=c, layer_start=bounds[i], layer_end=bounds[i + 1], tp=self.tp)
                           for i, c in enumerate(rep)) for rep in self.replicas)
        batch = len(reps) * self.dp * self.micro_batch_size * self.micro_batches
        gpus = len(reps) * depth * self.dp * self.tp
        job = Job(job_id=self.plan_id, arrival_s=0.0, model=self.model, gpus=gpus, iterations=iterations,
                  global_batch=batch, seq_len=SEQ_LEN)
        return Plan(job=job, replicas=reps, dp=self.dp, micro_batch_size=self.micro_batch_size,
                    micro_batches=self.micro_batches)


def plan_cases(topology: Topology, prefix: str) -> list[PlanCase]:
    """Plans over the topology's links: see the module docstring. ``prefix`` starts every id."""
    links = sorted(topology.links, key=lambda l: -l.bandwidth_gbps)  # widest first: cheap to run
    a, b = links[0].a, links[0].b
    far = next((c for c in topology.names if c not in (a, b) and any({l.a, l.b} == {b, c} for l in links)), None)
    thin = links[-1]
    hop = next(((x, z) for x in topology.names for z in topology.names
                if x < z and len(topology.path(x, z).links) > 1), None)
    cases = [
        PlanCase(plan_id="pipe2", shape="pipeline", model="gpt3-1.3b", replicas=((a, b),), dp=2),
        PlanCase(plan_id="pipe2-thin", shape="pipeline", model="gpt3-350m", replicas=((thin.a, thin.b),), dp=1),
        PlanCase(plan_id="dp2", shape="data-parallel", model="gpt3-350m", replicas=((a,), (b,)), dp=2,
                 micro_batches=4),
        PlanCase(plan_id="local", shape="local", model="gpt3-1.3b", replicas=((a, a),), dp=2, tp=2),
    ]
    if far is not None:
        cases.append(PlanCase(plan_id="pipe3", shape="pipeline", model="gpt3-2.7b", replicas=((a, b, far),), dp=1))
        cases.append(PlanCase(plan_id="dp3", shape="data-parallel", model="gpt3-125m", replicas=((a,), (b,), (far,)),
                              dp=1, micro_batches=4))
        cases.append(PlanCase(plan_id="mixed", shape="mixed", model="gpt3-350m", replicas=((a, b), (far, b)),
                              dp=1, micro_batches=4))
    if hop is not None:
        cases.append(PlanCase(plan_id="pipe-hop", shape="pipeline", model="gpt3-350m", replicas=(hop,), dp=1))
    return [PlanCase(**{**c.__dict__, "plan_id": f"{prefix}-{c.plan_id}"}) for c in cases]


def hosts_needed(cases: list[PlanCase], view: TopologyView) -> int:
    """Hosts per cluster the set needs (one rank per (replica, stage) in that cluster)."""
    return max(max(ranks_per_cluster(c.plan(2), view).values()) for c in cases)


def measured_timeline(runner: Runner, j: JobRun, iteration: int) -> list[dict]:
    """Every rank's ops of one iteration, times relative to that iteration's earliest op start
    (real-equivalent: wall / the dilation)."""
    ranks = []
    for r in j.ranks:
        mono, ops = None, []
        for line in read_lines(r.spec.out):
            if line.get("event") == "start":
                mono = line["mono"]
            elif line.get("event") == "op" and line.get("it") == iteration and mono is not None:
                ops.append([line["kind"], line["mb"], mono + line["start"], mono + line["end"]])
        ranks.append({"rank": r.spec.rank, "replica": r.spec.replica, "stage": r.spec.stage,
                      "ops": ops})
    t0 = min((op[2] for rk in ranks for op in rk["ops"]), default=0.0)
    for rk in ranks:
        rk["ops"] = [[k, mb, (s - t0) / runner.k, (e - t0) / runner.k] for k, mb, s, e in rk["ops"]]
    return ranks


def run_case(emu, topology: Topology, case: PlanCase, config: RunConfig, calibration: Calibration, *,
             out_dir: Path, log: Callable[[str], None], pool=None) -> tuple[dict, dict | None]:
    """Run one plan alone; return its ``plans.jsonl`` record and its timeline document (None if it failed)."""
    plan = case.plan(config.iterations)
    config = dataclasses.replace(config, planner=fixed_plan(plan, case.plan_id))  # the plan is the planner
    runner = Runner(topology, [plan.job], config, emu, out_dir=out_dir, log=log, pool=pool)
    runner.run()  # marks what was still running if it raises
    j = runner.jobs[0]
    cal_view = emulated_view(topology, config.net, calibration=calibration)
    record = {"plan_id": case.plan_id, "topology": topology.source, "job": case.model, "shape": case.shape,
              "description": j.as_json()["plan"], "ranks": len(j.ranks),
              "predicted_uncalibrated_s": j.predicted_s, "predicted_calibrated_s": predict_emulated(plan, cal_view),
              "measured_s": j.measured_s,
              "measured_spread_s": [min(j.iteration_s), max(j.iteration_s)] if j.iteration_s else None,
              "status": j.status}
    if j.status != "ok":
        record["reason"] = j.reason
        return record, None
    iteration = config.iterations - 1
    timeline = {"plan_id": case.plan_id, "iteration": iteration,
                "predicted": {"calibrated": True,
                              "stages": [list(map(list, ops)) for ops in
                                         predict(plan, cal_view, check_memory=False).timeline.ops]},
                "measured": {"ranks": measured_timeline(runner, j, iteration)}}
    return record, timeline
