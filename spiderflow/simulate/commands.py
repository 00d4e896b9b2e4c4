"""CLI commands around the simulator: ``simulate``, ``compare``, ``trace generate``."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from spiderflow.costmodel import NO_CALIBRATION, load_calibration
from spiderflow.errors import ConfigError
from spiderflow.placement import PLANNERS
from spiderflow.simulate.engine import SimConfig, simulate
from spiderflow.simulate.metrics import SUMMARY_KEYS, jct_cdf_png, summarise, write_rows
from spiderflow.topology import load_topology
from spiderflow.traces import FORMATS, generate_trace, load_trace, write_trace


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer (got {text!r})")
    return int(text)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--topology", default="topologies/paper8.yaml")
    p.add_argument("--trace", default="traces/synthetic-1000.csv")
    p.add_argument("--format", choices=FORMATS, help="trace format (default: told from the header)")
    p.add_argument("--skip-bad-rows", action="store_true")
    p.add_argument("--jobs", type=_positive_int, help="replay only the first N jobs of the trace")
    p.add_argument("--backfill", action="store_true", help="let later jobs start when the head cannot")
    p.add_argument("--charge-overhead", action="store_true", help="add scheduling overhead to the start delay")
    p.add_argument("--calibration")
    p.add_argument("--time-limit", type=float, default=10.0, help="ILP time limit per decision, seconds")
    p.add_argument("--search-budget", type=int, help="genetic trials per decision (default: the paper's 4,900)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out")
    p.add_argument("--json", action="store_true")


def add_simulate(sub) -> None:
    p = sub.add_parser("simulate", help="replay a trace with one planner")
    _common(p)
    p.add_argument("--planner", default="spinsearch", choices=list(PLANNERS))
    p.set_defaults(func=cmd_simulate)


def add_compare(sub) -> None:
    p = sub.add_parser("compare", help="replay a trace with several planners: the headline table")
    _common(p)
    p.add_argument("--planners", default=",".join(PLANNERS))
    p.set_defaults(func=cmd_compare)


def add_trace(sub) -> None:
    p = sub.add_parser("trace", help="trace tools")
    tsub = p.add_subparsers(dest="trace_cmd", required=True)
    g = tsub.add_parser("generate", help="a reproducible synthetic LLM-training trace")
    g.add_argument("--jobs", type=_positive_int, required=True)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--arrival", choices=("poisson", "bursty"), default="poisson")
    g.add_argument("--mean-interarrival", type=float, default=600.0, help="seconds")
    g.add_argument("--max-gpus", type=int, default=512)
    g.add_argument("--out", required=True)
    g.set_defaults(func=cmd_trace_generate)


def cmd_trace_generate(args) -> int:
    jobs = generate_trace(args.jobs, args.seed, arrival=args.arrival, mean_interarrival_s=args.mean_interarrival,
                          max_gpus=args.max_gpus)
    write_trace(jobs, args.out, comment=f"python -m spiderflow trace generate --jobs {args.jobs} "
                                        f"--seed {args.seed} --arrival {args.arrival} "
                                        f"--mean-interarrival {args.mean_interarrival} --max-gpus {args.max_gpus}")
    print(f"wrote {args.out}: {len(jobs)} jobs over {jobs[-1].arrival_s / 3600:.1f} h")
    return 0


def _load(args):
    topo = load_topology(args.topology)
    trace = load_trace(args.trace, format=args.format, skip_bad_rows=args.skip_bad_rows)
    jobs = trace.jobs[: args.jobs] if args.jobs else trace.jobs
    if not jobs:
        raise ConfigError(f"{args.trace}: no jobs to replay")
    if trace.skipped or any(trace.dropped.values()) or not args.json:
        print(trace.summary(), file=sys.stderr)
    cal = load_calibration(args.calibration) if args.calibration else NO_CALIBRATION
    return topo, jobs, cal


def _run(name: str, topo, jobs, cal, args) -> tuple[list, dict]:
    from tqdm import tqdm

    cfg = SimConfig(planner=name, backfill=args.backfill, charge_overhead=args.charge_overhead,
                    calibration=cal, seed=args.seed, time_limit_s=args.time_limit,
                    search_budget=args.search_budget)
    with tqdm(total=len(jobs), desc=f"{name:>10}", unit="job", leave=False,
              disable=args.json) as bar:
        records = simulate(topo, jobs, cfg, progress=bar.update)
    return records, summarise(records, topo.total_gpus)


def _resolved(args, planners: list[str]) -> dict:
    return {"topology": args.topology, "trace": args.trace, "format": args.format, "jobs": args.jobs,
            "planners": planners, "backfill": args.backfill, "charge_overhead": args.charge_overhead,
            "calibration": args.calibration, "time_limit_s": args.time_limit,
            "search_budget": args.search_budget, "seed": args.seed}


def cmd_simulate(args) -> int:
    topo, jobs, cal = _load(args)
    records, summary = _run(args.planner, topo, jobs, cal, args)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        write_rows(records, out / f"jobs-{args.planner}.csv")
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
        (out / "config.json").write_text(json.dumps(_resolved(args, [args.planner]), indent=2))
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        for key in SUMMARY_KEYS:
            value = summary[key]
            print(f"{key:>24}: {value:.4g}" if isinstance(value, float) else f"{key:>24}: {value}")
    return 0


def _ratio(a: float, b: float) -> float:
    return a / b if b and not math.isnan(a) and not math.isnan(b) else math.nan


def headline(summaries: dict[str, dict], reference: str = "spinsearch") -> str:
    ref = summaries.get(reference)
    lines = ["| planner | completed | avg JCT (h) | p95 JCT (h) | throughput (tokens/s) | avg overhead (ms) "
             "| JCT vs SpinSearch | throughput: SpinSearch x | overhead: SpinSearch lower by |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, s in summaries.items():
        jct = _ratio(s["avg_jct_s"], ref["avg_jct_s"]) if ref else math.nan
        thr = _ratio(ref["throughput_tokens_per_s"], s["throughput_tokens_per_s"]) if ref else math.nan
        ovh = _ratio(s["avg_overhead_s"], ref["avg_overhead_s"]) if ref else math.nan
        lines.append(f"| {name} | {s['completed']}/{s['jobs']} | {s['avg_jct_s'] / 3600:.2f} | "
                     f"{s['p95_jct_s'] / 3600:.2f} | {s['throughput_tokens_per_s']:.4g} | "
                     f"{s['avg_overhead_s'] * 1e3:.1f} | {jct:.2f}x | {thr:.2f}x | {ovh:.3g}x |")
    return "\n".join(lines)


def cmd_compare(args) -> int:
    planners = [p.strip() for p in args.planners.split(",") if p.strip()]
    for name in planners:
        if name not in PLANNERS:
            raise ConfigError(f"--planners: unknown planner {name!r}; known: {', '.join(PLANNERS)}")
    topo, jobs, cal = _load(args)
    summaries, jcts = {}, {}
    out = Path(args.out) if args.out else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
    for name in planners:
        records, summaries[name] = _run(name, topo, jobs, cal, args)
        jcts[name] = [r.jct_s for r in records if r.jct_s is not None]
        if out:
            write_rows(records, out / f"jobs-{name}.csv")
    table = headline(summaries)
    if out:
        (out / "summary.json").write_text(json.dumps({"planners": summaries}, indent=2))
        (out / "config.json").write_text(json.dumps(_resolved(args, planners), indent=2))
        (out / "headline.md").write_text(table + "\n")
        jct_cdf_png(jcts, out / "jct_cdf.png", f"JCT CDF: {Path(args.trace).name} on {topo.name}")
    if args.json:
        print(json.dumps({"planners": summaries}, indent=2))
    else:
        print(table)
        if out:
            print(f"\nwrote {out}/headline.md, summary.json, jobs-*.csv, jct_cdf.png")
    return 0
