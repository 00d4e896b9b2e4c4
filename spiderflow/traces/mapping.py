"""Turn a public-trace job (GPU count, run time, state, kind) into our :class:`Job`.

Public GPU-cluster traces record *how many GPUs* a job held and *how long* it
ran, not which model it trained. The mapping below is ours; docs/traces.md
states it in full. In order:

1. **Filter** (each job dropped for the first reason that holds, counted by
   reason in ``TraceLoad.dropped``):
   ``no_gpus`` (CPU-only job), ``not_finished`` (failed, cancelled, killed,
   timed out or still running; kept with ``keep_unfinished=True``),
   ``no_runtime`` (never started, or ran 0 s), ``below_min_gpus`` (fewer
   than ``min_gpus``, default 8: single-GPU debug and notebook jobs, which a
   cross-cluster planner has nothing to do with; kept with ``keep_small=True``).
2. **GPUs**: the trace's count (fractions rounded up) rounded up to a power of
   two, then clamped to ``max_gpus`` (default 512). Powers of two because
   the planners split a job into TP x PP x DP degrees and global batches into
   micro-batches, and these divide evenly; rounding to a multiple of 8 would
   distort less (65 -> 72 instead of 128) but leave shapes like 72 = 8 x 9
   that few parallel plans fit.
3. **Model** by GPU count (:data:`MODEL_BY_GPUS`), shifted one rung up the
   size ladder for Acme ``Pretrain`` jobs (unless the bigger model's training
   state would pass 30% of the GPUs' memory) and one rung down for ``Eval``
   and ``Debug`` jobs (:data:`KIND_SHIFT`).
4. **global_batch, seq_len**: the model's published pretraining batch and
   context (:data:`BATCH_BY_MODEL`), unless overridden.
5. **iterations** = round(run time / assumed iteration time), at least 1. The
   assumed iteration time is the model's FLOPs per iteration (Narayanan et
   al., SC'21 eq. 3 forward, x3 for forward + backward) on the job's GPUs at
   A100 peak x the default MFU (:mod:`spiderflow.hardware`): a job run on
   A100s at that efficiency would take about its traced run time. Pass
   ``iteration_time_s`` to use one fixed time instead.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, fields

from spiderflow.errors import ConfigError
from spiderflow.hardware import GPUS
from spiderflow.inputs import finite
from spiderflow.traces.common import MAX_BATCH, MAX_DURATION_S, MAX_GPUS, MAX_SEQ_LEN, shown
from spiderflow.workload import MODELS, Job

# Ordered by parameter count: the ladder KIND_SHIFT moves along.
MODEL_LADDER: tuple[str, ...] = ("gpt3-125m", "gpt3-350m", "gpt3-1.3b", "gpt3-2.7b",
                                 "gpt3-6.7b", "gpt3-13b", "llama2-70b", "gpt3-175b")

# Mixed-precision Adam keeps 16 bytes per parameter (Rajbhandari et al., SC'20, ZeRO, sec. 3.1);
# we size models against 40 GB per GPU (A100-40GB; the V100s in our topologies have 32 GB, but
# there the planners may shard or recompute).
STATE_BYTES_PER_PARAM = 16
FIT_GPU_MEMORY_BYTES = 40e9
# A step up the ladder (Pretrain) is taken only while the state stays within this fraction.
MAX_SHIFTED_STATE_FRACTION = 0.30

# GPUs (a power of two) -> model. Our choice: a ladder rung whose training state fills at
# most ~14% of the job's aggregate memory at 40 GB per GPU (4.9-13.6%; tests check it), so
# every mapped job has a feasible plan with room for activations and pipeline imbalance.
MODEL_BY_GPUS: dict[int, str] = {
    1: "gpt3-125m", 2: "gpt3-350m", 4: "gpt3-1.3b", 8: "gpt3-1.3b", 16: "gpt3-2.7b",
    32: "gpt3-6.7b", 64: "gpt3-13b", 128: "gpt3-13b", 256: "llama2-70b", 512: "gpt3-175b",
}

# Acme job types (Hu et al., NSDI'24, sec. 2.2: Pretrain, SFT, Eval, MLLM, Debug, Other).
# Pretraining trains the largest model its GPUs hold; evaluation and debug jobs are short
# runs on smaller models. Unknown kinds and other traces: no shift.
KIND_SHIFT: dict[str, int] = {"pretrain": +1, "sft": 0, "mllm": 0, "other": 0,
                              "eval": -1, "debug": -1}

# (global_batch in sequences, seq_len): GPT-3 batch sizes in tokens from Brown et al.,
# NeurIPS'20, Table 2.1 (0.5M, 0.5M, 1M, 1M, 2M, 2M, 3.2M) over 2048-token contexts;
# Llama 2: 4M-token batches of 4096-token sequences (Touvron et al., 2023, sec. 2.2).
BATCH_BY_MODEL: dict[str, tuple[int, int]] = {
    "gpt3-125m": (256, 2048), "gpt3-350m": (256, 2048), "gpt3-1.3b": (512, 2048),
    "gpt3-2.7b": (512, 2048), "gpt3-6.7b": (1024, 2048), "gpt3-13b": (1024, 2048),
    "gpt3-175b": (1536, 2048), "llama2-7b": (1024, 4096), "llama2-13b": (1024, 4096),
    "llama2-70b": (1024, 4096),
}

REFERENCE_GPU = "a100-80gb"  # the GPU whose achieved FLOP/s turns run time into iterations

DROP_REASONS = ("no_gpus", "not_finished", "no_runtime", "below_min_gpus")
# iteration_time_s at least 1 ms: run times (<= MAX_DURATION_S) then give at most 10^12 iterations
MIN_ITERATION_TIME_S = 1e-3


@dataclass(frozen=True, kw_only=True)
class MappingOptions:
    """How public-trace jobs become :class:`Job` s (the ``**options`` of ``load_trace``)."""

    min_gpus: int = 8
    max_gpus: int = 512
    keep_small: bool = False
    keep_unfinished: bool = False
    iteration_time_s: float | None = None
    global_batch: int | None = None
    seq_len: int | None = None

    def __post_init__(self) -> None:
        for name in ("min_gpus", "max_gpus"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1 or value & (value - 1):
                raise ConfigError(f"trace option {name} must be a power of two >= 1 (got {shown(value)})")
            if value > MAX_GPUS:
                raise ConfigError(f"trace option {name} must be at most {MAX_GPUS:,} (got {shown(value)})")
        if self.max_gpus < self.min_gpus:
            raise ConfigError(f"trace option max_gpus must be >= min_gpus={self.min_gpus} "
                              f"(got {self.max_gpus})")
        for name in ("keep_small", "keep_unfinished"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"trace option {name} must be true or false (got {shown(getattr(self, name))})")
        t = self.iteration_time_s
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or t != t or t <= 0):
            raise ConfigError(f"trace option iteration_time_s must be a number > 0 (got {shown(t)})")
        if t is not None and not (finite(t) and MIN_ITERATION_TIME_S <= t <= MAX_DURATION_S):
            raise ConfigError(f"trace option iteration_time_s must be from {MIN_ITERATION_TIME_S:g} to "
                              f"{MAX_DURATION_S:g} s (got {shown(t)})")
        for name, limit in (("global_batch", MAX_BATCH), ("seq_len", MAX_SEQ_LEN)):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or not 1 <= value <= limit):
                raise ConfigError(f"trace option {name} must be a positive integer up to {limit:,} "
                                  f"(got {shown(value)})")

    @classmethod
    def from_options(cls, options: dict[str, object], *, fmt: str) -> MappingOptions:
        known = {f.name for f in fields(cls)}
        for key in options:
            if key not in known:
                raise ConfigError(f"trace option {key!r} is not known for format {fmt}; "
                                  f"known: {', '.join(sorted(known))}")
        return cls(**options)  # type: ignore[arg-type]


@dataclass(frozen=True, kw_only=True)
class PublicJob:
    """The few facts a public trace gives about a job, in trace-clock seconds."""

    job_id: str
    submit_s: float
    gpus: float | None  # may be fractional (Alibaba plan_gpu); 0: CPU-only; None: never allocated
    duration_s: float | None  # None: never started
    finished: bool
    kind: str = ""  # Acme workload type, lower case; "" where the trace has none


def round_gpus(gpus: float, opts: MappingOptions) -> int:
    """Trace GPUs rounded up to a whole number, then to a power of two, clamped to max_gpus."""
    whole = max(1, math.ceil(gpus - 1e-9))
    return min(1 << (whole - 1).bit_length(), opts.max_gpus)


def state_fraction(model: str, gpus: int) -> float:
    """Share of ``gpus`` x 40 GB that the model's weights, gradients and Adam state take."""
    return STATE_BYTES_PER_PARAM * MODELS[model].params / (gpus * FIT_GPU_MEMORY_BYTES)


def model_for(gpus: int, kind: str = "") -> str:
    """The model a ``gpus``-GPU job of Acme type ``kind`` trains (see MODEL_BY_GPUS, KIND_SHIFT).

    A step up is not taken where the bigger model's state would pass
    MAX_SHIFTED_STATE_FRACTION of the GPUs' memory (64 GPUs: llama2-70b would take 43%).
    """
    base = MODEL_LADDER.index(MODEL_BY_GPUS[min(gpus, max(MODEL_BY_GPUS))])
    rung = min(max(base + KIND_SHIFT.get(kind, 0), 0), len(MODEL_LADDER) - 1)
    while rung > base and state_fraction(MODEL_LADDER[rung], gpus) > MAX_SHIFTED_STATE_FRACTION:
        rung -= 1
    return MODEL_LADDER[rung]


def iteration_flops(model: str, global_batch: int, seq_len: int) -> float:
    """Training FLOPs of one iteration: forward (Narayanan et al., SC'21, eq. 3) x 3."""
    spec = MODELS[model]
    forward = spec.layers * spec.layer_forward_flops(global_batch, seq_len) \
        + spec.head_forward_flops(global_batch, seq_len)
    return 3.0 * forward


def reference_iteration_time_s(model: str, gpus: int, global_batch: int, seq_len: int) -> float:
    """Seconds per iteration on ``gpus`` reference GPUs at their profile efficiency."""
    return iteration_flops(model, global_batch, seq_len) / (gpus * GPUS[REFERENCE_GPU].achieved_flops)


def drop_reason(pj: PublicJob, opts: MappingOptions) -> str | None:
    if pj.gpus is not None and pj.gpus <= 0:
        return "no_gpus"
    if not pj.finished and not opts.keep_unfinished:
        return "not_finished"
    if pj.gpus is None or pj.duration_s is None or pj.duration_s <= 0:
        return "no_runtime"
    if math.ceil(pj.gpus - 1e-9) < opts.min_gpus and not opts.keep_small:
        return "below_min_gpus"
    return None


def to_job(pj: PublicJob, opts: MappingOptions, *, arrival_s: float) -> Job:
    gpus = round_gpus(pj.gpus or 0.0, opts)
    model = model_for(gpus, pj.kind)
    batch, seq = BATCH_BY_MODEL[model]
    batch = opts.global_batch or batch
    seq = opts.seq_len or seq
    step_s = opts.iteration_time_s or reference_iteration_time_s(model, gpus, batch, seq)
    iterations = max(1, round(pj.duration_s / step_s))  # type: ignore[operator]
    return Job(job_id=pj.job_id, arrival_s=arrival_s, model=model, gpus=gpus,
               iterations=iterations, global_batch=batch, seq_len=seq)


def map_jobs(public: list[PublicJob], opts: MappingOptions) -> tuple[tuple[Job, ...], dict[str, int]]:
    """Filter and map; sort by submit time (stable) and re-base so the first job arrives at 0."""
    dropped: Counter[str] = Counter({r: 0 for r in DROP_REASONS})
    kept: list[PublicJob] = []
    for pj in public:
        reason = drop_reason(pj, opts)
        if reason:
            dropped[reason] += 1
        else:
            kept.append(pj)
    kept.sort(key=lambda pj: pj.submit_s)
    origin = kept[0].submit_s if kept else 0.0
    jobs = tuple(to_job(pj, opts, arrival_s=pj.submit_s - origin) for pj in kept)
    return jobs, dict(dropped)
