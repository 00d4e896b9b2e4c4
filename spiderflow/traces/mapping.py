"""Turn public-trace jobs (GPU count, run time, state, kind) into our :class:`Job` s.

Public GPU-cluster traces record *how many GPUs* a job held and *how long* it
ran, not which model it trained. The mapping below is ours; docs/traces.md
states it in full, with the reasons for its defaults. Rules, in order, each
reported in ``TraceLoad.report`` (one line per rule, what it kept and dropped):

1. **gpus**: CPU-only jobs are dropped (``no_gpus``).
2. **unfinished** (``censor`` | ``drop``): jobs that did not finish normally
   (failed, killed, cancelled, timed out, still running at the snapshot).
   ``censor`` (default) keeps them for the time they held GPUs; a job still
   running when the trace ends runs until the trace's last recorded time (its
   run time is right-censored there). ``drop`` drops them (``not_finished``).
3. **runtime**: jobs that never started or ran 0 s are dropped (``no_runtime``).
4. **fractional** (``aggregate`` | ``drop``): jobs holding a share of one GPU
   (Alibaba GPU sharing). ``aggregate`` (default) packs them, in arrival
   order, into groups whose shares add up to at least one GPU; a group is one
   1-GPU job arriving with its first member, running for the group's GPU
   seconds (sum of share x run time), so GPU time is kept; the members folded
   into another job are counted as ``merged``. ``drop`` drops them (``fractional``).
5. **scale**: GPUs x ``gpu_scale`` (default 8, 1 for Acme), rounded up to a
   power of two, raised to ``min_gpus`` (default 8; ``small="drop"`` drops
   such jobs instead, ``below_min_gpus``) and capped at ``max_gpus`` (512).
   Powers of two because the planners split a job into TP x PP x DP degrees
   and global batches into micro-batches, and these divide evenly.
6. **model**, **batch**, **iterations**: the model by mapped GPU count
   (:data:`MODEL_BY_GPUS`), a rung up the ladder for Acme ``Pretrain`` jobs and
   down for ``Eval``/``Debug`` (:data:`KIND_SHIFT`); the model's published
   pretraining batch (:data:`BATCH_BY_MODEL`); iterations = run time / the
   model's iteration time on the mapped GPUs at A100 peak x the profile MFU,
   so a job alone on A100s runs about its traced time: the run-time
   distribution is kept. Arrivals keep the trace's gaps, re-based to 0.
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

DROP_REASONS = ("no_gpus", "not_finished", "no_runtime", "fractional", "below_min_gpus", "merged")
FRACTIONAL_MODES = ("aggregate", "drop")
UNFINISHED_MODES = ("censor", "drop")
SMALL_MODES = ("raise", "drop")
# GPUs x gpu_scale: 8 maps one GPU of a 2017-2023 deep-learning cluster (median job: 1 GPU in
# Philly, Helios, PAI) to one 8-GPU server, the smallest unit our LLM jobs ask for, and keeps the
# ratios between jobs (2 -> 16, 8 -> 64). Acme is an LLM cluster already: its jobs keep their size.
DEFAULT_GPU_SCALE = 8.0
GPU_SCALE_BY_FORMAT: dict[str, float] = {"acme": 1.0}
MAX_GPU_SCALE = 1024.0
# iteration_time_s at least 1 ms: run times (<= MAX_DURATION_S) then give at most 10^12 iterations
MIN_ITERATION_TIME_S = 1e-3


@dataclass(frozen=True, kw_only=True)
class MappingOptions:
    """How public-trace jobs become :class:`Job` s (the ``**options`` of ``load_trace``)."""

    min_gpus: int = 8
    max_gpus: int = 512
    gpu_scale: float = DEFAULT_GPU_SCALE
    fractional: str = "aggregate"
    unfinished: str = "censor"
    small: str = "raise"
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
        scale = self.gpu_scale
        if not finite(scale) or not 0 < scale <= MAX_GPU_SCALE:
            raise ConfigError(f"trace option gpu_scale must be a number in (0, {MAX_GPU_SCALE:g}] "
                              f"(got {shown(scale)})")
        for name, modes in (("fractional", FRACTIONAL_MODES), ("unfinished", UNFINISHED_MODES),
                            ("small", SMALL_MODES)):
            if getattr(self, name) not in modes:
                raise ConfigError(f"trace option {name} must be one of {', '.join(modes)} "
                                  f"(got {shown(getattr(self, name))})")
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
        """The options of ``load_trace``; ``gpu_scale`` defaults per format (GPU_SCALE_BY_FORMAT)."""
        known = {f.name for f in fields(cls)}
        for key in options:
            if key not in known:
                raise ConfigError(f"trace option {key!r} is not known for format {fmt}; "
                                  f"known: {', '.join(sorted(known))}")
        options = dict(options)
        if options.get("gpu_scale") is None:
            options["gpu_scale"] = GPU_SCALE_BY_FORMAT.get(fmt, DEFAULT_GPU_SCALE)
        return cls(**options)  # type: ignore[arg-type]


@dataclass(frozen=True, kw_only=True)
class PublicJob:
    """The few facts a public trace gives about a job, in trace-clock seconds."""

    job_id: str
    submit_s: float
    gpus: float | None  # may be fractional (Alibaba GPU sharing); 0: CPU-only; None: never allocated
    duration_s: float | None  # summed length of its closed run intervals; None: none
    finished: bool
    kind: str = ""  # Acme workload type, lower case; "" where the trace has none
    open_since_s: float | None = None  # still running at the snapshot since this time (no end recorded)
    end_s: float | None = None  # the latest end time the trace records for it (to find the trace end)


def round_gpus(gpus: float, opts: MappingOptions) -> int:
    """Trace GPUs x gpu_scale, rounded up to a power of two, within [min_gpus, max_gpus]."""
    whole = max(1, math.ceil(gpus * opts.gpu_scale - 1e-9))
    return min(max(1 << (whole - 1).bit_length(), opts.min_gpus), opts.max_gpus)


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




@dataclass(frozen=True, kw_only=True)
class _Work:
    """A job between the rules: GPUs as traced (maybe a fraction), run time after censoring."""

    job_id: str
    submit_s: float
    gpus: float
    run_s: float
    kind: str
    finished: bool
    censored: bool = False


def trace_end_s(public: list[PublicJob]) -> float:
    """The trace's last recorded time: where jobs still running at the snapshot are cut off."""
    times = [pj.submit_s for pj in public]
    times += [t for pj in public for t in (pj.end_s, pj.open_since_s) if t is not None]
    return max(times, default=0.0)


def _runs(public: list[PublicJob], opts: MappingOptions, end_s: float) -> tuple[list[_Work], int]:
    """Run time of each job (censored at ``end_s`` where still running); how many never ran."""
    work: list[_Work] = []
    never = 0
    for pj in public:
        run = pj.duration_s or 0.0
        censored = pj.open_since_s is not None and opts.unfinished == "censor"
        if censored:
            run += max(0.0, end_s - pj.open_since_s)  # type: ignore[operator]
        if pj.gpus is None or run <= 0:
            never += 1
            continue
        work.append(_Work(job_id=pj.job_id, submit_s=pj.submit_s, gpus=pj.gpus, kind=pj.kind,
                          run_s=min(run, MAX_DURATION_S), finished=pj.finished, censored=censored))
    return work, never


def aggregate(fractional: list[_Work], taken: set[str]) -> list[_Work]:
    """Pack GPU shares, in arrival order (stable), into groups of at least one GPU.

    A group is one 1-GPU job: it arrives with its first member, is named after it
    (``<first id>+<others>``), and runs for the group's GPU seconds (sum of share x
    run time), so the GPU time of the trace is kept. ``taken``: ids already in use.
    """
    groups: list[_Work] = []
    members: list[_Work] = []

    def close() -> None:
        first = members[0]
        name = first.job_id if len(members) == 1 else f"{first.job_id}+{len(members) - 1}"
        base, n = name, 1
        while len(members) > 1 and name in taken:  # a real id that happens to look like ours
            n += 1
            name = f"{base}#{n}"
        taken.add(name)
        run = sum(m.gpus * m.run_s for m in members)
        groups.append(_Work(job_id=name, submit_s=first.submit_s, gpus=1.0, kind=first.kind,
                            run_s=min(run, MAX_DURATION_S), finished=all(m.finished for m in members)))
        members.clear()

    share = 0.0
    for w in sorted(fractional, key=lambda w: w.submit_s):
        members.append(w)
        share += w.gpus
        if share >= 1.0 - 1e-9:
            close()
            share = 0.0
    if members:
        close()
    return groups


def to_job(w: _Work, gpus: int, opts: MappingOptions, *, arrival_s: float) -> Job:
    model = model_for(gpus, w.kind)
    batch, seq = BATCH_BY_MODEL[model]
    batch = opts.global_batch or batch
    seq = opts.seq_len or seq
    step_s = opts.iteration_time_s or reference_iteration_time_s(model, gpus, batch, seq)
    return Job(job_id=w.job_id, arrival_s=arrival_s, model=model, gpus=gpus,
               iterations=max(1, round(w.run_s / step_s)), global_batch=batch, seq_len=seq)


def _gpus_line(pairs: Counter[tuple[float, int]]) -> str:
    """'1 -> 8 (x420), 2 -> 16 (x3)': the most common traced -> mapped GPU counts."""
    top = sorted(pairs.most_common(6))
    text = ", ".join(f"{traced:g} -> {mapped} (x{n})" for (traced, mapped), n in top)
    return text + (", ..." if len(pairs) > len(top) else "")


def map_jobs(public: list[PublicJob], opts: MappingOptions
             ) -> tuple[tuple[Job, ...], dict[str, int], tuple[str, ...]]:
    """Apply the rules of the module docstring: (jobs sorted by arrival, dropped by reason, report).

    The report has one line per rule saying what it kept and dropped. Arrivals are
    re-based so the first kept job arrives at 0 s; ties keep the trace's order.
    """
    dropped: Counter[str] = Counter({r: 0 for r in DROP_REASONS})
    report: list[str] = []
    end_s = trace_end_s(public)
    rest = [pj for pj in public if not (pj.gpus is not None and pj.gpus <= 0)]
    dropped["no_gpus"] = len(public) - len(rest)
    report.append(f"gpus: kept {len(rest)} of {len(public)} jobs; dropped {dropped['no_gpus']} CPU-only (no_gpus)")
    if opts.unfinished == "drop":
        dropped["not_finished"] = sum(not pj.finished for pj in rest)
        rest = [pj for pj in rest if pj.finished]
    work, dropped["no_runtime"] = _runs(rest, opts, end_s)
    if opts.unfinished == "drop":
        report.append(f"unfinished=drop: dropped {dropped['not_finished']} that failed, were killed or "
                      "were still running (not_finished)")
    else:
        censored = sum(w.censored for w in work)
        ended = sum(not w.finished and not w.censored for w in work)
        report.append(f"unfinished=censor: kept {ended} that failed or were killed, for the time they ran, "
                      f"and {censored} still running, cut at the trace end ({end_s:.0f} s on its clock)")
    report.append(f"runtime: dropped {dropped['no_runtime']} that never ran or ran 0 s (no_runtime)")
    fractional = [w for w in work if w.gpus < 1.0 - 1e-9]
    work = [w for w in work if w.gpus >= 1.0 - 1e-9]
    if opts.fractional == "drop":
        dropped["fractional"] = len(fractional)
        report.append(f"fractional=drop: dropped {len(fractional)} holding a share of one GPU (fractional)")
    else:
        groups = aggregate(fractional, {w.job_id for w in work} | {w.job_id for w in fractional})
        dropped["merged"] = len(fractional) - len(groups)
        work += groups
        report.append(f"fractional=aggregate: packed {len(fractional)} holding a share of one GPU into "
                      f"{len(groups)} 1-GPU jobs, GPU time kept ({dropped['merged']} folded into another: merged)")
    mapped: list[tuple[_Work, int]] = []
    raised = capped = 0
    pairs: Counter[tuple[float, int]] = Counter()
    for w in work:
        want = max(1, math.ceil(w.gpus * opts.gpu_scale - 1e-9))  # whole GPUs before the power of two
        if want < opts.min_gpus and opts.small == "drop":
            dropped["below_min_gpus"] += 1
            continue
        raised += want < opts.min_gpus
        capped += want > opts.max_gpus
        gpus = round_gpus(w.gpus, opts)
        pairs[(w.gpus, gpus)] += 1
        mapped.append((w, gpus))
    small = (f"dropped {dropped['below_min_gpus']} below {opts.min_gpus} (below_min_gpus)"
             if opts.small == "drop" else f"raised {raised} to {opts.min_gpus}")
    report.append(f"scale: GPUs x{opts.gpu_scale:g}, a power of two in [{opts.min_gpus}, {opts.max_gpus}]: "
                  f"{small}, capped {capped} at {opts.max_gpus}; {_gpus_line(pairs)}")
    mapped.sort(key=lambda m: m[0].submit_s)
    origin = mapped[0][0].submit_s if mapped else 0.0
    jobs = tuple(to_job(w, g, opts, arrival_s=w.submit_s - origin) for w, g in mapped)
    if jobs:
        runs = sorted(w.run_s for w, _ in mapped)
        gpu_h = sum(w.run_s * g for w, g in mapped) / 3600
        report.append(f"result: {len(jobs)} jobs arriving over {jobs[-1].arrival_s / 3600:.1f} h; run time "
                      f"median {runs[len(runs) // 2] / 60:.1f} min, max {runs[-1] / 3600:.1f} h; "
                      f"{gpu_h:,.0f} GPU-hours on the mapped GPUs")
    return jobs, dict(dropped), tuple(report)
