"""Job traces: our CSV, importers for public GPU-cluster traces, a synthetic generator.

    load_trace(path, *, format=None, skip_bad_rows=False, **options) -> TraceLoad
    write_trace(jobs, path, *, comment=None)
    generate_trace(jobs, seed, *, arrival="poisson", mean_interarrival_s=..., ...) -> tuple[Job, ...]

Formats and the public-trace mapping are documented in docs/traces.md.
"""

from spiderflow.traces.common import TraceLoad
from spiderflow.traces.generate import generate_trace
from spiderflow.traces.load import load_trace
from spiderflow.traces.mapping import MappingOptions
from spiderflow.traces.ours import format_trace, write_trace
from spiderflow.traces.sniff import FORMATS, sniff_format

__all__ = ["FORMATS", "MappingOptions", "TraceLoad", "format_trace", "generate_trace", "load_trace",
           "sniff_format", "write_trace"]
