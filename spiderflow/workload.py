"""Model specs (GPT-style decoder layers) and jobs.

Per-layer figures follow Narayanan et al., SC'21 (Megatron-LM, eq. 3):
a transformer layer's forward pass costs ``2 * b * s * P_matmul + 4 * b * s^2 * h``
FLOPs (``P_matmul`` the layer's weight-matrix parameters, the second term the
attention scores and their product with V); backward costs twice the forward.
Activation memory follows Korthikanti et al., MLSys'23 ("Reducing Activation
Recomputation in Large Transformer Models", section 4.1): a layer stores
``s*b*h*(10 + 24/t + 5*a*s/(h*t))`` bytes with tensor parallelism ``t`` and no
recomputation, and only its ``2*s*b*h``-byte input with full recomputation.
All tensors are bf16 (2 bytes).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from spiderflow.inputs import finite

BYTES_PER_ELEMENT = 2  # bf16 activations and weights
# Mixed-precision Adam: bf16 weights (2) + bf16 grads (2) + fp32 master weights,
# momentum and variance (12) = 16 bytes per parameter (Rajbhandari et al., SC'20, ZeRO, sec. 3.1).
WEIGHT_BYTES_PER_PARAM = 2
GRAD_BYTES_PER_PARAM = 2
OPTIMIZER_BYTES_PER_PARAM = 12


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    name: str
    layers: int
    hidden: int
    heads: int
    ffn: int
    vocab: int
    kv_heads: int | None = None  # grouped-query attention (Llama-2 70B); None = heads
    gated_mlp: bool = False  # SwiGLU: three FFN matrices instead of two
    source: str = ""

    @cached_property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @cached_property
    def layer_params(self) -> int:
        """Weights of one transformer layer (matrices, biases, norms)."""
        h = self.hidden
        kv = (self.kv_heads or self.heads) * self.head_dim
        attn = 2 * h * h + 2 * h * kv  # Q, O and K, V projections
        mlp = (3 if self.gated_mlp else 2) * h * self.ffn
        small = 0 if self.gated_mlp else 4 * h + self.ffn + h + 2 * kv  # GPT biases
        norms = 2 * h if self.gated_mlp else 4 * h
        return attn + mlp + small + norms

    @cached_property
    def layer_matmul_params(self) -> int:
        h = self.hidden
        kv = (self.kv_heads or self.heads) * self.head_dim
        return 2 * h * h + 2 * h * kv + (3 if self.gated_mlp else 2) * h * self.ffn

    @property
    def tied_embeddings(self) -> bool:
        """GPT-3 ties the output layer to the input embedding; Llama 2 does not."""
        return not self.gated_mlp

    @cached_property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @cached_property
    def params(self) -> int:
        """Whole-model parameters (embedding counted once: tied for GPT, untied Llama head added)."""
        head = 0 if self.tied_embeddings else self.embedding_params
        return self.layers * self.layer_params + self.embedding_params + head

    def layer_forward_flops(self, micro_batch: int, seq_len: int) -> float:
        """Forward FLOPs of one layer for one micro-batch (Narayanan et al., eq. 3)."""
        b, s, h = micro_batch, seq_len, self.hidden
        return 2.0 * b * s * self.layer_matmul_params + 4.0 * b * s * s * h

    def head_forward_flops(self, micro_batch: int, seq_len: int) -> float:
        """Forward FLOPs of the output projection to the vocabulary (last stage)."""
        return 2.0 * micro_batch * seq_len * self.hidden * self.vocab

    def boundary_bytes(self, micro_batch: int, seq_len: int) -> int:
        """Bytes of the activation (or its gradient) crossing a pipeline boundary."""
        return micro_batch * seq_len * self.hidden * BYTES_PER_ELEMENT

    def layer_activation_bytes(self, micro_batch: int, seq_len: int, *, tp: int = 1,
                               recompute: bool = False) -> float:
        """Activation memory one layer keeps for one in-flight micro-batch (Korthikanti et al.)."""
        b, s, h, a = micro_batch, seq_len, self.hidden, self.heads
        if recompute:
            return 2.0 * s * b * h
        return s * b * h * (10.0 + 24.0 / tp + 5.0 * a * s / (h * tp))


def _gpt3(name: str, layers: int, hidden: int, heads: int) -> ModelSpec:
    return ModelSpec(name=name, layers=layers, hidden=hidden, heads=heads, ffn=4 * hidden,
                     vocab=50257, source="Brown et al., NeurIPS'20 (GPT-3), Table 2.1")


def _llama2(name: str, layers: int, hidden: int, heads: int, ffn: int,
            kv_heads: int | None = None) -> ModelSpec:
    return ModelSpec(name=name, layers=layers, hidden=hidden, heads=heads, ffn=ffn, vocab=32000,
                     kv_heads=kv_heads, gated_mlp=True,
                     source="Touvron et al., 2023 (Llama 2), Table 1 and released configs")


MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        _gpt3("gpt3-125m", 12, 768, 12),
        _gpt3("gpt3-350m", 24, 1024, 16),
        _gpt3("gpt3-1.3b", 24, 2048, 16),  # Table 2.1 lists 24 heads of 128; 16 keeps h % a == 0
        _gpt3("gpt3-2.7b", 32, 2560, 32),
        _gpt3("gpt3-6.7b", 32, 4096, 32),
        _gpt3("gpt3-13b", 40, 5120, 40),  # Table 2.1 prints 5140; 40 heads x 128 = 5120
        _gpt3("gpt3-175b", 96, 12288, 96),
        _llama2("llama2-7b", 32, 4096, 32, 11008),
        _llama2("llama2-13b", 40, 5120, 40, 13824),
        _llama2("llama2-70b", 80, 8192, 64, 28672, kv_heads=8),
    )
}


def model_spec(name: str) -> ModelSpec:
    try:
        return MODELS[name]
    except KeyError:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(MODELS)}") from None


@dataclass(frozen=True, kw_only=True)
class Job:
    """A training job: what to train, with how many GPUs, for how long."""

    job_id: str
    arrival_s: float
    model: str
    gpus: int
    iterations: int
    global_batch: int
    seq_len: int
    priority: int = 0
    deadline_s: float | None = None

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise ValueError(f"model must be one of {', '.join(MODELS)} (got {self.model!r})")
        for field in ("gpus", "iterations", "global_batch", "seq_len"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{field} must be a positive integer (got {value!r})")
        if isinstance(self.priority, bool) or not isinstance(self.priority, int):
            raise ValueError(f"priority must be an integer (got {self.priority!r})")
        # finite() first: nan passes "< 0", and 10**400 makes math.isfinite raise
        if not finite(self.arrival_s) or self.arrival_s < 0:
            raise ValueError(f"arrival_s must be a finite number >= 0 (got {self.arrival_s!r})")
        if self.deadline_s is not None and not finite(self.deadline_s):
            raise ValueError(f"deadline_s must be a finite number or None (got {self.deadline_s!r})")

    @property
    def spec(self) -> ModelSpec:
        return MODELS[self.model]

    @property
    def tokens_per_iteration(self) -> int:
        return self.global_batch * self.seq_len
