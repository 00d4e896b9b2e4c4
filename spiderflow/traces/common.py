"""Shared pieces of the trace readers: the load result, row errors, CSV rows with
line numbers, and field parsers.

Every problem with user input becomes one :class:`ConfigError` line naming the
file, the line, the field, the value and the fix, e.g.
``traces/x.csv:14: gpus must be a positive integer (got 'abc')``.
A bad *row* raises :class:`RowError` inside a reader; :class:`RowSink` turns it
into that ConfigError, or counts and skips it when ``skip_bad_rows`` is set.

Every number is checked against the bounds below *before* any arithmetic, so
no sum, product or rounding of trace values can overflow or turn into
``inf``/``nan``. The bounds are far beyond any real trace; they are there to
catch corrupt values, not to judge jobs (a job too big for every topology is
the simulator's business).
"""

from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from spiderflow.errors import ConfigError
from spiderflow.inputs import read_text as read_input
from spiderflow.workload import Job

SKIP_HINT = "fix the row or skip bad rows (skip_bad_rows=True, --skip-bad-rows)"

# --- bounds on trace values (docs/traces.md, "Errors") ---
MAX_TRACE_BYTES = 1 << 30  # 1 GiB: a wrong path (a disk image, a core dump) fails fast, not out of memory
MAX_GPUS = 1 << 20  # GPUs of one job: 1,048,576, far beyond the largest GPU clusters built (~10^5)
MAX_ITERATIONS = 10**12
MAX_BATCH = 1 << 24  # sequences per global batch (LLM pretraining uses ~10^3)
MAX_SEQ_LEN = 1 << 24  # tokens per sequence
MAX_PRIORITY = 10**9  # |priority|
MAX_TIME_S = 1e11  # a time in seconds on a trace's clock (~3,170 years; POSIX time is ~1.7e9 today)
MAX_DURATION_S = 1e9  # a job's run time (~31.7 years)
MAX_INSTANCES = 1e6  # Alibaba v2020 inst_num: instances of one task
MAX_PLAN_GPU_PERCENT = 1e4  # Alibaba v2020 plan_gpu: 100 GPUs per instance
# date-time fields: traces of GPU clusters fall between these (the public ones in 2017-2024)
EARLIEST, LATEST = datetime(1970, 1, 1, tzinfo=timezone.utc), datetime(2100, 1, 1, tzinfo=timezone.utc)
MAX_NUMBER_CHARS = 64  # an integer of more digits is too large; a date-time of more characters is no date
_INT = re.compile(r"[+-]?[0-9]+\Z")
_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\Z")


def shown(value: object, limit: int = 40) -> str:
    """``repr(value)``, cut to ``limit`` characters, for an error message that stays one short line."""
    try:
        text = repr(value)
    except RecursionError:  # a JSON value nested nearly as deep as the decoder allows
        text = f"<{type(value).__name__} nested too deeply>"
    return text if len(text) <= limit else text[:limit - 3] + "..."


@dataclass(frozen=True, kw_only=True)
class TraceLoad:
    """What :func:`spiderflow.traces.load_trace` read.

    ``skipped`` counts malformed rows left out under ``skip_bad_rows``;
    ``dropped`` counts well-formed public-trace jobs the mapping left out, by
    reason (``no_gpus``, ``not_finished``, ``no_runtime``, ``fractional``,
    ``below_min_gpus``, and ``merged``: GPU shares folded into another job);
    ``report`` says, one line per mapping rule, what it kept and dropped.
    """

    jobs: tuple[Job, ...]
    skipped: int
    format: str
    source: str
    dropped: Mapping[str, int] = field(default_factory=dict)
    report: tuple[str, ...] = ()

    def summary(self) -> str:
        """One line for a CLI: how many jobs, and what was skipped or dropped."""
        parts = [f"{self.source}: {len(self.jobs)} jobs ({self.format})"]
        if self.skipped:
            parts.append(f"skipped {self.skipped} bad rows")
        if any(self.dropped.values()):
            parts.append("dropped " + ", ".join(f"{k}={v}" for k, v in sorted(self.dropped.items()) if v))
        return "; ".join(parts)


class RowError(Exception):
    """One bad field of one row: ``field`` and a message that holds the value and fix.

    ``column`` (0-based) is set where only the field's position is known (a CSV
    field too long to parse); :func:`named` gives it the header's name.
    """

    def __init__(self, field_name: str, message: str, *, column: int | None = None) -> None:
        super().__init__(f"{field_name} {message}")
        self.field_name = field_name
        self.message = message
        self.column = column


def named(err: RowError, columns: list[str] | tuple[str, ...]) -> RowError:
    """``err`` with its field named after ``columns[err.column]`` where only the position is known."""
    if err.column is not None and err.column < len(columns):
        return RowError(columns[err.column], err.message)
    return err


class RowSink:
    """Raises or counts row errors, per ``skip_bad_rows``."""

    def __init__(self, source: str, *, skip_bad_rows: bool) -> None:
        self.source = source
        self.skip_bad_rows = skip_bad_rows
        self.skipped = 0

    def bad(self, line: int, err: RowError, *, source: str | None = None) -> None:
        if not self.skip_bad_rows:
            raise ConfigError(f"{source or self.source}:{line}: {err}; {SKIP_HINT}") from None
        self.skipped += 1


def read_text(path: str | Path) -> str:
    """The trace file's text (:func:`spiderflow.inputs.read_text`: a directory, a
    byte that is not UTF-8 or a file over MAX_TRACE_BYTES is one ConfigError line)."""
    return read_input(path, what="trace file", max_bytes=MAX_TRACE_BYTES)


def _lines(text: str) -> Iterator[str]:
    """Lines split at ``\\n`` only (``str.splitlines`` also splits at form feeds and U+2028,
    which would shift the line numbers an editor shows); comment lines become blank."""
    for ln in io.StringIO(text, newline="\n"):
        ln = ln.rstrip("\n")
        ln = ln[:-1] if ln.endswith("\r") else ln
        yield "" if ln.lstrip().startswith("#") else ln


def _csv_error(exc: csv.Error, line: str) -> RowError:
    if "field larger than field limit" not in str(exc):
        return RowError("row", f"is not valid CSV ({exc})")
    limit = csv.field_size_limit()
    why = f"is longer than {limit:,} characters; no trace field is that long (a stray quote?)"
    column = None
    if '"' not in line:  # unquoted: the n-th comma-separated piece is the n-th field
        column = next((i for i, f in enumerate(line.split(",")) if len(f) > limit), None)
    if column is None:
        return RowError("row", "has a field that " + why)
    return RowError(f"field {column + 1}", why, column=column)


def csv_rows(text: str) -> Iterator[tuple[int, list[str] | RowError]]:
    """``(line number, fields or RowError)`` of each non-blank, non-comment (``#``) CSV line.

    A line the csv module cannot parse (a field over its 128 KiB limit, a
    stray quote) is a RowError on that line; reading goes on with the next.
    """
    last = [""]  # the line the reader took last, to find a too-long field in

    def feed() -> Iterator[str]:
        for ln in _lines(text):
            last[0] = ln
            yield ln

    reader = csv.reader(feed())
    while True:
        try:
            fields = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            yield reader.line_num, _csv_error(exc, last[0])
            continue
        if not fields or all(not f.strip() for f in fields):
            continue
        yield reader.line_num, [f.strip() for f in fields]


def header_rows(text: str, source: str, *, required: Iterable[str], fmt: str,
                allowed: Iterable[str] | None = None
                ) -> tuple[int, list[str], Iterator[tuple[int, dict[str, str] | RowError]]]:
    """Split a headed CSV into its header and ``(line, row dict or RowError)`` records.

    A header missing a ``required`` column, or (when ``allowed`` is given)
    holding an unknown one, is a ConfigError on the header line.
    """
    rows = csv_rows(text)
    try:
        header_line, header = next(rows)
    except StopIteration:
        raise ConfigError(f"{source}: is empty; format {fmt} needs a header line and job rows") from None
    if isinstance(header, RowError):
        raise ConfigError(f"{source}:{header_line}: header {header}; format {fmt} needs "
                          f"{','.join(required)}")
    missing = [c for c in required if c not in header]
    if missing:
        raise ConfigError(f"{source}:{header_line}: header lacks column(s) {', '.join(missing)} "
                          f"(got {shown(','.join(header), 80)}); format {fmt} needs {','.join(required)}")
    if allowed is not None:
        allowed = list(allowed)
        unknown = [c for c in header if c not in allowed]
        if unknown:
            raise ConfigError(f"{source}:{header_line}: header column {shown(unknown[0])} is not known; "
                              f"allowed: {','.join(allowed)}")
    dupes = sorted({c for c in header if header.count(c) > 1})
    if dupes:
        raise ConfigError(f"{source}:{header_line}: header repeats column(s) {shown(', '.join(dupes))}; "
                          "keep one of each")

    def records() -> Iterator[tuple[int, dict[str, str] | RowError]]:
        for line, fields in rows:
            if isinstance(fields, RowError):
                yield line, named(fields, header)
            elif len(fields) != len(header):
                yield line, RowError("row", f"has {len(fields)} fields but the header has "
                                     f"{len(header)} (got {shown(','.join(fields))})")
            else:
                yield line, dict(zip(header, fields))

    return header_line, header, records()


# --- field parsers: each raises RowError naming the field, the value and the fix ---

def text_field(row: Mapping[str, str], name: str) -> str:
    value = row[name]
    if not value:
        raise RowError(name, "must not be empty")
    return value


def _bound(value: float) -> str:
    return f"{int(value):,}" if value == int(value) and value <= 1e7 else f"{value:g}"


def int_field(row: Mapping[str, str], name: str, *, minimum: int = 1, maximum: int) -> int:
    """An integer in [minimum, maximum], written in ASCII digits."""
    raw = row[name]
    kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
    if not _INT.match(raw):
        raise RowError(name, f"must be {kind} (got {shown(raw)})")
    # more digits than MAX_NUMBER_CHARS: too large, and int() would refuse past 4,300 digits
    value = int(raw) if len(raw.lstrip("+-").lstrip("0")) <= MAX_NUMBER_CHARS else math.inf
    if value < minimum:
        raise RowError(name, f"must be {kind} (got {shown(raw)})")
    if value > maximum:
        raise RowError(name, f"must be at most {_bound(maximum)} (got {shown(raw)})")
    return value  # type: ignore[return-value]


def float_field(row: Mapping[str, str], name: str, *, minimum: float = 0.0, maximum: float,
                optional: bool = False) -> float | None:
    """A number in [minimum, maximum]; blank (or ``nan``, as pandas writes it) is None if ``optional``.

    Only plain decimal text is read (``12``, ``-0.5``, ``1e6``): not ``inf``,
    ``1_000`` or 400-digit integers, which ``float()`` would take or choke on.
    """
    raw = row[name]
    if optional and raw.lower() in ("", "nan", "none", "null"):
        return None
    value = float(raw) if _NUMBER.match(raw) else math.nan  # 400 digits: inf, refused below
    if math.isnan(value) or value < minimum:
        raise RowError(name, f"must be a number >= {minimum:g} (got {shown(raw)})")
    if value > maximum:
        raise RowError(name, f"must be at most {_bound(maximum)} (got {shown(raw)})")
    return value


def check_duration(value: float, name: str, raw: str) -> float:
    """A run time computed from two times, within MAX_DURATION_S."""
    if value > MAX_DURATION_S:
        raise RowError(name, f"makes a run time of {value:.3g} s, more than {MAX_DURATION_S:g} s "
                       f"(got {shown(raw)}); check the times")
    return value


def time_field(row: Mapping[str, str], name: str, *, optional: bool = False) -> float | None:
    """An ISO date-time (``2023-03-01 00:18:22+08:00``) as POSIX seconds; no zone means UTC."""
    raw = row[name]
    if optional and raw.lower() in ("", "nan", "nat", "none", "null"):
        return None
    return parse_time(raw, name)


def parse_time(raw: object, name: str) -> float:
    """A date-time between EARLIEST and LATEST as POSIX seconds; no zone means UTC."""
    if not isinstance(raw, str):
        raise RowError(name, f"must be a date-time string like '2023-03-01 00:18:22+08:00' (got {shown(raw)})")
    try:
        if len(raw) > MAX_NUMBER_CHARS:
            raise ValueError(raw)
        stamp = datetime.fromisoformat(raw)
    except ValueError:
        raise RowError(name, f"must be a date-time like '2023-03-01 00:18:22+08:00' (got {shown(raw)})") from None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=timezone.utc)
    if not EARLIEST <= stamp < LATEST:
        raise RowError(name, f"must be between {EARLIEST.year} and {LATEST.year} (got {shown(raw)}); "
                       "check the date")
    return stamp.timestamp()
