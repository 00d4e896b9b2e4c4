""":func:`~spiderflow.costmodel.schedule.estimate_1f1b` of many pipelines of one depth at once.

Step 8 of SpinSearch (:func:`~spiderflow.parallel.tpa.rebalance`) prices every move of one layer
across a stage boundary, each step: 2(S - 1) pipelines that differ from one another in two stages.
One at a time they were nearly two thirds of the step's CPU besides its exact schedules (2,000 simulated
jobs at load 0.9, under the profiler), and the 66 moves of a 34-stage plan take 3.8 ms. Here the
pipelines are the rows of arrays and each loop of the estimate runs over stages, numpy doing the
rows' arithmetic: 0.8 ms for those 66 (1.1 ms with inter-cluster syncs), 3.2 instead of 13.2 ms for
a 64-stage plan's 126. The same operations on the same floats in the same order, so each row's
result is the float ``estimate_1f1b`` gives (the tests compare them bit for bit).
"""

from __future__ import annotations

import numpy as np

FIELDS = ("forward_s", "backward_s", "send_forward_s", "send_forward_latency_s", "send_backward_s",
          "send_backward_latency_s", "sync_s", "sync_wan_s")  # the float rows of :func:`estimate_batch`'s input


def estimate_batch(cols: np.ndarray, rings: np.ndarray, m: int) -> np.ndarray:
    """Each pipeline's ``estimate_1f1b``: ``cols[f, k, i]`` is figure ``FIELDS[f]`` of stage ``i``
    of pipeline ``k``, ``rings[k, i]`` a number for its stage's ``sync_ring`` (equal rings, equal
    numbers, from 0), ``m`` the micro-batches of them all. Returns one float per pipeline."""
    fwd, bwd, send_f, lat_f, send_b, lat_b, sync_s, wan_s = cols
    work = fwd + bwd
    period = _steady_period(work, send_f, lat_f, send_b, lat_b, m)
    ready = _last_backwards(fwd, bwd, send_f, lat_f, send_b, lat_b, period, m)
    return np.maximum(ready[:, 0], _sync_ends(sync_s, wan_s, rings, ready).max(axis=1))


def _steady_period(work, send_f, lat_f, send_b, lat_b, m: int) -> np.ndarray:
    """:func:`~spiderflow.costmodel.schedule.steady_period` of each row: ``rows[k, i, t]`` is the
    round trip of stages i..i+t, summed left to right from stage i's work; past the last stage the
    window adds zeros, and such a sum, divided by at least as many micro-batches as the last real
    window's, is never the largest. The largest round trip of each length is divided once (division
    keeps order: the same float as dividing each and taking the largest)."""
    K, S = work.shape
    period = np.maximum(np.maximum(work.max(axis=1), (send_f - lat_f).max(axis=1)), (send_b - lat_b).max(axis=1))
    step = np.zeros((K, 2 * S))
    step[:, 1:S] = work[:, 1:] + (send_f[:, :-1] + send_b[:, 1:])
    rows = np.empty((K, S, S))
    rows[:] = np.lib.stride_tricks.sliding_window_view(step, S, axis=1)[:, :S]
    rows[:, :, 0] = work
    np.cumsum(rows, axis=2, out=rows)
    return np.maximum(period, (rows.max(axis=1) / np.minimum(np.arange(1.0, S + 1), m)).max(axis=1))


def _last_backwards(fwd, bwd, send_f, lat_f, send_b, lat_b, period: np.ndarray, m: int) -> np.ndarray:
    """:func:`~spiderflow.costmodel.schedule.last_backwards` of each row."""
    K, S = fwd.shape
    # _first_backwards' forward pass: forward 0 reaches stage j at the sum of the forwards and sends
    # before it (summed left to right), and the slowest server up to it is a running max
    arrive = np.zeros((K, S))
    np.cumsum((fwd + send_f)[:, :-1], axis=1, out=arrive[:, 1:])
    servers = np.empty((K, 2 * S))
    servers[:, 0::2], servers[:, 1::2] = fwd, send_f - lat_f
    slowest = np.maximum.accumulate(servers, axis=1)[:, 0::2]  # stage j: forwards up to j, sends before it
    warmup = np.minimum(np.arange(S - 1, -1, -1), m - 1)
    ready = arrive + fwd + warmup * slowest
    for j in range(S - 2, -1, -1):  # ... and its backward one
        ready[:, j] = np.maximum(ready[:, j], ready[:, j + 1] + bwd[:, j + 1] + send_b[:, j + 1])
    later = np.zeros(K)
    for i in range(S - 1, -1, -1):
        cool = min(S - 1 - i, m - 1)
        drain = bwd[:, i]
        if i + 1 < S:
            drain = np.maximum(drain, send_b[:, i + 1] - lat_b[:, i + 1])
        t = ready[:, i] + ((m - 1 - cool) * period + cool * np.minimum(drain, period))
        ready[:, i] = np.maximum(t, later) + bwd[:, i]
        later = ready[:, i] + send_b[:, i]
    return ready


def _sync_ends(sync_s, wan_s, rings, ready) -> np.ndarray:
    """:func:`~spiderflow.costmodel.schedule.sync_ends_of` of each row: stages in the order they
    become ready (ties by stage), an inter-cluster phase queued behind the last on its ring (only
    stages with one, in any row, are walked; the others end at ``ready + sync_s``)."""
    ends = ready + sync_s
    walked = np.flatnonzero((wan_s > 0).any(axis=0))
    if not len(walked):
        return ends
    K = len(ready)
    rows = np.arange(K)
    order = walked[np.argsort(ready[:, walked], axis=1, kind="stable")]
    ring_free = np.zeros((K, int(rings.max()) + 1))
    for p in range(len(walked)):
        i = order[:, p]
        t = ends[rows, i]
        wan = wan_s[rows, i]
        ring = rings[rows, i]
        queued = np.maximum(t, ring_free[rows, ring]) + wan
        on_wan = wan > 0
        t = np.where(on_wan, queued, t)
        ring_free[rows[on_wan], ring[on_wan]] = t[on_wan]
        ends[rows, i] = t
    return ends
