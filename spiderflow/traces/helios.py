"""Helios traces (SenseTime, clusters Earth, Saturn, Uranus, Venus; Hu et al., SC'21,
"Characterization and Prediction of Deep Learning Workloads in Large-Scale GPU
Datacenters"; github.com/S-Lab-System-Group/HeliosData, ``<cluster>/cluster_log.csv``).

Schema (header line present)::

    job_id,user,vc,gpu_num,cpu_num,node_num,state,submit_time,start_time,end_time,duration,queue

``state`` is a Slurm state (COMPLETED, CANCELLED, FAILED, TIMEOUT, NODE_FAIL);
times are ``YYYY-MM-DD HH:MM:SS`` wall-clock strings with no zone (read as
UTC: only differences matter); ``duration`` is end - start in seconds.

Mapping (see :mod:`spiderflow.traces.mapping`): arrival = ``submit_time``;
GPUs = ``gpu_num``; run time = ``duration`` (or end - start when blank);
finished = ``state`` COMPLETED; no job type, so the model follows the GPU
count alone. CPU-only jobs (``gpu_num`` 0) are dropped.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from spiderflow.traces.common import TraceLoad, text_field, time_field
from spiderflow.traces.mapping import PublicJob
from spiderflow.traces.public import gpu_field, load_public_csv, run_times, slurm_state

REQUIRED = ("job_id", "vc", "gpu_num", "state", "submit_time", "start_time", "end_time", "duration")


def parse_row(row: Mapping[str, str]) -> PublicJob:
    return PublicJob(job_id=text_field(row, "job_id"), gpus=gpu_field(row),
                     finished=slurm_state(row), submit_s=time_field(row, "submit_time"),  # type: ignore[arg-type]
                     **run_times(row))


def load_helios(path: str | Path, *, source: str, skip_bad_rows: bool = False, **options: object) -> TraceLoad:
    return load_public_csv(path, source=source, fmt="helios", required=REQUIRED, parse_row=parse_row,
                           skip_bad_rows=skip_bad_rows, options=options)
