"""Helpers for the trace tests: fixture paths and an independent iteration count."""

from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"

# (layers, hidden, vocab, matmul params per layer) re-derived here from the papers,
# not read from spiderflow.workload, so the mapping's arithmetic is checked independently.
GPT = {"gpt3-125m": (12, 768), "gpt3-350m": (24, 1024), "gpt3-1.3b": (24, 2048),
       "gpt3-2.7b": (32, 2560), "gpt3-6.7b": (32, 4096), "gpt3-13b": (40, 5120)}
A100_ACHIEVED_FLOPS = 312e12 * 0.45  # A100 bf16 dense peak x the default MFU


def _shape(model):
    if model in GPT:
        layers, h = GPT[model]
        return layers, h, 50257, 12 * h * h  # Q,K,V,O (4h^2) + two 4h-wide MLP matrices (8h^2)
    assert model == "llama2-70b"
    h, kv, ffn = 8192, 8 * 128, 28672
    return 80, h, 32000, 2 * h * h + 2 * h * kv + 3 * h * ffn


def expected_iterations(model, gpus, global_batch, seq_len, duration_s):
    layers, h, vocab, pm = _shape(model)
    b, s = global_batch, seq_len
    forward = layers * (2 * b * s * pm + 4 * b * s * s * h) + 2 * b * s * h * vocab
    step_s = 3 * forward / (gpus * A100_ACHIEVED_FLOPS)
    return max(1, round(duration_s / step_s))


@pytest.fixture
def data():
    return DATA


@pytest.fixture
def iters():
    return expected_iterations
