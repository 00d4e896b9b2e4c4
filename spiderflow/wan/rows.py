"""What the two change files share: reading a headed CSV (``#`` comments and blank lines skipped,
as in our trace CSV) into ``(line, row)`` pairs, the one-line error every bad value becomes:
``FILE: row N: FIELD must be ... (got X); FIX`` where N is the row's line number in the file, and
writing one (:func:`csv_text`)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from pathlib import Path

from spiderflow.errors import ConfigError
from spiderflow.inputs import read_text
from spiderflow.traces.common import _NUMBER, MAX_TIME_S, RowError, csv_rows, header_rows, shown

MAX_ROWS = 10_000_000  # a file of more change rows than this is a mistake (a trace of ~30 years at 100 s steps)


def rows(path: str | Path, *, what: str, columns: tuple[str, ...]) -> tuple[str, Iterator[tuple[int, dict]]]:
    """``(source, (line, row dict) pairs)`` of a headed CSV whose header is exactly ``columns`` (any
    order). A row that does not parse is a ConfigError naming its line."""
    if not isinstance(path, (str, Path)) or "\x00" in str(path):
        raise ConfigError(f"{what} path must be a file path (got {shown(path)})")
    source = str(path)
    text = read_text(path, what=what)
    if not any(True for _ in csv_rows(text)):
        raise ConfigError(f"{source}: is empty; a {what} needs the header {','.join(columns)} and rows under it")
    _, _, records = header_rows(text, source, required=columns, allowed=columns, fmt=what)

    def checked() -> Iterator[tuple[int, dict]]:
        for n, (line, row) in enumerate(records):
            if n >= MAX_ROWS:
                raise ConfigError(f"{source}: has more than {MAX_ROWS:,} rows; is this the right file?")
            if isinstance(row, RowError):
                raise fail(source, line, row.field_name, row.message)
            yield line, row

    return source, checked()


def fail(source: str, line: int, field: str, message: str) -> ConfigError:
    return ConfigError(f"{source}: row {line}: {field} {message}")


def number(source: str, line: int, row: dict, name: str, *, fix: str, low: float = 0.0, strict: bool = False,
           high: float = MAX_TIME_S, optional: bool = False) -> float | None:
    """A plain decimal number in ``[low, high]`` (``(low, high]`` when ``strict``); an empty cell is
    None when ``optional``. ``nan``, ``inf`` and text are refused with the value and ``fix``."""
    raw = row[name]
    if optional and raw == "":
        return None
    value = float(raw) if _NUMBER.match(raw) else math.nan
    kind = f"a number {'>' if strict else '>='} {low:g}" + (" or empty (unchanged)" if optional else "")
    if math.isnan(value) or value < low or (strict and value == low):
        raise fail(source, line, name, f"must be {kind} (got {shown(raw)}); {fix}")
    if value > high:
        raise fail(source, line, name, f"must be at most {high:g} (got {shown(raw)}); is it a typo?")
    return value


def timed(source: str, records: Iterator[tuple[int, dict]]) -> Iterator[tuple[int, dict, float]]:
    """``(line, row, time_s)``: each row's ``time_s`` checked, and the rows sorted by it (equal times
    keep the file's order; a row earlier than the one above it is refused, not re-sorted)."""
    last = None
    for line, row in records:
        time_s = number(source, line, row, "time_s", fix="give seconds on the trace's clock")
        if last is not None and time_s < last[0]:
            raise fail(source, line, "time_s", f"must not go back in time: row {last[1]} is at {last[0]:g} s "
                       f"(got {shown(row['time_s'])}); sort the rows by time_s")
        last = (time_s, line)
        yield line, row, time_s


def csv_text(columns: tuple[str, ...], cells: Iterable[list[str]], *, comment: str = "") -> str:
    """A change file's text: ``comment`` lines first, each behind ``# ``, then the header and a line
    of ``cells`` per row."""
    out = [f"# {ln}" if ln else "#" for ln in comment.splitlines()]
    out.append(",".join(columns))
    out += [",".join(row) for row in cells]
    return "\n".join(out) + "\n"
