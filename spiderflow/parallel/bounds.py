"""Cheap per-shape figures that let TPA skip shapes without changing its answer.

TPA scores every (shape, micro-batching) candidate with the cost model's
closed-form ``estimate`` after choosing its memory levers. Three things here
make that search cheaper while keeping its result identical:

- **Memory arithmetically** (:func:`memory_variant`): which of TPA's memory
  levers (none, ZeRO-1, ZeRO-1 + recomputation) is the first to fit, from the
  layer split alone, with exactly :func:`~spiderflow.costmodel.memory.stage_memory`'s
  arithmetic (same operations in the same order, so the same floats and the
  same verdicts) but no ``Plan`` built per variant.
- **An admissible lower bound** (:class:`ShapeBound`): a floor under
  ``estimate`` of the shape with micro-batch size ``b`` and ``m`` micro-batches,
  whatever memory lever it ends up needing. With candidates taken in order of
  their bound, TPA stops once the bound exceeds the k-th best estimate found:
  no skipped candidate could have entered the best k. :class:`QuickBound` is a
  coarser floor per shape in O(segments), before its layer split and then on
  it (:meth:`QuickBound.split`), that orders the candidates (a shape of pipeline
  replicas prices its rings on its split from the start: every plan of the
  shape takes that split).
- **Floors per split of the chain** (:func:`split_floors`, :func:`chain_floor`):
  under every shape with R pipeline replicas at once, computed before any
  shape is bounded: a search asked to beat a time its chain cannot beat ends
  at once, and a split that cannot beat the best found is never bounded.

Why the bound is a floor under ``estimate`` (:mod:`spiderflow.costmodel.schedule`):
``estimate = max(last backward of stage 0, sync ends)`` per distinct replica,
each stage's sync starting when its last backward ends
(:func:`~spiderflow.costmodel.schedule.last_backwards`, non-decreasing in each
stage's forward and backward time and in the steady period). The layer split's
floor (:class:`ShapeBound`) uses each stage's work without recomputation unless
told the plan recomputes (recomputation only adds a forward; ZeRO-1 changes
memory, not time), the exact p2p (over the hops the plan's own transfers crowd,
as estimate prices them) and sync times (they do not depend on the memory
levers). First in O(S): the period from single stages and adjacent pairs, and
no stage ending before the last stage's last backward plus the last gradient's
way back up to it; then estimate's own stage ends on estimate's own period
(every window of stages, one array per replica evaluated for each
micro-batching at once). Each term is at most estimate's. A ring runs its
inter-cluster phases one at a time, so its last one ends no earlier than any
phase's start plus the phases that start no earlier.

How tight it is decides how many candidates TPA fits and estimates. Without the
crowded hops it was 1.2-2.4x under the estimate of 512-GPU plans near the best
on the 64-cluster topology (long chains route through each other), and every
one of those was estimated; with them and the recomputation term, the
estimates of those plans equal their floors. Since the estimate counts the
warm-up forwards queued on thin links, the floor follows each stage's end as
estimate computes it, and all of estimate's windows: with the adjacent pairs
alone its median on the deep plans TPA estimated was 0.89 of their estimates
(1,000 jobs of the 64-cluster trace), and TPA estimated three times as many;
the windows in a Python loop made the bound 13% of a simulator run. They are
judged in numpy arrays, but up to ``SMALL_WINDOWS`` stages (28 windows) in a
Python loop, where numpy's cost per call is most of the work. The memory levers
come before the split's floors (:class:`MemoryFit`): half the candidates whose
split TPA bounded recompute, and floors without the recomputation were about 6%
under their estimates.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np

from spiderflow.costmodel.memory import GB, USABLE_FRACTION
from spiderflow.costmodel.network import Channel, Crowded, TopologyView
from spiderflow.costmodel.schedule import last_backwards
from spiderflow.costmodel.stages import ring_allreduce_s, wan_sync_s
from spiderflow.costmodel.work import chains_crowd_of
from spiderflow.parallel.shapes import Shape, replica_runs
from spiderflow.workload import (GRAD_BYTES_PER_PARAM, OPTIMIZER_BYTES_PER_PARAM,
                                 WEIGHT_BYTES_PER_PARAM, Job)

# the levers TPA tries in turn when a stage does not fit: (zero1, recompute)
MEMORY_VARIANTS = ((False, False), (True, False), (True, True))
SAFETY = 1e-9  # relative margin for float rounding between the bound's sums and estimate's
SMALL_WINDOWS = 8  # up to this many stages, a replica's windows are judged in a Python loop


def _stage_params(layers: int, first: bool, last: bool, spec) -> int:
    """:func:`~spiderflow.costmodel.stages.stage_params` from the layer range's ends."""
    params = layers * spec.layer_params
    if first:
        params += spec.embedding_params
    if last and (not first or not spec.tied_embeddings):
        params += spec.embedding_params
    return params


def memory_variant(job: Job, shape: Shape, counts: list[int], b: int, m: int,
                   view: TopologyView) -> tuple[bool, bool] | None:
    """The first of ``MEMORY_VARIANTS`` under which every stage fits; None if none does.

    Mirrors ``stage_memory``'s arithmetic term by term (tested to agree with ``fits_memory``)."""
    return MemoryFit(job, shape, counts, view).variant(b, m)


class MemoryFit:
    """:func:`memory_variant` of one shape and layer split, for any (b, m): TPA asks it for every
    micro-batching of a split before taking its floor (a plan that recomputes has a higher one)."""

    def __init__(self, job: Job, shape: Shape, counts: list[int], view: TopologyView) -> None:
        spec, topo = job.spec, view.topology
        S = len(counts)
        self.job, self.S = job, S
        self.dp_group = shape.dp * len(shape.replicas)
        # One entry per distinct (tp, parameters, layers, last, memory): of stages alike in all
        # but their position, the first holds the most micro-batches in flight (min(S - i, m)),
        # so needs the most memory (every term is non-negative and rounding is monotone): if it
        # fits, they all do.
        first: dict[tuple, int] = {}
        for rep in shape.replicas:
            i = 0
            for cluster, tp, pp in rep:
                have = topo.cluster(cluster).profile.memory_gb * USABLE_FRACTION
                for _ in range(pp):
                    key = (tp, _stage_params(counts[i], i == 0, i == S - 1, spec), counts[i], i == S - 1, have)
                    if first.get(key, S) > i:
                        first[key] = i
                    i += 1
        # per stage: its static memory without and with ZeRO-1 (stage_memory's operations)
        statics = []
        for zero1 in (False, True):
            opt = OPTIMIZER_BYTES_PER_PARAM / (self.dp_group if zero1 else 1)
            statics.append([params / tp * (WEIGHT_BYTES_PER_PARAM + GRAD_BYTES_PER_PARAM + opt)
                            for (tp, params, _, _, _), _ in first.items()])
        self.stages = [(tp, layers, i, last, have, plain, sharded)
                       for ((tp, _, layers, last, have), i), plain, sharded in zip(first.items(), *statics)]
        self._act: dict[int, dict[int, tuple[float, float, float]]] = {}

    def _acts(self, b: int) -> dict[int, tuple[float, float, float]]:
        """Per tp: a layer's activations for one micro-batch of ``b`` without and with
        recomputation, and the last stage's logits."""
        hit = self._act.get(b)
        if hit is None:
            spec, seq = self.job.spec, self.job.seq_len
            hit = self._act[b] = {tp: (spec.layer_activation_bytes(b, seq, tp=tp, recompute=False),
                                       spec.layer_activation_bytes(b, seq, tp=tp, recompute=True),
                                       b * seq * spec.vocab * 2 / tp)
                                  for tp in {st[0] for st in self.stages}}
        return hit

    def variant(self, b: int, m: int) -> tuple[bool, bool] | None:
        acts, S = self._acts(b), self.S
        for zero1, recompute in MEMORY_VARIANTS:
            for tp, layers, i, last, have, plain, sharded in self.stages:
                plain_act, recomputed_act, logits = acts[tp]
                in_flight = S - i if S - i < m else m
                if recompute:
                    act = in_flight * layers * recomputed_act + plain_act
                else:
                    act = in_flight * layers * plain_act
                if last:
                    act += logits
                if not ((sharded if zero1 else plain) + act) / GB <= have:
                    break
            else:
                return zero1, recompute
        return None


def _segment(job: Job, cluster: str, tp: int, view: TopologyView) -> tuple[float, float]:
    """(FLOP/s of a stage with ``tp`` GPUs of ``cluster``, its TP all-reduce seconds per layer and
    per pass for one sequence), as :func:`~spiderflow.costmodel.stages.stage_compute_s` prices
    them; memoised on the view."""
    key = ("segment", job.model, job.seq_len, cluster, tp)
    hit = view._memo.get(key)
    if hit is None:
        c = view.topology.cluster(cluster)
        prof = c.profile
        speed = prof.peak_tflops * 1e12 * view.calibration.gpu_efficiency.get(prof.name, prof.efficiency) * tp
        tp_s = 0.0
        if tp > 1:
            nvlink = Channel(0.0, c.intra_node_bandwidth_gbps * 1e9 / 8)
            tp_s = 2 * ring_allreduce_s(job.spec.boundary_bytes(1, job.seq_len), tp, nvlink)
        hit = view._memo[key] = (speed, tp_s)
    return hit


def shape_channels(shape: Shape, view: TopologyView) -> Crowded:
    """Channels between the clusters of one shape's chain as ``estimate`` prices its sends: over
    the hops the plan's own transfers crowd (:func:`~spiderflow.costmodel.work.chains_crowd_of`;
    only the order of each replica's clusters matters, so every shape of a chain shares them)."""
    return view.crowded(chains_crowd_of(tuple(tuple(c for c, _, _ in rep) for rep in shape.replicas), view))


@lru_cache(maxsize=256)
def _windows_of(stages: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every window i < j of ``stages`` stages: its first and last stage and its stage count (read-only)."""
    i, j = np.triu_indices(stages, k=1)
    count = (j - i + 1).astype(float)
    for a in (i, j, count):
        a.setflags(write=False)
    return i, j, count


@dataclass(frozen=True)
class _Replica:
    work: tuple[float, ...]  # per stage, F + B without recomputation, per sequence of micro-batch
    bwd: tuple[float, ...]  # B without recomputation, per sequence
    fwd: tuple[float, ...]  # F, per sequence: what recomputation adds to B
    # per stage: (alpha_s, bytes per sequence / beta) forward to the next and backward to the previous
    send_f: tuple[tuple[float, float], ...]
    send_b: tuple[tuple[float, float], ...]
    sync_s: tuple[float, ...]  # intra-cluster sync, seconds
    wan: tuple[tuple[float, tuple[str, ...]], ...]  # inter-cluster sync seconds and its ring
    peak: float  # per sequence, the largest of any stage's work and send time either way

    @classmethod
    def of(cls, work, bwd, fwd, send_f, send_b, sync_s, wan) -> "_Replica":
        peak = max(max(work), max([f[1] for f in send_f]), max([k[1] for k in send_b]))
        return cls(work, bwd, fwd, send_f, send_b, sync_s, wan, peak)

    @cached_property
    def windows(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every window of two or more stages i..j as (alphas, seconds per sequence, stages): its
        round trip with micro-batches of b sequences is ``alphas + b * seconds`` (the stages' work
        and the sends between them both ways), as estimate's ``steady_period`` sums it (here by
        differences of prefix sums: the same within ``SAFETY``)."""
        S = len(self.work)
        work = np.array(self.work)
        (a_f, t_f), (a_b, t_b) = np.array(self.send_f).T, np.array(self.send_b).T
        # crossing into stage j (j >= 1): the send j-1 -> j and the gradient j -> j-1, and stage j's work
        alphas = np.concatenate(([0.0], np.cumsum(a_f[:-1] + a_b[1:])))
        seconds = np.concatenate(([0.0], np.cumsum(work[1:] + t_f[:-1] + t_b[1:])))
        i, j, stages = _windows_of(S)
        return alphas[j] - alphas[i], work[i] + seconds[j] - seconds[i], stages

    @cached_property
    def few_windows(self) -> list[tuple[float, float, int]]:
        """:attr:`windows` as a list, summed the same way (prefix sums added left to right)."""
        S = len(self.work)
        alphas = list(itertools.accumulate((f[0] + k[0] for f, k in zip(self.send_f[:-1], self.send_b[1:])),
                                           initial=0.0))
        seconds = list(itertools.accumulate((w + f[1] + k[1] for w, f, k in
                                             zip(self.work[1:], self.send_f[:-1], self.send_b[1:])), initial=0.0))
        return [(alphas[j] - alphas[i], self.work[i] + seconds[j] - seconds[i], j - i + 1)
                for i in range(S) for j in range(i + 1, S)]

    @cached_property
    def _scaled(self) -> dict:
        return {}

    def scaled(self, b: int) -> tuple[list[float], ...]:
        """Per stage with micro-batches of ``b`` sequences: forward, backward, send to the next,
        its latency, send to the previous, its latency (memoised per ``b``)."""
        hit = self._scaled.get(b)
        if hit is None:
            hit = self._scaled[b] = ([b * f for f in self.fwd], [b * w for w in self.bwd],
                                     [a + b * t for a, t in self.send_f], [a for a, _ in self.send_f],
                                     [a + b * t for a, t in self.send_b], [a for a, _ in self.send_b])
        return hit

    def period(self, b: int, m: int, every_window: bool) -> float:
        """Estimate's steady period of this replica with micro-batches of ``b``, ``m`` of them, or
        (``every_window`` False) the part of it from single stages and adjacent pairs, in O(S)."""
        period = b * self.peak  # = max over stages of b*work, b*send time either way (b > 0: the same float)
        if m < 2:
            return period
        if every_window:
            if len(self.work) <= SMALL_WINDOWS:  # a few windows: numpy's per-call cost is most of it
                for alpha, seconds, stages in self.few_windows:
                    t = (alpha + b * seconds) / (stages if stages < m else m)
                    if t > period:
                        period = t
                return period
            alphas, seconds, stages = self.windows
            if len(stages):
                period = max(period, float(np.max((alphas + b * seconds) / np.minimum(stages, m))))
            return period
        _, _, sf, _, sb, _ = self.scaled(b)
        work = self.work
        for j in range(len(work) - 1):  # estimate's window over stages j..j+1
            t = (b * work[j] + b * work[j + 1] + sf[j] + sb[j + 1]) / 2
            if t > period:
                period = t
        return period

    def recomputing(self) -> "_Replica":
        """The same replica with full recomputation: every backward runs its forward again."""
        return _Replica.of(tuple(w + f for w, f in zip(self.work, self.fwd)),
                           tuple(w + f for w, f in zip(self.bwd, self.fwd)), self.fwd, self.send_f, self.send_b,
                           self.sync_s, self.wan)


class ShapeBound:
    """Lower bounds on ``estimate`` for one shape and layer split, for any (b, m)."""

    def __init__(self, job: Job, shape: Shape, counts: list[int], view: TopologyView,
                 channel: Crowded | None = None) -> None:
        spec, s = job.spec, job.seq_len
        topo = view.topology
        S = len(counts)
        # per replica: (cluster, tp) of each stage; per stage: its replicas' clusters
        layouts = [[(cluster, tp) for cluster, tp, pp in rep for _ in range(pp)] for rep in shape.replicas]
        ats = list(zip(*[[cluster for cluster, _ in lay] for lay in layouts]))
        params = [_stage_params(n, i == 0, i == S - 1, spec) for i, n in enumerate(counts)]
        # Gradient syncs, as stage_syncs / intra_sync_s / wan_sync_s price them (they do not depend on
        # b, m or the memory levers): per stage, its replicas' clusters and replica 0's tp.
        # (most stages of a shape repeat another's clusters, tp and parameters: each priced once)
        sync_s, wan = [], []
        syncs: dict[tuple, tuple[float, tuple]] = {}
        for at, (_, tp), n in zip(ats, layouts[0], params):
            key = (at, tp, n)
            hit = syncs.get(key)
            if hit is None:
                clusters = tuple(dict.fromkeys(at))
                nbytes = n / tp * GRAD_BYTES_PER_PARAM
                intra = 0.0
                for c in clusters:
                    g = shape.dp * at.count(c)
                    spans = g * tp > topo.cluster(c).gpus_per_node
                    intra = max(intra, ring_allreduce_s(nbytes, g, view.intra(c, spans_nodes=spans)))
                hit = syncs[key] = (intra, (wan_sync_s(float(n * GRAD_BYTES_PER_PARAM), clusters, view),
                                            tuple(sorted(clusters))) if len(clusters) > 1 else (0.0, ()))
            sync_s.append(hit[0])
            wan.append(hit[1])
        sync_s, wan = tuple(sync_s), tuple(wan)
        lf, hf = spec.layer_forward_flops(1, s), spec.head_forward_flops(1, s)
        group = spec.boundary_bytes(1, s)
        channel = shape_channels(shape, view) if channel is None else channel
        none = (0.0, 0.0)
        self.replicas: list[_Replica] = []
        seen: set = set()
        for rep in shape.replicas:
            if rep in seen:
                continue
            seen.add(rep)
            work, bwd, fwds, send_f, send_b = [], [], [], [], []
            i = 0
            for j, (cluster, tp, pp) in enumerate(rep):  # a segment's stages share speed and inner sends
                speed, tp_s = _segment(job, cluster, tp, view)
                for n in counts[i:i + pp]:
                    fwd = (n * lf + (hf if i == S - 1 else 0.0)) / speed
                    work.append(3 * fwd + 2 * n * tp_s)
                    bwd.append(2 * fwd + n * tp_s)
                    fwds.append(fwd + n * tp_s)
                    i += 1
                inner = self._send(channel.get(view, cluster, cluster), cluster, cluster, group, shape.dp) \
                    if pp > 1 else none
                send_b.append(self._send(channel.get(view, cluster, rep[j - 1][0]), cluster, rep[j - 1][0], group,
                                         shape.dp) if j else none)
                send_b.extend([inner] * (pp - 1))
                send_f.extend([inner] * (pp - 1))
                send_f.append(self._send(channel.get(view, cluster, rep[j + 1][0]), cluster, rep[j + 1][0], group,
                                         shape.dp) if j + 1 < len(rep) else none)
            self.replicas.append(_Replica.of(tuple(work), tuple(bwd), tuple(fwds), tuple(send_f), tuple(send_b),
                                             sync_s, wan))
        self._recomputing: list[_Replica] | None = None  # the replicas with full recomputation, once asked

    @staticmethod
    def _send(chan: Channel, a: str, b: str, group: int, dp: int) -> tuple[float, float]:
        nbytes = group if a == b else dp * group
        return chan.alpha_s, nbytes / chan.bytes_per_s

    def bound(self, b: int, m: int, recompute: bool = False, every_window: bool = False) -> float:
        """A floor under ``estimate`` of this shape's plan with micro-batches of ``b``, ``m`` of them
        (with full recomputation: each backward also runs its forward again, as ``estimate`` prices it)."""
        if recompute:
            if self._recomputing is None:
                self._recomputing = [r.recomputing() for r in self.replicas]
            replicas = self._recomputing
        else:
            replicas = self.replicas
        best = self._replica_bound(replicas[0], b, m, every_window)
        for r in replicas[1:]:
            t = self._replica_bound(r, b, m, every_window)
            if t > best:
                best = t
        return best * (1 - SAFETY)

    @staticmethod
    def _replica_bound(r: _Replica, b: int, m: int, every_window: bool) -> float:
        fwd, bwd, sf, _, sb, _ = scaled = r.scaled(b)
        if every_window:
            # estimate's own stage ends on its own period (work without recomputation unless the
            # plan recomputes: at most estimate's, which only grow with the work)
            ready = last_backwards(*scaled, r.period(b, m, True), m)
        else:
            # O(S): no stage ends before the last stage's, (m - 1) periods after micro-batch 0 went
            # down the pipeline, and the last gradient's way back up to it
            S = len(fwd)
            ready = [0.0] * S
            later = (m - 1) * r.period(b, m, False) + sum(fwd) + sum(sf)
            for i in range(S - 1, -1, -1):
                ready[i] = later = later + bwd[i]
                later += sb[i]
        best = ready[0]
        rings: dict[tuple[str, ...], list[tuple[float, float]]] = {}
        for t, sync, (wan, ring) in zip(ready, r.sync_s, r.wan):
            t += sync
            if wan > 0:
                rings.setdefault(ring, []).append((t, wan))
            elif t > best:
                best = t
        # A ring runs its inter-cluster phases one at a time, each once its stage is ready: in any
        # order the last ends no earlier than any phase's start plus the phases that cannot start
        # before it (the best order's end, which only grows with the ready times).
        for phases in rings.values():
            after = 0.0
            for t, wan in sorted(phases, reverse=True):
                after += wan
                if t + after > best:
                    best = t + after
        return best


def split_floors(job: Job, segments: Sequence[tuple[str, int]], view: TopologyView) -> dict[int, float]:
    """Per number R of pipeline replicas the chain ``segments`` (ordered (cluster, gpus)) can split
    into (R equal runs of consecutive segments), a floor under ``estimate`` of every plan TPA can
    make of that split, before enumerating a shape. Each is under :class:`QuickBound` of every
    shape with R replicas, from what every such shape pays at least:

    - compute: every replica's stages run its share of the batch, ``m*b*dp*R >= global_batch``,
      at best at the speed of all its GPUs: ``global_batch * 3 * layers * layer FLOPs / all
      GPUs' FLOP/s`` (the slowest replica takes at least the average);
    - a run's WAN boundary: its period carries ``b*dp`` activations per micro-batch and the fill
      sends them twice more, so ``(m + 1) * b * dp * bytes / beta >= global_batch / R * bytes /
      beta`` over that boundary's channel (the hops the split's own transfers crowd);
    - R = one replica per segment: the whole model's gradient crosses one ring of all of them.

    TPA orders its candidates by these before it bounds a shape, and skips the splits (or the
    whole chain, :func:`chain_floor`) that cannot beat what it has or was asked to beat."""
    spec, s = job.spec, job.seq_len
    names = [c for c, _ in segments]
    k = len(names)
    speed = sum(g * _segment(job, c, 1, view)[0] for c, g in segments)
    compute = job.global_batch * 3 * spec.layers * spec.layer_forward_flops(1, s) / speed
    floors = {}
    group = spec.boundary_bytes(1, s)
    for runs in replica_runs(names):
        r, size = len(runs), len(runs[0])
        wan = 0.0
        if len(set(names)) < k:
            pass  # a cluster twice in the chain: compute only
        elif size == 1:
            if k > 1:
                ring = view.ring(tuple(names))
                wan = 2 * (k - 1) / k * spec.params * GRAD_BYTES_PER_PARAM / ring.bytes_per_s
        else:
            channels = view.crowded(chains_crowd_of(runs, view))  # (view.p2p_crowded, the crowd looked up once)
            wan = max(job.global_batch / r * group / channels.get(view, a, b).bytes_per_s
                      for run in runs for a, b in zip(run, run[1:]))
        floors[r] = max(compute, wan) * (1 - 2 * SAFETY)
    return floors


def chain_floor(job: Job, segments: Sequence[tuple[str, int]], view: TopologyView) -> float:
    """A floor under ``estimate`` of every plan TPA can make of ``segments``: the least of
    :func:`split_floors`. A search asked only to beat a time the chain cannot beat ends before
    enumerating a shape (on the 64-cluster synthetic trace, half of the searches that find
    nothing to beat the best so far)."""
    return min(split_floors(job, segments, view).values())


class QuickBound:
    """A coarser floor under ``estimate`` from the shape alone, in O(segments x replicas): the
    layer split that minimises the compute terms, the exact p2p, and each ring's inter-cluster
    syncs (the whole model's gradient where one ring serves every stage, else each stage's layers
    on ``rings_on``, the layer split every plan of the shape takes, or a layer per stage without
    it), which start no earlier than a stage's sync-ready time >= ``(m - 1) * period + sum(forward
    sends)``. :meth:`split` gives the same floor on a layer split (each segment's busiest stage,
    every stage's work and the rings' syncs on it), and with ``recompute`` for plans that run each
    forward again in their backward."""

    def __init__(self, job: Job, shape: Shape, view: TopologyView, channel: Crowded | None = None,
                 rings_on: Sequence[int] | None = None) -> None:
        spec, s = job.spec, job.seq_len
        group = spec.boundary_bytes(1, s)
        self.lf, self.hf, self.layers = spec.layer_forward_flops(1, s), spec.head_forward_flops(1, s), spec.layers
        channel = shape_channels(shape, view) if channel is None else channel
        self._links: list[tuple] = []  # per distinct replica: its segments and what its sends take
        seen: set = set()
        for rep in shape.replicas:
            if rep in seen:
                continue
            seen.add(rep)
            alpha_sum = bytes_sum = widest = back_alpha = back_bytes = 0.0
            segments = []  # (speed, TP all-reduce s per layer, stages)
            wan = []  # across each WAN boundary: both ways' latency and seconds per sequence
            for j, (cluster, tp, pp) in enumerate(rep):
                segments.append((*_segment(job, cluster, tp, view), pp))
                if pp > 1:  # boundaries between this segment's own stages
                    chan = view.p2p(cluster, cluster)
                    alpha_sum += (pp - 1) * chan.alpha_s
                    bytes_sum += (pp - 1) * group / chan.bytes_per_s
                    back_alpha += (pp - 1) * chan.alpha_s
                    back_bytes += (pp - 1) * group / chan.bytes_per_s
                    t = group / chan.bytes_per_s
                    if t > widest:
                        widest = t
                if j + 1 < len(rep):  # the WAN boundary to the next segment
                    chan = channel.get(view, cluster, rep[j + 1][0])
                    back = channel.get(view, rep[j + 1][0], cluster)
                    alpha_sum += chan.alpha_s
                    bytes_sum += shape.dp * group / chan.bytes_per_s
                    t = shape.dp * group / chan.bytes_per_s
                    if t > widest:
                        widest = t
                    back_alpha += back.alpha_s
                    back_bytes += shape.dp * group / back.bytes_per_s
                    wan.append((chan.alpha_s + back.alpha_s,
                                shape.dp * group / chan.bytes_per_s + shape.dp * group / back.bytes_per_s))
            self._links.append((tuple(segments), tuple(wan), widest, alpha_sum, bytes_sum, back_alpha, back_bytes))
        # the rings' inter-cluster phases: per interval of stages one ring serves, its figures
        self._intervals = self._ring_intervals(job, shape, view) if len(shape.replicas) > 1 else ()
        self._spec = job.spec
        self.ring_s = self._rings(rings_on)
        self.replicas = self._terms(None, False)

    def split(self, counts: Sequence[int], recompute: bool = False) -> "QuickBound":
        """This floor on the layer split ``counts`` (recomputing: for plans that recompute)."""
        out = object.__new__(QuickBound)
        out.__dict__.update(self.__dict__)
        out.replicas = self._terms(counts, recompute)
        if self._intervals:
            out.ring_s = self._rings(counts)
        return out

    def _terms(self, counts: Sequence[int] | None, recompute: bool) -> list[tuple]:
        # per layer: its forward and backward (TP all-reduced) and, recomputing, the forward again
        passes, reduces = (4, 3) if recompute else (3, 2)
        lf, L = self.lf, self.layers
        out = []
        for segments, wan, widest, alpha_sum, bytes_sum, back_alpha, back_bytes in self._links:
            costs = [passes * lf / speed + reduces * tp_s for speed, tp_s, _ in segments]
            if counts is None:  # a layer a stage at each WAN boundary; the split that balances compute
                ends = [(1, 1)] * len(segments)
                work = L * min(costs)
                busiest = L / sum(pp / cost for (_, _, pp), cost in zip(segments, costs))
            else:  # the layers of each segment's first and last stage; its busiest stage
                ends, i, work, busiest = [], 0, 0.0, 0.0
                for (_, _, pp), cost in zip(segments, costs):
                    mine = counts[i:i + pp]
                    ends.append((mine[0], mine[-1]))
                    work += sum(mine) * cost
                    t = max(mine) * cost
                    if t > busiest:
                        busiest = t
                    i += pp
            work += passes * self.hf / segments[-1][0]
            # estimate's window over the two stages across each WAN boundary, and over every stage:
            # all compute and every transfer both ways, / min(S, m)
            windows = [(alpha, seconds + ends[j][1] * costs[j] + ends[j + 1][0] * costs[j + 1], 2)
                       for j, (alpha, seconds) in enumerate(wan)]
            windows.append((alpha_sum + back_alpha, work + bytes_sum + back_bytes, sum(pp for _, _, pp in segments)))
            out.append((work, busiest, widest, alpha_sum, bytes_sum, back_alpha, back_bytes, tuple(windows)))
        return out

    @staticmethod
    def _ring_intervals(job: Job, shape: Shape, view: TopologyView) -> tuple:
        """Per interval of stages between the replicas' segment cuts whose clusters differ: (first
        stage, stages, the ring's clusters (sorted), its per-phase latency and seconds per gradient
        byte: ``wan_sync_s``'s ``2(n-1) alpha`` and ``2(n-1)/n / beta``), and, where one ring serves
        every stage, the whole model's parameters (else None)."""
        cuts = sorted({x for rep in shape.replicas for x in itertools.accumulate(pp for _, _, pp in rep)})
        intervals = []  # (first stage, stages, clusters in order of first appearance) between cuts
        start = 0
        for end in cuts:
            clusters = []
            for rep in shape.replicas:
                at = 0
                for cluster, _, pp in rep:
                    if at <= start < at + pp:
                        clusters.append(cluster)
                        break
                    at += pp
            intervals.append((start, end - start, tuple(dict.fromkeys(clusters))))
            start = end
        spec = job.spec
        # one ring serves every stage: the whole model's gradient crosses it, whatever the split
        whole = spec.layers * spec.layer_params + spec.embedding_params \
            + (spec.embedding_params if shape.depth > 1 or not spec.tied_embeddings else 0) \
            if len({cl for _, _, cl in intervals}) == 1 else None
        out = []
        for first, stages, clusters in intervals:
            n = len(clusters)
            if n <= 1:
                continue
            ring = view.ring(clusters)
            out.append((first, stages, tuple(sorted(clusters)), 2 * (n - 1) * ring.alpha_s,
                        2 * (n - 1) / n / ring.bytes_per_s, whole))
        return tuple(out)

    def _rings(self, counts: Sequence[int] | None) -> float:
        """The longest ring's inter-cluster sync seconds, at least: the sum of its stages' phases
        (``wan_sync_s`` of each stage's gradient, as ``estimate`` serialises them on the ring, each
        after its stage's last backward, which is after ``fill``), with the gradient of a layer per
        stage where the split is not known (``counts`` None) and of the stage's layers where it is
        (a ring of two-replica shapes carries tens of layers: on 4,000 admission calls at load 0.9
        the quick floors with a layer per stage sat at 0.72-0.76x what they had to beat, the
        shape's own bound at 1.2x)."""
        spec = self._spec
        per_ring: dict[tuple[str, ...], float] = {}
        for first, stages, key, alpha, per_byte, whole in self._intervals:
            if whole is not None:
                params = whole
            elif counts is None:
                params = stages * spec.layer_params
            else:
                last = len(counts) - 1
                params = sum(_stage_params(counts[i], i == 0, i == last, spec) for i in range(first, first + stages))
            t = stages * alpha + params * GRAD_BYTES_PER_PARAM * per_byte
            per_ring[key] = per_ring.get(key, 0.0) + t
        return max(per_ring.values(), default=0.0)

    def bound(self, b: int, m: int) -> float:
        # (comparisons, not max() and min() calls: TPA asks this of every candidate it pops)
        best = 0.0
        for work, busiest, widest, alpha_sum, bytes_sum, back_alpha, back_bytes, windows in self.replicas:
            period = b * (busiest if busiest >= widest else widest)
            if m >= 2:
                for alpha, slope, stages in windows:
                    t = (alpha + b * slope) / (stages if stages <= m else m)
                    if t > period:
                        period = t
            fill = (m - 1) * period + alpha_sum + b * bytes_sum
            t, ring = fill + back_alpha + b * back_bytes + b * work, fill + self.ring_s
            if ring > t:
                t = ring
            if t > best:
                best = t
        return best * (1 - SAFETY)
