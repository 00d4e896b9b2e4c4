"""Per-job rows and the run summary of a simulation (the paper's three figures and more)."""

from __future__ import annotations

import csv
import math
import statistics
from pathlib import Path

from spiderflow.simulate.engine import JobRecord

SUMMARY_KEYS = ("jobs", "completed", "rejected", "avg_jct_s", "p50_jct_s", "p95_jct_s", "avg_queue_s",
                "makespan_s", "throughput_tokens_per_s", "jobs_per_hour", "gpu_utilization",
                "avg_overhead_s", "total_overhead_s")


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))]


def summarise(records: list[JobRecord], total_gpus: int) -> dict:
    """The run's metrics (:data:`SUMMARY_KEYS`). A metric that has no value is None (null in JSON),
    never NaN: the JCT and queue metrics when no job completed, throughput, jobs per hour and GPU
    utilisation when the makespan is 0 (no job completed), avg_overhead_s when no job was placed."""
    done = [r for r in records if r.status == "done"]
    jcts = [r.jct_s for r in done]
    if done:
        first = min(r.job.arrival_s for r in records)
        makespan = max(r.end_s for r in done) - first
    else:
        makespan = 0.0
    tokens = sum(r.job.iterations * r.job.tokens_per_iteration for r in done)
    gpu_s = sum((r.end_s - r.start_s) * r.job.gpus for r in done)
    decided = [r for r in records if r.status in ("done", "running")]
    return {
        "jobs": len(records),
        "completed": len(done),
        "rejected": sum(r.status == "rejected" for r in records),
        "avg_jct_s": statistics.fmean(jcts) if jcts else None,
        "p50_jct_s": _pct(jcts, 0.50),
        "p95_jct_s": _pct(jcts, 0.95),
        "avg_queue_s": statistics.fmean([r.queue_s for r in done]) if done else None,
        "makespan_s": makespan,
        "throughput_tokens_per_s": tokens / makespan if makespan > 0 else None,
        "jobs_per_hour": len(done) / makespan * 3600 if makespan > 0 else None,
        "gpu_utilization": gpu_s / (total_gpus * makespan) if makespan > 0 else None,
        "avg_overhead_s": statistics.fmean([r.overhead_s for r in decided]) if decided else None,
        "total_overhead_s": sum(r.overhead_s for r in records),
    }


ROW_KEYS = ("job_id", "model", "gpus", "arrival_s", "status", "start_s", "end_s", "jct_s", "queue_s",
            "overhead_s", "alone_iteration_s", "placement", "reason")


def job_rows(records: list[JobRecord]) -> list[dict]:
    rows = []
    for r in records:
        rows.append({
            "job_id": r.job.job_id, "model": r.job.model, "gpus": r.job.gpus, "arrival_s": r.job.arrival_s,
            "status": r.status, "start_s": r.start_s, "end_s": r.end_s, "jct_s": r.jct_s,
            "queue_s": r.queue_s, "overhead_s": r.overhead_s, "alone_iteration_s": r.alone_iteration_s,
            "placement": " ".join(f"{c}:{g}" for c, g in r.placement.items()), "reason": r.reason,
        })
    return rows


def write_rows(records: list[JobRecord], path: Path) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=ROW_KEYS)
        w.writeheader()
        for row in job_rows(records):
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()})


def jct_cdf_png(jcts_by_planner: dict[str, list[float]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    for name, jcts in jcts_by_planner.items():
        xs = sorted(j / 3600 for j in jcts)
        if xs:
            ax.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], where="post", label=name)
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (hours, log scale)")
    ax.set_ylabel("fraction of jobs")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
