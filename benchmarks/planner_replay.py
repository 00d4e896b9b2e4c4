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

import hashlib
import pickle
import sys
import time
from pathlib import Path

from spiderflow import scheduling
from spiderflow.cliutil import OneLineParser, float_in, int_in, one_line_errors, output_file, seed_arg
from spiderflow.errors import ConfigError, InfeasiblePlan
from spiderflow.placement import PLANNERS, PlacementRequest
from spiderflow.simulate.engine import SimConfig, simulate
from spiderflow.topology.generate import generate_topology
from spiderflow.traces.generate import MAX_JOBS, MAX_LOAD
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
    try:
        out.write_bytes(pickle.dumps(calls))
    except OSError as exc:
        raise ConfigError(f"--out {out}: cannot write ({exc.strerror or exc})") from None
    return len(calls)


def replay(path: Path) -> tuple[int, float, float, str]:
    try:
        calls = pickle.loads(path.read_bytes())
    except Exception as exc:  # unreadable, or not a pickle of the recording's shape
        raise ConfigError(f"{path}: cannot read a recording ({getattr(exc, 'strerror', None) or exc}); "
                          f"give a file that `record --out` wrote") from None
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


def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(prog="benchmarks/planner_replay.py", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("--jobs", type=int_in(1, MAX_JOBS), default=1000)
    rec.add_argument("--load", type=float_in(0.0, MAX_LOAD), default=None, help="offered load (default: 600 s gaps)")
    rec.add_argument("--seed", type=seed_arg, default=0)
    rec.add_argument("--no-wait", action="store_true", help="SpinSearch without its admission")
    rec.add_argument("--out", type=output_file, required=True)
    rep = sub.add_parser("replay")
    rep.add_argument("calls", type=Path)
    args = ap.parse_args(argv)

    def work() -> None:
        if args.cmd == "record":
            n = record(args.jobs, args.load, args.seed, not args.no_wait, Path(args.out))
            print(f"{n} SpinSearch calls recorded in {args.out}")
        else:
            n, cpu, big, sig = replay(args.calls)
            print(f"{n} calls: {cpu:.2f} s of CPU ({big:.2f} s for jobs over 128 GPUs); answers {sig}")
    return one_line_errors(work)  # e.g. --load with one job: its arrivals span no time


if __name__ == "__main__":
    sys.exit(main())
