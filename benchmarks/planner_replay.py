"""SpinSearch's calls in a simulation, recorded and replayed: its CPU time on exactly those calls,
and a fingerprint of every answer (to show that a speed-up changed no plan).

``record`` simulates a 64-cluster synthetic trace (``benchmarks/simulator_speed.py``'s) and
keeps every request the scheduler's memo passed to SpinSearch (the job, free GPUs, link load).
``replay`` asks SpinSearch those requests again, in order, in a fresh process, and prints the CPU
time (all calls, and those of jobs over 128 GPUs) and a SHA-1 of the answers (segments and plans,
or the refusal). Run ``replay`` from two commits (``PYTHONPATH=<worktree>``) on one recording: equal
fingerprints mean equal answers.

    .venv/bin/python benchmarks/planner_replay.py record --jobs 1000 --load 0.9 --seed 2 --out calls.pkl
    .venv/bin/python benchmarks/planner_replay.py replay calls.pkl

The recording is a pickle: replay only files you recorded.
"""

from __future__ import annotations

import argparse
import hashlib
import pickle
import time
from pathlib import Path

from spiderflow import scheduling
from spiderflow.errors import InfeasiblePlan
from spiderflow.placement import PLANNERS, PlacementRequest
from spiderflow.simulate.engine import SimConfig, simulate
from spiderflow.topology.generate import generate_topology
from spiderflow.traces.planned import PlannedGpuTime

from simulator_speed import speed_trace  # this folder is on the path when the script runs

CLUSTERS = 64


def record(jobs: int, load: float | None, seed: int, wait: bool, out: Path) -> int:
    topo = generate_topology(CLUSTERS, 0)
    trace = speed_trace(topo, jobs, seed, load, PlannedGpuTime(topo))
    calls = []
    init = scheduling.Scheduler.__init__

    def recording_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        strategy = self._strategy

        def recorded(req: PlacementRequest):
            calls.append((req.job, dict(req.free_gpus), dict(req.link_load), req.allowed))
            return strategy(req)

        self._strategy = recorded

    scheduling.Scheduler.__init__ = recording_init
    try:
        simulate(topo, trace, SimConfig(planner="spinsearch", wait=wait))
    finally:
        scheduling.Scheduler.__init__ = init
    out.write_bytes(pickle.dumps(calls))
    return len(calls)


def replay(path: Path) -> tuple[int, float, float, str]:
    calls = pickle.loads(path.read_bytes())
    topo = generate_topology(CLUSTERS, 0)
    place = PLANNERS["spinsearch"]
    answers, big = [], 0.0
    cpu0 = time.process_time()
    for job, free, load, allowed in calls:
        t = time.process_time()
        try:
            p = place(PlacementRequest(job=job, topology=topo, free_gpus=free, link_load=load, allowed=allowed))
            answers.append((job.job_id, p.segments, repr(p.plan)))
        except InfeasiblePlan as exc:
            answers.append((job.job_id, "refused", str(exc)))
        if job.gpus > 128:
            big += time.process_time() - t
    cpu = time.process_time() - cpu0
    return len(calls), cpu, big, hashlib.sha1(repr(answers).encode()).hexdigest()[:12]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("--jobs", type=int, default=1000)
    rec.add_argument("--load", type=float, default=None, help="offered load (default: 600 s gaps)")
    rec.add_argument("--seed", type=int, default=0)
    rec.add_argument("--no-wait", action="store_true", help="SpinSearch without its admission")
    rec.add_argument("--out", type=Path, required=True)
    rep = sub.add_parser("replay")
    rep.add_argument("calls", type=Path)
    args = ap.parse_args()
    if args.cmd == "record":
        n = record(args.jobs, args.load, args.seed, not args.no_wait, args.out)
        print(f"{n} SpinSearch calls recorded in {args.out}")
    else:
        n, cpu, big, sig = replay(args.calls)
        print(f"{n} calls: {cpu:.2f} s of CPU ({big:.2f} s for jobs over 128 GPUs); answers {sig}")


if __name__ == "__main__":
    main()
