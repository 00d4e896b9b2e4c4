"""Synthetic LLM-development traces, reproducible from a seed.

In the spirit of the Acme characterisation (Hu et al., NSDI'24, "Characterization
of Large Language Model Development in the Datacenter", sec. 3): evaluation jobs
are most of the jobs but a small share of GPU time; pretraining jobs are a few
percent of the jobs but take most of the GPU time; LLM jobs are mostly short
(minutes), with a long tail of pretraining runs lasting days. The class shares,
GPU counts and durations below are **our choices in that spirit**, not a fit to
the trace; docs/traces.md gives the resulting mix.

Each job: a class (eval, finetune, pretrain) by :data:`DEFAULT_MIX`; GPUs (a
power of two, 8..512) from the class's weights; a model from the class's list
that fits the GPUs (:func:`fits`), a ``target`` run time drawn log-normally and
clipped; ``iterations`` = target / the reference iteration time (A100 at the
profile MFU, :func:`spiderflow.traces.mapping.reference_iteration_time_s`), so
a job alone on A100s runs about its target time and longer across a slow WAN.

Arrivals: ``poisson`` (exponential gaps of mean ``mean_interarrival_s``) or
``bursty``: bursts of on average ``burst_jobs`` jobs (geometric), gaps inside
a burst ``burst_gap_ratio`` x the mean, gaps between bursts sized so the
overall mean gap is still ``mean_interarrival_s`` (users submit sweeps of
evaluation and fine-tuning jobs at once). The first job arrives at 0 s.
"""

from __future__ import annotations

import math
import numbers
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from spiderflow.errors import ConfigError
from spiderflow.inputs import finite
from spiderflow.traces.common import MAX_GPUS, MAX_TIME_S, shown
from spiderflow.traces.mapping import (BATCH_BY_MODEL, MODEL_LADDER, iteration_flops, reference_iteration_time_s,
                                       state_fraction)
from spiderflow.workload import Job

MINUTE, HOUR, DAY = 60.0, 3600.0, 86400.0
ARRIVALS = ("poisson", "bursty")
# A model "fits" a job when its training state (mapping.state_fraction: 16 bytes/param against
# 40 GB per GPU) takes at most a quarter of the memory, leaving room for activations.
FIT_FRACTION = 0.25
# Bounds on the arguments: generating a million jobs takes seconds; more is a typo, not a trace.
MAX_JOBS = 1_000_000
MAX_MEAN_INTERARRIVAL_S = 1e7  # ~116 days
MAX_BURST_JOBS = 1000.0  # mean jobs per burst (a sweep)


@dataclass(frozen=True, kw_only=True)
class JobClass:
    """One kind of job: GPU weights, candidate models, run-time distribution, batch shape."""

    name: str
    gpus: tuple[tuple[int, float], ...]  # (GPUs, weight)
    models: tuple[str, ...]  # smallest first
    largest_only: int  # pick among this many largest fitting models (0: all that fit)
    median_s: float  # log-normal median run time
    sigma: float  # log-normal shape
    min_s: float
    max_s: float
    global_batch: int | None = None  # None: the model's pretraining batch (mapping.BATCH_BY_MODEL)
    seq_len: int | None = None


CLASSES: dict[str, JobClass] = {c.name: c for c in (
    # Evaluation: 8-16 GPUs, minutes (median 10 min, 2 min..3 h), small batches.
    JobClass(name="eval", gpus=((8, 0.7), (16, 0.3)),
             models=("gpt3-350m", "gpt3-1.3b", "gpt3-2.7b", "gpt3-6.7b", "llama2-7b"), largest_only=0,
             median_s=10 * MINUTE, sigma=1.0, min_s=2 * MINUTE, max_s=3 * HOUR,
             global_batch=64, seq_len=2048),
    # Fine-tuning (SFT): 8-64 GPUs, hours (median 2 h, 15 min..2 days); 128-sequence
    # batches as in Alpaca (Taori et al., 2023).
    JobClass(name="finetune", gpus=((8, 0.3), (16, 0.35), (32, 0.25), (64, 0.1)),
             models=("gpt3-1.3b", "gpt3-2.7b", "gpt3-6.7b", "llama2-7b", "gpt3-13b", "llama2-13b"),
             largest_only=0, median_s=2 * HOUR, sigma=1.0, min_s=15 * MINUTE, max_s=2 * DAY,
             global_batch=128, seq_len=2048),
    # Pretraining: 64-512 GPUs, the two largest models that fit, a day or so (median 12 h,
    # 2 h..4 days), the model's published pretraining batch and context.
    JobClass(name="pretrain", gpus=((64, 0.35), (128, 0.3), (256, 0.2), (512, 0.15)),
             models=("gpt3-6.7b", "gpt3-13b", "llama2-13b", "llama2-70b", "gpt3-175b"), largest_only=2,
             median_s=12 * HOUR, sigma=0.8, min_s=2 * HOUR, max_s=4 * DAY),
)}
DEFAULT_MIX: dict[str, float] = {"eval": 0.65, "finetune": 0.28, "pretrain": 0.07}


def fits(model: str, gpus: int) -> bool:
    """True when the model's training state takes at most FIT_FRACTION of the GPUs' memory."""
    return state_fraction(model, gpus) <= FIT_FRACTION


def _check(jobs: int, seed: int, arrival: str, mean_interarrival_s: float, burst_jobs: float,
           burst_gap_ratio: float, max_gpus: int, mix: Mapping[str, float]) -> None:
    def bad(name: str, rule: str, value: object) -> ConfigError:
        return ConfigError(f"trace generate: {name} must be {rule} (got {shown(value)})")

    if isinstance(jobs, bool) or not isinstance(jobs, numbers.Integral) or jobs < 1:
        raise bad("jobs", "a positive integer", jobs)
    if jobs > MAX_JOBS:
        raise bad("jobs", f"at most {MAX_JOBS:,}", jobs)
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise bad("seed", "an integer", seed)
    if not isinstance(arrival, str) or arrival not in ARRIVALS:
        raise bad("arrival", f"one of {', '.join(ARRIVALS)}", arrival)
    for name, value, low, high in (("mean_interarrival_s", mean_interarrival_s, 0.0, MAX_MEAN_INTERARRIVAL_S),
                                   ("burst_jobs", burst_jobs, 1.0, MAX_BURST_JOBS)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value <= low:
            raise bad(name, f"a number > {low:g}", value)
        if not finite(value) or value > high:  # finite(): 10**400 is an int math.isfinite cannot take
            raise bad(name, f"at most {high:g}", value)
    if not finite(burst_gap_ratio) or not 0 < burst_gap_ratio < 1:
        raise bad("burst_gap_ratio", "a number in (0, 1)", burst_gap_ratio)
    if isinstance(max_gpus, bool) or not isinstance(max_gpus, int) or max_gpus < 8 or max_gpus & (max_gpus - 1):
        raise bad("max_gpus", "a power of two >= 8", max_gpus)
    if max_gpus > MAX_GPUS:
        raise bad("max_gpus", f"at most {MAX_GPUS:,}", max_gpus)
    for name, share in mix.items():
        if name not in CLASSES:
            raise bad("mix", f"keyed by {', '.join(CLASSES)}", name)
        if not finite(share) or share < 0:
            raise bad(f"mix[{name}]", "a finite number >= 0", share)
    if sum(mix.values()) <= 0:
        raise bad("mix", "a mapping with some share > 0", dict(mix))
    if jobs * mean_interarrival_s > MAX_TIME_S / 2:  # the last arrival must stay a valid arrival_s
        raise ConfigError(f"trace generate: jobs x mean_interarrival_s must be at most {MAX_TIME_S / 2:g} s "
                          f"(got {jobs} x {mean_interarrival_s:g}); lower one of them")


def _gap(rng: random.Random, arrival: str, mean_s: float, burst_jobs: float, ratio: float) -> float:
    """The time from one arrival to the next."""
    if arrival == "poisson":
        return rng.expovariate(1.0 / mean_s)
    inside = ratio * mean_s
    # A burst of B jobs (mean b) spans (B-1) inside-gaps + one between-gap; keeping
    # the mean gap at mean_s needs between = b*mean_s - (b-1)*inside.
    between = burst_jobs * mean_s - (burst_jobs - 1) * inside
    ends_burst = rng.random() < 1.0 / burst_jobs  # geometric burst length, mean burst_jobs
    return rng.expovariate(1.0 / (between if ends_burst else inside))


def _one(rng: random.Random, cls: JobClass, max_gpus: int) -> tuple[str, int, float]:
    options = [(g, w) for g, w in cls.gpus if g <= max_gpus] or [(max_gpus, 1.0)]
    gpus = rng.choices([g for g, _ in options], [w for _, w in options])[0]
    fitting = [m for m in cls.models if fits(m, gpus)] or [m for m in MODEL_LADDER if fits(m, gpus)][-1:]
    if cls.largest_only:
        fitting = fitting[-cls.largest_only:]
    model = rng.choice(fitting)
    target = rng.lognormvariate(math.log(cls.median_s), cls.sigma)
    return model, gpus, min(max(target, cls.min_s), cls.max_s)


def generate_trace(jobs: int, seed: int, *, arrival: str = "poisson", mean_interarrival_s: float = 600.0,
                   burst_jobs: float = 8.0, burst_gap_ratio: float = 0.05, max_gpus: int = 512,
                   mix: Mapping[str, float] | None = None) -> tuple[Job, ...]:
    """``jobs`` synthetic jobs, the same for the same arguments (``random.Random(seed)``).

    ``max_gpus`` caps GPU counts for small topologies (a capped class keeps its
    weights for the counts that remain; models are refitted to the GPUs);
    ``mix`` overrides :data:`DEFAULT_MIX` (shares are normalised).
    """
    if mix is not None and not isinstance(mix, Mapping):
        raise ConfigError(f"trace generate: mix must be a mapping of class -> share (got {shown(mix)})")
    mix = dict(DEFAULT_MIX if mix is None else mix)
    _check(jobs, seed, arrival, mean_interarrival_s, burst_jobs, burst_gap_ratio, max_gpus, mix)
    rng = random.Random(int(seed))
    names = [n for n in CLASSES if mix.get(n, 0) > 0]
    width = max(5, len(str(jobs - 1)))
    out: list[Job] = []
    t = 0.0
    for i in range(int(jobs)):  # one job's draws at a time, so a shorter trace is a prefix of a longer
        if i:
            t += _gap(rng, arrival, float(mean_interarrival_s), float(burst_jobs), float(burst_gap_ratio))
            if t > MAX_TIME_S:  # a rare long tail of bursty gaps; the product check above keeps the mean lower
                raise ConfigError(f"trace generate: arrivals pass {MAX_TIME_S:g} s at job {i}; "
                                  "lower jobs, mean_interarrival_s or burst_jobs")
        cls = CLASSES[rng.choices(names, [mix[n] for n in names])[0]]
        model, gpus, target_s = _one(rng, cls, max_gpus)
        batch, seq = BATCH_BY_MODEL[model]
        batch, seq = cls.global_batch or batch, cls.seq_len or seq
        step_s = reference_iteration_time_s(model, gpus, batch, seq)
        out.append(Job(job_id=f"{cls.name}-{i:0{width}d}", arrival_s=round(t, 3), model=model, gpus=gpus,
                       iterations=max(1, round(target_s / step_s)), global_batch=batch, seq_len=seq))
    return tuple(out)


# --- sizing arrivals to an offered load (``trace generate --topology FILE --load L``) ---
MAX_LOAD = 2.0


def gpu_seconds(job: Job, flops_per_gpu: float) -> float:
    """GPU seconds the job needs at ``flops_per_gpu``: its iterations' FLOPs over the per-GPU rate.

    A lower bound on its GPU time on real GPUs: communication and pipeline bubbles
    only add to it (16x on paper8's traces), so load sizing uses the planner's
    predicted run time instead (:mod:`spiderflow.traces.planned`); this bound is
    the fallback for a job no plan fits.
    """
    return job.iterations * iteration_flops(job.model, job.global_batch, job.seq_len) / flops_per_gpu


def offered_load(jobs: tuple[Job, ...] | list[Job], *, total_gpus: int,
                 job_gpu_seconds: Callable[[Job], float]) -> float:
    """Sum over jobs of ``job_gpu_seconds(job)`` (GPUs x run time), over total GPUs x the span of arrivals.

    ``trace generate --load`` passes :class:`spiderflow.traces.planned.PlannedGpuTime`
    (the planner's predicted run time on the empty topology).
    """
    span = jobs[-1].arrival_s - jobs[0].arrival_s if jobs else 0.0
    if span <= 0 or total_gpus <= 0:
        return math.inf
    return sum(job_gpu_seconds(j) for j in jobs) / (total_gpus * span)


def mean_gap_for_load(jobs: int, seed: int, load: float, *, total_gpus: int,
                      job_gpu_seconds: Callable[[Job], float], **kwargs: object) -> float:
    """The ``mean_interarrival_s`` at which ``generate_trace(jobs, seed, **kwargs)`` offers ``load``.

    Every gap the generator draws is proportional to the mean gap (exponential
    draws, and bursts whose gaps are fixed ratios of it) while the jobs' draws
    do not depend on it, so one trace at a reference mean gives the span per
    second of mean gap, and the mean follows in closed form.
    """
    if isinstance(load, bool) or not finite(load) or not 0 < load <= MAX_LOAD:
        raise ConfigError(f"trace generate: load must be a number in (0, {MAX_LOAD:g}] (got {shown(load)})")
    if isinstance(jobs, bool) or not isinstance(jobs, numbers.Integral) or jobs < 2:
        raise ConfigError(f"trace generate: load needs at least 2 jobs, so arrivals span some time (got {shown(jobs)})")
    reference_s = 600.0
    ref = generate_trace(jobs, seed, mean_interarrival_s=reference_s, **kwargs)  # type: ignore[arg-type]
    span_per_s = (ref[-1].arrival_s - ref[0].arrival_s) / reference_s
    work = sum(job_gpu_seconds(j) for j in ref)
    if span_per_s <= 0:
        raise ConfigError("trace generate: every job of this seed arrives at once; use more jobs or another seed")
    mean = work / (load * total_gpus * span_per_s)
    if not 0 < mean <= MAX_MEAN_INTERARRIVAL_S or jobs * mean > MAX_TIME_S / 2:
        raise ConfigError(f"trace generate: load {load:g} on {total_gpus} GPUs needs a mean gap of {mean:.3g} s "
                          f"between {jobs} jobs, beyond (0, {MAX_MEAN_INTERARRIVAL_S:g}] s; raise the load "
                          "or the number of jobs, or lower --max-gpus")
    return mean
