"""A headline with error bars (issue 15): SpinSearch against the baselines over seeds and loads.

Replays synthetic traces in the simulator (no emulator) on each topology at
each offered load, one trace per seed, with every planner at the shared
scheduler's defaults (:class:`spiderflow.scheduling.SchedulerConfig`: FIFO, with
SpinSearch's admission reserving for a head too big for the free GPUs, ILP
time limit 10 s per decision, genetic's default 4,900 trials) and the paper's
accounting of scheduling overhead (``SimConfig(charge_overhead=True)``: a
decision's wall time delays its job and the ones queued behind it). Each replay
starts with the planners' memos cleared, as a fresh scheduler would: none of
its decisions is answered from the sizing, another planner's run or another case.
``spinsearch`` is SpinSearch with its topology-aware admission (the default),
``spinsearch-nowait`` the ablation without it (``wait=False``). One more row
set replays windows of consecutive jobs of the real Alibaba v2023 sample
(tests/traces/data/real/README.md) on their own arrivals.

For each topology, load and baseline B, per seed: B's avg JCT / SpinSearch's
and SpinSearch's throughput / B's (> 1: SpinSearch is better); over seeds the
geometric mean with a 95% t-interval on the log ratios, and the minimum. Per
trace also a floor under avg JCT and a ceiling on throughput (:func:`floors`:
every job run on its plan alone, queued only behind a job that cannot share
the topology): how far each planner is from them, and so the most any planner
could show against B there.

    .venv/bin/python benchmarks/headline.py [--out DIR] [--seeds 5[,geo64=3]] [--jobs 12[,geo64=8]]
        [--topologies topologies/paper8.yaml,topologies/geo64.yaml] [--loads 0.5,0.7,0.9]
        [--planners spinsearch,spinsearch-nowait,ilp,ilp-topo,genetic,blind] [--real paper8|none]

writes ``headline.md`` (tables), ``headline.png`` and ``.pdf`` (the ratios
drawn), ``rows.csv`` (one row per topology, load, seed and planner),
``calls.csv`` (every planner call's wall time) and ``config.json``
(provenance and every setting) to
``--out`` (default ``runs/headline-<time>``); progress goes to stderr.
``--render DIR`` redraws ``headline.md`` and the figure from those files alone: its settings line
as the run's config.json recorded them, not as today's code has them.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import inspect
import json
import math
import os
import statistics
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from spiderflow import placement
from spiderflow.bench import machine
from spiderflow.placement import genetic, ilp
from spiderflow.cliutil import (OneLineParser, dumps, float_in, make_output_dir, one_line_errors, output_dir,
                                write_output_file)
from spiderflow.errors import ConfigError
from spiderflow.provenance import provenance
from spiderflow.scheduling import DEFAULT_TIME_LIMIT_S
from spiderflow.simulate.engine import SimConfig, simulate
from spiderflow.simulate.floors import trace_floors
from spiderflow.simulate.metrics import SUMMARY_KEYS, summarise
from spiderflow.topology import Topology, load_topology
from spiderflow.traces import generate_trace, load_trace
from spiderflow.traces.generate import MAX_LOAD, mean_gap_for_load, offered_load
from spiderflow.traces.planned import PlannedGpuTime
from spiderflow.workload import Job

REPO = Path(__file__).resolve().parent.parent
GENETIC_TRIALS = inspect.signature(genetic.place_genetic).parameters["trials"].default  # DT-FM's 4,900
# planner label -> (strategy name, SpinSearch's topology-aware admission)
VARIANTS = {"spinsearch": ("spinsearch", True), "spinsearch-nowait": ("spinsearch", False),
            "ilp": ("ilp", True), "ilp-topo": ("ilp-topo", True), "genetic": ("genetic", True),
            "blind": ("blind", True)}
REFERENCE, ABLATION = "spinsearch", "spinsearch-nowait"
BASELINES = ("ilp", "ilp-topo", "genetic", "blind")
GOAL_BASELINES = ("ilp", "genetic")  # issue 15: >= 1.3x lower JCT, >= 1.25x throughput, no seed < 1.0x
GOAL_JCT, GOAL_THROUGHPUT, GOAL_FLOOR = 1.3, 1.25, 1.0
REAL_TRACE = REPO / "tests/traces/data/real/alibaba2023_openb_pod_list_default_3402-4310.csv"
REAL_SOURCE = ("Alibaba cluster-trace-gpu-v2023 (github.com/alibaba/clusterdata, commit 50a91c7c), pods "
               "openb-pod-3402..4310 of openb_pod_list_default.csv; Weng et al., \"Beware of Fragmentation: "
               "Scheduling GPU-Sharing Workloads with Fragmentation Gradient Descent\", USENIX ATC '23")
# Two-sided 95% quantiles of Student's t for 1..30 degrees of freedom (any statistics table, e.g. the
# NIST/SEMATECH e-Handbook of Statistical Methods, 1.3.6.7.2); the normal 1.96 beyond.
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
        2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
        2.045, 2.042)
ROW_KEYS = ("topology", "load", "seed", "planner", "offered_load", "mean_interarrival_s", *SUMMARY_KEYS,
            "planner_calls", "call_mean_s", "call_p95_s", "job_overhead_mean_s", "job_overhead_p95_s",
            "wall_s", "cpu_s")


@dataclass(frozen=True, kw_only=True)
class Case:
    """One trace to replay with every planner."""

    topology: str  # the topology's name
    load: str  # "0.7", or "real" for the Alibaba windows
    seed: int  # the generator's seed (the window's index for the real trace); also the planners' seed
    jobs: tuple[Job, ...]
    offered_load: float
    mean_interarrival_s: float


# ---------------------------------------------------------------- traces
def sizer_for(topo: Topology, _cache: dict = {}) -> PlannedGpuTime:  # noqa: B006 (one per topology)
    """What ``trace generate --topology T --load L`` sizes load by: each job's GPU-seconds as
    SpinSearch plans it alone on the empty topology (spiderflow/traces/planned.py)."""
    if topo.name not in _cache:
        _cache[topo.name] = PlannedGpuTime(topo)
    return _cache[topo.name]


def synthetic(topo: Topology, load: float, seed: int, jobs: int) -> Case:
    """``trace generate --topology T --load L --seed S --jobs N``, in process."""
    total, sizer = topo.total_gpus, sizer_for(topo)
    max_gpus = min(512, 1 << (total.bit_length() - 1))
    mean = mean_gap_for_load(jobs, seed, load, total_gpus=total, job_gpu_seconds=sizer, max_gpus=max_gpus)
    trace = generate_trace(jobs, seed, mean_interarrival_s=mean, max_gpus=max_gpus)
    return Case(topology=topo.name, load=f"{load:g}", seed=seed, jobs=trace,
                offered_load=offered_load(trace, total_gpus=total, job_gpu_seconds=sizer), mean_interarrival_s=mean)


def real_windows(topo: Topology, path: Path, jobs: int, windows: int) -> tuple[list[Case], list[str]]:
    """Disjoint windows of ``jobs`` consecutive jobs of the public trace (default mapping, as
    ``trace import`` does), from its start, arrivals rebased to each window's first; and the
    mapping's report (what each rule kept and dropped)."""
    load = load_trace(path)
    trace, cases = load.jobs, []
    for w in range(windows):
        part = trace[w * jobs:(w + 1) * jobs]
        if len(part) < max(2, jobs):
            break
        t0 = part[0].arrival_s
        part = tuple(dataclasses.replace(j, arrival_s=j.arrival_s - t0) for j in part)
        span = part[-1].arrival_s
        cases.append(Case(topology=topo.name, load="real", seed=w, jobs=part,
                          offered_load=offered_load(part, total_gpus=topo.total_gpus, job_gpu_seconds=sizer_for(topo)),
                          mean_interarrival_s=span / (len(part) - 1)))
    return cases, list(load.report)


def floors(topo: Topology, case: Case) -> dict:
    """Bounds on ``case`` for a planner whose plans are no faster than SpinSearch's for each job alone on
    the empty topology (the sizing's plans; in `bench planner` as fast as or faster than each plan
    `ilp-topo` proved optimal): ``spiderflow.simulate.floors.trace_floors``. Every job runs on that plan
    from its arrival or later, with no other job's load and no overhead, where the only queue kept is
    behind a job that cannot share the topology with any other (e.g. a 128-GPU run on paper8: the jobs
    arriving during it wait for it, or it for them). The least avg JCT of such schedules is a floor under
    avg JCT, the least span from the first arrival to the last end a floor under the makespan, and every
    job's tokens over that span a ceiling on throughput (all jobs done). ``jct_floor_alone_s``: the floor
    without even that queue (the mean run alone); ``jct_no_foresight_s``: the same minimum where such a job
    is never held back for one that has not arrived yet (a reference, not a floor: ``schedule_floors``). A
    job no plan fits is left out (every planner rejects it)."""
    return trace_floors(case.jobs, sizer_for(topo)) or {}


# ---------------------------------------------------------------- runs
@contextlib.contextmanager
def timed_planner(name: str, calls: list[tuple[str, float]]) -> Iterator[None]:
    """Each call of planner ``name`` appends (job id, wall time) to ``calls`` while in the block (the
    registry entry is swapped for a timing wrapper and restored; the scheduler looks it up by name,
    so SpinSearch keeps its admission). One job's decision may make several calls (SpinSearch's
    look-ahead; a retry after a placement that did not fit)."""
    strategy = placement.PLANNERS[name]

    def timed(req):
        t0 = time.perf_counter()
        try:
            return strategy(req)
        finally:
            calls.append((req.job.job_id, time.perf_counter() - t0))

    placement.PLANNERS[name] = timed
    try:
        yield
    finally:
        placement.PLANNERS[name] = strategy


def p95(xs: Sequence[float]) -> float | None:
    """Nearest-rank 95th percentile (as spiderflow.simulate.metrics does)."""
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, math.ceil(0.95 * len(xs)) - 1))]


def replay(topo: Topology, case: Case, label: str) -> dict:
    """One row: ``case`` replayed with planner ``label`` at the defaults, overhead charged."""
    name, wait = VARIANTS[label]
    cfg = SimConfig(planner=name, wait=wait, charge_overhead=True, seed=case.seed)
    timed: list[tuple[str, float]] = []
    placement.clear_memos()  # a fresh scheduler: nothing planned by sizing, another planner or another case
    wall0, cpu0 = time.perf_counter(), time.process_time()
    with timed_planner(name, timed):
        records = simulate(topo, case.jobs, cfg)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    calls = [s for _, s in timed]
    jobs = list(per_job(timed).values())
    return {"topology": case.topology, "load": case.load, "seed": case.seed, "planner": label,
            "offered_load": case.offered_load, "mean_interarrival_s": case.mean_interarrival_s,
            **summarise(records, topo.total_gpus), "planner_calls": len(calls),
            "call_mean_s": statistics.fmean(calls) if calls else None, "call_p95_s": p95(calls),
            "job_overhead_mean_s": statistics.fmean(jobs) if jobs else None,
            "job_overhead_p95_s": p95(jobs), "wall_s": wall, "cpu_s": cpu,
            "_calls": timed}  # raw (job id, seconds) of every call: calls.csv and the pooled figures


# ---------------------------------------------------------------- statistics
def log_interval(ratios: Sequence[float]) -> tuple[float, float | None, float | None]:
    """Geometric mean of ``ratios`` and its 95% t-interval, computed on their logs (None for one value)."""
    logs = [math.log(r) for r in ratios]
    mean = statistics.fmean(logs)
    if len(logs) < 2:
        return math.exp(mean), None, None
    half = (T975[len(logs) - 2] if len(logs) - 1 <= len(T975) else 1.96) * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def ratio_rows(rows: Sequence[dict], reference: str = REFERENCE,
               others: Sequence[str] = BASELINES) -> list[dict]:
    """Per (topology, load, other planner): per-seed ratios other's JCT / reference's and reference's
    throughput / other's, their geometric mean, 95% interval and minimum. Seeds where either has
    no value (no job completed) are left out and counted."""
    by = {(r["topology"], r["load"], r["seed"], r["planner"]): r for r in rows}
    cells = list(dict.fromkeys((r["topology"], r["load"]) for r in rows))
    out = []
    for topo, load in cells:
        seeds = sorted({s for (t, l, s, _p) in by if (t, l) == (topo, load)})
        for other in others:
            jct, thr, missing = [], [], 0
            for s in seeds:
                ref, b = by.get((topo, load, s, reference)), by.get((topo, load, s, other))
                if ref is None or b is None:
                    continue
                if None in (ref["avg_jct_s"], b["avg_jct_s"], ref["throughput_tokens_per_s"],
                            b["throughput_tokens_per_s"]):
                    missing += 1
                    continue
                jct.append(b["avg_jct_s"] / ref["avg_jct_s"])
                thr.append(ref["throughput_tokens_per_s"] / b["throughput_tokens_per_s"])
            if not jct:
                continue
            j, jlo, jhi = log_interval(jct)
            t, tlo, thi = log_interval(thr)
            out.append({"topology": topo, "load": load, "reference": reference, "other": other, "seeds": len(jct),
                        "missing": missing, "jct": j, "jct_lo": jlo, "jct_hi": jhi, "jct_min": min(jct),
                        "thr": t, "thr_lo": tlo, "thr_hi": thi, "thr_min": min(thr),
                        "jct_by_seed": jct, "thr_by_seed": thr})
    return out


def _short_of(x: float, target: float) -> str:
    """``x`` (below ``target``) with two decimals, or three where two would round it up to the target."""
    return f"{x:.2f}x" if round(x, 2) < target else f"{x:.3f}x"


def goal(r: dict, ceiling: dict | None = None) -> str:
    """Whether a row of :func:`ratio_rows` meets issue 15's goal, and by how much it misses; where the
    baseline's ``ceiling`` (:func:`ceiling_rows`) is below a target, no planner could meet it there; where only
    the baseline's avg JCT over the reference without foresight is below the JCT target, both are given."""
    short = []
    beyond = (lambda key, target: f" (ceiling {ceiling[key]:.2f}x)" if ceiling and ceiling[key] < target else "")
    if r["jct"] < GOAL_JCT:
        no_foresight = ceiling.get("jct_no_foresight") if ceiling else None
        short.append(f"JCT {_short_of(r['jct'], GOAL_JCT)} < {GOAL_JCT}x" + (
            f" (ceiling {ceiling['jct']:.2f}x, {no_foresight:.2f}x without foresight)"
            if no_foresight is not None and no_foresight < GOAL_JCT <= ceiling["jct"] else beyond("jct", GOAL_JCT)))
    if r["thr"] < GOAL_THROUGHPUT:
        short.append(f"thr {_short_of(r['thr'], GOAL_THROUGHPUT)} < {GOAL_THROUGHPUT}x"
                     + beyond("thr", GOAL_THROUGHPUT))
    if min(r["jct_min"], r["thr_min"]) < GOAL_FLOOR:
        short.append(f"a seed at {min(r['jct_min'], r['thr_min']):.2f}x")
    return "met" if not short else "missed: " + "; ".join(short)


# ---------------------------------------------------------------- tables
def _x(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f}"


def _ms(v: float | None) -> str:
    return "n/a" if v is None else f"{v * 1e3:.1f}"


def ratio_table(ratios: Sequence[dict], with_goal: bool = True, ceilings: Sequence[dict] = ()) -> str:
    ceiling = {(c["topology"], c["load"], c["planner"]): c for c in ceilings}
    lines = ["| topology | load | vs | seeds | avg JCT x (geo-mean) | 95% CI | min | throughput x (geo-mean) "
             "| 95% CI | min |" + (" issue 15 goal |" if with_goal else ""),
             "|---|---|---|---:|---:|---|---:|---:|---|---:|" + ("---|" if with_goal else "")]
    for r in ratios:
        ci = (lambda lo, hi: "n/a" if lo is None else f"{lo:.2f}-{hi:.2f}")
        g = ((goal(r, ceiling.get((r["topology"], r["load"], r["other"]))) if r["other"] in GOAL_BASELINES
              else "") if with_goal else None)
        lines.append(f"| {r['topology']} | {r['load']} | {r['other']} | {r['seeds']} | {_x(r['jct'])} | "
                     f"{ci(r['jct_lo'], r['jct_hi'])} | {_x(r['jct_min'])} | {_x(r['thr'])} | "
                     f"{ci(r['thr_lo'], r['thr_hi'])} | {_x(r['thr_min'])} |" + (f" {g} |" if with_goal else ""))
    return "\n".join(lines)


def per_job(calls: Sequence[tuple[str, float]]) -> dict[str, float]:
    """Seconds of planner calls per job (all its attempts): the overhead charged to its start."""
    out: dict[str, float] = {}
    for job_id, sec in calls:
        out[job_id] = out.get(job_id, 0.0) + sec
    return out


def overhead_table(rows: Sequence[dict]) -> str:
    """Per topology and planner, pooled over its loads and seeds: every planner call, every placed job."""
    lines = ["| topology | planner | planner calls | mean per call (ms) | p95 per call (ms) | mean per job (ms) "
             "| p95 per job (ms) | replay wall (s) |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for topo, planner in dict.fromkeys((r["topology"], r["planner"]) for r in rows):
        mine = [r for r in rows if (r["topology"], r["planner"]) == (topo, planner)]
        calls = [s for r in mine for _, s in r["_calls"]]
        jobs = [s for r in mine for s in per_job(r["_calls"]).values()]
        lines.append(f"| {topo} | {planner} | {len(calls)} | {_ms(statistics.fmean(calls) if calls else None)} | "
                     f"{_ms(p95(calls))} | {_ms(statistics.fmean(jobs) if jobs else None)} | {_ms(p95(jobs))} | "
                     f"{sum(r['wall_s'] for r in mine):.1f} |")
    return "\n".join(lines)


def ceiling_rows(rows: Sequence[dict], cases: Sequence[dict]) -> list[dict]:
    """Per (topology, load, planner): over seeds, the geometric mean of the planner's avg JCT / the case's
    floor and of the case's throughput ceiling / the planner's throughput (:func:`floors`; 1 = at the floor),
    and of its avg JCT / the reference without foresight where the cases have one (``jct_no_foresight``, else
    None: ``trace_floors``; not a floor, so a baseline's figure there says how far it is from what is reachable
    without holding a job back for jobs yet to arrive, not a bound).
    A baseline's figure is also the largest ratio any planner could show against it there."""
    floor = {(c["topology"], c["load"], c["seed"]): c for c in cases if "jct_floor_s" in c}
    by: dict[tuple, list[tuple[float, float, float | None]]] = {}  # (topology, load, planner) -> per seed
    for r in rows:
        f = floor.get((r["topology"], r["load"], r["seed"]))
        if f is not None and r["avg_jct_s"] and r["throughput_tokens_per_s"]:
            jct = r["avg_jct_s"] / f["jct_floor_s"]
            thr = f["throughput_ceiling_tokens_per_s"] / r["throughput_tokens_per_s"]
            no_foresight = r["avg_jct_s"] / f["jct_no_foresight_s"] if "jct_no_foresight_s" in f else None
            by.setdefault((r["topology"], r["load"], r["planner"]), []).append((jct, thr, no_foresight))
    return [{"topology": topo, "load": load, "planner": planner, "seeds": len(xs),
             "jct": log_interval([j for j, _, _ in xs])[0], "thr": log_interval([t for _, t, _ in xs])[0],
             "jct_no_foresight": None if any(o is None for _, _, o in xs) else log_interval([o for _, _, o in xs])[0]}
            for (topo, load, planner), xs in by.items()]


def ceiling_table(ceilings: Sequence[dict], ratios: Sequence[dict]) -> str:
    """SpinSearch's distance to the floors, and per baseline the ratio shown against the most any planner could."""
    mine = {(c["topology"], c["load"], c["planner"]): c for c in ceilings}
    three = (lambda v: "n/a" if v is None else f"{v:.3f}")
    lines = ["| topology | load | vs | SpinSearch avg JCT / floor | baseline's | JCT x shown | JCT x ceiling "
             "| SpinSearch avg JCT / reference without foresight | baseline's: JCT x reachable without foresight "
             "| SpinSearch throughput: ceiling / it | baseline's | throughput x shown | throughput x ceiling |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in ratios:
        ref = mine.get((r["topology"], r["load"], r["reference"]))
        b = mine.get((r["topology"], r["load"], r["other"]))
        if ref is None or b is None:
            continue
        lines.append(f"| {r['topology']} | {r['load']} | {r['other']} | {ref['jct']:.3f} | {b['jct']:.3f} | "
                     f"{_x(r['jct'])} | {_x(b['jct'])} | {three(ref['jct_no_foresight'])} | "
                     f"{_x(b['jct_no_foresight'])} | "
                     f"{ref['thr']:.3f} | {b['thr']:.3f} | {_x(r['thr'])} | {_x(b['thr'])} |")
    return "\n".join(lines)


def ratio_figure(ratios: Sequence[dict], stem: Path, ceilings: Sequence[dict] = (), title: str = "") -> list[tuple]:
    """``stem``.png and .pdf: per (topology, load) and baseline, the geometric mean ratio with its 95% interval
    (bars), each seed's ratio (faint dots) and the ceiling any planner could show there (a short dash), for
    avg JCT (top) and throughput (bottom), log scale, the goal's targets dashed. Returns the points drawn:
    (metric, topology, load, baseline, geometric mean, interval low, high, ceiling or None)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    cells = list(dict.fromkeys((r["topology"], r["load"]) for r in ratios))
    others = list(dict.fromkeys(r["other"] for r in ratios))
    by = {(r["topology"], r["load"], r["other"]): r for r in ratios}
    ceiling = {(c["topology"], c["load"], c["planner"]): c for c in ceilings}
    width = 0.8 / max(1, len(others))
    drawn = []
    fig, axes = plt.subplots(2, 1, figsize=(max(8.0, 0.9 * len(cells) + 2), 7.0), dpi=150, sharex=True)
    for ax, (key, label, target) in zip(axes, (("jct", "avg JCT: baseline / SpinSearch", GOAL_JCT),
                                               ("thr", "throughput: SpinSearch / baseline", GOAL_THROUGHPUT))):
        for k, other in enumerate(others):
            colour = f"C{k}"
            for x, cell in enumerate(cells):
                r = by.get((*cell, other))
                if r is None:
                    continue
                pos = x - 0.4 + width * (k + 0.5)
                lo, hi = r[f"{key}_lo"], r[f"{key}_hi"]
                err = [[r[key] - lo], [hi - r[key]]] if lo is not None else None
                ax.errorbar([pos], [r[key]], yerr=err, fmt="o", color=colour, markersize=4, capsize=2,
                            label=other if x == 0 else None)
                ax.plot([pos + width / 4] * len(r[f"{key}_by_seed"]), r[f"{key}_by_seed"], ".", color=colour,
                        alpha=0.4, markersize=3)
                top = ceiling.get((cell[0], cell[1], other))
                if top is not None:
                    ax.plot([pos], [top[key]], "_", color=colour, markersize=9, markeredgewidth=1.5)
                drawn.append((key, cell[0], cell[1], other, r[key], lo, hi, None if top is None else top[key]))
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.axhline(target, color="grey", linestyle="--", linewidth=0.8)
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(FixedLocator(sorted([0.25, 0.5, 0.7, 1, target, 2, 3, 5, 10, 20, 50])))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}x"))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.tick_params(axis="y", labelsize=7)
        ax.set_ylabel(f"{label} (log)", fontsize=8)
        ax.grid(True, axis="y", which="both", alpha=0.3)
    axes[0].legend(fontsize=7, ncol=len(others), loc="upper left")
    key = ["dots: seeds; bars: 95% interval of the geometric mean;",
           "dashes: the ceiling any planner could show; dashed line: issue 15's goal"]
    axes[0].set_title("\n".join([*textwrap.wrap(title, 100), *key]), fontsize=8)
    axes[1].set_xticks(range(len(cells)), [f"{t}\n{load}" for t, load in cells], fontsize=7)
    fig.tight_layout()
    fig.savefig(stem.with_suffix(".png"))
    fig.savefig(stem.with_suffix(".pdf"), metadata={"CreationDate": None})  # the same bytes when drawn again
    plt.close(fig)
    return drawn


def write_figure(out: Path, rows: Sequence[dict], config: dict) -> list[tuple]:
    """``out``/headline.png and .pdf (:func:`ratio_figure`) of the run's ratios against the baselines."""
    return ratio_figure(ratio_rows(rows), out / "headline", ceiling_rows(rows, config.get("cases", [])),
                        config["command"] + (f" at {config['git_commit'][:7]}" if config.get("git_commit") else ""))


def completion_table(rows: Sequence[dict]) -> str:
    lines = ["| topology | load | planner | completed / jobs (all seeds) | rejected | offered load (mean) "
             "| avg JCT (h, mean over seeds) | throughput (tokens/s, mean over seeds) |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    for topo, load, planner in dict.fromkeys((r["topology"], r["load"], r["planner"]) for r in rows):
        mine = [r for r in rows if (r["topology"], r["load"], r["planner"]) == (topo, load, planner)]
        jct = [r["avg_jct_s"] for r in mine if r["avg_jct_s"] is not None]
        thr = [r["throughput_tokens_per_s"] for r in mine if r["throughput_tokens_per_s"] is not None]
        done, jobs = sum(r["completed"] for r in mine), sum(r["jobs"] for r in mine)
        offered = statistics.fmean(r["offered_load"] for r in mine)
        lines.append(f"| {topo} | {load} | {planner} | {done}/{jobs} "
                     f"| {sum(r['rejected'] for r in mine)} | {offered:.2f} | "
                     f"{statistics.fmean(jct) / 3600 if jct else float('nan'):.2f} | "
                     f"{statistics.fmean(thr) if thr else float('nan'):.4g} |")
    return "\n".join(lines)


# The shared scheduler's queue as this code runs it (config.json's sim.queue; the settings line reads the run's record)
QUEUE = ("FIFO, where SpinSearch's admission lets a head too big for the free GPUs reserve its best ones instead, "
         "EASY backfill")
QUEUE_UNRECORDED = "queue discipline not recorded in this run's config.json"


def ilp_pool() -> dict:
    """`ilp`'s pool as this code builds it, for config.json: a setting of the baseline that moves its rows."""
    return {"size": ilp.POOL_SIZE, "gap": ilp.POOL_GAP, "budget": "as many as the decision's time limit allows"}


def pool_text(pool: dict | None) -> str:
    """The settings line's words for `ilp`'s pool as the run's config.json records it (not today's code's)."""
    if pool is None:
        return "`ilp`'s and `ilp-topo`'s pool of MILP chains is not recorded in this run's config.json"
    return (f"`ilp` and `ilp-topo` score a pool of up to {pool['size']} MILP chains within {pool['gap']:.0%} of "
            f"the optimum, {pool['budget']}")


def markdown(rows: Sequence[dict], config: dict, wall_s: float) -> str:
    """headline.md from the rows and the run's config.json: the settings line describes the code as it ran."""
    sim = config["sim"]
    ratios = ratio_rows(rows)
    ablation = ratio_rows(rows, reference=REFERENCE, others=(ABLATION,))
    parts = [
        "# Headline with error bars (simulated trace replay)", "",
        f"Command: `{config['command']}`", "",
        f"Machine: {config['machine']}, run on CPU(s) {config['cpus_allowed']}; "
        f"load average {config['loadavg_start']:.2f} at start, "
        f"{config['loadavg_end']:.2f} at the end. Benchmark wall time {wall_s / 60:.1f} min "
        f"({wall_s:.0f} s), CPU {config['cpu_s']:.0f} s. Commit {config['git_commit']}"
        + (f", with uncommitted changes to {', '.join(config['uncommitted'])}" if config.get("uncommitted") else "")
        + ".", "",
        f"Settings: every planner at the shared scheduler's defaults ({sim.get('queue', QUEUE_UNRECORDED)}; "
        "ILP time limit "
        f"{sim['time_limit_s']:g} s per decision, in which {pool_text(sim.get('ilp_pool'))}; genetic's default "
        f"{sim['genetic_trials']:,} trials), "
        "scheduling overhead charged "
        "(`SimConfig(charge_overhead=True)`), each replay starting with the planners' memos cleared; "
        "synthetic traces from `generate_trace` with arrivals sized to the "
        "offered load (`trace generate --topology T --load L --seed S --jobs N`), the seed also the planners' seed. "
        f"Seeds: {config['seeds']}; jobs per trace: {config['jobs']}.", "",
        "Ratios: per seed, the baseline's avg JCT / SpinSearch's and SpinSearch's throughput (tokens/s) / the "
        "baseline's, so > 1 means SpinSearch is better; over seeds the geometric mean, a 95% Student-t interval "
        "on the log ratios (mean +- t(0.975, n-1) sd / sqrt(n), exponentiated), and the minimum. Goal (issue 15, "
        f"against {' and '.join(GOAL_BASELINES)}): JCT >= {GOAL_JCT}x and throughput >= {GOAL_THROUGHPUT}x "
        f"(geometric mean), no seed below {GOAL_FLOOR}x.", "",
    ]
    if config.get("note"):
        parts += ["## Sizing", "", config["note"], ""]
    if config.get("real"):
        parts += [f"Load `real`: windows of {config['real']['jobs']} consecutive jobs of the real sample "
                  f"({REAL_SOURCE}), default mapping (`trace import`), each window's arrivals as traced (rebased "
                  f"to its first job), replayed on {config['real']['topology']}; the 'seed' is the window.", ""]
    placement_only = ratio_rows(rows, reference=ABLATION)
    ceilings = ceiling_rows(rows, config.get("cases", []))
    parts += ["## SpinSearch vs the baselines", "", ratio_table(ratios, ceilings=ceilings), "",
              "`headline.png` (and `.pdf`) draws these ratios: each seed's, the geometric mean with its interval "
              "and the ceiling below.", ""]
    if ceilings:
        parts += ["## How far from what any planner could show", "",
                  "Floors per trace (`floors` in benchmarks/headline.py, in config.json's cases): every job run on "
                  "SpinSearch's plan for it alone on the empty topology, from its arrival or later, with no other "
                  "job's load and no overhead, where the only queue kept is a job that cannot share the topology "
                  "with any other (a 128-GPU run on paper8's 128 GPUs: the jobs arriving during it wait for its "
                  "end, or it for theirs; `spiderflow.simulate.floors`); every other job runs from its arrival. "
                  "The avg JCT floor is the least mean JCT of such schedules, the throughput ceiling every job's "
                  "tokens over the least span from the first arrival to the last end (both offline minima: they "
                  "may hold a long run back for jobs that have not arrived yet, which no online scheduler can). "
                  "The reference without foresight is the same minimum over the schedules that never do: such a "
                  "job starts at its earliest start or as jobs that had arrived by then end, before any such job "
                  "that arrived later. It is not a floor (contention moves those times in a real replay): it says "
                  "how far a planner is from what is reachable without foresight. Per "
                  "planner the geometric mean over seeds of its avg JCT / the floor and of the ceiling / its "
                  "throughput (1 = at the floor; a plan alone is a prediction, so a replay can land a little "
                  "under 1). A baseline's figure is the largest ratio any planner could show against it there "
                  "(the ceiling), beside the ratio SpinSearch shows.", "",
                  ceiling_table(ceilings, ratios), ""]
    if placement_only:
        parts += ["## SpinSearch without admission vs the baselines", "",
                  "The same ratios against `spinsearch-nowait`: placement, plans and overhead alone, every "
                  "planner starting a job as soon as it can.", "", ratio_table(placement_only, with_goal=False), ""]
    parts += ["## SpinSearch's topology-aware admission (with / without)", "",
              "JCT x: without admission's avg JCT / with; throughput x: with / without.", "",
              ratio_table(ablation, with_goal=False), "",
              "## Scheduling overhead per planner", "",
              "Per call: one planner invocation (SpinSearch's admission makes up to 4 per decision: now and at "
              "the next 3 expected ends). Per job: all calls for that job (every attempt), what its start is "
              "charged. Pooled over the topology's loads and seeds (the real-trace windows included); every "
              "call in calls.csv.", "",
              overhead_table(rows), "",
              "## Completed jobs and raw means", "", completion_table(rows), ""]
    return "\n".join(parts)


# ---------------------------------------------------------------- driver
def uncommitted() -> list[str] | None:
    """Files that differ from the commit in provenance (``git status --porcelain``; None without git):
    the library records the commit only, and a benchmark may run on a tree with edits."""
    try:
        done = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                              capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return [line[3:] for line in done.stdout.splitlines()]


def write_rows(rows: Sequence[dict], path: Path) -> None:
    """rows.csv: :data:`ROW_KEYS`, floats as ``repr`` (they read back exactly)."""
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=ROW_KEYS)
        w.writeheader()
        for row in rows:
            w.writerow({k: (repr(v) if isinstance(v, float) else v) for k, v in row.items() if k in ROW_KEYS})


INT_KEYS = ("seed", "jobs", "completed", "rejected", "planner_calls")
TEXT_KEYS = ("topology", "load", "planner")


def read_results(out: Path) -> tuple[list[dict], dict]:
    """rows (with their calls) and config of a finished run, as :func:`run_benchmark` had them."""
    calls: dict[tuple, list] = {}
    with open(out / "calls.csv", newline="") as fh:
        for c in csv.DictReader(fh):
            key = (c["topology"], c["load"], int(c["seed"]), c["planner"])
            calls.setdefault(key, []).append((c["job_id"], float(c["call_s"])))
    rows = []
    with open(out / "rows.csv", newline="") as fh:
        for r in csv.DictReader(fh):
            row = {k: (v if k in TEXT_KEYS else None if v == "" else int(v) if k in INT_KEYS else float(v))
                   for k, v in r.items()}
            row["_calls"] = calls.get((row["topology"], row["load"], row["seed"], row["planner"]), [])
            rows.append(row)
    return rows, json.loads((out / "config.json").read_text())


def counts(text: str, what: str) -> tuple[int, dict[str, int]]:
    """``"5"`` or ``"5,geo64=3"``: a default and per-topology overrides."""
    default, over = None, {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        name, _, value = item.rpartition("=")
        try:
            n = int(value)
        except ValueError:
            raise SystemExit(f"--{what}: {item!r} is not N or TOPOLOGY=N") from None
        if n < 1 or (what == "jobs" and n < 2):
            raise SystemExit(f"--{what}: {item!r} must be at least {2 if what == 'jobs' else 1}")
        if name:
            over[name] = n
        else:
            default = n
    if default is None:
        raise SystemExit(f"--{what}: give a default N (e.g. 5 or 5,geo64=3)")
    return default, over


def run_benchmark(out: Path, *, seeds: tuple[int, dict[str, int]], jobs: tuple[int, dict[str, int]],
                  topologies: Sequence[str], loads: Sequence[float], planners: Sequence[str],
                  real: str | None = None, note: str = "", argv: list[str] | None = None,
                  log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True)) -> dict:
    """Replay every case with every planner; write headline.md, rows.csv and config.json to ``out``.
    Returns {"rows", "ratios", "ablation", "config"}."""
    for p in planners:
        if p not in VARIANTS:
            raise SystemExit(f"--planners: unknown {p!r}; known: {', '.join(VARIANTS)}")
    if REFERENCE not in planners:
        raise SystemExit(f"--planners must include {REFERENCE} (every ratio is against it)")
    wall0, cpu0, load0 = time.perf_counter(), time.process_time(), os.getloadavg()[0]
    started = {**provenance(argv), "uncommitted": uncommitted()}  # the code as it was when the run began
    topos = {t: load_topology(t) for t in topologies}
    cases: list[tuple[Topology, Case]] = []
    def sized(path: str, topo: Topology) -> tuple[int, int]:
        """(seeds, jobs) for a topology: an override by its name or its file's stem, else the default."""
        keys = (topo.name, Path(path).stem)
        return (next((seeds[1][k] for k in keys if k in seeds[1]), seeds[0]),
                next((jobs[1][k] for k in keys if k in jobs[1]), jobs[0]))

    for path, topo in topos.items():
        n_seeds, n_jobs = sized(path, topo)
        cases += [(topo, synthetic(topo, load, s, n_jobs)) for load in loads for s in range(n_seeds)]
    real_cfg = None
    if real:
        topo = next((t for t in topos.values() if t.name == real), None) or load_topology(real)
        n_seeds, n_jobs = sized(real, topo)
        windows, report = real_windows(topo, REAL_TRACE, n_jobs, n_seeds)
        cases += [(topo, c) for c in windows]
        real_cfg = {"topology": topo.name, "trace": str(REAL_TRACE.relative_to(REPO)), "jobs": n_jobs,
                    "windows": len(windows), "source": REAL_SOURCE, "mapping": "default (trace import)",
                    "mapping_report": report}
    total = len(cases) * len(planners)
    out = make_output_dir(out)
    rows = []
    for topo, case in cases:
        for label in planners:
            row = replay(topo, case, label)
            rows.append(row)
            write_rows(rows, out / "rows.csv")  # as measured: an interrupted run keeps its rows
            log(f"[{len(rows)}/{total}] {case.topology} load {case.load} seed {case.seed} {label}: "
                f"{row['completed']}/{row['jobs']} done, avg JCT {_x((row['avg_jct_s'] or math.nan) / 3600)} h, "
                f"{row['planner_calls']} calls, mean {_ms(row['call_mean_s'])} ms; {row['wall_s']:.1f} s "
                f"(elapsed {time.perf_counter() - wall0:.0f} s)")
    wall = time.perf_counter() - wall0
    config = {**started,
              "command": " ".join(["python", "benchmarks/headline.py", *(argv or [])[1:]]),
              "machine": machine(), "cpus_allowed": sorted(os.sched_getaffinity(0)),
              "loadavg_start": load0, "loadavg_end": os.getloadavg()[0],
              "wall_s": wall, "cpu_s": time.process_time() - cpu0,
              "topologies": {t: topos[t].name for t in topologies}, "loads": list(loads),
              "seeds": {"default": seeds[0], **seeds[1]}, "jobs": {"default": jobs[0], **jobs[1]},
              "planners": {p: {"planner": VARIANTS[p][0], "wait": VARIANTS[p][1]} for p in planners},
              "sim": {"charge_overhead": True, "overhead_scale": 1.0, "backfill": False,
                      "time_limit_s": DEFAULT_TIME_LIMIT_S, "search_budget": None, "genetic_trials": GENETIC_TRIALS,
                      "ilp_pool": ilp_pool(), "queue": QUEUE,
                      "calibration": None, "exact": False, "seed": "the trace's seed (the window's index)",
                      "memos": "cleared before each replay (spiderflow.placement.clear_memos)"},
              "trace": {"generator": "spiderflow.traces.generate_trace", "arrival": "poisson",
                        "load_sizing": "mean_gap_for_load over the topology's GPUs, each job's GPU-seconds as "
                                       "SpinSearch plans it alone on the empty topology (PlannedGpuTime); max_gpus = min(512, GPUs rounded down to a power of 2)"},
              "real": real_cfg, "note": note,
              "cases": [{"topology": c.topology, "load": c.load, "seed": c.seed, "jobs": len(c.jobs),
                         "offered_load": c.offered_load, "mean_interarrival_s": c.mean_interarrival_s,
                         **floors(t, c)}
                        for t, c in cases]}
    with open(out / "calls.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(("topology", "load", "seed", "planner", "job_id", "call_s"))
        for row in rows:
            for job_id, s in row["_calls"]:
                w.writerow((row["topology"], row["load"], row["seed"], row["planner"], job_id, repr(s)))
    (out / "config.json").write_text(dumps(config) + "\n")
    (out / "headline.md").write_text(markdown(rows, config, wall))
    write_figure(out, rows, config)
    log(f"wrote {out}/headline.md, headline.png and .pdf, rows.csv, calls.csv, config.json ({wall:.0f} s)")
    return {"rows": rows, "ratios": ratio_rows(rows), "ablation": ratio_rows(rows, others=(ABLATION,)),
            "config": config}


def load_list(text: str) -> list[float]:
    """argparse type for ``--loads``: offered loads, comma-separated, each in (0, 2]."""
    one = float_in(0.0, MAX_LOAD)
    try:
        return [one(x) for x in text.split(",") if x.strip()] or [one("")]
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"must be offered loads, comma-separated, each in (0, {MAX_LOAD:g}] "
                                         f"(got {text!r})") from None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv if argv is None else argv)
    ap = OneLineParser(prog="benchmarks/headline.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=output_dir, default=None, help="results directory (default runs/headline-<time>)")
    ap.add_argument("--seeds", default="5", help="trace seeds 0..N-1 (real-trace windows): N, or N,TOPOLOGY=M, "
                                                 "TOPOLOGY a name or file stem (default %(default)s)")
    ap.add_argument("--jobs", default="15,geo64=6", help="jobs per trace (window): N, or N,TOPOLOGY=M "
                                                         "(default %(default)s)")
    ap.add_argument("--topologies", default="topologies/paper8.yaml,topologies/geo64.yaml")
    ap.add_argument("--loads", type=load_list, default="0.5,0.7,0.9", help="offered loads (default %(default)s)")
    ap.add_argument("--planners", default=",".join(VARIANTS), help="from " + ", ".join(VARIANTS))
    ap.add_argument("--real", default="paper8", help="topology (name or file) for the real-trace windows, or "
                                                     "'none' (default %(default)s)")
    ap.add_argument("--note", default="", help="text for headline.md's Sizing section (or @FILE)")
    ap.add_argument("--render", type=Path, metavar="DIR",
                    help="only rewrite DIR/headline.md and its figure from its rows.csv, calls.csv and config.json "
                         "(with --note: that note instead of the recorded one, recorded in its place)")
    args = ap.parse_args(argv[1:])
    return one_line_errors(lambda: _main(args, argv))


def _main(args: argparse.Namespace, argv: list[str]) -> None:
    note = args.note
    if note.startswith("@"):
        try:
            note = Path(note[1:]).read_text().strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"--note {args.note}: cannot read ({getattr(exc, 'strerror', None) or exc})") from None
    if args.render:
        try:
            rows, config = read_results(args.render)
            text = markdown(rows, config if not note else {**config, "note": note}, config["wall_s"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            why = getattr(exc, "strerror", None) or (f"no {exc}" if isinstance(exc, KeyError) else exc)
            raise ConfigError(f"--render {args.render}: cannot read a run's results ({why}); "
                              "give a directory this benchmark wrote") from None
        if note and note != config.get("note"):  # recorded, so that a later --render keeps it
            write_output_file(args.render / "config.json", dumps({**config, "note": note}) + "\n", "--render")
        write_output_file(args.render / "headline.md", text, "--render")
        write_figure(args.render, rows, config)
        print(f"wrote {args.render}/headline.md, headline.png and .pdf", file=sys.stderr)
        return
    out = Path(args.out) if args.out else REPO / "runs" / time.strftime("headline-%Y%m%d-%H%M%S")
    real = None if args.real == "none" else (str(REPO / "topologies" / f"{args.real}.yaml")
                                             if "/" not in args.real and not args.real.endswith(".yaml")
                                             else args.real)
    topologies = [t.strip() for t in args.topologies.split(",") if t.strip()]
    run_benchmark(out, seeds=counts(args.seeds, "seeds"), jobs=counts(args.jobs, "jobs"), topologies=topologies,
                  loads=args.loads, planners=[p.strip() for p in args.planners.split(",") if p.strip()], real=real,
                  note=note, argv=argv)


if __name__ == "__main__":
    sys.exit(main())
