"""The 1F1B pipeline schedule: exact critical path and a closed-form estimate.

Exact: every stage runs its operations in 1F1B order (``min(S-1-i, m)``
warm-up forwards, then one-forward-one-backward, then the remaining
backwards; Narayanan et al., SC'21, fig. 4). An operation starts when its
stage is free and its input has arrived: F(i, k) needs F(i-1, k) plus the
activation transfer, B(i, k) needs B(i+1, k) plus the gradient transfer (and
the last stage's B needs its own F). Transfers over one stage boundary and
direction are serialised (one channel) for their ``n / beta`` part, so a thin
WAN link that cannot keep up with compute shows up as queueing, not as a
formula's max(); their latency (alpha) overlaps the next transfer, as a
message in flight does not stop the next from entering the link.
A stage's gradient sync starts after its last backward (intra-cluster
phase first); inter-cluster phases of stages on the same ring of clusters
queue on that ring, in the order the stages become ready. The iteration ends
when the last sync ends. Cost: O(S * m).

Fast: stage i starts its first backward at ``b_i``, then runs one backward a
``period`` while it still has forwards to run, then (its cool-down, no
forwards left) as fast as its own backward and the link bringing its
gradients allow, and it ends its last backward then, or when the last gradient
from stage i+1 lets it, if later; then its sync. The steady-state ``period``
per micro-batch is the larger of the busiest resource (a stage's ``F_i + B_i``
or one boundary's ``n / beta``) and 1F1B's in-flight limit: stage i holds at
most ``S - i`` micro-batches, so stages i..j hold at most ``j - i + 1`` between
them, and each must make the round trip ``RT_ij`` (compute of stages i..j and
the transfers between them, both ways) before its slot frees: ``period >= RT_ij
/ min(j - i + 1, m)``. Across a thin WAN boundary that window of 2
micro-batches, not the link's bandwidth, sets the pace. ``b_i`` is exact
(:func:`first_backwards`): a stage runs ``w_i = min(S - 1 - i, m - 1)``
warm-up forwards and one more before its first backward, and ahead of a thin
boundary those forwards cross the link one after another (a 16-stage plan
whose boundary 3-4 takes 2.76 s a transfer: stage 4 starts its first backward
at 32.3 s, once 12 forwards crossed; an estimate that counted only micro-batch
0's own round trip was 13% under the exact schedule). Stages past a thin
boundary end early, and their syncs start then. O(S^2). Exact for uniform
stages without communication; an estimate otherwise
(benchmarks/results/estimate_gap.md; tests bound the gap). The period's round
trips are summed in numpy arrays from ``NUMPY_PERIOD`` stages up (64 stages:
71 instead of 343 us), left to right as in Python, so the floats are the same.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from functools import lru_cache
from operator import add, sub, truediv

import numpy as np

from spiderflow.costmodel.stages import StageCost

NUMPY_PERIOD = 12  # from this many stages, steady_period sums its round trips in numpy arrays


class Timeline:
    """The exact schedule of one iteration: when the pipeline and the last sync end, and per
    stage its operations, (kind, micro_batch, start_s, end_s) with kind 'F' | 'B' | 'S' (sync).

    The operations are laid out when first read (the schedule is run again, recording them): the
    planner compares iteration times alone, and a 64-stage plan of 1,024 micro-batches has
    131,072 of them (recording them took 40% of its schedule's time)."""

    __slots__ = ("pipeline_s", "iteration_s", "_costs", "_m", "_ends", "_ops")

    def __init__(self, costs: Sequence[StageCost], micro_batches: int, free: list[float], ends: list[float]) -> None:
        self.pipeline_s = max(free)  # last backward end
        self.iteration_s = max([self.pipeline_s, *ends])  # last sync end
        self._costs, self._m, self._ends = tuple(costs), micro_batches, (free, ends)  # a copy: laid out later
        self._ops: tuple[tuple[tuple[str, int, float, float], ...], ...] | None = None

    @property
    def ops(self) -> tuple[tuple[tuple[str, int, float, float], ...], ...]:
        if self._ops is None:
            _, ops = _sweep(self._costs, self._m, record=True)
            free, ends = self._ends
            for i in range(len(ops)):
                if ends[i] > free[i]:
                    ops[i].append(("S", -1, free[i], ends[i]))
            self._ops = tuple(tuple(o) for o in ops)
        return self._ops

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Timeline):
            return NotImplemented
        return (self.pipeline_s, self.iteration_s, self.ops) == (other.pipeline_s, other.iteration_s, other.ops)

    def __hash__(self) -> int:
        return hash((self.pipeline_s, self.iteration_s))

    def __repr__(self) -> str:
        return f"Timeline(pipeline_s={self.pipeline_s!r}, iteration_s={self.iteration_s!r})"


@lru_cache(maxsize=512)
def _order(stage: int, stages: int, micro_batches: int) -> tuple[int, ...]:
    """:func:`one_f_one_b_order` coded for the sweep: k for F(k), -1 - k for B(k)."""
    return tuple(k if kind == "F" else -1 - k for kind, k in one_f_one_b_order(stage, stages, micro_batches))


def one_f_one_b_order(stage: int, stages: int, micro_batches: int) -> list[tuple[str, int]]:
    warmup = min(stages - 1 - stage, micro_batches)
    order: list[tuple[str, int]] = [("F", k) for k in range(warmup)]
    f, b = warmup, 0
    while f < micro_batches:
        order.append(("F", f))
        f += 1
        order.append(("B", b))
        b += 1
    order.extend(("B", k) for k in range(b, micro_batches))
    return order


def simulate_1f1b(costs: list[StageCost], micro_batches: int) -> Timeline:
    free, _ = _sweep(costs, micro_batches, record=False)
    return Timeline(costs, micro_batches, free, sync_ends(costs, free))


def _sweep(costs: Sequence[StageCost], micro_batches: int, record: bool
           ) -> tuple[list[float], list[list[tuple[str, int, float, float]]]]:
    """Each stage's last backward end, and (``record``) its operations in order."""
    S, m = len(costs), micro_batches
    orders = [_order(i, S, m) for i in range(S)]
    fwd = [c.forward_s for c in costs]
    bwd = [c.backward_s for c in costs]
    send_f = [c.send_forward_s for c in costs]
    send_b = [c.send_backward_s for c in costs]
    lat_f = [c.send_forward_latency_s for c in costs]
    lat_b = [c.send_backward_latency_s for c in costs]
    pos = [0] * S
    free = [0.0] * S
    f_end = [[0.0] * m for _ in range(S)]
    # input arrival times (None: not yet produced); channel busy-until per boundary and direction
    f_ready: list[list[float | None]] = [[0.0] * m] + [[None] * m for _ in range(S - 1)]
    b_ready: list[list[float | None]] = [[None] * m for _ in range(S)]
    chan_f = [0.0] * S  # boundary i -> i+1
    chan_b = [0.0] * S  # boundary i -> i-1
    ops: list[list[tuple[str, int, float, float]]] = [[] for _ in range(S)]
    remaining = sum(len(o) for o in orders)
    last = S - 1
    # Sweeps alternate direction: forward passes carry activations down the pipeline, backward
    # passes carry gradients up it (a one-way sweep moves a gradient one stage per pass). Every
    # operation's time is fixed by its inputs, so the visiting order does not change the result.
    down, up = range(S), range(S - 1, -1, -1)
    sweep = 0
    while remaining:
        progressed = False
        sweep += 1
        for i in (down if sweep % 2 else up):
            order, p = orders[i], pos[i]
            n = len(order)
            if p == n:
                continue
            # stage i alone writes its row of f_end, its free time and its two outgoing channels
            t_free, out, first = free[i], ops[i], p
            fr, fe, br = f_ready[i], f_end[i], b_ready[i]
            fr_next = f_ready[i + 1] if i < last else None
            br_prev = b_ready[i - 1] if i > 0 else None
            fw, bw, sf, lf, sb, lb = fwd[i], bwd[i], send_f[i], lat_f[i], send_b[i], lat_b[i]
            cf, cb = chan_f[i], chan_b[i]
            while p < n:
                k = order[p]
                if k >= 0:  # F(k)
                    ready = fr[k]
                    if ready is None:
                        break
                    start = t_free if t_free > ready else ready
                    t_free = start + fw
                    fe[k] = t_free
                    if fr_next is not None:
                        t0 = t_free if t_free > cf else cf
                        cf = t0 + sf - lf
                        fr_next[k] = t0 + sf
                else:  # B(-1 - k)
                    k = -1 - k
                    ready = fe[k] if i == last else br[k]
                    if ready is None:
                        break
                    start = t_free if t_free > ready else ready
                    t_free = start + bw
                    if br_prev is not None:
                        t0 = t_free if t_free > cb else cb
                        cb = t0 + sb - lb
                        br_prev[k] = t0 + sb
                if record:
                    out.append(("F" if order[p] >= 0 else "B", k, start, t_free))
                p += 1
            if p != first:
                remaining -= p - first
                progressed = True
            pos[i], free[i], chan_f[i], chan_b[i] = p, t_free, cf, cb
        if not progressed:  # pragma: no cover - the 1F1B order is deadlock-free
            raise RuntimeError("1F1B schedule deadlocked")
    return free, ops


def sync_ends(costs: list[StageCost], ready: list[float]) -> list[float]:
    """End of each stage's gradient sync; WAN phases on one ring are serialised."""
    return sync_ends_of([c.sync_s for c in costs], [c.sync_wan_s for c in costs], [c.sync_ring for c in costs],
                        ready)


def sync_ends_of(sync_s: Sequence[float], wan_s: Sequence[float], rings: Sequence[tuple[str, ...]],
                 ready: Sequence[float]) -> list[float]:
    """:func:`sync_ends` from each stage's intra-cluster sync, inter-cluster phase and its ring."""
    ring_free: dict[tuple[str, ...], float] = {}
    ends = [0.0] * len(sync_s)
    for i in sorted(range(len(sync_s)), key=lambda k: (ready[k], k)):
        t = ready[i] + sync_s[i]
        wan = wan_s[i]
        if wan > 0:
            ring = rings[i]
            t = max(t, ring_free.get(ring, 0.0)) + wan
            ring_free[ring] = t
        ends[i] = t
    return ends


def first_backwards(costs: list[StageCost], micro_batches: int) -> list[float]:
    """When each stage starts its first backward in the exact 1F1B schedule, in O(S).

    Stage j runs forwards 0..w_j (``w_j = min(S - 1 - j, m - 1)``) and then B(0), which also needs
    the gradient from stage j+1. Every stage before j runs more warm-up forwards than j, so those
    forwards pass through it before it waits for a gradient: they flow through stages and
    boundaries as through deterministic servers in tandem, all waiting at the start, and forward
    k leaves stage j at ``sum(F up to j) + sum(sends before j) + k * max(F up to j, n / beta of
    the boundaries before j)`` (a link's latency delays each transfer but does not hold the link).
    """
    return _first_backwards([c.forward_s for c in costs], [c.backward_s for c in costs],
                            [c.send_forward_s for c in costs], [c.send_forward_latency_s for c in costs],
                            [c.send_backward_s for c in costs], micro_batches)


def _first_backwards(fwd: Sequence[float], bwd: Sequence[float], send_f: Sequence[float],
                     lat_f: Sequence[float], send_b: Sequence[float], m: int) -> list[float]:
    S = len(fwd)
    first = [0.0] * S
    arrive = slowest = 0.0  # when forward 0 reaches stage j; the slowest server before it so far
    for j in range(S):
        f = fwd[j]
        if f > slowest:
            slowest = f
        first[j] = arrive + f + (S - 1 - j if S - 1 - j < m - 1 else m - 1) * slowest  # end of its last warm-up forward
        arrive += f + send_f[j]
        if send_f[j] - lat_f[j] > slowest:
            slowest = send_f[j] - lat_f[j]
    for j in range(S - 2, -1, -1):
        t = first[j + 1] + bwd[j + 1] + send_b[j + 1]
        if t > first[j]:
            first[j] = t
    return first


def last_backwards(fwd: Sequence[float], bwd: Sequence[float], send_f: Sequence[float], lat_f: Sequence[float],
                   send_b: Sequence[float], lat_b: Sequence[float], period: float, m: int) -> list[float]:
    """When each stage ends its last backward, by the estimate (per stage: forward, backward, send
    to the next and to the previous stage and their latencies; the steady ``period``). Stage i runs
    a backward per period from its first (:func:`first_backwards`) until its forwards end; its last
    ``w_i`` backwards (the cool-down: no forwards left, so no in-flight window) go as fast as it and
    the link that brings their gradients allow. It ends then, or when the last gradient from stage
    i+1 reaches it, if later. Non-decreasing in each stage's forward and backward time and in
    ``period`` (TPA's floors rely on it: :mod:`spiderflow.parallel.bounds`)."""
    S = len(fwd)
    ready = _first_backwards(fwd, bwd, send_f, lat_f, send_b, m)
    later = 0.0
    for i in range(S - 1, -1, -1):
        cool = S - 1 - i if S - 1 - i < m - 1 else m - 1
        drain = bwd[i]
        if i + 1 < S and send_b[i + 1] - lat_b[i + 1] > drain:
            drain = send_b[i + 1] - lat_b[i + 1]
        steady = (m - 1 - cool) * period + cool * (drain if drain <= period else period)
        t = ready[i] + steady
        later = ready[i] = (t if t >= later else later) + bwd[i]
        later += send_b[i]
    return ready


def steady_period(work: Sequence[float], send_f: Sequence[float], lat_f: Sequence[float],
                  send_b: Sequence[float], lat_b: Sequence[float], m: int) -> float:
    """The estimate's steady-state ``period`` per micro-batch (module docstring), in O(S^2)."""
    S = len(work)
    period = max(max(work), max(map(sub, send_f, lat_f)), max(map(sub, send_b, lat_b)))
    # RT_ij = sum_{i<=k<=j} (F_k + B_k) + both-way sends between them, summed left to right
    if S >= NUMPY_PERIOD:
        at, inside, stages = _round_trips(S)
        step = np.zeros(S + 1)
        step[1:S] = np.add(work[1:], np.add(send_f[:-1], send_b[1:]))
        rows = step[at]  # row i: stage i's work, then each step after it (0 past the last stage)
        rows[:, 0] = work
        np.cumsum(rows, axis=1, out=rows)  # sequential along a row: the same sums as accumulate's
        rows /= np.minimum(stages, m)
        best = float(rows[inside].max())
        return best if best > period else period
    step = [0.0] + [work[j] + (send_f[j - 1] + send_b[j]) for j in range(1, S)]
    for i in range(S):
        round_trips = itertools.accumulate(step[i + 1:], initial=work[i])
        if m >= S - i:
            period = max(period, max(map(truediv, round_trips, range(1, S - i + 1))))
        else:
            period = max(period, max(rt / min(k, m) for k, rt in enumerate(round_trips, 1)))
    return period


@lru_cache(maxsize=128)
def _round_trips(S: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For :func:`steady_period` on ``S`` stages: per window start i and length t + 1, the step it
    adds last (``S``, a zero, past the last stage), whether the window fits, and t + 1 (read-only)."""
    t = np.arange(S)
    at = t[None, :] + t[:, None]
    inside = at < S
    at = np.where(inside, at, S)
    stages = t + 1.0
    for a in (at, inside, stages):
        a.setflags(write=False)
    return at, inside, stages


def estimate_1f1b(costs: list[StageCost], micro_batches: int) -> float:
    fwd, bwd, send_f, lat_f, send_b, lat_b = zip(*[(c.forward_s, c.backward_s, c.send_forward_s,
                                                    c.send_forward_latency_s, c.send_backward_s,
                                                    c.send_backward_latency_s) for c in costs])
    return estimate_columns(fwd, bwd, list(map(add, fwd, bwd)), send_f, lat_f, send_b, lat_b,
                            [c.sync_s for c in costs], [c.sync_wan_s for c in costs], [c.sync_ring for c in costs],
                            micro_batches)


def estimate_columns(fwd: Sequence[float], bwd: Sequence[float], work: Sequence[float], send_f: Sequence[float],
                     lat_f: Sequence[float], send_b: Sequence[float], lat_b: Sequence[float],
                     sync_s: Sequence[float], wan_s: Sequence[float], rings: Sequence[tuple[str, ...]],
                     m: int) -> float:
    """:func:`estimate_1f1b` from its stages' figures, one sequence per figure (``work``: each
    stage's forward + backward): the simulator's re-pricing keeps them so
    (:class:`~spiderflow.costmodel.work.Repricer`)."""
    period = steady_period(work, send_f, lat_f, send_b, lat_b, m)
    # each stage is ready to sync when its last backward ends: stages past a thin boundary end
    # early (the link paces the stages before it), and their syncs start then
    ready = last_backwards(fwd, bwd, send_f, lat_f, send_b, lat_b, period, m)
    return max([ready[0], *sync_ends_of(sync_s, wan_s, rings, ready)])


def floor_1f1b(costs: list[StageCost], micro_batches: int) -> float:
    """A lower bound on :func:`simulate_1f1b`'s pipeline time, in O(S).

    Every stage runs its m forwards and m backwards one after another, after micro-batch 0's
    forwards on the stages before it and before micro-batch m-1's backwards on them. Every
    boundary's channel carries m transfers one after another (``n / beta`` each; the last also
    waits its latency), after micro-batch 0's forwards up to it (forward channel) or the last
    stage's (backward channel), and before the work the last micro-batch still has downstream.
    """
    m, S = micro_batches, len(costs)
    fwd = [c.forward_s for c in costs]
    bwd = [c.backward_s for c in costs]
    all_f, b_after = sum(fwd), sum(bwd)  # b_after: backwards of stage i and those after it
    best = 0.0
    f_before = b_before = 0.0  # sums over the stages before i
    for i, c in enumerate(costs):
        best = max(best, f_before + b_before + m * (fwd[i] + bwd[i]))
        if i + 1 < S:  # forward channel i -> i+1, then F(m-1) on i+1 and B(m-1) from i+1 down to 0
            occupied = c.send_forward_s - c.send_forward_latency_s
            best = max(best, f_before + fwd[i] + m * occupied + c.send_forward_latency_s
                       + fwd[i + 1] + bwd[i + 1] + bwd[i] + b_before)
        if i > 0:  # backward channel i -> i-1, after B(0) on i; then B(m-1) from i-1 down to 0
            occupied = c.send_backward_s - c.send_backward_latency_s
            best = max(best, all_f + b_after + m * occupied + c.send_backward_latency_s + b_before)
        f_before += fwd[i]
        b_before += bwd[i]
        b_after -= bwd[i]
    return best
