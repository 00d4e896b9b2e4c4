"""``python -m spiderflow bench planner``: scheduling overhead and plan quality per planner.

For each cluster count N: one generated topology (``generate_topology(N, seed)``),
a background of running jobs (a third of the GPUs taken at random, and 1-3
competing flows on a quarter of the WAN links), and ``jobs`` jobs (GPT-3 1.3B to
Llama-2 70B, 8 to 512 GPUs, never more than half the free GPUs). Every planner
places and plans every job against the same state, each decision cold: the planners' memos
(process-wide, and shared: every planner plans its placements with TPA) are cleared before each,
so no decision is answered from another planner's work or an earlier job's. Per planner and N:
median / p95 wall time of the decision, and the predicted iteration time of its
plan on the full-knowledge view (current load included), both also as ratios to
SpinSearch's (geometric mean over the jobs both planned).
"""

from __future__ import annotations

import csv
import datetime as dt
import math
import os
import platform
import random
import statistics
from dataclasses import dataclass
from pathlib import Path

from spiderflow.errors import InfeasiblePlan
from spiderflow.placement import PLANNERS, PlacementRequest, clear_memos, run_planner
from spiderflow.topology import Topology
from spiderflow.topology.generate import generate_topology
from spiderflow.workload import Job

BENCH_MODELS = ("gpt3-1.3b", "gpt3-6.7b", "gpt3-13b", "llama2-7b", "llama2-13b", "llama2-70b")
BENCH_GPUS = (8, 16, 32, 64, 128, 256, 512)


@dataclass(frozen=True)
class Row:
    clusters: int
    job: str
    model: str
    gpus: int
    planner: str
    status: str
    overhead_s: float
    iteration_s: float  # nan when the planner found no plan


def background(topo: Topology, rng: random.Random) -> tuple[dict[str, int], dict[tuple[str, str], float]]:
    free = {c.name: c.total_gpus - rng.randrange(0, c.total_gpus // 3 + 1, 8) for c in topo.clusters}
    load = {l.key: float(rng.randint(1, 3)) for l in topo.links if rng.random() < 0.25}
    return free, load


def bench_jobs(free: dict[str, int], n: int, rng: random.Random) -> list[Job]:
    cap = sum(free.values()) // 2
    jobs = []
    for i in range(n):
        gpus = min(rng.choice(BENCH_GPUS), max(8, cap - cap % 8))
        jobs.append(Job(job_id=f"b{i}", arrival_s=0.0, model=rng.choice(BENCH_MODELS), gpus=gpus,
                        iterations=1, global_batch=512, seq_len=2048))
    return jobs


def bench_case(n_clusters: int, n_jobs: int, seed: int) -> tuple[Topology, dict[str, int],
                                                                 dict[tuple[str, str], float], list[Job]]:
    """One size of the benchmark: its topology, the GPUs left free and the link load by the
    background, and its jobs (each planned alone on that state)."""
    topo = generate_topology(n_clusters, seed)
    rng = random.Random(seed * 1000 + n_clusters)
    free, load = background(topo, rng)
    return topo, free, load, bench_jobs(free, n_jobs, rng)


def run_size(n_clusters: int, n_jobs: int, seed: int, planners: list[str], *, time_limit_s: float,
             progress=None) -> list[Row]:
    topo, free, load, jobs = bench_case(n_clusters, n_jobs, seed)
    rows = []
    for job in jobs:
        for name in planners:
            req = PlacementRequest(job=job, topology=topo, free_gpus=free, link_load=load, seed=seed,
                                   time_limit_s=time_limit_s)
            clear_memos()
            try:
                res = run_planner(name, req)
                rows.append(Row(n_clusters, job.job_id, job.model, job.gpus, name, res.placement.status,
                                res.overhead_s, res.prediction.iteration_s))
            except InfeasiblePlan as exc:
                rows.append(Row(n_clusters, job.job_id, job.model, job.gpus, name, f"infeasible: {exc}",
                                math.nan, math.nan))
            if progress is not None:
                progress.update(1)
    return rows


def _p95(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(math.ceil(0.95 * len(xs))) - 1)]


def _geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else math.nan


def summarise(rows: list[Row], reference: str = "spinsearch") -> list[dict]:
    out = []
    for n in sorted({r.clusters for r in rows}):
        ref = {r.job: r for r in rows if r.clusters == n and r.planner == reference}
        for name in dict.fromkeys(r.planner for r in rows if r.clusters == n):
            mine = [r for r in rows if r.clusters == n and r.planner == name]
            ok = [r for r in mine if not math.isnan(r.iteration_s)]
            both = [(r, ref[r.job]) for r in ok if r.job in ref and not math.isnan(ref[r.job].iteration_s)]
            over = [r.overhead_s for r in ok]
            statuses = sorted({r.status for r in ok})
            out.append({
                "clusters": n, "planner": name, "planned": len(ok), "jobs": len(mine),
                "median_overhead_ms": statistics.median(over) * 1e3 if over else math.nan,
                "p95_overhead_ms": _p95(over) * 1e3 if over else math.nan,
                "overhead_x_spinsearch": _geomean([r.overhead_s / s.overhead_s for r, s in both]),
                "iteration_x_spinsearch": _geomean([r.iteration_s / s.iteration_s for r, s in both]),
                "worst_iteration_x_spinsearch": max((r.iteration_s / s.iteration_s for r, s in both),
                                                    default=math.nan),
                "statuses": ";".join(statuses),
            })
    return out


def machine() -> str:
    cpu = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} cores ({cpu}), Python {platform.python_version()}, {platform.system()} {platform.release()}"


def markdown(summary: list[dict], header: str) -> str:
    lines = [header, "",
             "| clusters | planner | planned | median overhead (ms) | p95 overhead (ms) | overhead x SpinSearch "
             "| iteration x SpinSearch (geo-mean) | worst iteration x SpinSearch | solver status |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---|"]
    for s in summary:
        lines.append(f"| {s['clusters']} | {s['planner']} | {s['planned']}/{s['jobs']} | "
                     f"{s['median_overhead_ms']:.1f} | {s['p95_overhead_ms']:.1f} | "
                     f"{s['overhead_x_spinsearch']:.1f} | {s['iteration_x_spinsearch']:.3f} | "
                     f"{s['worst_iteration_x_spinsearch']:.3f} | {s['statuses']} |")
    return "\n".join(lines) + "\n"


def write_results(rows: list[Row], summary: list[dict], out_dir: Path, header: str) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / "planner_rows.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(Row.__dataclass_fields__)
        for r in rows:
            w.writerow([getattr(r, f) for f in Row.__dataclass_fields__])
    with open(out_dir / "planner_summary.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(summary[0]))
        w.writeheader()
        w.writerows(summary)
    md = out_dir / "planner.md"
    md.write_text(markdown(summary, header))
    return md


def header_line(args_text: str) -> str:
    return (f"Planner benchmark, {dt.date.today().isoformat()}, on {machine()}.\n\n"
            f"Command: `{args_text}`")


__all__ = ["PLANNERS", "run_size", "summarise", "write_results", "header_line", "markdown"]
