"""How far the cost model's closed-form estimate is from its exact 1F1B schedule on the plans
SpinSearch makes in simulated replays, where running jobs load the links.

The simulator prices a running job's iterations with the estimate and the planners rank plans by
it, while the emulator's predictions use the exact schedule: this is the gap between the two.
Every plan SpinSearch returns during each replay (started at once, as with ``--no-wait``; every
decision asked, none memoised) is priced both ways on the network state it was planned on.

    .venv/bin/python benchmarks/estimate_gap.py [--traces 64:600:1,64:600:2,8:300:3] [--out FILE]

A trace ``C:N:S`` is ``generate_trace(N, S)`` at 600 s gaps on ``generate_topology(C, 0)``.
Writes benchmarks/results/estimate_gap.md: per trace and over all, the plans, the median, 90th
and 99th percentile and largest |estimate - exact| / exact, how many are over 2% and 5%, and the
signed range (negative: the estimate is under the exact schedule); then the worst plans.
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import sys
import time
from pathlib import Path

from spiderflow.bench import machine
from spiderflow.cli import MAX_GENERATED_CLUSTERS
from spiderflow.cliutil import (OneLineParser, field_items, int_in, one_line_errors, output_file, seed_arg,
                                write_output_file)
from spiderflow.costmodel import estimate, predict
from spiderflow.placement import clear_memos
from spiderflow.placement.spinsearch import place
from spiderflow.simulate.engine import SimConfig, simulate
from spiderflow.topology.generate import generate_topology
from spiderflow.traces import generate_trace
from spiderflow.traces.generate import MAX_JOBS

OUT = Path(__file__).parent / "results" / "estimate_gap.md"
TRACES = field_items(int_in(2, MAX_GENERATED_CLUSTERS), int_in(1, MAX_JOBS), seed_arg,  # --traces
                     what="CLUSTERS:JOBS:SEED",
                     ranges=f"with 2..{MAX_GENERATED_CLUSTERS:,} clusters and 1..{MAX_JOBS:,} jobs")


def gaps_of_trace(clusters: int, jobs: int, seed: int) -> list[tuple[float, str]]:
    """(signed gap, description) of every plan SpinSearch returns replaying this trace."""
    topo = generate_topology(clusters, 0)
    rows: list[tuple[float, str]] = []

    def recording(req):
        placement = place(req)
        view, plan = req.topology_view(), placement.plan
        exact = predict(plan, view).iteration_s
        where = " ".join(f"{c}:{g}" for c, g in placement.segments)
        rows.append(((estimate(plan, view) - exact) / exact,
                     f"{plan.job.model} on {where}: {plan.depth} stages x {len(plan.replicas)} replicas, "
                     f"m = {plan.micro_batches}; exact {exact:.4g} s"))
        return placement

    recording.name = "spinsearch"  # type: ignore[attr-defined]
    clear_memos()
    simulate(topo, generate_trace(jobs, seed, mean_interarrival_s=600.0), SimConfig(planner=recording))
    return rows


def summary(gaps: list[float]) -> str:
    a = sorted(abs(g) for g in gaps)
    pct = lambda q: a[min(len(a) - 1, int(q * len(a)))]  # noqa: E731
    return (f"{len(a)} | {100 * statistics.median(a):.2f}% | {100 * pct(0.9):.2f}% | {100 * pct(0.99):.2f}% | "
            f"{100 * a[-1]:.2f}% | {sum(x > 0.02 for x in a)} | {sum(x > 0.05 for x in a)} | "
            f"{100 * min(gaps):+.2f}% .. {100 * max(gaps):+.2f}%")


def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(prog="benchmarks/estimate_gap.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--traces", type=TRACES, default="64:600:1,64:600:2,8:300:3", help="CLUSTERS:JOBS:SEED,...")
    ap.add_argument("--out", type=output_file, default=str(OUT))
    args = ap.parse_args(argv)
    return one_line_errors(lambda: run(args))


def run(args: argparse.Namespace) -> None:
    traces = args.traces
    head = ("| trace | plans | median | p90 | p99 | max | over 2% | over 5% | signed range |\n"
            "|---|---:|---:|---:|---:|---:|---:|---:|---|\n")
    lines, every = [], []
    cpu0 = time.process_time()
    for clusters, jobs, seed in traces:
        rows = gaps_of_trace(clusters, jobs, seed)
        every += rows
        lines.append(f"| {clusters} clusters, {jobs} jobs, seed {seed} | {summary([g for g, _ in rows])} |")
        print(lines[-1], file=sys.stderr, flush=True)
    lines.append(f"| all | {summary([g for g, _ in every])} |")
    worst = sorted(every, key=lambda r: -abs(r[0]))[:5]
    text = (f"# Estimate against exact schedule\n\n{dt.date.today()}, {machine()}; "
            f"{time.process_time() - cpu0:.0f} s of CPU.\n\n"
            f"Command: `.venv/bin/python benchmarks/estimate_gap.py --traces "
            f"{','.join(':'.join(map(str, t)) for t in traces)}`\n\n"
            "|estimate - exact| / exact of every plan SpinSearch returned, on the state it was planned on:\n\n"
            + head + "\n".join(lines) + "\n\nWorst plans:\n\n"
            + "\n".join(f"- {100 * g:+.2f}%: {d}" for g, d in worst) + "\n")
    write_output_file(args.out, text)
    print(text)


if __name__ == "__main__":
    sys.exit(main())
