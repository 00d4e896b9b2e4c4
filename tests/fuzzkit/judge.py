"""What a run of a mutated input may end in, and the checks that tell (issue 16).

A run is *accepted* (exit 0, and its output is sane), *rejected* (non-zero exit with one
short ``error: ...`` line on stderr), or a failure: a ``traceback`` (any other exception),
a ``hang`` (past the time bound), ``unclean`` (a non-zero exit whose message is not one
short line), ``badjson`` (``--json`` output that is not strict JSON) or ``wrong`` (exit 0
with an output that cannot be right: a non-finite or negative time, a job not accounted
for, a value that differs from the file, a duplicate key silently resolved).

The checks are written independently of the loaders: they re-read the input with plain
``yaml``/``json``/``csv`` and compare.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
import signal
import sys
import time
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml

KINDS = ("accepted", "rejected", "traceback", "hang", "unclean", "badjson", "wrong", "crash")
FAILURES = ("traceback", "hang", "unclean", "badjson", "wrong", "crash")
MAX_MESSAGE_CHARS = 2000  # "one short line": a message holding a 128 KiB field is not one
_TQDM = re.compile(r"\d+%\||\d+(?:\.\d+)?(?:it|job)/s\]|\[\d\d:\d\d<|^\s*\w*:\s+\d+%")
# Lines a run may print on stderr before it fails: a trace's summary, the planners' rejections, and a
# public trace's import report, what each mapping rule kept and dropped (spiderflow/traces/mapping.py)
_INFO = (re.compile(r": \d+ jobs \("), re.compile(r": \d+ of \d+ jobs rejected, e\.g\. "),
         re.compile(r"^(gpus|runtime|scale|result|unfinished=\w+|fractional=\w+): "))


@dataclass(frozen=True)
class Outcome:
    kind: str
    detail: str = ""

    @property
    def failed(self) -> bool:
        return self.kind in FAILURES


class Problem(Exception):
    """An accepted run whose output is not sane: ``kind`` is ``wrong`` or ``badjson``."""

    def __init__(self, message: str, kind: str = "wrong") -> None:
        super().__init__(message)
        self.kind = kind


class Hang(BaseException):
    """Raised by the in-process timer; a BaseException so ``except Exception`` cannot swallow it."""


# ---------------------------------------------------------------- messages

def one_line(message: str) -> str | None:
    """None if ``message`` is one short line, else what is wrong with it."""
    lines = message.splitlines()
    if len(lines) != 1 or not lines[0].strip():
        return f"message of {len(lines)} lines: {message[:200]!r}"
    if len(message) > MAX_MESSAGE_CHARS:
        return f"message of {len(message):,} characters: {message[:120]!r}..."
    return None


def _stderr_lines(err: str) -> list[str]:
    out = []
    for line in re.split(r"[\r\n]", err):
        if line.strip() and not _TQDM.search(line):
            out.append(line.strip())
    return out


def judge_exit(rc: int, out: str, err: str) -> Outcome | None:
    """The outcome told by exit code and stderr alone; None for exit 0 (the output decides)."""
    if "Traceback (most recent call last)" in err:
        last = [ln for ln in err.splitlines() if ln.strip()]
        text = last[-1] if last else err[-200:]
        frames = re.findall(r'File "[^"]*/((?:spiderflow|emulator)/[^"]+)", line (\d+)', err)
        where = f" (at {frames[-1][0]}:{frames[-1][1]})" if frames else ""
        return Outcome("traceback", (text if len(text) <= 240 else text[:200] + "..." + text[-37:]) + where)
    if rc < 0:
        return Outcome("crash", f"killed by signal {-rc}")
    if rc == 0:
        return None
    lines = _stderr_lines(err)
    errors = [ln for ln in lines if ln.startswith("error:") or ln == "interrupted"]
    others = [ln for ln in lines if ln not in errors and not any(p.search(ln) for p in _INFO)]
    if len(errors) != 1 or others:
        return Outcome("unclean", f"exit {rc}, stderr {err[-300:]!r}")
    bad = one_line(errors[0])
    if bad:
        return Outcome("unclean", bad)
    return Outcome("rejected", errors[0][:300])


# ---------------------------------------------------------------- running in-process

def exception_line(exc: BaseException) -> str:
    """``Type: message`` cut to one short line, and where the project's code raised it."""
    where = ""
    for frame in traceback.extract_tb(exc.__traceback__):
        parts = Path(frame.filename).parts
        if "spiderflow" in parts or "emulator" in parts:
            where = f" (at {'/'.join(parts[-2:])}:{frame.lineno})"
    text = f"{type(exc).__name__}: {exc}".replace("\n", " ")
    return (text if len(text) <= 240 else text[:200] + "..." + text[-37:]) + where


def _on_alarm(signum, frame):
    raise Hang()


@contextlib.contextmanager
def time_bound(seconds: float):
    """Raise :class:`Hang` in the main thread after ``seconds`` (SIGALRM). A timer already set
    (pytest-timeout's) is put back afterwards with the time that is left of it."""
    old = signal.signal(signal.SIGALRM, _on_alarm)
    start = time.monotonic()
    old_delay, old_interval = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        if old_delay:
            signal.setitimer(signal.ITIMER_REAL, max(old_delay - (time.monotonic() - start), 1e-3), old_interval)


def run_main(main: Callable[[list[str]], int], argv: list[str], *, timeout_s: float
             ) -> tuple[Outcome | None, int, str, str]:
    """Run ``main(argv)`` with stdout/stderr captured as a terminal would encode them (stdout
    strict UTF-8, so a path with a surrogate fails as it would for real). Returns (outcome
    if already decided, exit code, stdout, stderr)."""
    raw_out, raw_err = io.BytesIO(), io.BytesIO()
    out = io.TextIOWrapper(raw_out, encoding="utf-8", errors="strict", write_through=True)
    err = io.TextIOWrapper(raw_err, encoding="utf-8", errors="backslashreplace", write_through=True)
    rc, crash = 0, None
    with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(out), \
            contextlib.redirect_stderr(err):
        warnings.simplefilter("always", RuntimeWarning)
        try:
            with time_bound(timeout_s):
                rc = main(argv)
        except SystemExit as exc:
            code = exc.code
            rc = 0 if code is None else code if isinstance(code, int) else 1
            if isinstance(code, str):
                print(code, file=sys.stderr)
        except Hang:
            crash = Outcome("hang", f"past {timeout_s:g} s")
        except BaseException as exc:  # noqa: BLE001 - any other exception is the failure we look for
            crash = Outcome("traceback", exception_line(exc))
        with contextlib.suppress(Exception):
            out.flush()
            err.flush()
    stdout = raw_out.getvalue().decode("utf-8", "replace")
    stderr = raw_err.getvalue().decode("utf-8", "replace")
    runtime = [w for w in caught if issubclass(w.category, RuntimeWarning)]
    if crash is None and rc == 0 and runtime:
        crash = Outcome("wrong", f"RuntimeWarning: {runtime[0].message}")
    return crash, int(rc or 0), stdout, stderr


def call_loader(load: Callable[[], Any], *, timeout_s: float) -> tuple[Outcome, Any]:
    """Call a loader: (accepted, its result), (rejected, None) on a one-line SpiderFlowError,
    else a failure."""
    from spiderflow.errors import SpiderFlowError

    try:
        with time_bound(timeout_s), warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            result = load()
    except Hang:
        return Outcome("hang", f"past {timeout_s:g} s"), None
    except SpiderFlowError as exc:
        bad = one_line(str(exc))
        return (Outcome("unclean", bad) if bad else Outcome("rejected", str(exc)[:300])), None
    except BaseException as exc:  # noqa: BLE001
        return Outcome("traceback", exception_line(exc)), None
    return Outcome("accepted"), result


# ---------------------------------------------------------------- sane outputs

def strict_json(text: str, what: str) -> Any:
    def no_constant(name):
        raise Problem(f"{what}: JSON holds {name}", "badjson")
    try:
        return json.loads(text, parse_constant=no_constant)
    except ValueError as exc:
        raise Problem(f"{what}: not JSON ({exc}): {text[:120]!r}", "badjson") from None


def _time(value: Any, where: str, *, nullable: bool = False) -> None:
    if value is None and nullable:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise Problem(f"{where} = {value!r}: not a finite non-negative number")


NULLABLE = {"avg_jct_s", "p50_jct_s", "p95_jct_s", "avg_queue_s", "throughput_tokens_per_s", "jobs_per_hour",
            "gpu_utilization", "avg_overhead_s"}


def check_summary(s: Any, expected_jobs: int | None, where: str) -> None:
    if not isinstance(s, dict):
        raise Problem(f"{where}: summary is {type(s).__name__}")
    for key, value in s.items():
        _time(value, f"{where}.{key}", nullable=key in NULLABLE)
    if expected_jobs is not None and s.get("jobs") != expected_jobs:
        raise Problem(f"{where}.jobs = {s.get('jobs')}, but the trace holds {expected_jobs} jobs to replay")
    if s.get("completed", 0) + s.get("rejected", 0) != s.get("jobs"):
        raise Problem(f"{where}: completed {s.get('completed')} + rejected {s.get('rejected')} != jobs {s.get('jobs')}")
    if not s.get("completed"):
        raise Problem(f"{where}: exit 0 with no job completed")
    for key in ("avg_jct_s", "p95_jct_s", "avg_queue_s", "throughput_tokens_per_s"):
        if s.get(key) is None:
            raise Problem(f"{where}.{key} is null although {s['completed']} jobs completed")
    if s["gpu_utilization"] is not None and s["gpu_utilization"] > 1 + 1e-9:
        raise Problem(f"{where}.gpu_utilization = {s['gpu_utilization']} > 1")
    if s["avg_queue_s"] > s["avg_jct_s"] * (1 + 1e-9) + 1e-9:
        raise Problem(f"{where}: avg_queue_s {s['avg_queue_s']} > avg_jct_s {s['avg_jct_s']}")


def check_floors(floors: Any, expected_jobs: int) -> None:
    """compare's floors: null or finite and non-negative, over no more jobs than were replayed, the JCT floor
    no higher than the reference without foresight (not checked against the replays: the floors hold for
    planners whose plans are no faster than SpinSearch's alone, which a baseline may beat)."""
    if floors is None:
        return
    if not isinstance(floors, dict):
        raise Problem(f"floors is {type(floors).__name__}")
    for key, value in floors.items():
        _time(value, f"floors.{key}", nullable=key == "throughput_ceiling_tokens_per_s")
    if not 0 < floors["jobs"] <= expected_jobs:
        raise Problem(f"floors.jobs = {floors['jobs']}, {expected_jobs} jobs replayed")
    if floors["jct_floor_s"] > floors["jct_no_foresight_s"] * (1 + 1e-9):
        raise Problem(f"floors.jct_floor_s {floors['jct_floor_s']} > jct_no_foresight_s {floors['jct_no_foresight_s']}")


def check_plan(out: dict, gpus: int, names: set[str], allowed: list[str] | None) -> None:
    _time(out.get("overhead_s"), "overhead_s")
    _time(out.get("memory_gb_per_gpu"), "memory_gb_per_gpu")
    pred = out.get("predicted")
    if not isinstance(pred, dict) or not pred:
        raise Problem(f"predicted is {pred!r}")
    for key, value in pred.items():
        _time(value, f"predicted.{key}")
    if pred.get("iteration_s", 0) <= 0:
        raise Problem(f"predicted.iteration_s = {pred.get('iteration_s')}")
    placement = out.get("placement") or {}
    if sum(placement.values()) != gpus:
        raise Problem(f"placement {placement} holds {sum(placement.values())} GPUs, not --gpus {gpus}")
    if not set(placement) <= (set(allowed) if allowed else names):
        raise Problem(f"placement {placement} uses clusters outside {sorted(allowed or names)}")


_NONFINITE_TEXT = re.compile(r"(?<![\w/.-])-?(nan|inf|infinity)(?![\w.-])", re.IGNORECASE)


def no_nonfinite_text(text: str, what: str) -> None:
    m = _NONFINITE_TEXT.search(text)
    if m:
        raise Problem(f"{what} shows {m.group(0)!r}: {text[max(0, m.start() - 60):m.end() + 20]!r}")


# ---------------------------------------------------------------- accepted inputs match their files

def _yaml_duplicates(text: str) -> str | None:
    """The first key repeated within one YAML mapping, read independently of the loader."""
    node = yaml.compose(text, Loader=yaml.SafeLoader)
    stack, seen_nodes = [node], set()
    while stack:
        n = stack.pop()
        if n is None or id(n) in seen_nodes:
            continue
        seen_nodes.add(id(n))
        if isinstance(n, yaml.MappingNode):
            keys = [(k.tag, k.value) for k, _ in n.value if isinstance(k, yaml.ScalarNode)]
            dup = next((k for k in keys if keys.count(k) > 1), None)
            if dup:
                return dup[1]
            stack += [c for pair in n.value for c in pair]
        elif isinstance(n, yaml.SequenceNode):
            stack += n.value
    return None


def check_topology_file(data: bytes, topo) -> None:
    """An accepted topology file: no repeated key, and every cluster and link as written."""
    text = data.decode("utf-8").removeprefix("\ufeff")
    dup = _yaml_duplicates(text)
    if dup is not None:
        raise Problem(f"accepted a topology whose mappings repeat the key {dup!r} (one value silently won)")
    raw = yaml.safe_load(text)
    if len(raw["clusters"]) != len(topo.clusters):
        raise Problem(f"{len(raw['clusters'])} clusters in the file, {len(topo.clusters)} loaded")
    for c, rc in zip(topo.clusters, raw["clusters"]):
        for key in ("name", "gpu", "nodes", "gpus_per_node"):
            if getattr(c, key) != rc[key] or type(rc[key]) is bool:
                raise Problem(f"cluster {c.name}: {key} loaded as {getattr(c, key)!r}, file says {rc[key]!r}")
        if c.total_gpus <= 0:
            raise Problem(f"cluster {c.name} has {c.total_gpus} GPUs")
    raw_links = raw.get("links") or []
    if len(raw_links) != len(topo.links):
        raise Problem(f"{len(raw_links)} links in the file, {len(topo.links)} loaded")
    loaded = {frozenset((link.a, link.b)): link for link in topo.links}
    for rl in raw_links:
        link = loaded.get(frozenset((rl["a"], rl["b"])))
        if link is None:
            raise Problem(f"link {rl['a']}-{rl['b']} of the file was not loaded")
        for key in ("bandwidth_gbps", "latency_ms"):
            value = getattr(link, key)
            if value != rl[key] or not math.isfinite(value) or value < 0:
                raise Problem(f"link {link.a}-{link.b}: {key} loaded as {value!r}, file says {rl[key]!r}")


def _json_pairs_dup(pairs):
    keys = [k for k, _ in pairs]
    dup = next((k for k in keys if keys.count(k) > 1), None)
    if dup is not None:
        raise Problem(f"accepted JSON whose object repeats the key {dup!r} (one value silently won)")
    return dict(pairs)


def _json_constant(name: str):
    raise Problem(f"accepted JSON holding {name}")


def check_calibration_file(data: bytes, cal) -> None:
    """An accepted calibration file: strict JSON with no repeated key, values as written."""
    raw = json.loads(data.decode("utf-8").removeprefix("\ufeff"), object_pairs_hook=_json_pairs_dup,
                     parse_constant=_json_constant)
    for key, entry in (raw.get("paths") or {}).items():
        a, b = key.split("->")
        ab = cal.paths[(a, b)]
        if (ab.alpha_s, ab.beta_gbps) != (entry["alpha_s"], entry["beta_gbps"]):
            raise Problem(f"paths.{key} loaded as {ab}, file says {entry}")
    for section in ("paths", "intra", "rings"):
        for entry in getattr(cal, section).values():
            if not (math.isfinite(entry.alpha_s) and entry.alpha_s >= 0 and math.isfinite(entry.beta_gbps)
                    and entry.beta_gbps > 0):
                raise Problem(f"{section} entry loaded as {entry}")
    for gpu, eff in cal.gpu_efficiency.items():
        if not 0 < eff <= 1:
            raise Problem(f"gpu_efficiency.{gpu} loaded as {eff}")


def _data_rows(text: str) -> list[list[str]]:
    """The rows of CSV text without quotes (so a comma always separates fields)."""
    lines = [ln.removesuffix("\r") for ln in text.split("\n")]
    rows = [ln.split(",") for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]
    return [r for r in rows if any(f.strip() for f in r)]


def check_trace_load(load, *, data: bytes | None, fmt: str, skip_bad_rows: bool) -> None:
    """An accepted trace: sane jobs, unique ids, and (where the file is plain CSV of one row
    per job) every row either a job, a skipped bad row or a dropped public job."""
    from spiderflow.workload import MODELS

    jobs = load.jobs
    if not jobs:
        raise Problem("accepted a trace with no jobs")
    ids = [j.job_id for j in jobs]
    if len(set(ids)) != len(ids):
        raise Problem(f"two jobs share an id ({next(i for i in ids if ids.count(i) > 1)!r})")
    for j in jobs:
        for key in ("arrival_s",):
            _time(getattr(j, key), f"job {j.job_id!r}.{key}")
        for key in ("gpus", "iterations", "global_batch", "seq_len"):
            v = getattr(j, key)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise Problem(f"job {j.job_id!r}.{key} = {v!r}")
        if j.model not in MODELS:
            raise Problem(f"job {j.job_id!r}.model = {j.model!r}")
    if not skip_bad_rows and load.skipped:
        raise Problem(f"skipped {load.skipped} rows without skip_bad_rows")
    if data is None or fmt not in ("ours", "acme", "helios", "alibaba-v2023"):
        return
    text = data.decode("utf-8").removeprefix("\ufeff")
    if '"' in text or "\x00" in text:
        return  # quoting and NULs: leave row counting to the csv module
    rows = len(_data_rows(text)) - 1  # the header
    counted = len(jobs) + load.skipped + sum((load.dropped or {}).values())
    if counted != rows:
        raise Problem(f"{rows} data rows, but {len(jobs)} jobs + {load.skipped} skipped + "
                      f"{sum((load.dropped or {}).values())} dropped = {counted}")


def read_bytes(path: str | Path) -> bytes | None:
    try:
        return Path(path).read_bytes() if Path(path).is_file() else None
    except OSError:
        return None
