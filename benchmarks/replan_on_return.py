"""Spot GPUs withdrawn and returned: SpinSearch with and without re-planning once they are back.

A job SpinSearch places while a cluster's GPUs are withdrawn lands on what is left; once they
come back it is planned again and moves when that pays (docs/wan-events.md). This replays, in
the simulator, the headline's synthetic traces (``trace generate --topology T --load L``, here
on paper8) with seeded spot withdrawals (``wan spot --hours H --withdrawals N``, H the span of
the arrivals, its defaults otherwise: each takes one cluster's GPUs whole, at a time drawn over
the span, with 120 s of notice, for 2-8 hours; a cluster's overlapping ones merge). SpinSearch
runs at the shared scheduler's defaults (FIFO, admission on), once with re-planning and once
with ``--no-replan``; overhead is not charged, so both replays are deterministic and differ only
by the rule.

    .venv/bin/python benchmarks/replan_on_return.py [--jobs 100] [--seeds 5] [--loads 0.5,0.7,0.9]
        [--withdrawals 8,24] [--out FILE]

prints (and with ``--out`` writes) Markdown tables, one per number of withdrawals drawn: per load
and seed, SpinSearch's avg JCT with re-planning and without, their ratio (> 1: re-planning is
better), and the re-placements (stops and moves) of each replay; then per load the geometric mean
and the minimum ratio.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from headline import load_list, synthetic  # noqa: E402  (benchmarks/headline.py: the same traces, loads)

from spiderflow.bench import machine  # noqa: E402
from spiderflow.cliutil import (OneLineParser, int_in, int_list, one_line_errors, output_file,  # noqa: E402
                                write_output_file)
from spiderflow.provenance import provenance  # noqa: E402
from spiderflow.simulate.engine import SimConfig, simulate  # noqa: E402
from spiderflow.simulate.metrics import summarise  # noqa: E402
from spiderflow.topology import Topology, load_topology  # noqa: E402
from spiderflow.traces.generate import MAX_JOBS  # noqa: E402
from spiderflow.wan.spot import SpotPattern, generate_spot_events  # noqa: E402

TOPOLOGY = Path(__file__).resolve().parent.parent / "topologies" / "paper8.yaml"


def withdrawals(topo: Topology, span_s: float, seed: int, count: int) -> tuple:
    """``wan spot --seed SEED --hours SPAN --withdrawals COUNT`` on ``topo``, in process."""
    return tuple(generate_spot_events(topo, seed, SpotPattern(hours=span_s / 3600, withdrawals=count)))


def replay(topo: Topology, jobs, events, replan: bool) -> tuple[float, int]:
    """SpinSearch's avg JCT and re-placements (stops and moves) on ``jobs`` under ``events``."""
    records = simulate(topo, jobs, SimConfig(planner="spinsearch", capacity_events=events, replan=replan))
    return summarise(records, topo.total_gpus)["avg_jct_s"], sum(r.replanned for r in records)


def table(topo: Topology, args, count: int) -> list[str]:
    """The Markdown rows for ``count`` withdrawals drawn per trace: per load and seed, then per load."""
    lines = ["| load | seed | withdrawals (merged) | avg JCT with re-planning (h) | with `--no-replan` (h) | ratio "
             "| re-placements with / without |", "|---|---:|---:|---:|---:|---:|---|"]
    ratios: dict[str, list[float]] = {}
    for load in args.loads:
        for seed in range(args.seeds):
            case = synthetic(topo, load, seed, args.jobs)
            events = withdrawals(topo, max(j.arrival_s for j in case.jobs), seed, count)
            (on, moved_on), (off, moved_off) = (replay(topo, case.jobs, events, r) for r in (True, False))
            ratios.setdefault(f"{load:g}", []).append(off / on)
            lines.append(f"| {load:g} | {seed} | {len(events)} | {on / 3600:.2f} | {off / 3600:.2f} | {off / on:.4f}x "
                         f"| {moved_on} / {moved_off} |")
            print(lines[-1], file=sys.stderr, flush=True)
    lines += ["", "| load | geometric mean of the ratios | minimum |", "|---|---:|---:|"]
    for load, rs in ratios.items():
        lines.append(f"| {load} | {math.exp(sum(map(math.log, rs)) / len(rs)):.4f}x | {min(rs):.4f}x |")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="benchmarks/replan_on_return.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int_in(2, MAX_JOBS), default=100)
    p.add_argument("--seeds", type=int_in(1, 10_000), default=5)
    p.add_argument("--loads", type=load_list, default="0.5,0.7,0.9")
    p.add_argument("--withdrawals", type=int_list(1, 100_000), default="8,24",
                   help="withdrawals drawn per trace, one table each")
    p.add_argument("--out", type=output_file)
    args = p.parse_args(argv)
    return one_line_errors(lambda: run(args, argv))


def run(args: argparse.Namespace, argv: list[str] | None) -> None:
    topo = load_topology(TOPOLOGY)
    prov, start, cpu0 = provenance(argv), time.time(), time.process_time()
    body: list[str] = []
    for count in args.withdrawals:
        body += [f"## {count} withdrawals drawn per trace", "", *table(topo, args, count), ""]
    lines = [f"# Re-planning once spot GPUs return ({args.jobs} jobs of paper8's synthetic traces)", "",
             f"{prov['started']}, {machine()}, commit {prov['git_commit']}; {time.time() - start:.0f} s wall, "
             f"{time.process_time() - cpu0:.0f} s CPU. Command: `{' '.join(prov['argv'])}`", "", *body]
    text = "\n".join(lines)
    print(text)
    if args.out:
        write_output_file(args.out, text)


if __name__ == "__main__":
    sys.exit(main())
