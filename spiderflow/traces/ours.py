"""Our job-trace CSV: one job per row, times in seconds since the trace start.

Columns (header line required, in any order)::

    job_id,arrival_s,model,gpus,iterations,global_batch,seq_len[,priority][,deadline_s]

- ``job_id``: unique, non-empty text.
- ``arrival_s``: submission time in seconds, a number from 0 to MAX_TIME_S.
- ``model``: a name from :data:`spiderflow.workload.MODELS`.
- ``gpus``, ``iterations``, ``global_batch`` (sequences), ``seq_len`` (tokens):
  positive integers up to :data:`LIMITS`.
- ``priority``: optional integer (default 0; larger is more important), at
  most MAX_PRIORITY either way.
- ``deadline_s``: optional absolute time in seconds (same clock as
  ``arrival_s``, at most MAX_TIME_S) by which the job should finish; blank
  for none; must be later than ``arrival_s``.

Lines starting with ``#`` and blank lines are ignored. Rows are returned sorted
by ``arrival_s`` (stable); times are kept as written.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterable
from pathlib import Path

from spiderflow.errors import ConfigError
from spiderflow.traces.common import (MAX_BATCH, MAX_GPUS, MAX_ITERATIONS, MAX_PRIORITY, MAX_SEQ_LEN,
                                      MAX_TIME_S, RowError, RowSink, TraceLoad, float_field, header_rows,
                                      int_field, read_text, shown, text_field)
from spiderflow.workload import MODELS, Job

REQUIRED = ("job_id", "arrival_s", "model", "gpus", "iterations", "global_batch", "seq_len")
OPTIONAL = ("priority", "deadline_s")
COLUMNS = REQUIRED + OPTIONAL
LIMITS = {"gpus": MAX_GPUS, "iterations": MAX_ITERATIONS, "global_batch": MAX_BATCH, "seq_len": MAX_SEQ_LEN}


def parse_row(row: dict[str, str]) -> Job:
    """One row -> Job; raises RowError on the first bad field."""
    job_id = text_field(row, "job_id")
    arrival = float_field(row, "arrival_s", maximum=MAX_TIME_S)
    model = row["model"]
    if model not in MODELS:
        raise RowError("model", f"must be one of {', '.join(MODELS)} (got {shown(model)})")
    ints = {name: int_field(row, name, maximum=limit) for name, limit in LIMITS.items()}
    priority = 0
    if row.get("priority"):
        raw = row["priority"]
        if not re.fullmatch(r"[+-]?[0-9]{1,12}", raw):
            raise RowError("priority", f"must be an integer (got {shown(raw)})")
        priority = int(raw)
        if abs(priority) > MAX_PRIORITY:
            raise RowError("priority", f"must be from {-MAX_PRIORITY:,} to {MAX_PRIORITY:,} (got {shown(raw)})")
    deadline = (float_field(row, "deadline_s", optional=True, maximum=MAX_TIME_S)
                if "deadline_s" in row else None)
    if deadline is not None and deadline <= arrival:  # type: ignore[operator]
        raise RowError("deadline_s", f"must be later than arrival_s={row['arrival_s']} "
                       f"(got {shown(row['deadline_s'])}); it is an absolute time, not a duration")
    return Job(job_id=job_id, arrival_s=arrival, model=model, priority=priority,  # type: ignore[arg-type]
               deadline_s=deadline, **ints)


def load_ours(path: str | Path, *, source: str, skip_bad_rows: bool = False) -> TraceLoad:
    text = read_text(path)
    _, _, records = header_rows(text, source, required=REQUIRED, allowed=COLUMNS, fmt="ours")
    sink = RowSink(source, skip_bad_rows=skip_bad_rows)
    jobs: list[Job] = []
    seen: dict[str, int] = {}
    for line, row in records:
        try:
            if isinstance(row, RowError):
                raise row
            job = parse_row(row)
            if job.job_id in seen:
                raise RowError("job_id", f"repeats line {seen[job.job_id]} (got {shown(job.job_id)}); "
                               "give each job a unique id")
        except RowError as err:
            sink.bad(line, err)
            continue
        except ValueError as err:  # Job.__post_init__: a check parse_row does not repeat
            sink.bad(line, RowError("row", str(err)))
            continue
        seen[job.job_id] = line
        jobs.append(job)
    if not jobs:
        raise ConfigError(f"{source}: has no valid job rows (skipped {sink.skipped} bad rows); "
                          "add at least one job under the header")
    jobs.sort(key=lambda j: j.arrival_s)
    return TraceLoad(jobs=tuple(jobs), skipped=sink.skipped, format="ours", source=source)


def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)  # shortest text that reads back to the same float
    return str(value)


def format_trace(jobs: Iterable[Job], *, comment: str | None = None) -> str:
    """The CSV text of ``jobs``; optional columns appear only where some job uses them."""
    jobs = list(jobs)
    columns = list(REQUIRED)
    if any(j.priority != 0 for j in jobs):
        columns.append("priority")
    if any(j.deadline_s is not None for j in jobs):
        columns.append("deadline_s")
    out = io.StringIO()
    for line in (comment or "").splitlines():
        out.write(f"# {line}\n" if line else "#\n")
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    for job in jobs:
        writer.writerow([_cell(float(job.arrival_s) if c == "arrival_s" else getattr(job, c))
                         for c in columns])
    return out.getvalue()


def write_trace(jobs: Iterable[Job], path: str | Path, *, comment: str | None = None) -> None:
    """Write ``jobs`` as our CSV at ``path``; ``comment`` lines go first, each behind ``# ``."""
    try:
        Path(path).write_text(format_trace(jobs, comment=comment))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot write trace file ({exc.strerror})") from None
