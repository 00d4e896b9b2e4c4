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
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from spiderflow.errors import ConfigError
from spiderflow.traces.common import (MAX_DURATION_S, MAX_GPUS, RowError, RowSink, TraceLoad, parse_time,
                                      read_text, shown)
from spiderflow.traces.mapping import MappingOptions, PublicJob
from spiderflow.traces.public import finish

STATUSES = ("Pass", "Killed", "Failed")
_SPACE = re.compile(r"\s*")
MAX_INT_DIGITS = 20


class BadNumber:
    """A JSON number no field of a job can be: NaN, Infinity, or too large for a float.

    The decoder keeps it as this marker instead of raising (an integer of 5,000
    digits makes ``int()`` raise ``ValueError``), so the job holding it is one
    bad row, named and skippable, and a value in a field we do not read is ignored.
    """

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _int(text: str) -> int | BadNumber:
    return int(text) if len(text.lstrip("-")) <= MAX_INT_DIGITS else BadNumber(text)


def _float(text: str) -> float | BadNumber:
    value = float(text)
    return value if math.isfinite(value) else BadNumber(text)


class _LineError(json.JSONDecodeError):
    """A JSON Lines line that does not decode: a bad row, not the end of the read."""


def json_objects(text: str, source: str) -> Iterator[tuple[int, Any]]:
    """``(line where it starts, value)`` of each element of a JSON list, or of each JSON line.

    In JSON Lines a line that is not valid JSON comes as a RowError (the next
    line starts afresh); in a list the first error ends the read.
    """
    decoder = json.JSONDecoder(parse_int=_int, parse_float=_float, parse_constant=BadNumber)
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
            if lines:
                raise _LineError(exc.msg, exc.doc, exc.pos) from None
            raise ConfigError(f"{source}:{exc.lineno}: is not valid JSON ({exc.msg}, column {exc.colno}); "
                              "a philly trace is cluster_job_log: a JSON list of job objects") from None
        except RecursionError:
            raise ConfigError(f"{source}:{line_at(at)}: a job object is nested too deeply to be a "
                              "philly job; is this cluster_job_log?") from None

    lines = text.startswith("{", pos)
    if lines:  # JSON Lines
        while pos < len(text):
            start = pos
            try:
                value, pos = decode(pos)
            except _LineError as exc:  # a bad row: go on with the next line
                yield line_at(start), RowError("", f"is not valid JSON ({exc.msg}, line {exc.lineno} "
                                               f"column {exc.colno})")
                end = text.find("\n", start)
                pos = len(text) if end < 0 else end
            else:
                yield line_at(start), value
            pos = _SPACE.match(text, pos).end()  # type: ignore[union-attr]
        return
    if not text.startswith("[", pos):
        raise ConfigError(f"{source}:{line_at(pos)}: must start with '[' (a JSON list of job objects) "
                          f"(got {shown(text[pos:pos + 20])})")
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
                              f"(got {shown(text[pos:pos + 20])}); the file may be cut short")


def _attempt_gpus(attempt: dict, where: str) -> int:
    detail = attempt.get("detail") or []
    if not isinstance(detail, list):
        raise RowError(f"{where}.detail", f"must be a list of {{ip, gpus}} objects (got {shown(detail)})")
    total = 0
    for j, machine in enumerate(detail):
        gpus = machine.get("gpus") if isinstance(machine, dict) else None
        if not isinstance(gpus, list):
            raise RowError(f"{where}.detail[{j}].gpus", f"must be a list of GPU names (got {shown(gpus)})")
        total += len(gpus)
    if total > MAX_GPUS:
        raise RowError(f"{where}.detail", f"lists {total:,} GPUs, more than {MAX_GPUS:,}; is the log corrupt?")
    return total


def parse_job(obj: Any) -> PublicJob:
    if not isinstance(obj, dict):
        raise RowError("job", f"must be a JSON object (got {shown(obj)})")
    job_id = obj.get("jobid")
    if not isinstance(job_id, str) or not job_id:
        raise RowError("jobid", f"must be a non-empty string (got {shown(job_id)})")
    status = obj.get("status")
    if status not in STATUSES:
        raise RowError("status", f"must be one of {', '.join(STATUSES)} (got {shown(status)})")
    submit = parse_time(obj.get("submitted_time"), "submitted_time")
    attempts = obj.get("attempts") or []
    if not isinstance(attempts, list):
        raise RowError("attempts", f"must be a list of attempt objects (got {shown(attempts)})")
    gpus: int | None = None
    run_s: float | None = None
    last_end: float | None = None
    still_running = False
    open_since: float | None = None
    for i, attempt in enumerate(attempts):
        where = f"attempts[{i}]"
        if not isinstance(attempt, dict):
            raise RowError(where, f"must be an object with start_time, end_time, detail (got {shown(attempt)})")
        gpus = max(gpus or 0, _attempt_gpus(attempt, where))
        start, end = attempt.get("start_time"), attempt.get("end_time")
        start_s = parse_time(start, f"{where}.start_time") if start not in (None, "None", "") else None
        end_s = parse_time(end, f"{where}.end_time") if end not in (None, "None", "") else None
        still_running = end_s is None and i == len(attempts) - 1
        open_since = start_s if still_running else None
        if end_s is not None:
            last_end = end_s if last_end is None else max(last_end, end_s)
        if start_s is not None and end_s is not None:
            if end_s < start_s:
                raise RowError(f"{where}.end_time", f"must not precede start_time {start!r} (got {end!r})")
            run_s = (run_s or 0.0) + (end_s - start_s)
    if run_s is not None and run_s > MAX_DURATION_S:
        raise RowError("attempts", f"add up to {run_s:.3g} s of run time, more than {MAX_DURATION_S:g} s; "
                       "check the attempts' times")
    return PublicJob(job_id=job_id, submit_s=submit, gpus=gpus, duration_s=run_s,
                     finished=status == "Pass" and not still_running, open_since_s=open_since,
                     end_s=last_end)


def load_philly(path: str | Path, *, source: str, skip_bad_rows: bool = False,
                **options: object) -> TraceLoad:
    opts = MappingOptions.from_options(options, fmt="philly")
    text = read_text(path)
    sink = RowSink(source, skip_bad_rows=skip_bad_rows)
    public: list[PublicJob] = []
    seen: dict[str, int] = {}
    for index, (line, obj) in enumerate(json_objects(text, source)):
        try:
            if isinstance(obj, RowError):
                raise obj
            pj = parse_job(obj)
            if pj.job_id in seen:
                raise RowError("jobid", f"repeats line {seen[pj.job_id]} (got {pj.job_id!r}); "
                               "each job must appear once")
        except RowError as err:
            sink.bad(line, RowError(f"jobs[{index}]" + (f".{err.field_name}" if err.field_name else ""),
                                    err.message))
            continue
        seen[pj.job_id] = line
        public.append(pj)
    return finish(public, opts=opts, sink=sink, fmt="philly", source=source)
