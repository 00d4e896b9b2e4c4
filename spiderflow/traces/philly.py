"""Philly trace (Microsoft; Jeon et al., ATC'19, "Analysis of Large-Scale
Multi-Tenant GPU Clusters for DNN Training Workloads"; github.com/msr-fiddle/
philly-traces, file ``cluster_job_log``).

Schema: one JSON list of job objects (JSON Lines, one object per line, is read
too)::

    {"jobid": "application_..._14199", "status": "Pass", "vc": "ee9e8c", "user": "ce2f4c",
     "submitted_time": "2017-10-07 01:11:39",
     "attempts": [{"start_time": "2017-10-07 01:12:09", "end_time": "2017-10-07 01:13:23",
                   "detail": [{"ip": "m47", "gpus": ["gpu0", "gpu1"]}]}, ...]}

``status`` is Pass, Killed or Failed; times are ``YYYY-MM-DD HH:MM:SS`` local
wall-clock strings with no zone (read as UTC: only differences matter, so a
daylight-saving change inside a job shifts it by an hour). A job may have no
attempts, an attempt may lack a time (a logging gap), and a last attempt with no
``end_time`` was still running at the snapshot.

Mapping (see :mod:`spiderflow.traces.mapping`): arrival = ``submitted_time``;
GPUs = the largest number of GPUs any attempt held (its ``detail[].gpus``
summed); run time = the summed length of the attempts that have both times
(the time the job held GPUs, retries included); finished = ``status`` Pass and
the last attempt ended. No job type. A finished job with no attempts (or none
with both times) counts as ``no_runtime``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from spiderflow.errors import ConfigError
from spiderflow.traces.common import RowError, RowSink, TraceLoad, parse_time, read_text
from spiderflow.traces.mapping import MappingOptions, PublicJob
from spiderflow.traces.public import finish

STATUSES = ("Pass", "Killed", "Failed")
_SPACE = re.compile(r"\s*")


def json_objects(text: str, source: str) -> Iterator[tuple[int, Any]]:
    """``(line where it starts, value)`` of each element of a JSON list, or of each JSON line."""
    decoder = json.JSONDecoder()
    pos = _SPACE.match(text).end()  # type: ignore[union-attr]
    line, counted = 1, 0

    def line_at(at: int) -> int:
        nonlocal line, counted
        line += text.count("\n", counted, at)
        counted = at
        return line

    def decode(at: int) -> tuple[Any, int]:
        try:
            return decoder.raw_decode(text, at)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{source}:{exc.lineno}: is not valid JSON ({exc.msg}, column {exc.colno}); "
                              "a philly trace is cluster_job_log: a JSON list of job objects") from None

    if text.startswith("{", pos):  # JSON Lines
        while pos < len(text):
            start = pos
            value, pos = decode(pos)
            yield line_at(start), value
            pos = _SPACE.match(text, pos).end()  # type: ignore[union-attr]
        return
    if not text.startswith("[", pos):
        raise ConfigError(f"{source}:{line_at(pos)}: must start with '[' (a JSON list of job objects) "
                          f"(got {text[pos:pos + 20]!r})")
    pos = _SPACE.match(text, pos + 1).end()  # type: ignore[union-attr]
    if text.startswith("]", pos):
        return
    while True:
        start = pos
        value, pos = decode(pos)
        yield line_at(start), value
        pos = _SPACE.match(text, pos).end()  # type: ignore[union-attr]
        if text.startswith(",", pos):
            pos = _SPACE.match(text, pos + 1).end()  # type: ignore[union-attr]
        elif text.startswith("]", pos):
            break
        else:
            raise ConfigError(f"{source}:{line_at(pos)}: expected ',' or ']' after a job object "
                              f"(got {text[pos:pos + 20]!r}); the file may be cut short")


def _attempt_gpus(attempt: dict, where: str) -> int:
    detail = attempt.get("detail") or []
    if not isinstance(detail, list):
        raise RowError(f"{where}.detail", f"must be a list of {{ip, gpus}} objects (got {detail!r})")
    total = 0
    for j, machine in enumerate(detail):
        gpus = machine.get("gpus") if isinstance(machine, dict) else None
        if not isinstance(gpus, list):
            raise RowError(f"{where}.detail[{j}].gpus", f"must be a list of GPU names (got {gpus!r})")
        total += len(gpus)
    return total


def parse_job(obj: Any) -> PublicJob:
    if not isinstance(obj, dict):
        raise RowError("job", f"must be a JSON object (got {str(obj)[:40]!r})")
    job_id = obj.get("jobid")
    if not isinstance(job_id, str) or not job_id:
        raise RowError("jobid", f"must be a non-empty string (got {job_id!r})")
    status = obj.get("status")
    if status not in STATUSES:
        raise RowError("status", f"must be one of {', '.join(STATUSES)} (got {status!r})")
    submit = parse_time(obj.get("submitted_time"), "submitted_time")
    attempts = obj.get("attempts") or []
    if not isinstance(attempts, list):
        raise RowError("attempts", f"must be a list of attempt objects (got {attempts!r})")
    gpus: int | None = None
    run_s: float | None = None
    still_running = False
    for i, attempt in enumerate(attempts):
        where = f"attempts[{i}]"
        if not isinstance(attempt, dict):
            raise RowError(where, f"must be an object with start_time, end_time, detail (got {attempt!r})")
        gpus = max(gpus or 0, _attempt_gpus(attempt, where))
        start, end = attempt.get("start_time"), attempt.get("end_time")
        start_s = parse_time(start, f"{where}.start_time") if start not in (None, "None", "") else None
        end_s = parse_time(end, f"{where}.end_time") if end not in (None, "None", "") else None
        still_running = end_s is None and i == len(attempts) - 1
        if start_s is not None and end_s is not None:
            if end_s < start_s:
                raise RowError(f"{where}.end_time", f"must not precede start_time {start!r} (got {end!r})")
            run_s = (run_s or 0.0) + (end_s - start_s)
    return PublicJob(job_id=job_id, submit_s=submit, gpus=gpus, duration_s=run_s,
                     finished=status == "Pass" and not still_running)


def load_philly(path: str | Path, *, source: str, skip_bad_rows: bool = False,
                **options: object) -> TraceLoad:
    opts = MappingOptions.from_options(options, fmt="philly")
    text = read_text(path, source)
    sink = RowSink(source, skip_bad_rows=skip_bad_rows)
    public: list[PublicJob] = []
    seen: dict[str, int] = {}
    for index, (line, obj) in enumerate(json_objects(text, source)):
        try:
            pj = parse_job(obj)
            if pj.job_id in seen:
                raise RowError("jobid", f"repeats line {seen[pj.job_id]} (got {pj.job_id!r}); "
                               "each job must appear once")
        except RowError as err:
            sink.bad(line, RowError(f"jobs[{index}].{err.field_name}", err.message))
            continue
        seen[pj.job_id] = line
        public.append(pj)
    return finish(public, opts=opts, sink=sink, fmt="philly", source=source)
