"""CPU proxies of pipeline stages for `emulator run --compute real` (no root, no timed asserts)."""

import pytest

from emulator.jobs.compute import ProxyShape, StageProxy, cpu_flops_per_s, proxy_forward_flops, proxy_shape
from spiderflow.workload import MODELS


def test_proxy_flops_are_the_cost_models_formula():
    # by hand, per layer: 2 b s (12 h^2) + 4 b s^2 h with b=2, s=32, h=64
    shape = ProxyShape(layers=2, hidden=64, heads=1, seq_len=32, micro_batch=2)
    assert proxy_forward_flops(shape) == 2 * (2 * 2 * 32 * 12 * 64 ** 2 + 4 * 2 * 32 ** 2 * 64) == 13_631_488
    gpt = MODELS["gpt3-125m"]  # a proxy of GPT-3 125M's own shape counts what the cost model counts
    same = ProxyShape(layers=12, hidden=768, heads=12, seq_len=1024, micro_batch=1)
    assert proxy_forward_flops(same) == 12 * gpt.layer_forward_flops(1, 1024)


@pytest.mark.parametrize("target", [3e6, 2e7, 1.3e8, 1e9, 2.5e10])
@pytest.mark.parametrize("layers,micro_batch", [(1, 1), (6, 2)])
def test_proxy_shape_hits_the_flops_target(target, layers, micro_batch):
    shape = proxy_shape(target, layers, micro_batch, 2048)
    assert proxy_forward_flops(shape) == pytest.approx(target, rel=0.03)
    assert (shape.layers, shape.micro_batch) == (layers, micro_batch)
    assert shape.hidden >= 16 and shape.hidden % shape.heads == 0 and shape.heads == max(1, shape.hidden // 64)
    if shape.hidden > 16:
        assert shape.seq_len == 128  # min(seq_len, 128)


def test_a_short_sequence_is_kept():
    assert proxy_shape(1e8, 2, 1, 64).seq_len == 64


def test_below_the_floor_the_sequence_shrinks():
    floor = proxy_forward_flops(ProxyShape(layers=4, hidden=16, heads=1, seq_len=128, micro_batch=1))
    shape = proxy_shape(floor / 10, 4, 1, 1024)
    assert (shape.hidden, shape.heads) == (16, 1) and 1 < shape.seq_len < 128
    assert proxy_forward_flops(shape) == pytest.approx(floor / 10, rel=0.1)
    assert proxy_shape(0.0, 4, 1, 1024) == ProxyShape(layers=4, hidden=16, heads=1, seq_len=1, micro_batch=1)


def test_bad_arguments_name_the_value():
    with pytest.raises(ValueError, match="layers.*0"):
        proxy_shape(1e6, 0, 1, 128)
    with pytest.raises(ValueError, match="forward_flops_target.*-1"):
        proxy_shape(-1.0, 1, 1, 128)
    with pytest.raises(ValueError, match="multiple of heads"):
        ProxyShape(layers=1, hidden=130, heads=4, seq_len=8, micro_batch=1)


def test_forward_and_backward_produce_gradients_1f1b_style():
    shape = ProxyShape(layers=2, hidden=128, heads=2, seq_len=16, micro_batch=2)
    proxy = StageProxy(shape, seed=1)
    proxy.forward(0)
    proxy.forward(1)
    assert proxy.in_flight == 2
    grad_in = proxy.backward(0)
    assert grad_in.shape == (2, 16, 128) and proxy.in_flight == 1
    params = list(proxy.blocks.parameters())
    assert params and all(p.grad is not None and p.grad.abs().sum() > 0 for p in params)
    proxy.backward(1)
    with pytest.raises(ValueError, match="no forward in flight"):
        proxy.backward(1)
    proxy.forward(2)
    with pytest.raises(ValueError, match="already in flight"):
        proxy.forward(2)
    proxy.zero_grad()
    assert all(p.grad is None for p in params)


def test_recomputation_keeps_no_graph_and_gives_the_same_gradient():
    shape = ProxyShape(layers=2, hidden=32, heads=1, seq_len=8, micro_batch=1)
    plain, recompute = StageProxy(shape, seed=3), StageProxy(shape, recompute=True, seed=3)
    plain.forward(0)
    recompute.forward(0)
    assert recompute._in_flight[0][1] is None  # only the input is kept, as checkpointing does
    assert plain.backward(0).allclose(recompute.backward(0))


def test_the_cpu_probe_returns_a_rate():
    assert cpu_flops_per_s(0.05, n=64) > 1e6
    with pytest.raises(ValueError):
        cpu_flops_per_s(0.0)
