"""Shared pieces of the trace readers: the load result, row errors, CSV rows with
line numbers, and field parsers.

Every problem with user input becomes one :class:`ConfigError` line naming the
file, the line, the field, the value and the fix, e.g.
``traces/x.csv:14: gpus must be a positive integer (got 'abc')``.
A bad *row* raises :class:`RowError` inside a reader; :class:`RowSink` turns it
into that ConfigError, or counts and skips it when ``skip_bad_rows`` is set.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from spiderflow.errors import ConfigError
from spiderflow.workload import Job

SKIP_HINT = "fix the row or skip bad rows (skip_bad_rows=True, --skip-bad-rows)"


@dataclass(frozen=True, kw_only=True)
class TraceLoad:
    """What :func:`spiderflow.traces.load_trace` read.

    ``skipped`` counts malformed rows left out under ``skip_bad_rows``;
    ``dropped`` counts well-formed public-trace jobs the mapping left out, by
    reason (``no_gpus``, ``not_finished``, ``no_runtime``, ``below_min_gpus``).
    """

    jobs: tuple[Job, ...]
    skipped: int
    format: str
    source: str
    dropped: Mapping[str, int] = field(default_factory=dict)

    def summary(self) -> str:
        """One line for a CLI: how many jobs, and what was skipped or dropped."""
        parts = [f"{self.source}: {len(self.jobs)} jobs ({self.format})"]
        if self.skipped:
            parts.append(f"skipped {self.skipped} bad rows")
        if any(self.dropped.values()):
            parts.append("dropped " + ", ".join(f"{k}={v}" for k, v in sorted(self.dropped.items()) if v))
        return "; ".join(parts)


class RowError(Exception):
    """One bad field of one row: ``field`` and a message that holds the value and fix."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name} {message}")
        self.field_name = field_name
        self.message = message


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


def read_text(path: str | Path, source: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8-sig")
    except IsADirectoryError:
        raise ConfigError(f"{source}: is a directory, not a trace file; name the file") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{source}: is not UTF-8 text ({exc.reason} at byte {exc.start}); "
                          "pass a CSV or JSON trace") from None
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read trace file ({exc.strerror})") from None


def csv_rows(text: str) -> Iterator[tuple[int, list[str]]]:
    """``(line number, fields)`` of each non-blank, non-comment (``#``) CSV line."""
    lines = ("" if ln.lstrip().startswith("#") else ln for ln in text.splitlines())
    reader = csv.reader(lines)
    for fields in reader:
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
    missing = [c for c in required if c not in header]
    if missing:
        raise ConfigError(f"{source}:{header_line}: header lacks column(s) {', '.join(missing)} "
                          f"(got {','.join(header)}); format {fmt} needs {','.join(required)}")
    if allowed is not None:
        allowed = list(allowed)
        unknown = [c for c in header if c not in allowed]
        if unknown:
            raise ConfigError(f"{source}:{header_line}: header column {unknown[0]!r} is not known; "
                              f"allowed: {','.join(allowed)}")
    dupes = sorted({c for c in header if header.count(c) > 1})
    if dupes:
        raise ConfigError(f"{source}:{header_line}: header repeats column(s) {', '.join(dupes)}; "
                          "keep one of each")

    def records() -> Iterator[tuple[int, dict[str, str] | RowError]]:
        for line, fields in rows:
            if len(fields) != len(header):
                yield line, RowError("row", f"has {len(fields)} fields but the header has "
                                     f"{len(header)} (got {','.join(fields)!r})")
            else:
                yield line, dict(zip(header, fields))

    return header_line, header, records()


# --- field parsers: each raises RowError naming the field, the value and the fix ---

def text_field(row: Mapping[str, str], name: str) -> str:
    value = row[name]
    if not value:
        raise RowError(name, "must not be empty")
    return value


def int_field(row: Mapping[str, str], name: str, *, minimum: int = 1) -> int:
    raw = row[name]
    try:
        value = int(raw)
    except ValueError:
        kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise RowError(name, f"must be {kind} (got {raw!r})") from None
    if value < minimum:
        kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise RowError(name, f"must be {kind} (got {raw!r})")
    return value


def float_field(row: Mapping[str, str], name: str, *, minimum: float = 0.0,
                optional: bool = False) -> float | None:
    """A finite number >= ``minimum``; blank (or ``nan``, as pandas writes it) is None if ``optional``."""
    raw = row[name]
    if optional and raw.lower() in ("", "nan", "none", "null"):
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < minimum:
        raise RowError(name, f"must be a number >= {minimum:g} (got {raw!r})")
    return value


def time_field(row: Mapping[str, str], name: str, *, optional: bool = False) -> float | None:
    """An ISO date-time (``2023-03-01 00:18:22+08:00``) as POSIX seconds; no zone means UTC."""
    raw = row[name]
    if optional and raw.lower() in ("", "nan", "nat", "none", "null"):
        return None
    return parse_time(raw, name)


def parse_time(raw: object, name: str) -> float:
    if not isinstance(raw, str):
        raise RowError(name, f"must be a date-time string like '2023-03-01 00:18:22+08:00' (got {raw!r})")
    try:
        stamp = datetime.fromisoformat(raw)
    except ValueError:
        raise RowError(name, f"must be a date-time like '2023-03-01 00:18:22+08:00' (got {raw!r})") from None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=timezone.utc)
    return stamp.timestamp()
