"""``load_trace``: pick the reader for a format (given or sniffed) and run it."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from spiderflow import shipped
from spiderflow.errors import ConfigError
from spiderflow.traces.acme import load_acme
from spiderflow.traces.alibaba2020 import load_alibaba2020
from spiderflow.traces.alibaba2023 import load_alibaba2023
from spiderflow.traces.common import TraceLoad, shown
from spiderflow.traces.helios import load_helios
from spiderflow.traces.ours import load_ours
from spiderflow.traces.philly import load_philly
from spiderflow.traces.sniff import FORMATS, sniff_format

READERS: dict[str, Callable[..., TraceLoad]] = {
    "ours": load_ours, "acme": load_acme, "helios": load_helios, "philly": load_philly,
    "alibaba-v2020": load_alibaba2020, "alibaba-v2023": load_alibaba2023,
}


def load_trace(path: str | Path, *, format: str | None = None, skip_bad_rows: bool = False,
               **options: object) -> TraceLoad:
    """Read a job trace; ``format=None`` tells it from the file's header.

    ``options`` tune how public-trace jobs become ours (``gpu_scale``,
    ``min_gpus``, ``max_gpus``, ``fractional``, ``unfinished``, ``small``,
    ``iteration_time_s``, ``global_batch``, ``seq_len``; ``job_table``/``task_table``
    for alibaba-v2020): see :mod:`spiderflow.traces.mapping`; ``TraceLoad.report``
    says what each rule kept and dropped. Jobs come sorted by arrival; a public
    trace's first kept job arrives at 0 s, ours keeps its times.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise ConfigError(f"trace path must be a file path (got {type(path).__name__})")
    if "\x00" in str(path):
        raise ConfigError(f"trace path {shown(str(path))} holds a NUL byte; give the file's path")
    path = shipped.find(path, "trace")
    source = str(path)
    if format is None:
        if not shipped.exists(path):
            raise ConfigError(f"{source}: no such trace file; give a path or a shipped name "
                              f"({', '.join(shipped.names('trace'))})")
        format = sniff_format(path, source=source)
    elif not isinstance(format, str) or format not in READERS:
        raise ConfigError(f"--format must be one of {', '.join(FORMATS)} (got {shown(format)})")
    if format == "ours" and options:
        raise ConfigError(f"trace option {sorted(options)[0]!r} applies only to public traces; "
                          "our CSV already names model, GPUs and iterations")
    return READERS[format](path, source=source, skip_bad_rows=skip_bad_rows, **options)
