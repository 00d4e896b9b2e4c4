"""A run directory of ``emulator calibrate``, read and checked (no root).

``load_run`` reads config.json (required), microbench.jsonl, plans.jsonl and
timelines/*.json (each optional) and checks every record against the formats
of docs/calibration.md before the report computes anything from them: a value
of the wrong type or out of range is one EmulatorError line naming the file,
the line (JSON-lines files), the field and the fix, never a traceback from
deep in the fits or figures and never a malformed record quietly left out of a
fit (as a size "x" was) or of the MAPE. Unknown keys are kept (for the record)
and not checked.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from emulator.calibrate.fit import OPS, read_numbered_jsonl
from spiderflow.errors import ConfigError, EmulatorError
from spiderflow.inputs import finite, load_json, read_text
from spiderflow.traces.common import shown

SCOPES = ("wan", "intra", "pair", "cross")
OP_KINDS = ("F", "B", "S")
MAX_BYTES = 1e15  # real-equivalent bytes of one message or buffer: a petabyte
MAX_SECONDS = 1e6  # any time in a run directory (about 11.6 days)
MAX_DILATION = 1e6
GOT_CHARS = 60


@dataclass(frozen=True, kw_only=True)
class Run:
    path: Path
    config: dict
    microbench: list[dict]
    plans: list[dict]
    timelines: dict[str, dict]  # plan_id -> timelines/<plan_id>.json

    @property
    def scale(self) -> float:
        return self.config["scale"]

    @property
    def dilation(self) -> float:
        return float(self.config.get("dilation", 1.0))

    @property
    def mechanism(self) -> str:
        return str(self.config.get("mechanism") or "unknown mechanism")


class _Where:
    """Where a record is (file, and line for JSON-lines) and the fix its errors end with."""

    def __init__(self, path: Path, fix: str, line: int | None = None):
        self.path, self.fix, self.line = path, fix, line

    def refuse(self, field: str, must: str, value: Any = None, *, got: bool = True) -> EmulatorError:
        where = f"{self.path}" + ("" if self.line is None else f": line {self.line}")
        return EmulatorError(f"{where}: {field} must be {must}" + (f" (got {shown(value, GOT_CHARS)})" if got else "")
                             + f"; {self.fix}")


# ---- value checks: each returns None when the value is fine, else what it must be ------------------------

def _text(value) -> str | None:
    return None if isinstance(value, str) else "a string"


def _name(value) -> str | None:
    return None if isinstance(value, str) and value.strip() else "a non-empty string"


def _int_at_least(low: int) -> Callable[[Any], str | None]:
    def check(value):
        ok = isinstance(value, int) and not isinstance(value, bool) and finite(value) and value >= low
        return None if ok else f"an integer >= {low}"
    return check


def _positive_up_to(high: float) -> Callable[[Any], str | None]:
    def check(value):
        return None if finite(value) and 0 < value <= high else f"a positive number up to {high:g}"
    return check


def _one_of(choices: tuple) -> Callable[[Any], str | None]:
    return lambda value: None if value in choices and isinstance(value, str) else "one of " + ", ".join(choices)


def _list_of(check: Callable[[Any], str | None]) -> Callable[[Any], str | None]:
    def each(value):
        if not isinstance(value, list):
            return "a list"
        bad = next((check(v) for v in value if check(v)), None)
        return None if bad is None else f"a list, each {bad}"
    return each


def _or_null(check: Callable[[Any], str | None]) -> Callable[[Any], str | None]:
    return lambda value: None if value is None or check(value) is None else f"null or {check(value)}"


_seconds = _positive_up_to(MAX_SECONDS)


def _alpha(value) -> str | None:
    return None if finite(value) and 0 <= value <= MAX_SECONDS else f"a number from 0 to {MAX_SECONDS:g}"


def _fields(record: dict, where: _Where, required: dict, optional: dict) -> None:
    for field, check in required.items():
        if field not in record:
            must = check(None) or "present"
            raise where.refuse(field, must + " (the field is missing)", got=False)
    for field, check in (*required.items(), *optional.items()):
        if field in record and (must := check(record[field])):
            raise where.refuse(field, must, record[field])


# ---- the files -------------------------------------------------------------------------------------------

_CONFIG = {"dilation": _positive_up_to(MAX_DILATION), "dilation_reason": _text, "mechanism": _text,
           "compute": _text, "started": _text, "note": _text, "topologies": _list_of(_text),
           "host_steal_pct": lambda v: None if finite(v) and 0 <= v <= 100 else "a number from 0 to 100"}

_MICROBENCH = {"topology": _name, "op": _one_of(OPS), "scope": _one_of(SCOPES), "name": _name,
               "ranks": _int_at_least(2), "bytes": _positive_up_to(MAX_BYTES), "time_s": _seconds}
_MICROBENCH_OPTIONAL = {"clusters": _list_of(_text), "count": _int_at_least(0), "type": _text,
                        "samples_s": _list_of(_seconds), "configured_alpha_s": _or_null(_alpha),
                        "configured_beta_gbps": _or_null(_positive_up_to(1e9))}
_COMPUTE = {"device": _name, "predicted_s": _seconds, "time_s": _seconds,
            "efficiency": lambda v: None if finite(v) and 0 < v <= 1 else "a number in (0, 1]"}

_PLAN = {"plan_id": _name, "status": _name}
_PLAN_OPTIONAL = {"topology": _text, "job": _text, "shape": _text, "description": _text, "ranks": _int_at_least(1),
                  "reason": _or_null(_text)}
PLAN_TIMES = ("predicted_uncalibrated_s", "predicted_calibrated_s", "measured_s")


def check_config(config: dict, path: Path) -> None:
    where = _Where(path, "write the values the run used")
    scale = config.get("scale")
    if not finite(scale) or not scale > 0:
        raise EmulatorError(f"{path}: scale must be a positive number (got {scale!r}); write the --scale the run used")
    _fields(config, where, {}, _CONFIG)


def check_microbench(record: dict, where: _Where) -> None:
    if record.get("op") == "compute":
        _fields(record, where, _COMPUTE, {"name": _text})
        return
    _fields(record, where, _MICROBENCH, _MICROBENCH_OPTIONAL)
    if record["op"] == "p2p" and record["ranks"] != 2:
        raise where.refuse("ranks", "2 for a p2p record", record["ranks"])


def _spread(value) -> str | None:
    ok = (isinstance(value, list) and len(value) == 2 and all(_seconds(v) is None for v in value)
          and value[0] <= value[1])
    return None if ok else "null or [min, max] of positive seconds, min <= max"


def check_plan(record: dict, where: _Where) -> None:
    _fields(record, where, _PLAN, {**_PLAN_OPTIONAL, "measured_spread_s": lambda v: None if v is None else _spread(v)})
    if record["status"] == "ok":  # it ran: both predictions are needed, and a measurement if it made one
        _fields(record, _Where(where.path, "a plan with status ok has both predictions; fix or delete that line",
                               where.line), {k: _seconds for k in PLAN_TIMES[:2]}, {})
    _fields(record, where, {}, {k: _or_null(_seconds) for k in PLAN_TIMES})


def _op(value) -> str | None:
    ok = (isinstance(value, list) and len(value) == 4 and value[0] in OP_KINDS and isinstance(value[0], str)
          and _int_at_least(-1)(value[1]) is None and all(finite(t) and abs(t) <= MAX_SECONDS for t in value[2:])
          and value[2] <= value[3])
    return None if ok else "[kind F, B or S, micro-batch >= -1, start_s, end_s >= start_s]"


def _check_ops(ops, field: str, where: _Where) -> None:
    if not isinstance(ops, list):
        raise where.refuse(field, "a list of ops", ops)
    for j, op in enumerate(ops):
        if must := _op(op):
            raise where.refuse(f"{field}[{j}]", must, op)


def _check_object(value, field: str, where: _Where) -> None:
    if not isinstance(value, dict):
        raise where.refuse(field, "an object", value)


def check_timeline(doc: dict, path: Path) -> None:
    where = _Where(path, "fix or delete that file (the report draws no timeline without it)")
    _fields(doc, where, {}, {"plan_id": _name, "iteration": _int_at_least(0)})
    predicted, measured = doc.get("predicted", {}), doc.get("measured", {})
    _check_object(predicted, "predicted", where)
    _check_object(measured, "measured", where)
    _fields(predicted, where, {}, {"calibrated": _or_null(lambda v: None if isinstance(v, bool) else "true or false")})
    stages = predicted.get("stages", [])
    if not isinstance(stages, list):
        raise where.refuse("predicted.stages", "a list (one list of ops per stage)", stages)
    for i, ops in enumerate(stages):
        _check_ops(ops, f"predicted.stages[{i}]", where)
    ranks = measured.get("ranks", [])
    if not isinstance(ranks, list):
        raise where.refuse("measured.ranks", "a list", ranks)
    for i, rank in enumerate(ranks):
        field = f"measured.ranks[{i}]"
        _check_object(rank, field, where)
        for key, must in (("rank", _int_at_least(0)), ("stage", _int_at_least(0))):
            if key not in rank:
                raise where.refuse(f"{field}.{key}", must(None) + " (the field is missing)", got=False)
            if must(rank[key]):
                raise where.refuse(f"{field}.{key}", must(rank[key]), rank[key])
        if rank.get("replica") is not None and _int_at_least(0)(rank["replica"]):
            raise where.refuse(f"{field}.replica", "null or an integer >= 0", rank["replica"])
        _check_ops(rank.get("ops", []), f"{field}.ops", where)


# ---- reading ---------------------------------------------------------------------------------------------

def _read_json(path: Path) -> dict:
    """A run directory's JSON object, read through spiderflow.inputs (size, UTF-8, duplicate keys,
    NaN/Infinity, nesting): one EmulatorError line otherwise."""
    try:
        value = load_json(read_text(path, what="JSON file"), str(path))
    except ConfigError as exc:
        raise EmulatorError(str(exc)) from None
    if not isinstance(value, dict):
        raise EmulatorError(f"{path}: top level must be a JSON object")
    return value


def _read_lines(path: Path, check: Callable[[dict, _Where], None]) -> list[dict]:
    if not path.is_file():
        return []
    records = read_numbered_jsonl(path)
    for number, record in records:
        check(record, _Where(path, "fix or delete that line", number))
    return [record for _, record in records]


def _unique_plan_ids(plans: list[dict], path: Path) -> None:
    seen: set[str] = set()
    for plan in plans:
        if plan["plan_id"] in seen:
            raise EmulatorError(f"{path}: plan_id {plan['plan_id']!r} appears twice; plan ids name timelines "
                                "and must be unique: rename or delete one")
        seen.add(plan["plan_id"])


def load_run(run_dir: Path) -> Run:
    """The run directory's files, checked (module docstring)."""
    run_dir = Path(run_dir)
    if not (run_dir / "config.json").is_file():
        raise EmulatorError(f"{run_dir}: no config.json; is this a directory written by `emulator calibrate`?")
    config = _read_json(run_dir / "config.json")
    check_config(config, run_dir / "config.json")
    plans = _read_lines(run_dir / "plans.jsonl", check_plan)
    _unique_plan_ids(plans, run_dir / "plans.jsonl")
    timelines: dict[str, dict] = {}
    files: dict[str, Path] = {}
    for path in sorted((run_dir / "timelines").glob("*.json")):
        doc = _read_json(path)
        check_timeline(doc, path)
        plan_id = doc.get("plan_id") or path.stem
        if plan_id in files:
            raise EmulatorError(f"{path}: plan_id {plan_id!r} already has a timeline, {files[plan_id]}; "
                                "delete one of the two files")
        timelines[plan_id], files[plan_id] = doc, path
    return Run(path=run_dir, config=config, microbench=_read_lines(run_dir / "microbench.jsonl", check_microbench),
               plans=plans, timelines=timelines)
