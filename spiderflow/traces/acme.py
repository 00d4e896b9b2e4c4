"""Acme traces (Shanghai AI Lab, clusters Seren and Kalos; Hu et al., NSDI'24,
"Characterization of Large Language Model Development in the Datacenter";
github.com/InternLM/AcmeTrace, ``data/job_trace/trace_{seren,kalos}.csv``).

Schema (header line present)::

    job_id,user,node_num,gpu_num,cpu_num,type,state,submit_time,start_time,end_time,duration,queue,gpu_time

Kalos adds ``mem_per_pod_GB,shared_mem_per_pod,fail_time,stop_time`` (ignored).
``type`` is Pretrain, SFT, Eval, MLLM, Debug or Other; ``state`` a Slurm state
(COMPLETED, CANCELLED, FAILED, TIMEOUT, NODE_FAIL, and RUNNING at the
snapshot); times are ISO strings with a zone (``2023-03-01 00:18:22+08:00``);
``duration`` is end - start in seconds.

Mapping (see :mod:`spiderflow.traces.mapping`): arrival = ``submit_time``;
GPUs = ``gpu_num``; run time = ``duration`` (or end - start when blank);
finished = ``state`` COMPLETED (the AcmeTrace README counts TIMEOUT and
NODE_FAIL as failed); kind = ``type``, which shifts the model a rung up for
Pretrain and down for Eval/Debug. CPU-only jobs (``gpu_num`` 0) are dropped.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from spiderflow.traces.common import RowError, TraceLoad, shown, text_field, time_field
from spiderflow.traces.mapping import PublicJob
from spiderflow.traces.public import gpu_field, load_public_csv, run_times, slurm_state

REQUIRED = ("job_id", "gpu_num", "type", "state", "submit_time", "start_time", "end_time", "duration")
TYPES = ("pretrain", "sft", "eval", "mllm", "debug", "other")


def parse_row(row: Mapping[str, str]) -> PublicJob:
    kind = row["type"].lower()
    if kind not in TYPES:
        raise RowError("type", f"must be one of Pretrain, SFT, Eval, MLLM, Debug, Other (got {shown(row['type'])})")
    return PublicJob(job_id=text_field(row, "job_id"), gpus=gpu_field(row),
                     finished=slurm_state(row), submit_s=time_field(row, "submit_time"),  # type: ignore[arg-type]
                     **run_times(row), kind=kind)


def load_acme(path: str | Path, *, source: str, skip_bad_rows: bool = False, **options: object) -> TraceLoad:
    return load_public_csv(path, source=source, fmt="acme", required=REQUIRED, parse_row=parse_row,
                           skip_bad_rows=skip_bad_rows, options=options)
