"""Tell a trace's format from its first bytes: the CSV header's columns, the JSON
shape, or (for the headerless Alibaba v2020 tables) the row shape."""

from __future__ import annotations

import csv
from pathlib import Path

from spiderflow.errors import ConfigError
from spiderflow.inputs import decode
from spiderflow.traces import alibaba2020

FORMATS = ("ours", "acme", "helios", "philly", "alibaba-v2020", "alibaba-v2023")

# format -> columns its header must hold (checked in this order; first match wins)
HEADER_SIGNS: tuple[tuple[str, frozenset[str]], ...] = (
    ("ours", frozenset({"job_id", "arrival_s", "model", "gpus"})),
    ("acme", frozenset({"job_id", "gpu_num", "type", "state", "submit_time"})),
    ("helios", frozenset({"job_id", "vc", "gpu_num", "state", "submit_time"})),
    ("alibaba-v2023", frozenset({"name", "num_gpu", "gpu_milli"})),
)
HEAD_BYTES = 65536


def _unknown(source: str, seen: str) -> ConfigError:
    return ConfigError(f"{source}: cannot tell the trace format ({seen}); formats: "
                       f"{', '.join(FORMATS)}; pass one with --format (format=...)")


def sniff_format(path: str | Path, *, source: str | None = None) -> str:
    """One of FORMATS, or a ConfigError that lists them and names ``--format``."""
    path = Path(path)
    source = source or str(path)
    if path.is_dir():
        if (path / alibaba2020.TASK_FILE).is_file():
            return "alibaba-v2020"
        raise _unknown(source, f"a directory without {alibaba2020.TASK_FILE}")
    try:
        with open(path, "rb") as fh:
            data = fh.read(HEAD_BYTES)
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read trace file ({exc.strerror})") from None
    try:
        head = data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        if exc.end < len(data) or len(data) < HEAD_BYTES:  # a bad byte, not a character the head cut
            decode(data, source)  # raises: names the line and offset
        head = data[:exc.start].decode("utf-8").removeprefix("\ufeff")
    body = head.lstrip()
    if body.startswith(("[", "{")):
        if '"jobid"' in head and ('"attempts"' in head or '"submitted_time"' in head):
            return "philly"
        raise _unknown(source, "JSON without the philly keys jobid, attempts, submitted_time")
    first = next((ln for ln in body.splitlines() if ln.strip() and not ln.lstrip().startswith("#")), "")
    columns = {c.strip() for c in next(csv.reader([first]), [])}
    for fmt, needed in HEADER_SIGNS:
        if needed <= columns:
            return fmt
    if alibaba2020.sniff_table(path):
        return "alibaba-v2020"
    shown = first if len(first) <= 80 else first[:77] + "..."
    raise _unknown(source, f"first line {shown!r}" if first else "the file is empty")
