"""The loop every one-file public CSV importer shares: rows -> PublicJob -> Job."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from spiderflow.errors import ConfigError
from spiderflow.traces.common import (MAX_DURATION_S, MAX_GPUS, RowError, RowSink, TraceLoad, check_duration,
                                      float_field, header_rows, read_text, shown, time_field)
from spiderflow.traces.mapping import MappingOptions, PublicJob, map_jobs

SLURM_FINISHED = "COMPLETED"  # Slurm job states in Acme and Helios (Hu et al., SC'21 / NSDI'24)
SLURM_STATES = ("COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "RUNNING", "PENDING",
                "PREEMPTED", "OUT_OF_MEMORY")


def finish(public: list[PublicJob], *, opts: MappingOptions, sink: RowSink, fmt: str,
           source: str) -> TraceLoad:
    """Map, and refuse an empty result with the counts that explain it."""
    jobs, dropped, report = map_jobs(public, opts)
    if not jobs:
        why = ", ".join(f"{k}={v}" for k, v in dropped.items() if v) or "no rows"
        raise ConfigError(f"{source}: no jobs left to replay from this {fmt} trace "
                          f"(skipped {sink.skipped} bad rows; dropped {why}); keep more with "
                          "unfinished='censor', fractional='aggregate', small='raise'")
    return TraceLoad(jobs=jobs, skipped=sink.skipped, format=fmt, source=source, dropped=dropped,
                     report=report)


def load_public_csv(path: str | Path, *, source: str, fmt: str, required: tuple[str, ...],
                    parse_row: Callable[[Mapping[str, str]], PublicJob], skip_bad_rows: bool,
                    options: dict[str, object]) -> TraceLoad:
    opts = MappingOptions.from_options(options, fmt=fmt)
    text = read_text(path)
    _, _, records = header_rows(text, source, required=required, fmt=fmt)
    sink = RowSink(source, skip_bad_rows=skip_bad_rows)
    public: list[PublicJob] = []
    seen: dict[str, int] = {}
    for line, row in records:
        try:
            if isinstance(row, RowError):
                raise row
            pj = parse_row(row)
            if pj.job_id in seen:
                raise RowError("job_id", f"repeats line {seen[pj.job_id]} (got {shown(pj.job_id)}); "
                               "each job must appear once")
        except RowError as err:
            sink.bad(line, err)
            continue
        seen[pj.job_id] = line
        public.append(pj)
    return finish(public, opts=opts, sink=sink, fmt=fmt, source=source)


def run_times(row: Mapping[str, str]) -> dict[str, float | None]:
    """``duration_s`` (the ``duration`` column, else end_time - start_time; None: never ended),
    ``open_since_s`` (start_time of a job with no end: still running at the snapshot) and
    ``end_s`` (end_time), as PublicJob keyword arguments."""
    duration = float_field(row, "duration", optional=True, maximum=MAX_DURATION_S)
    start = time_field(row, "start_time", optional=True)
    end = time_field(row, "end_time", optional=True)
    if start is not None and end is not None and end < start:
        raise RowError("end_time", f"must not precede start_time={row['start_time']!r} "
                       f"(got {row['end_time']!r})")
    if duration is None and start is not None and end is not None:
        duration = check_duration(end - start, "end_time", row["end_time"])
    still_running = duration is None and start is not None and end is None
    return {"duration_s": duration, "open_since_s": start if still_running else None, "end_s": end}


def gpu_field(row: Mapping[str, str], name: str = "gpu_num") -> float:
    """A job's GPU count: a number from 0 (CPU-only) to MAX_GPUS."""
    return float_field(row, name, maximum=MAX_GPUS)  # type: ignore[return-value]


def slurm_state(row: Mapping[str, str], name: str = "state") -> bool:
    """True for a job that finished normally; RowError for a state Slurm does not have."""
    words = row[name].split()  # sacct writes e.g. "CANCELLED by 1234"
    state = words[0].upper() if words else ""
    if state not in SLURM_STATES:
        raise RowError(name, f"must be one of {', '.join(SLURM_STATES)} (got {shown(row[name])})")
    return state == SLURM_FINISHED
