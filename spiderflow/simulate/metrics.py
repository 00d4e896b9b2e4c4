"""Per-job rows and the run summary of a simulation (the paper's three figures and more)."""

from __future__ import annotations

import csv
import math
import statistics
from pathlib import Path

from spiderflow.plan import placement_text
from spiderflow.scheduling import JobRecord

SUMMARY_KEYS = ("jobs", "completed", "rejected", "avg_jct_s", "p50_jct_s", "p95_jct_s", "avg_queue_s",
                "makespan_s", "throughput_tokens_per_s", "jobs_per_hour", "gpu_utilization",
                "avg_overhead_s", "total_overhead_s")
# With WAN or capacity events (docs/wan-events.md) the summary and the per-job rows add these; a run
# without them keeps the keys above only, so its files are as they were.
CHANGE_SUMMARY_KEYS = ("replanned", "rerouted", "lost_s")
CHANGE_ROW_KEYS = ("replanned", "rerouted", "lost_s")


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))]


def summarise(records: list[JobRecord], total_gpus: int, *, changes: bool = False) -> dict:
    """The run's metrics (:data:`SUMMARY_KEYS`). A metric that has no value is None (null in JSON),
    never NaN: the JCT and queue metrics when no job completed, throughput, jobs per hour and GPU
    utilisation when the makespan is 0 (no job completed), avg_overhead_s when no job was placed.
    With ``changes`` (a run with WAN or capacity events) also :data:`CHANGE_SUMMARY_KEYS`: jobs
    re-planned (placed again after a change stopped or moved them) and re-routed at least once, and
    the summed ``lost_s`` of every job (the seconds between a change stopping its iterations and
    their resuming: queueing, restart cost, start-up)."""
    done = [r for r in records if r.completed]
    jcts = [r.jct_s for r in done]
    if done:
        first = min(r.arrival_s for r in records)
        makespan = max(r.end_s for r in done) - first
    else:
        makespan = 0.0
    tokens = sum(r.job.iterations * r.job.tokens_per_iteration for r in done)
    gpu_s = sum((r.end_s - r.start_s) * r.job.gpus for r in done)
    decided = [r for r in records if r.plan is not None]
    extra = {} if not changes else {
        "replanned": sum(getattr(r, "replanned", 0) > 0 for r in records),
        "rerouted": sum(getattr(r, "rerouted", 0) > 0 for r in records),
        "lost_s": sum(getattr(r, "lost_s", 0.0) for r in records),
    }
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
        **extra,
    }


# ---- human units for text output (``--json`` keeps raw SI values) ---------------------------------------

DURATION_UNITS = ((1e-3, "us", 1e-6), (1.0, "ms", 1e-3), (120.0, "s", 1.0), (2 * 3600.0, "min", 60.0),
                  (math.inf, "h", 3600.0))  # (below this many seconds, unit, seconds per unit)


def duration_unit(seconds: float) -> tuple[str, float]:
    """(unit, seconds per unit) that a duration of this size reads best in: us, ms, s, min or h."""
    for below, unit, per in DURATION_UNITS:
        if abs(seconds) < below:
            return unit, per
    return "h", 3600.0


def decimals(value: float, digits: int = 3) -> int:
    """Decimal places that show ``value`` to ``digits`` significant digits (none past the point for 100+)."""
    return 0 if value == 0 or abs(value) >= 10 ** (digits - 1) else digits - 1 - math.floor(math.log10(abs(value)))


def human_duration(seconds: float | None, unit: str | None = None) -> str:
    """``seconds`` as e.g. "67.6 s", "3.21 h", "850 ms" (3 significant digits, never e-notation); "n/a" for None."""
    if seconds is None or not math.isfinite(seconds):
        return "n/a"
    if seconds == 0 and unit is None:
        return "0 s"
    unit, per = (unit, dict((u, p) for _, u, p in DURATION_UNITS)[unit]) if unit else duration_unit(seconds)
    value = seconds / per
    return f"{value:.{min(decimals(value), 3)}f} {unit}"


def human_count(value: float | None, unit: str = "") -> str:
    """A rate or count with a k/M/G/T prefix, 3 significant digits: "1.23M tokens/s"."""
    if value is None or not math.isfinite(value):
        return "n/a"
    for prefix, factor in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3), ("", 1.0)):
        if abs(value) >= factor or not prefix:
            shown = value / factor
            return f"{shown:.{decimals(shown)}f}{prefix} {unit}".rstrip()
    raise AssertionError("unreachable")  # pragma: no cover


def human_pct(fraction: float | None) -> str:
    return "n/a" if fraction is None or not math.isfinite(fraction) else f"{fraction * 100:.1f}%"


def rounded_parts(total: float, parts: list[float], places: int) -> list[float]:
    """``parts`` rounded to ``places`` decimals so that they add up to ``total`` rounded the same way
    (largest remainder): a printed sum that adds up on paper."""
    scale = 10 ** places
    target = round(total * scale)
    floors = [math.floor(p * scale) for p in parts]
    order = sorted(range(len(parts)), key=lambda i: parts[i] * scale - floors[i], reverse=True)
    short = target - sum(floors)
    for i in order[:max(0, short)]:
        floors[i] += 1
    return [f / scale for f in floors]


ROW_KEYS = ("job_id", "model", "gpus", "arrival_s", "status", "start_s", "end_s", "jct_s", "queue_s",
            "overhead_s", "alone_iteration_s", "placement", "reason", "admission")


def ratio_of(a: float | None, b: float | None) -> float | None:
    """``a / b``, or None when either is missing or NaN, or ``b`` is 0 (a table's ratio column)."""
    ok = a is not None and b is not None and b and not math.isnan(a) and not math.isnan(b)
    return a / b if ok else None


def fmt_value(x: float | None, spec: str, factor: float = 1.0, suffix: str = "") -> str:
    """``x * factor`` in ``spec`` with ``suffix``; ``n/a`` for a missing or NaN value."""
    return "n/a" if x is None or math.isnan(x) else f"{x * factor:{spec}}{suffix}"


def job_rows(records: list[JobRecord], *, changes: bool = False) -> list[dict]:
    """One dict per job (:data:`ROW_KEYS`, and :data:`CHANGE_ROW_KEYS` with ``changes``)."""
    rows = []
    for r in records:
        extra = {k: getattr(r, k, 0) for k in CHANGE_ROW_KEYS} if changes else {}
        rows.append({
            "job_id": r.job.job_id, "model": r.job.model, "gpus": r.job.gpus, "arrival_s": r.arrival_s,
            "status": r.status, "start_s": r.start_s, "end_s": r.end_s, "jct_s": r.jct_s,
            "queue_s": r.queue_s, "overhead_s": r.overhead_s, "alone_iteration_s": getattr(r, "alone_iteration_s", None),
            "placement": placement_text(r.placement.items()), "reason": r.reason,
            "admission": r.admission, **extra,
        })
    return rows


def write_rows(records: list[JobRecord], path: Path, *, changes: bool = False) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=ROW_KEYS + (CHANGE_ROW_KEYS if changes else ()))
        w.writeheader()
        for row in job_rows(records, changes=changes):
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()})


# Line styles that stay apart in grey scale and where planners' curves overlap (matplotlib's default
# colour cycle; a dash pattern and a marker each, so a curve hidden under another still shows).
CDF_STYLES = (("C0", "-", "o"), ("C1", "--", "s"), ("C2", "-.", "^"), ("C3", ":", "D"), ("C4", (0, (5, 1, 1, 1)), "v"),
              ("C5", (0, (1, 1)), "P"), ("C6", (0, (8, 2)), "X"), ("C7", (0, (3, 1, 1, 1, 1, 1)), "*"))


def jct_cdf_png(jcts_by_planner: dict[str, list[float]], path: Path, title: str, *,
                jobs: int | None = None) -> list[Path]:
    """Empirical CDF of job completion time per planner (``ax.ecdf``), hours on a log axis, one line
    style per planner; written as ``path`` (PNG) and beside it as PDF. ``jobs``: how many jobs were
    replayed, so the legend says how many each planner completed. Returns the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    path = Path(path)
    handles = []
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=150)
    for n, (name, jcts) in enumerate(jcts_by_planner.items()):
        hours = [j / 3600 for j in jcts if j is not None and math.isfinite(j) and j > 0]
        if not hours:
            continue
        colour, dashes, marker = CDF_STYLES[n % len(CDF_STYLES)]
        label = name + (f" ({len(hours)}/{jobs} completed)" if jobs is not None else "")
        line = ax.ecdf(hours, label=label, color=colour, linestyle=dashes, linewidth=1.6)
        # sparse markers on the step's corners, offset per planner so identical curves stay apart
        xs, ys = line.get_xdata(), line.get_ydata()
        every = max(1, len(xs) // 8)
        ax.plot(xs[n % every::every], ys[n % every::every], linestyle="none", marker=marker, color=colour,
                markersize=4, markerfacecolor="none")
        handles.append(Line2D([], [], color=colour, linestyle=dashes, linewidth=1.6, marker=marker, markersize=4,
                              markerfacecolor="none", label=line.get_label()))
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (hours, log scale)")
    ax.set_ylabel("fraction of jobs completed within")
    ax.set_ylim(0, 1.02)
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    if handles:
        ax.legend(handles=handles, fontsize=8, loc="lower right")
    fig.tight_layout()
    written = [path.with_suffix(".png"), path.with_suffix(".pdf")]
    for out in written:
        fig.savefig(out)
    plt.close(fig)
    return written
