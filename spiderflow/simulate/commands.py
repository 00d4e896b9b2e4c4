"""CLI commands around the simulator: ``simulate``, ``compare``; ``trace`` is in spiderflow/traces/cli.py."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from spiderflow import shipped
from spiderflow.cliutil import (add_scheduler_arguments, dumps, input_file, int_in, name_list, output_dir,
                                output_dir_for)
from spiderflow.costmodel import NO_CALIBRATION, load_calibration
from spiderflow.costmodel.calibration import check_calibration_applies
from spiderflow.errors import ConfigError
from spiderflow.placement import PLANNERS
from spiderflow.provenance import provenance
from spiderflow.simulate.engine import SimConfig, simulate
from spiderflow.simulate.floors import faster_link, floor_ratios, floors_text, trace_floors
from spiderflow.simulate.metrics import (CHANGE_SUMMARY_KEYS, SUMMARY_KEYS, fmt_value, human_count, human_duration, human_pct, jct_cdf_png,
                                        ratio_of, summarise, write_rows)
from spiderflow.topology import load_topology
from spiderflow.traces.planned import PlannedGpuTime
from spiderflow.traces import FORMATS, load_trace
from spiderflow.traces.cli import add_trace  # noqa: F401  (the `trace` subcommands live with the traces)
from spiderflow.wan.cli import add_change_arguments, load_changes


COMPARED = tuple(p for p in PLANNERS if p != "joint-ilp")  # compare's default planners
MAX_TRACE_JOBS = 10_000_000  # sanity bound (a value past it is a typo)


def _common(p: argparse.ArgumentParser) -> None:
    # The shipped defaults are small and fast (5 jobs on 4 clusters, seconds); synthetic-1000.csv on
    # paper8 overloads it (JCT becomes queueing), so it is no default.
    p.add_argument("--topology", default="default",
                   help="topology YAML, or a shipped name: " + ", ".join(shipped.names("topology"))
                        + " (default %(default)s)")
    p.add_argument("--trace", default="default",
                   help="trace CSV (ours or a public format), or a shipped name: "
                        + ", ".join(shipped.names("trace")) + " (default %(default)s)")
    p.add_argument("--format", choices=FORMATS, help="trace format (default: told from the header)")
    p.add_argument("--skip-bad-rows", action="store_true",
                   help="skip (and count) rows that do not parse instead of stopping at the first")
    p.add_argument("--jobs", type=int_in(1, MAX_TRACE_JOBS), help="replay only the first N jobs of the trace")
    p.add_argument("--charge-overhead", action="store_true", help="add scheduling overhead to the start delay")
    p.add_argument("--calibration", type=input_file,
                   help="calibration JSON from `emulator calibrate` (default: none, the topology's figures as given)")
    p.add_argument("--calibration-any-topology", action="store_true",
                   help="apply --calibration although it records another topology than --topology")
    add_scheduler_arguments(p)
    add_change_arguments(p)
    p.add_argument("--out", type=output_dir, help="directory for the results (made if missing)")
    p.add_argument("--json", action="store_true",
                   help="print the summary as JSON; a metric with no value (avg_jct_s when no job "
                        "completed) is null")


def add_simulate(sub) -> None:
    p = sub.add_parser("simulate", help="replay a trace with one planner")
    _common(p)
    p.add_argument("--planner", default="spinsearch", choices=list(PLANNERS),
                   help="placement strategy (default %(default)s)")
    p.set_defaults(func=cmd_simulate)


def add_compare(sub) -> None:
    p = sub.add_parser("compare", help="replay a trace with several planners: the headline table")
    _common(p)
    p.add_argument("--planners", type=name_list(PLANNERS, "planner"), default=list(COMPARED),
                   help=f"comma-separated, each once, from {', '.join(PLANNERS)} (default {','.join(COMPARED)}: "
                        "joint-ilp, one MILP for placement and plan, runs to its time limit on most decisions: "
                        "5 s median at 8 clusters in the planner benchmark)")
    p.set_defaults(func=cmd_compare)


def _load(args):
    topo = load_topology(args.topology)
    args.changes = load_changes(args, topo)  # WAN and capacity events: SimConfig fields
    trace = load_trace(args.trace, format=args.format, skip_bad_rows=args.skip_bad_rows)
    jobs = trace.jobs[: args.jobs] if args.jobs else trace.jobs
    if not jobs:
        raise ConfigError(f"{args.trace}: no jobs to replay")
    if trace.skipped or any(trace.dropped.values()) or not args.json:
        for line in trace.report:  # a public trace: what each mapping rule kept and dropped
            print(line, file=sys.stderr)
        print(trace.summary(), file=sys.stderr)
    cal = load_calibration(args.calibration) if args.calibration else NO_CALIBRATION
    check_calibration_applies(cal, topo, allow_other_topology=args.calibration_any_topology)
    return topo, jobs, cal


def _changing(args) -> bool:
    """Did the run have WAN or capacity events? Then its summary and rows add the change metrics."""
    return bool(getattr(args, "changes", {}).get("wan_events") or getattr(args, "changes", {}).get("capacity_events"))


def _run(name: str, topo, jobs, cal, args) -> tuple[list, dict]:
    from tqdm import tqdm

    cfg = SimConfig(planner=name, backfill=args.backfill, charge_overhead=args.charge_overhead,
                    calibration=cal, seed=args.seed, time_limit_s=args.time_limit,
                    search_budget=args.search_budget, wait=args.wait, **args.changes)
    with tqdm(total=len(jobs), desc=f"{name:>10}", unit="job", leave=False,
              disable=args.json) as bar:
        records = simulate(topo, jobs, cfg, progress=bar.update)
    return records, summarise(records, topo.total_gpus, changes=_changing(args))


def _note_rejected(name: str, records: list, args) -> None:
    """One stderr line when some jobs were rejected (no empty topology could host them)."""
    rejected = [r for r in records if r.status == "rejected"]
    if rejected:
        where = f"every reason in {args.out}/jobs-{name}.csv" if args.out else "--out writes every reason"
        print(f"{name}: {len(rejected)} of {len(records)} jobs rejected, e.g. {rejected[0].reason}; {where}",
              file=sys.stderr)


def _resolved(args, planners: list[str]) -> dict:
    return {**provenance(), "topology": args.topology, "trace": args.trace, "format": args.format, "jobs": args.jobs,
            "planners": planners, "backfill": args.backfill, "charge_overhead": args.charge_overhead,
            "calibration": args.calibration, "time_limit_s": args.time_limit,
            "search_budget": args.search_budget, "seed": args.seed, "wait": args.wait,
            "wan_events": args.wan_events, "capacity_events": args.capacity_events, "replan": args.replan}


def _none_placeable(args, records_by_planner: dict[str, list]) -> None:
    """A trace none of whose jobs any planner could place even on the empty topology is bad input
    (the wrong trace for this topology, or a typo in it), not a result: every metric would be empty.
    One line naming the first job's reason; a trace with some placeable jobs reports the others as
    ``rejected`` with their reason in the jobs CSV."""
    if all(r.status == "rejected" for records in records_by_planner.values() for r in records):
        records = next(iter(records_by_planner.values()))
        raise ConfigError(f"{args.trace}: none of its {len(records)} jobs can be placed on {args.topology} "
                          f"({records[0].reason}); give a topology with "
                          "enough GPUs for them, or a trace made for this topology")


def cmd_simulate(args) -> int:
    topo, jobs, cal = _load(args)
    with output_dir_for(args.out) as out:  # said before the run; a trace refused after it leaves none
        records, summary = _run(args.planner, topo, jobs, cal, args)
        _none_placeable(args, {args.planner: records})
    _note_rejected(args.planner, records, args)
    if out:
        write_rows(records, out / f"jobs-{args.planner}.csv", changes=_changing(args))
        (out / "summary.json").write_text(dumps(summary))
        (out / "config.json").write_text(dumps(_resolved(args, [args.planner])))
    if args.json:
        print(dumps(summary))
    else:
        print(format_summary(summary))
    return 0


def format_summary(summary: dict) -> str:
    """The summary in human units, one metric a line ("n/a" where it has no value, see summarise);
    ``--json`` prints the same metrics in raw SI units under their SUMMARY_KEYS names."""
    shown = {
        "jobs": ("jobs", str), "completed": ("completed", str), "rejected": ("rejected", str),
        "avg_jct_s": ("avg JCT", human_duration), "p50_jct_s": ("p50 JCT", human_duration),
        "p95_jct_s": ("p95 JCT", human_duration), "avg_queue_s": ("avg queueing", human_duration),
        "makespan_s": ("makespan", human_duration),
        "throughput_tokens_per_s": ("throughput", lambda v: human_count(v, "tokens/s")),
        "jobs_per_hour": ("jobs per hour", lambda v: human_count(v)),
        "gpu_utilization": ("GPU utilisation", human_pct),
        "avg_overhead_s": ("avg scheduling overhead", human_duration),
        "total_overhead_s": ("total scheduling overhead", human_duration),
    }
    shown.update({"replanned": ("jobs re-planned", str), "rerouted": ("jobs re-routed", str),
                  "lost_s": ("time lost to changes", human_duration)})
    keys = SUMMARY_KEYS + tuple(k for k in CHANGE_SUMMARY_KEYS if k in summary)
    return "\n".join(f"{label:>25}: {'n/a' if summary[key] is None else fmt(summary[key])}"
                     for key, (label, fmt) in ((k, shown[k]) for k in keys))  # a new key needs a line


def headline(summaries: dict[str, dict], reference: str = "spinsearch", floors: dict | None = None) -> str:
    ref = summaries.get(reference)
    # Every ratio column points one way: > 1 means SpinSearch is better (lower JCT, higher
    # throughput, lower overhead), < 1 that this planner is.
    lines = ["| planner | completed | avg JCT (h) | p95 JCT (h) | throughput (tokens/s) | avg overhead (ms) "
             "| avg JCT / SpinSearch's | SpinSearch's throughput / this | overhead / SpinSearch's |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    changing = any("replanned" in s for s in summaries.values())  # a run with WAN or capacity events
    if changing:
        lines = [lines[0] + " re-planned | lost to changes (h) |", lines[1] + "---:|---:|"]
    if floors:  # how far each planner is from what any planner could reach (1 = there)
        lines = [lines[0] + " avg JCT / floor | ceiling / throughput |", lines[1] + "---:|---:|"]
    for name, s in summaries.items():
        jct = ratio_of(s["avg_jct_s"], ref["avg_jct_s"]) if ref else None
        thr = ratio_of(ref["throughput_tokens_per_s"], s["throughput_tokens_per_s"]) if ref else None
        ovh = ratio_of(s["avg_overhead_s"], ref["avg_overhead_s"]) if ref else None
        above, below = floor_ratios(s, floors) if floors else (None, None)
        lines.append(f"| {name} | {s['completed']}/{s['jobs']} | {fmt_value(s['avg_jct_s'], '.2f', 1 / 3600)} | "
                     f"{fmt_value(s['p95_jct_s'], '.2f', 1 / 3600)} | {fmt_value(s['throughput_tokens_per_s'], '.4g')} | "
                     f"{fmt_value(s['avg_overhead_s'], '.1f', 1e3)} | {fmt_value(jct, '.2f', suffix='x')} | "
                     f"{fmt_value(thr, '.2f', suffix='x')} | {fmt_value(ovh, '.3g', suffix='x')} |"
                     + (f" {s['replanned']} | {fmt_value(s['lost_s'], '.2f', 1 / 3600)} |" if changing else "")
                     + (f" {fmt_value(above, '.2f', suffix='x')} | {fmt_value(below, '.2f', suffix='x')} |"
                        if floors else ""))
    return "\n".join(lines)


def cdf_title(jobs: int, trace: str, topology: str, seed: int) -> str:
    """The JCT CDF's title: what was replayed (the jobs actually replayed, not the trace's size)."""
    return f"JCT CDF: {jobs} jobs of {Path(trace).name} replayed on {topology} (seed {seed})"


def cmd_compare(args) -> int:
    planners = list(args.planners)  # known and distinct: checked by the option's type
    topo, jobs, cal = _load(args)
    summaries, jcts, records = {}, {}, {}
    with output_dir_for(args.out) as out:  # said before the runs; a trace refused after them leaves none
        for name in planners:
            records[name], summaries[name] = _run(name, topo, jobs, cal, args)
            jcts[name] = [r.jct_s for r in records[name] if r.jct_s is not None]
        _none_placeable(args, records)
    for name in planners:
        _note_rejected(name, records[name], args)
    if out:
        for name in planners:
            write_rows(records[name], out / f"jobs-{name}.csv", changes=_changing(args))
    faster = faster_link(topo, args.changes.get("wan_events", ()))
    floors = None if faster else trace_floors(jobs, PlannedGpuTime(topo, cal))
    table = headline(summaries, floors=floors)
    about = floors_text(floors, len(jobs), faster, events=_changing(args))
    if out:
        (out / "summary.json").write_text(dumps({"planners": summaries, "floors": floors}))
        (out / "config.json").write_text(dumps(_resolved(args, planners)))
        (out / "headline.md").write_text(table + "\n\nEvery ratio > 1 means SpinSearch is better (lower JCT, "
                                         "higher throughput, lower overhead).\n\n" + about + "\n")
        jct_cdf_png(jcts, out / "jct_cdf.png", cdf_title(len(jobs), args.trace, topo.name, args.seed),
                    jobs=len(jobs))
    if args.json:
        print(dumps({"planners": summaries, "floors": floors}))
    else:
        print(table)
        print("\nratios > 1: SpinSearch is better (lower JCT, higher throughput, lower overhead)")
        print(about)
        if out:
            print(f"\nwrote {out}/headline.md, summary.json, jobs-*.csv, jct_cdf.png and .pdf")
    return 0
