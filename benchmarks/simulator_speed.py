"""Simulator speed: N synthetic jobs on a generated 64-cluster topology with SpinSearch.

Target (issue 4): 10,000 jobs in under 60 s on one core. Writes
benchmarks/results/simulator_speed.md with wall and CPU time, the machine and
its load average (the machine is shared: CPU time is the steadier figure).

The trace is ``generate_trace(N, 0)`` at its default mean gap (600 s), which offers the
64-cluster topology 4.0x (2,000 jobs) to 6.0x (10,000) its GPUs on SpinSearch's plans at 6e7b40b
(6.5x before step 8 made them faster): the queue never drains.
``--load L`` sizes the gap to an offered load L instead (``trace generate --load``: each job's
GPU time as SpinSearch plans it alone on the empty topology).

    .venv/bin/python benchmarks/simulator_speed.py [--jobs 10000] [--clusters 64] [--planner spinsearch]
        [--no-wait] [--load L]

Every 1,000 jobs ended (done or rejected) it prints a line to stderr with the CPU time so far: with
admission on, 10,000 jobs take minutes (``--load 0.9``) to a quarter of an hour of CPU (the 600 s gaps;
README, "Simulator speed"), and the lines show how far a run got.

The trace is sized (and its offered load computed) by planning each job shape alone with
SpinSearch; the planners' memos are cleared before the timed run, which starts cold.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
import time
from pathlib import Path

from spiderflow.bench import machine
from spiderflow.cli import MAX_GENERATED_CLUSTERS
from spiderflow.cliutil import OneLineParser, float_in, int_in, one_line_errors, output_file, write_output_file
from spiderflow.placement import PLANNERS, clear_memos
from spiderflow.simulate.engine import SimConfig, simulate
from spiderflow.simulate.metrics import summarise
from spiderflow.topology import Topology
from spiderflow.topology.generate import generate_topology
from spiderflow.traces import generate_trace
from spiderflow.traces.generate import MAX_JOBS, MAX_LOAD, mean_gap_for_load, offered_load
from spiderflow.traces.planned import PlannedGpuTime
from spiderflow.workload import Job

OUT = Path(__file__).parent / "results" / "simulator_speed.md"


def speed_gap(topo: Topology, jobs: int, seed: int, load: float | None, gpu_time: PlannedGpuTime) -> float:
    """The mean gap of the benchmark's trace: 600 s, or the gap that offers ``load``."""
    return 600.0 if load is None else mean_gap_for_load(jobs, seed, load, total_gpus=topo.total_gpus,
                                                        job_gpu_seconds=gpu_time)


def speed_trace(topo: Topology, jobs: int, seed: int, load: float | None, gpu_time: PlannedGpuTime) -> list[Job]:
    """The benchmark's trace: ``generate_trace(jobs, seed)`` at 600 s gaps, or sized to ``load``."""
    return generate_trace(jobs, seed, mean_interarrival_s=speed_gap(topo, jobs, seed, load, gpu_time))


def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(prog="benchmarks/simulator_speed.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int_in(1, MAX_JOBS), default=10_000)
    ap.add_argument("--clusters", type=int_in(2, MAX_GENERATED_CLUSTERS), default=64)
    ap.add_argument("--planner", choices=list(PLANNERS), default="spinsearch")
    ap.add_argument("--no-wait", action="store_true", help="SpinSearch without its admission (starts every job at once)")
    ap.add_argument("--load", type=float_in(0.0, MAX_LOAD), default=None,
                    help="size arrivals to this offered load (default: 600 s gaps)")
    ap.add_argument("--out", type=output_file, default=str(OUT))
    args = ap.parse_args(argv)
    return one_line_errors(lambda: run(args))  # e.g. --load with one job: its arrivals span no time


def run(args: argparse.Namespace) -> None:
    topo = generate_topology(args.clusters, 0)
    gpu_time = PlannedGpuTime(topo)
    jobs = speed_trace(topo, args.jobs, 0, args.load, gpu_time)
    load = offered_load(jobs, total_gpus=topo.total_gpus, job_gpu_seconds=gpu_time)
    clear_memos()  # sizing planned each job shape alone on this topology: the timed run starts cold
    load0 = os.getloadavg()[0]
    wall0, cpu0 = time.perf_counter(), time.process_time()
    ended = 0

    def progress(n: int) -> None:
        nonlocal ended
        ended += n
        if ended % 1000 == 0:
            print(f"{ended} jobs ended after {time.process_time() - cpu0:.1f} s of CPU", file=sys.stderr, flush=True)

    records = simulate(topo, jobs, SimConfig(planner=args.planner, wait=not args.no_wait), progress=progress)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    s = summarise(records, topo.total_gpus)
    text = (f"# Simulator speed\n\n{dt.date.today()}, {machine()}; load average at start {load0:.2f}.\n\n"
            f"Command: `.venv/bin/python benchmarks/simulator_speed.py --jobs {args.jobs} "
            f"--clusters {args.clusters} --planner {args.planner}{' --no-wait' if args.no_wait else ''}"
            f"{'' if args.load is None else f' --load {args.load:g}'}`\n\n"
            f"| jobs | clusters | GPUs | offered load | planner | wall (s) | CPU (s) | planner time (s) | completed | "
            f"rejected | avg JCT (s) |\n|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|\n"
            f"| {args.jobs} | {args.clusters} | {topo.total_gpus} | {load:.2f} | {args.planner} | {wall:.1f} | {cpu:.1f} | "
            f"{s['total_overhead_s']:.1f} | {s['completed']} | {s['rejected']} | {s['avg_jct_s']:.4g} |\n")
    write_output_file(args.out, text)
    print(text)


if __name__ == "__main__":
    sys.exit(main())
