"""Time dilation: ``--dilation K|auto`` on ``emulator run``, ``check`` and ``calibrate``.

Why (DESIGN.md; Gupta et al., "To infinity and beyond: time-warped network
emulation", NSDI 2006; DieCast, NSDI 2007): on a small host every emulated
operation carries a fixed cost the cost model does not have: Python around
each op, gloo's bookkeeping per message, a sleep's wake-up, the delay
daemon's work per packet. With many ranks on two cores those costs also
queue behind each other. Dilating time by K (wire rates / K, delays x K,
compute sleeps x K, timeouts and arrivals x K; measured times / K) keeps
every modelled time in proportion and shrinks those fixed costs K-fold
against it. The price: wall time x K.

``auto`` (:func:`choose_dilation`) picks the smallest K in
:data:`CANDIDATES` whose predicted distortion stays within
:data:`ERROR_BUDGET` for every job about to run, from

- the per-op overhead measured on this machine now
  (:func:`measure_op_overhead_s`: a short sleep's wake-up overshoot plus
  :data:`GLOO_OP_S`), multiplied by the CPU contention (``ranks / cores``
  when more ranks run than there are cores);
- each job's plan: its iteration time and the operations on its critical
  path per iteration (:func:`critical_ops`);

so ``distortion(K) = ops x overhead x contention / (K x iteration_s)``.
The run states K and this reason in every output.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from dataclasses import dataclass

from spiderflow.costmodel import PlanWork

CANDIDATES = (1, 2, 4, 8)
ERROR_BUDGET = 0.01  # target distortion of an iteration time by fixed per-op costs
# gloo's own cost per send/recv on this class of machine (Python call, bookkeeping, two syscalls),
# measured over loopback: benchmarks/results/dilation.md
GLOO_OP_S = 100e-6
SLEEP_PROBE_S = 0.001


@dataclass(frozen=True, kw_only=True)
class Choice:
    dilation: float
    reason: str

    def as_json(self) -> dict:
        return {"dilation": self.dilation, "reason": self.reason}


def parse_dilation(text: str) -> float | str:
    """``"auto"`` or a number in 1..64 (argparse type; one clear line otherwise)."""
    import argparse

    if text == "auto":
        return "auto"
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number >= 1 or 'auto' (got {text!r})") from None
    if not (math.isfinite(value) and 1 <= value <= 64):
        raise argparse.ArgumentTypeError(f"must be in 1..64 or 'auto' (got {text!r})")
    return value


def measure_op_overhead_s(samples: int = 50) -> float:
    """Per-op fixed cost now: median overshoot of a 1 ms sleep (timer slack cut to 1 us, as the
    ranks have it) plus :data:`GLOO_OP_S`."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(29, 1000, 0, 0, 0)  # PR_SET_TIMERSLACK, ns
    except (OSError, AttributeError):
        pass
    over = []
    for _ in range(samples):
        t = time.perf_counter()
        time.sleep(SLEEP_PROBE_S)
        over.append(time.perf_counter() - t - SLEEP_PROBE_S)
    return max(0.0, statistics.median(over)) + GLOO_OP_S


def critical_ops(work: PlanWork) -> int:
    """Emulated operations on one iteration's critical path: 1F1B's ``m + S - 1`` forwards and as
    many backwards, one transfer after each across a stage boundary, and ``2(p - 1)`` steps of each
    ring of the gradient sync (p: the most ranks of a stage's sync)."""
    m, s = work.micro_batches, work.depth
    compute = 2 * (m + s - 1)
    transfers = compute if s > 1 else 0
    ring = max((sum(len(g) for g in groups) for groups in work.sync_groups if groups), default=1)
    return compute + transfers + 2 * (ring - 1)


def distortion(ops: int, iteration_s: float, overhead_s: float, contention: float, k: float) -> float:
    return ops * overhead_s * contention / (k * iteration_s)


def choose_dilation(jobs: list[tuple[str, PlanWork, float]], *, overhead_s: float, peak_ranks: int,
                    cores: int | None = None) -> Choice:
    """The smallest K of :data:`CANDIDATES` within :data:`ERROR_BUDGET` for every job (or the largest K).

    ``jobs``: (job id, its work, its predicted iteration time in real-equivalent seconds);
    ``peak_ranks``: how many ranks may run at once (an upper bound)."""
    cores = cores or os.cpu_count() or 1
    contention = max(1.0, peak_ranks / cores)
    if not jobs:
        return Choice(dilation=1.0, reason="no job to size it by")
    worst_id, worst = max(((jid, distortion(critical_ops(w), it, overhead_s, contention, 1.0))
                           for jid, w, it in jobs), key=lambda x: x[1])
    k = next((c for c in CANDIDATES if worst / c <= ERROR_BUDGET), CANDIDATES[-1])
    return Choice(dilation=float(k), reason=(
        f"per-op overhead {overhead_s * 1e3:.2f} ms measured, x{contention:.1f} contention "
        f"({peak_ranks} ranks at most on {cores} cores); the tightest job, {worst_id}, would be distorted "
        f"{100 * worst:.1f}% at K=1, {100 * worst / k:.1f}% at K={k} (budget {100 * ERROR_BUDGET:g}%"
        f"{'' if worst / k <= ERROR_BUDGET else ', not met: K capped at ' + str(CANDIDATES[-1])})"))
