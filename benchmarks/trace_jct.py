"""Avg JCT of SpinSearch (with admission) on simulator_speed.py's 64-cluster traces, per load and seed,
and the geometric mean of the ratios between two checkouts' runs.

    .venv/bin/python benchmarks/trace_jct.py run DIR --traces 0.9:2,0.5:0 [--jobs 1000] [--gaps-from BASE_DIR]
    .venv/bin/python benchmarks/trace_jct.py compare BASE_DIR OTHER_DIR

``run`` writes one ``LOAD_SEED.json`` per trace into DIR (summary, CPU time, and each job's start, end
and segments) for the checkout it is run from (``PYTHONPATH=<worktree>``: compare commits from
worktrees); avg JCT is deterministic, so the two checkouts can run at once, one per core.
``compare`` prints, per trace both have, OTHER's avg JCT and throughput over BASE's, then the
geometric mean of the JCT ratios with a 95% t-interval, their range, and the throughput's mean.

A trace's arrivals are spaced to its load by SpinSearch's plan of each job alone, so a change to
SpinSearch's plans also changes the traces (plans 4.5% faster alone, arrivals 4.5% closer): to
compare a planner change on the same traces, ``--gaps-from BASE_DIR`` takes each trace's mean gap
from BASE_DIR's run of it (its ``mean_gap_s``, or, for a run written before that was kept, the
gap its arrivals were drawn at).
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from headline import T975  # noqa: E402  (two-sided 95% t quantiles)
from simulator_speed import speed_gap  # noqa: E402

from spiderflow.cliutil import (OneLineParser, field_items, float_in, int_in, one_line_errors, output_dir,  # noqa: E402
                                output_dir_for, seed_arg)
from spiderflow.placement import clear_memos  # noqa: E402
from spiderflow.simulate.engine import SimConfig, simulate  # noqa: E402
from spiderflow.simulate.metrics import summarise  # noqa: E402
from spiderflow.topology.generate import generate_topology  # noqa: E402
from spiderflow.traces import generate_trace  # noqa: E402
from spiderflow.traces.generate import MAX_JOBS, MAX_LOAD  # noqa: E402
from spiderflow.traces.planned import PlannedGpuTime  # noqa: E402

REFERENCE_GAP_S = 600.0


def base_gap(base: Path, load: float, seed: int, jobs: int) -> float:
    """The mean gap of BASE's run of this trace (``--gaps-from``)."""
    f = base / f"{load:g}_{seed}.json"
    if not f.exists():
        raise SystemExit(f"--gaps-from: {f} is missing (run that trace there first)")
    data = json.loads(f.read_text())
    if data["jobs"] != jobs:
        raise SystemExit(f"--gaps-from: {f} has {data['jobs']} jobs, this run {jobs} (set --jobs to match)")
    if "mean_gap_s" in data:
        return data["mean_gap_s"]
    # every gap is proportional to the mean gap: the last arrival at a reference mean gives it
    last = max(r["arrival_s"] for r in data["records"])
    return REFERENCE_GAP_S * last / generate_trace(jobs, seed, mean_interarrival_s=REFERENCE_GAP_S)[-1].arrival_s


def run(out: Path, traces: list[tuple[float, int]], jobs: int, gaps_from: Path | None = None) -> None:
    topo = generate_topology(64, 0)
    gpu_time = PlannedGpuTime(topo)  # each job shape planned alone once, for every trace's gap
    for load, seed in traces:
        if gaps_from is None:
            gap = speed_gap(topo, jobs, seed, load, gpu_time)
        else:
            gap = base_gap(gaps_from, load, seed, jobs)
        trace = generate_trace(jobs, seed, mean_interarrival_s=gap)
        clear_memos()
        cpu0 = time.process_time()
        records = simulate(topo, trace, SimConfig(planner="spinsearch"))
        cpu = time.process_time() - cpu0
        s = summarise(records, topo.total_gpus)
        rows = [{"job_id": r.job.job_id, "gpus": r.job.gpus, "arrival_s": r.arrival_s, "start_s": r.start_s,
                 "end_s": r.end_s, "segments": [list(x) for x in r.segments], "admission": r.admission}
                for r in records]
        (out / f"{load:g}_{seed}.json").write_text(json.dumps(
            {"load": load, "seed": seed, "jobs": jobs, "mean_gap_s": gap, "cpu_s": cpu, "summary": s,
             "records": rows}))
        print(f"load {load:g} seed {seed}: avg JCT {s['avg_jct_s']:.4g} s, throughput "
              f"{s['throughput_tokens_per_s']:.4g} tokens/s, {cpu:.1f} s of CPU", flush=True)


def compare(base: Path, other: Path) -> None:
    jct, thr = [], []
    for f in sorted(base.glob("*.json")):
        g = other / f.name
        if not g.exists():
            continue
        a, b = json.loads(f.read_text()), json.loads(g.read_text())
        r = b["summary"]["avg_jct_s"] / a["summary"]["avg_jct_s"]
        t = b["summary"]["throughput_tokens_per_s"] / a["summary"]["throughput_tokens_per_s"]
        jct.append(math.log(r))
        thr.append(math.log(t))
        print(f"load {a['load']:g} seed {a['seed']}: base avg JCT {a['summary']['avg_jct_s']:.4g} s; "
              f"JCT x{r:.3f}, throughput x{t:.3f}")
    if len(jct) < 2:
        raise SystemExit("compare: fewer than two traces in both directories")
    m, h = statistics.fmean(jct), T975[min(len(jct) - 1, len(T975)) - 1] * statistics.stdev(jct) / math.sqrt(len(jct))
    print(f"{len(jct)} traces: avg JCT geometric mean x{math.exp(m):.3f} (95% {math.exp(m - h):.3f}-"
          f"{math.exp(m + h):.3f}), x{math.exp(min(jct)):.3f} to x{math.exp(max(jct)):.3f}; throughput "
          f"x{math.exp(statistics.fmean(thr)):.3f}")


def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(prog="benchmarks/trace_jct.py", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("out", type=output_dir)
    r.add_argument("--traces", type=field_items(float_in(0.0, MAX_LOAD), seed_arg, what="LOAD:SEED",
                                                ranges=f"each load in (0, {MAX_LOAD:g}] and seed an integer from 0"),
                   required=True, help="LOAD:SEED,... e.g. 0.9:2,0.5:0")
    r.add_argument("--jobs", type=int_in(2, MAX_JOBS), default=1000)
    r.add_argument("--gaps-from", type=Path, default=None, metavar="BASE_DIR",
                   help="space each trace's arrivals as in BASE_DIR's run of it (same traces across planner changes)")
    c = sub.add_parser("compare")
    c.add_argument("base", type=Path)
    c.add_argument("other", type=Path)
    args = ap.parse_args(argv)

    def work() -> None:
        if args.cmd == "compare":
            compare(args.base, args.other)
        else:
            with output_dir_for(args.out, "DIR") as out:  # (a refused run leaves no empty DIR behind)
                run(out, args.traces, args.jobs, args.gaps_from)
    return one_line_errors(work)


if __name__ == "__main__":
    sys.exit(main())
