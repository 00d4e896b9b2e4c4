"""Alibaba PAI GPU trace v2020 (Weng et al., NSDI'22, "MLaaS in the Wild";
github.com/alibaba/clusterdata, ``cluster-trace-gpu-v2020``).

Two tables are read; the published CSVs have **no header row** (the column names
ship as separate ``.header`` files), so columns are taken by position. A header
line equal to the ``.header`` file's, if present, is skipped.

``pai_task_table.csv``::

    job_name,task_name,inst_num,status,start_time,end_time,plan_cpu,plan_mem,plan_gpu,gpu_type

``pai_job_table.csv``::

    job_name,inst_id,user,status,start_time,end_time

Times are seconds on a shifted clock; ``plan_gpu`` is the GPU share *per
instance in percent* (50.0 = half a GPU; blank for CPU-only tasks such as
parameter servers); statuses are Terminated (the only success), Failed,
Running, Waiting. In the job table ``start_time`` is the *submission* time.

``path`` may be the task table, the job table, or the folder holding both;
the other table is found beside it under its published name, or given with
the ``job_table=`` / ``task_table=`` options. The task table is required
(it alone has GPU counts); without the job table, a job's arrival is its
first task's start and its status the tasks' (all Terminated = finished).

Mapping (see :mod:`spiderflow.traces.mapping`): one job per ``job_name``;
GPUs = sum over its tasks of ``inst_num x plan_gpu / 100`` (rounded up);
arrival = job ``start_time``; run time = last task end - first task start;
finished = job status Terminated. No job type.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from spiderflow.errors import ConfigError
from spiderflow.traces.common import (MAX_GPUS, MAX_INSTANCES, MAX_PLAN_GPU_PERCENT, MAX_TIME_S, RowError, RowSink,
                                      TraceLoad, check_duration, csv_rows, float_field, named, read_text, shown)
from spiderflow.traces.mapping import MappingOptions, PublicJob
from spiderflow.traces.public import finish

TASK_COLUMNS = ("job_name", "task_name", "inst_num", "status", "start_time", "end_time",
                "plan_cpu", "plan_mem", "plan_gpu", "gpu_type")
JOB_COLUMNS = ("job_name", "inst_id", "user", "status", "start_time", "end_time")
TASK_FILE, JOB_FILE = "pai_task_table.csv", "pai_job_table.csv"
STATUSES = ("Terminated", "Failed", "Running", "Waiting")
FINISHED = "Terminated"


@dataclass
class _Tasks:
    first_line: int
    gpus: float = 0.0
    start_s: float | None = None
    end_s: float | None = None
    all_terminated: bool = True


def _rows(path: Path, columns: tuple[str, ...], sink: RowSink):
    source = str(path)
    for line, fields in csv_rows(read_text(path)):
        if isinstance(fields, RowError):
            sink.bad(line, named(fields, columns), source=source)
            continue
        if tuple(fields) == columns:
            continue  # a header line copied from the .header file
        if len(fields) != len(columns):
            sink.bad(line, RowError("row", f"has {len(fields)} fields but {path.name} rows have "
                                    f"{len(columns)}: {','.join(columns)} (got {shown(','.join(fields))})"),
                     source=source)
            continue
        yield line, dict(zip(columns, fields)), source


def _status(row: dict[str, str]) -> str:
    if row["status"] not in STATUSES:
        raise RowError("status", f"must be one of {', '.join(STATUSES)} (got {shown(row['status'])})")
    return row["status"]


def _name(row: dict[str, str]) -> str:
    if not row["job_name"]:
        raise RowError("job_name", "must not be empty")
    return row["job_name"]


def read_tasks(path: Path, sink: RowSink) -> dict[str, _Tasks]:
    jobs: dict[str, _Tasks] = {}
    for line, row, source in _rows(path, TASK_COLUMNS, sink):
        try:
            name = _name(row)
            status = _status(row)
            # bounded before the product below: inst_num x plan_gpu stays finite
            inst = float_field(row, "inst_num", maximum=MAX_INSTANCES)
            plan_gpu = float_field(row, "plan_gpu", optional=True, maximum=MAX_PLAN_GPU_PERCENT) or 0.0
            start = float_field(row, "start_time", optional=True, maximum=MAX_TIME_S)
            end = float_field(row, "end_time", optional=True, maximum=MAX_TIME_S)
            held = (jobs[name].gpus if name in jobs else 0.0) + inst * plan_gpu / 100.0  # type: ignore[operator]
            if held > MAX_GPUS:
                raise RowError("plan_gpu", f"inst_num x plan_gpu / 100 brings job {shown(name)} to {held:,.0f} "
                               f"GPUs, past the {MAX_GPUS:,} a job may have (got inst_num={row['inst_num']}, "
                               f"plan_gpu={row['plan_gpu']})")
            if start is not None and end is not None:
                if end < start:
                    raise RowError("end_time", f"must not precede start_time={row['start_time']} "
                                   f"(got {row['end_time']!r})")
                check_duration(end - start, "end_time", row["end_time"])
        except RowError as err:
            sink.bad(line, err, source=source)
            continue
        tasks = jobs.setdefault(name, _Tasks(first_line=line))
        tasks.gpus += inst * plan_gpu / 100.0  # type: ignore[operator]
        if start is not None:
            tasks.start_s = start if tasks.start_s is None else min(tasks.start_s, start)
        if end is not None:
            tasks.end_s = end if tasks.end_s is None else max(tasks.end_s, end)
        tasks.all_terminated &= status == FINISHED
    return jobs


def read_jobs(path: Path, sink: RowSink) -> dict[str, tuple[float, bool]]:
    """job_name -> (submit time, finished)."""
    jobs: dict[str, tuple[float, bool]] = {}
    seen: dict[str, int] = {}
    for line, row, source in _rows(path, JOB_COLUMNS, sink):
        try:
            name = _name(row)
            if name in seen:
                raise RowError("job_name", f"repeats line {seen[name]} (got {shown(name)}); "
                               "each job must appear once")
            finished = _status(row) == FINISHED
            submit = float_field(row, "start_time", maximum=MAX_TIME_S)
        except RowError as err:
            sink.bad(line, err, source=source)
            continue
        seen[name] = line
        jobs[name] = (submit, finished)  # type: ignore[assignment]
    return jobs


def resolve_tables(path: Path, *, job_table: object = None, task_table: object = None
                   ) -> tuple[Path, Path | None]:
    """(task table, job table or None) from ``path`` and the options."""
    for name, value in (("job_table", job_table), ("task_table", task_table)):
        if value is not None and not isinstance(value, (str, os.PathLike)):
            raise ConfigError(f"trace option {name} must be a file path (got {shown(value)})")
    given = {"job": Path(job_table) if job_table else None, "task": Path(task_table) if task_table else None}
    folder = path if path.is_dir() else path.parent
    if not path.is_dir():
        kind = "job" if sniff_table(path) == "job" else "task"
        if given[kind] is None:
            given[kind] = path
    for kind, name in (("task", TASK_FILE), ("job", JOB_FILE)):
        if given[kind] is None and (folder / name).is_file():
            given[kind] = folder / name
    if given["task"] is None:
        raise ConfigError(f"{path}: alibaba-v2020 needs {TASK_FILE} (the only table with GPU counts); "
                          f"put it beside {JOB_FILE} or pass task_table=PATH")
    return given["task"], given["job"]  # type: ignore[return-value]


def sniff_table(path: Path) -> str | None:
    """'task' or 'job' for a v2020 table, judged by its first line; None otherwise."""
    try:
        with open(path, encoding="utf-8-sig") as fh:
            first = fh.readline(65536)
    except (OSError, UnicodeDecodeError):
        return None
    fields = [f.strip() for f in first.rstrip("\r\n").split(",")]
    if tuple(fields) == TASK_COLUMNS or (len(fields) == 10 and fields[3] in STATUSES and _num(fields[2])):
        return "task"
    if tuple(fields) == JOB_COLUMNS or (len(fields) == 6 and fields[3] in STATUSES and _num(fields[4])):
        return "job"
    return None


def _num(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def load_alibaba2020(path: str | Path, *, source: str, skip_bad_rows: bool = False,
                     job_table: object = None, task_table: object = None,
                     **options: object) -> TraceLoad:
    opts = MappingOptions.from_options(options, fmt="alibaba-v2020")
    task_path, job_path = resolve_tables(Path(path), job_table=job_table, task_table=task_table)
    sink = RowSink(source, skip_bad_rows=skip_bad_rows)
    tasks = read_tasks(task_path, sink)
    submitted = read_jobs(job_path, sink) if job_path is not None else {}
    public: list[PublicJob] = []
    for name, t in tasks.items():
        submit, finished = submitted.get(name, (t.start_s, t.all_terminated))
        if submit is None:  # no job-table row and no task ever started: nothing to replay
            public.append(PublicJob(job_id=name, submit_s=0.0, gpus=t.gpus, duration_s=None,
                                    finished=finished))
            continue
        run = t.end_s - t.start_s if t.start_s is not None and t.end_s is not None else None
        open_since = t.start_s if t.start_s is not None and t.end_s is None else None  # still running
        public.append(PublicJob(job_id=name, submit_s=submit, gpus=t.gpus, duration_s=run,
                                finished=finished and open_since is None, open_since_s=open_since,
                                end_s=t.end_s))
    return finish(public, opts=opts, sink=sink, fmt="alibaba-v2020", source=source)
