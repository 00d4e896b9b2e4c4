"""Alibaba GPU trace v2023 (Weng et al., ATC'23, "Beware of Fragmentation: Scheduling
GPU-Sharing Workloads with Fragmentation Gradient Descent"; github.com/alibaba/
clusterdata, ``cluster-trace-gpu-v2023/csv/openb_pod_list_*.csv``).

Schema (header line present)::

    name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time

``num_gpu`` is whole GPUs (0..8); ``gpu_milli`` the thousandths of one GPU a
GPU-sharing pod (``num_gpu`` 1) asks for; ``pod_phase`` is Succeeded, Running,
Pending or Failed at the pod's deletion; times are seconds (``scheduled_time``
blank for pods never scheduled). The sampled lists that carry only the first
five columns have no times and cannot be replayed.

Mapping (see :mod:`spiderflow.traces.mapping`): one job per pod; arrival =
``creation_time``; GPUs = ``num_gpu``, or ``gpu_milli / 1000`` of one GPU for a
GPU-sharing pod (aggregated into whole GPUs by default); run time =
``deletion_time - scheduled_time``; a scheduled pod with no deletion time was
still running at the snapshot (censored at the trace end by default);
finished = phase Succeeded **or Running**: most pods of the trace were deleted
while Running, which we read as removed by their owner after running without
error, whereas Failed pods did not end well and Pending ones never ran. No job
type. The largest pods ask for 8 GPUs: the default ``gpu_scale`` 8 maps them to 64.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from spiderflow.traces.common import MAX_TIME_S, RowError, TraceLoad, check_duration, float_field, shown, text_field
from spiderflow.traces.mapping import PublicJob
from spiderflow.traces.public import gpu_field, load_public_csv

REQUIRED = ("name", "num_gpu", "gpu_milli", "pod_phase", "creation_time", "deletion_time",
            "scheduled_time")
PHASES = ("Succeeded", "Running", "Pending", "Failed")
FINISHED = ("Succeeded", "Running")


def parse_row(row: Mapping[str, str]) -> PublicJob:
    name = text_field(row, "name")
    gpus = gpu_field(row, "num_gpu")
    milli = float_field(row, "gpu_milli", optional=True, maximum=1000.0) or 0.0  # thousandths of one GPU
    # gpu_milli is the share of one GPU a GPU-sharing pod (num_gpu 1) asks for (the v2023 README);
    # a share with num_gpu 0 is read the same way
    if gpus <= 1 and 0 < milli < 1000:
        gpus = milli / 1000.0
    phase = row["pod_phase"]
    if phase not in PHASES:
        raise RowError("pod_phase", f"must be one of {', '.join(PHASES)} (got {shown(phase)})")
    created = float_field(row, "creation_time", maximum=MAX_TIME_S)
    deleted = float_field(row, "deletion_time", optional=True, maximum=MAX_TIME_S)
    scheduled = float_field(row, "scheduled_time", optional=True, maximum=MAX_TIME_S)
    run = None
    if scheduled is not None and deleted is not None:
        if deleted < scheduled:
            raise RowError("deletion_time", f"must not precede scheduled_time={row['scheduled_time']} "
                           f"(got {row['deletion_time']!r})")
        run = check_duration(deleted - scheduled, "deletion_time", row["deletion_time"])
    still_running = scheduled is not None and deleted is None  # no deletion yet at the snapshot
    return PublicJob(job_id=name, submit_s=created, gpus=gpus, duration_s=run,  # type: ignore[arg-type]
                     finished=phase in FINISHED and not still_running, end_s=deleted,
                     open_since_s=scheduled if still_running else None)


def load_alibaba2023(path: str | Path, *, source: str, skip_bad_rows: bool = False,
                     **options: object) -> TraceLoad:
    return load_public_csv(path, source=source, fmt="alibaba-v2023", required=REQUIRED,
                           parse_row=parse_row, skip_bad_rows=skip_bad_rows, options=options)
