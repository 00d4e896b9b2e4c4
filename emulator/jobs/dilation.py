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
:data:`CANDIDATES` under which every job about to run keeps its predicted
distortion within :data:`ERROR_BUDGET`:

    distortion(K) = ops x overhead x contention(K) / (K x iteration_s)

- ``ops``: the operations whose fixed cost lands on the job's critical path per
  iteration (:func:`critical_ops`), ``iteration_s`` its predicted iteration time;
- ``overhead``: the per-op fixed cost on this machine now
  (:func:`measure_op_overhead_s`: a 1 ms sleep's overshoot, measured, plus
  :data:`PER_OP_S`);
- ``contention(K) = 1 / (1 - rho / K)``: ``rho`` is the share of the cores
  that all the jobs' fixed per-op costs (:func:`host_ops`) would take at K = 1
  if they all ran at once (an upper bound); a K where ``rho / K >= 0.9`` is not taken.

K = 8 is never chosen by ``auto``: on this machine pipelines across WAN links
ran 8-10% slower than predicted at K = 8 whatever the congestion control
(BBR, CUBIC, Reno), within 0-5% at K = 1, 2 and 4 (docs/emulator-run.md,
"Time dilation"); ask for it with ``--dilation 8``. The run states K and
the reason in every output.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from dataclasses import dataclass

from emulator.jobs.worker import tight_timers
from spiderflow.costmodel import PlanWork

CANDIDATES = (1, 2, 4)
ERROR_BUDGET = 0.03  # the tightest job's iteration time distorted by at most this by fixed per-op costs
# A rank's own cost per emulated op beyond a sleep's overshoot (its Python, the op's JSON line, gloo's
# call for a transfer): paper8's one-rank jobs of 16 ops per 17-51 ms iteration measured 13-17% slow at
# K = 1 among 31 ranks, 0.13-0.18 ms per op (benchmarks/results/dilation.md; before their compute ran on the GPU
# stream's clock, which took it off their iterations but not off the cores)
PER_OP_S = 100e-6
MAX_LOAD = 0.9  # rho / K at or above this: the cores would be saturated by fixed costs alone
SLEEP_PROBE_S = 0.001


@dataclass(frozen=True, kw_only=True)
class Choice:
    dilation: float
    reason: str


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
    ranks have it) plus :data:`PER_OP_S`."""
    tight_timers()
    over = []
    for _ in range(samples):
        t = time.perf_counter()
        time.sleep(SLEEP_PROBE_S)
        over.append(time.perf_counter() - t - SLEEP_PROBE_S)
    return max(0.0, statistics.median(over)) + PER_OP_S


def host_ops(work: PlanWork) -> int:
    """Emulated operations the ranks on one iteration's critical path run: 1F1B's ``m + S - 1``
    forwards and as many backwards, one transfer after each across a stage boundary, and
    ``2(p - 1)`` steps of each ring of the gradient sync (p: the most ranks of a stage's sync).
    Each costs the host its fixed cost: what the jobs load the cores with (``rho``)."""
    m, s = work.micro_batches, work.depth
    compute = 2 * (m + s - 1)
    transfers = compute if s > 1 else 0
    return compute + transfers + 2 * (_ring(work) - 1)


def critical_ops(work: PlanWork) -> int:
    """Those of :func:`host_ops` whose fixed cost delays the iteration. A rank's compute runs on its
    GPU stream's clock (:class:`emulator.jobs.worker.GpuStream`): ops back to back carry the host's
    cost once, where the run of them ends. One stage: that end, then the ring. More stages: every
    compute op ends in a send that a waiting neighbour receives, so all of them count, as before."""
    if work.depth == 1:
        return 1 + 2 * (_ring(work) - 1)
    return host_ops(work)


def _ring(work: PlanWork) -> int:
    return max((sum(len(g) for g in groups) for groups in work.sync_groups if groups), default=1)


def distortion(ops: int, iteration_s: float, overhead_s: float, contention: float, k: float) -> float:
    return ops * overhead_s * contention / (k * iteration_s)


def choose_dilation(jobs: list[tuple[str, PlanWork, float]], *, overhead_s: float, cores: int | None = None,
                    one_at_a_time: bool = False) -> Choice:
    """The smallest K of :data:`CANDIDATES` within :data:`ERROR_BUDGET` for every job (else the largest).

    ``jobs``: (job id, its work, its predicted iteration time in real-equivalent seconds);
    ``one_at_a_time``: the jobs never run together (calibration's plan set), so ``rho`` is the
    largest job's, not their sum."""
    cores = cores or os.cpu_count() or 1
    if not jobs:
        return Choice(dilation=1.0, reason="no job to size it by")
    loads = [host_ops(w) * overhead_s / it for _jid, w, it in jobs]
    rho = (max(loads) if one_at_a_time else sum(loads)) / cores

    def worst(k: float) -> tuple[float, str]:
        if rho / k >= MAX_LOAD:
            return float("inf"), "the cores"
        cont = 1.0 / (1.0 - rho / k)
        return max((distortion(critical_ops(w), it, overhead_s, cont, k), jid) for jid, w, it in jobs)

    k = next((c for c in CANDIDATES if worst(c)[0] <= ERROR_BUDGET), CANDIDATES[-1])
    d, jid = worst(k)
    d1, _ = worst(1)
    at1 = "saturated" if d1 == float("inf") else f"{100 * d1:.1f}%"
    met = "" if d <= ERROR_BUDGET else f", not met: auto stops at K={CANDIDATES[-1]}"
    return Choice(dilation=float(k), reason=(
        f"per-op overhead {overhead_s * 1e3:.2f} ms (measured now), fixed costs of "
        f"{'the busiest of' if one_at_a_time else 'all'} {len(jobs)} jobs {100 * rho:.0f}% of {cores} cores at K=1; "
        f"the tightest job, {jid}, distorted {at1} at K=1"
        + (f", {100 * d:.1f}% at K={k}" if k != 1 else "") + f" (budget {100 * ERROR_BUDGET:g}%{met})"))
