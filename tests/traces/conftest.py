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


# The mapping before issue 15 (GPUs as traced, unfinished and fractional jobs and jobs below
# min_gpus dropped): the field-by-field tests of each importer check their rows under it.
LEGACY = {"gpu_scale": 1, "unfinished": "drop", "fractional": "drop", "small": "drop"}


def drops(**counts):
    """A TraceLoad.dropped dict: every reason, zero unless given."""
    return {"no_gpus": 0, "not_finished": 0, "no_runtime": 0, "fractional": 0, "below_min_gpus": 0,
            "merged": 0, **counts}


@pytest.fixture
def legacy():
    return dict(LEGACY)


@pytest.fixture
def dropped():
    return drops


def trace_cli(argv):
    """``python -m spiderflow <argv>`` for the ``trace`` subcommands, as spiderflow.cli.main runs them
    (one-line errors, exit 2), without importing the planners the other commands need."""
    from spiderflow.cliutil import OneLineParser
    from spiderflow.errors import SpiderFlowError
    from spiderflow.traces.cli import add_trace

    parser = OneLineParser(prog="python -m spiderflow")
    add_trace(parser.add_subparsers(dest="command", required=True))
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return exc.code
    try:
        return args.func(args)
    except SpiderFlowError as exc:
        import sys
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code


@pytest.fixture
def cli():
    return trace_cli
