"""The one reader of JSON-lines files: ranks' records and the run directory's own.

Ranks (:mod:`emulator.jobs.worker`, :mod:`emulator.calibrate.opbench_worker`)
append one JSON object per line, flushed per line, so a rank killed or still
writing can leave its last line partial: :func:`read_lines` skips that one
line and a missing file reads as no lines (the rank never started). Files the
run directory keeps (``plans.jsonl``, ``microbench.jsonl``) are read with
``strict=True``: a file that cannot be read, or any line that is not a JSON
object, is an :class:`~spiderflow.errors.EmulatorError` naming the line.
"""

from __future__ import annotations

import json
from pathlib import Path

from spiderflow.errors import EmulatorError


def read_lines(path: str | Path, *, strict: bool = False) -> list[dict]:
    """The JSON objects of a JSON-lines file, blank lines skipped (see the module docstring)."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        if strict:
            raise EmulatorError(f"{path}: no such file") from None
        return []
    except OSError as exc:
        raise EmulatorError(f"{path}: cannot read ({exc.strerror})") from None
    lines = text.splitlines()
    out = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            if not strict and number == len(lines):  # the line a rank was writing when it stopped
                continue
            raise EmulatorError(f"{path}: line {number} is not valid JSON ({exc.msg}); fix or delete "
                                "that line (an interrupted run can leave a partial last line)") from None
        if not isinstance(value, dict):
            raise EmulatorError(f"{path}: line {number} is not a JSON object (got {type(value).__name__})")
        out.append(value)
    return out
