"""Real compute for ``emulator run --compute real``: a CPU proxy of one pipeline stage.

The emulator scales bytes and bandwidths by the same factor so transfer times
are kept; real compute does the same for FLOPs. A rank runs a *proxy* of its
stage: the stage's number of GPT-style blocks (pre-LayerNorm, causal
self-attention through ``scaled_dot_product_attention``, MLP of 4h with GELU)
at the plan's micro-batch size, a sequence length of ``min(seq_len, 128)``
and a hidden size ``h'`` chosen so that the proxy's forward FLOPs equal
``forward_s x cpu_flops_per_s``: the cost model's forward time of the stage
(TP traffic and, on the last stage, the output head included) times this
machine's single-thread float32 matmul rate (:func:`cpu_flops_per_s`). On an
idle core the proxy then takes about the predicted GPU time; what it measures
beyond that is real CPU compute: ranks contending for cores, the small blocks'
efficiency against the probe's matmuls, Python and autograd overhead.

FLOPs are counted with the cost model's own formula
(:meth:`spiderflow.workload.ModelSpec.layer_forward_flops`, Narayanan et al.,
SC'21, eq. 3) applied to the proxy's shape, never a second formula.

Floor: ``h' >= 16``. Where even 16 overshoots the target, ``h'`` stays 16 and
the sequence is shortened (down to 1 token); below that the proxy takes longer
than ``forward_s`` (a few kFLOPs per layer: microseconds of math, dwarfed by
the ~0.1 ms of Python per block call anyway).

Backward is real autograd (``out.backward(grad)`` with a fixed gradient), about
2x the forward as the cost model assumes. With recomputation the forward runs
under ``torch.no_grad()`` (only the input is kept, as activation checkpointing
does) and the backward reruns it with grad first: 3x the forward in all, as the
cost model's ``backward_s`` has it.

Shapes and FLOPs are pure Python; torch is imported only by :func:`cpu_flops_per_s`
and :class:`StageProxy`, so :mod:`emulator.jobs.launch` can size proxies without it.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from spiderflow.workload import ModelSpec

COMPUTE_MODES = ("emulated", "real")
PROXY_MAX_SEQ_LEN = 128
PROXY_MIN_HIDDEN = 16
HEAD_DIM = 64  # heads = max(1, h' // 64), as GPT-3's 64- to 128-wide heads at small h'
PROBE_MATMUL_N = 256  # the probe's square float32 matmul (2 n^3 FLOPs)
PROBE_CHUNK_S = 0.01


@dataclass(frozen=True, kw_only=True)
class ProxyShape:
    layers: int
    hidden: int
    heads: int
    seq_len: int
    micro_batch: int

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "heads", "seq_len", "micro_batch"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"ProxyShape.{name} must be a positive integer (got {value!r})")
        if self.hidden % self.heads:
            raise ValueError(f"ProxyShape.hidden must be a multiple of heads (got {self.hidden} and {self.heads})")


def proxy_heads(hidden: int) -> int:
    return max(1, hidden // HEAD_DIM)


def proxy_forward_flops(shape: ProxyShape) -> float:
    """Forward FLOPs of the proxy for one micro-batch: the cost model's per-layer formula
    (:meth:`ModelSpec.layer_forward_flops`) on a GPT block of the proxy's shape."""
    block = ModelSpec(name="proxy", layers=shape.layers, hidden=shape.hidden, heads=shape.heads,
                      ffn=4 * shape.hidden, vocab=1)
    return shape.layers * block.layer_forward_flops(shape.micro_batch, shape.seq_len)


def _shape(layers: int, hidden: int, seq_len: int, micro_batch: int) -> ProxyShape:
    return ProxyShape(layers=layers, hidden=hidden, heads=proxy_heads(hidden), seq_len=seq_len,
                      micro_batch=micro_batch)


def _positive_root(a: float, b: float, c: float) -> float:
    """The positive root of a x^2 + b x - c = 0 (a, b, c >= 0)."""
    return (-b + math.sqrt(b * b + 4.0 * a * c)) / (2.0 * a)


def proxy_shape(forward_flops_target: float, layers: int, micro_batch: int, seq_len: int, *,
                max_seq_len: int = PROXY_MAX_SEQ_LEN, min_hidden: int = PROXY_MIN_HIDDEN) -> ProxyShape:
    """The proxy of a stage of ``layers`` layers whose forward FLOPs are closest to the target.

    Sequence ``min(seq_len, max_seq_len)``, hidden ``h' >= min_hidden`` (a multiple of its
    heads); where ``min_hidden`` overshoots, ``h' = min_hidden`` and the sequence shrinks
    (down to 1). For a GPT block (ffn 4h) the formula is ``L (24 b s h^2 + 4 b s^2 h)``;
    its root is the starting point, the nearby valid shapes are scored with
    :func:`proxy_forward_flops`.
    """
    for name, value in (("layers", layers), ("micro_batch", micro_batch), ("seq_len", seq_len),
                        ("max_seq_len", max_seq_len), ("min_hidden", min_hidden)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"proxy_shape: {name} must be a positive integer (got {value!r})")
    if not forward_flops_target >= 0:
        raise ValueError(f"proxy_shape: forward_flops_target must be >= 0 (got {forward_flops_target!r})")
    target = float(forward_flops_target)
    b, n, s = micro_batch, layers, min(seq_len, max_seq_len)

    def error(shape: ProxyShape) -> float:
        return abs(proxy_forward_flops(shape) - target)

    if proxy_forward_flops(_shape(n, min_hidden, s, b)) >= target:  # the floor: shorten the sequence
        h = min_hidden
        s_root = _positive_root(4.0 * b * h * n, 24.0 * b * h * h * n, target)  # L(4bh s^2 + 24bh^2 s)
        lo = max(1, min(s, math.floor(s_root)))
        return min((_shape(n, h, x, b) for x in sorted({lo, min(s, lo + 1)})), key=error)
    h_root = _positive_root(24.0 * b * s * n, 4.0 * b * s * s * n, target)
    lo, hi = max(min_hidden, math.floor(h_root * 0.95) - 2), math.ceil(h_root * 1.05) + 2
    valid = [h for h in range(lo, hi + 1) if h % proxy_heads(h) == 0]
    return min((_shape(n, h, s, b) for h in valid), key=error)


def cpu_flops_per_s(seconds: float = 0.3, *, n: int = PROBE_MATMUL_N) -> float:
    """This machine's single-thread float32 matmul rate (FLOP/s), probed for about ``seconds``.

    Square ``n x n`` matmuls (``2 n^3`` FLOPs each) in chunks of ~10 ms; the best chunk's
    rate is returned (the rate of an idle core: a chunk another process interrupted is
    slower, not faster). One thread, as each rank runs (``torch.set_num_threads(1)``).
    """
    import torch

    if not seconds > 0:
        raise ValueError(f"cpu_flops_per_s: seconds must be > 0 (got {seconds!r})")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a, b = torch.randn(n, n), torch.randn(n, n)
        a @ b  # first call: allocation, kernel selection
        t = time.perf_counter()
        a @ b
        per = max(1, int(PROBE_CHUNK_S / max(time.perf_counter() - t, 1e-6)))
        best, deadline = 0.0, time.perf_counter() + seconds
        while True:
            t = time.perf_counter()
            for _ in range(per):
                a @ b
            dt = time.perf_counter() - t
            best = max(best, per * 2.0 * n ** 3 / dt)
            if t + dt >= deadline:
                return best
    finally:
        torch.set_num_threads(threads)


class StageProxy:
    """The proxy blocks of one stage, run micro-batch by micro-batch as 1F1B does.

    ``forward(k)`` runs micro-batch ``k`` and keeps its graph (with recomputation: only
    its input) until ``backward(k)``, which returns the gradient of the input (what a
    stage sends back). The input is a fixed local tensor of the proxy's shape: the
    tensor a rank receives is the real-size (scaled) transfer, not the proxy's input.
    """

    def __init__(self, shape: ProxyShape, *, recompute: bool = False, seed: int = 0) -> None:
        import torch
        from torch import nn

        self.shape, self.recompute = shape, recompute
        self._torch, self._sdpa, self._gelu = torch, nn.functional.scaled_dot_product_attention, nn.functional.gelu
        torch.manual_seed(seed)
        h = shape.hidden
        self.blocks = nn.ModuleList(
            nn.ModuleDict({"ln1": nn.LayerNorm(h), "qkv": nn.Linear(h, 3 * h), "proj": nn.Linear(h, h),
                           "ln2": nn.LayerNorm(h), "fc": nn.Linear(h, 4 * h), "out": nn.Linear(4 * h, h)})
            for _ in range(shape.layers))
        size = (shape.micro_batch, shape.seq_len, h)
        self.input = torch.randn(size)
        self.grad_output = torch.randn(size)
        self._in_flight: dict[int, tuple] = {}

    def _run(self, x):
        b, s, h = x.shape
        a = self.shape.heads
        for blk in self.blocks:
            q, k, v = blk["qkv"](blk["ln1"](x)).split(h, dim=-1)
            q, k, v = (t.view(b, s, a, h // a).transpose(1, 2) for t in (q, k, v))
            y = self._sdpa(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, h)
            x = x + blk["proj"](y)
            x = x + blk["out"](self._gelu(blk["fc"](blk["ln2"](x))))
        return x

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    def forward(self, k: int) -> None:
        if k in self._in_flight:
            raise ValueError(f"micro-batch {k} is already in flight (forward twice without a backward)")
        x = self.input.detach().requires_grad_(True)
        if self.recompute:
            with self._torch.no_grad():
                self._run(x)
            self._in_flight[k] = (x, None)
        else:
            self._in_flight[k] = (x, self._run(x))

    def backward(self, k: int):
        try:
            x, out = self._in_flight.pop(k)
        except KeyError:
            raise ValueError(f"micro-batch {k} has no forward in flight") from None
        if out is None:  # recomputation: the forward again, with its graph this time
            out = self._run(x)
        out.backward(self.grad_output)
        return x.grad

    def zero_grad(self) -> None:
        self.blocks.zero_grad(set_to_none=True)

    def warm_up(self) -> None:
        """One forward and backward (first-call allocations and kernel selection), grads cleared."""
        self.forward(-1)
        self.backward(-1)
        self.zero_grad()
