"""``emulator check --step``'s figures from the receiver's byte counts (no network needed): how long
the rate took to settle after a step, and the rate after it, also where it settled only in the
phase's last window (a loaded machine: a clean-clone CI run read no window after it and reported
no rate at all)."""

import math

import pytest

from emulator.net.hoststeal import STOLEN_SHARE
from emulator.net.measure import STOLEN_TRIES
from emulator.net.step import SAMPLE_S, Step, rate_after, settle_time, step_again


def _samples(rate_mbps, end: float) -> list[tuple[float, int]]:
    """(time, cumulative bytes) every SAMPLE_S from 0 to ``end`` for a rate ``rate_mbps(t)``."""
    out, total = [], 0.0
    for i in range(round(end / SAMPLE_S) + 1):
        t = i * SAMPLE_S
        out.append((t, int(total)))
        total += rate_mbps(t) * 1e6 / 8 * SAMPLE_S
    return out


def test_a_step_down_settles_and_the_rate_after_it_is_the_new_one():
    samples = _samples(lambda t: 100.0 if t < 1.0 else 50.0, 4.0)
    settle = settle_time(samples, 1.0, 3.8, 50.0)
    assert settle is not None and settle <= 0.3
    assert rate_after(samples, 1.0, 3.8, 50.0) == pytest.approx(50.0, rel=0.01)


def test_a_rate_that_settles_in_the_phases_last_window_still_has_a_rate_after_it():
    samples = _samples(lambda t: 80.0 if t < 1.79 else 50.0, 2.2)
    assert settle_time(samples, 0.0, 2.0, 50.0) is not None  # the last windows are within 10% of 50
    after = rate_after(samples, 0.0, 2.0, 50.0)
    assert not math.isnan(after) and after == pytest.approx(50.0, rel=0.1)


def test_a_rate_that_never_settles_is_read_over_the_phases_second_half():
    samples = _samples(lambda t: 100.0 if t < 1.0 else 80.0, 4.0)
    assert settle_time(samples, 1.0, 3.8, 50.0) is None
    assert rate_after(samples, 1.0, 3.8, 50.0) == pytest.approx(80.0, rel=0.01)


def _step(settle_s, steal_pct):
    return Step(link="east-west", direction="east -> west", from_gbps=0.6, to_gbps=0.3, rate_before_mbps=60.0,
                rate_after_mbps=30.0, apply_ms=20.0, settle_s=settle_s, host_steal_pct=steal_pct)


def test_a_failed_step_is_made_again_only_while_the_host_steals():
    stolen, calm = 100 * STOLEN_SHARE * 2, 0.0
    assert not step_again([_step(0.2, stolen), _step(0.5, stolen)], 0)  # both ok
    assert not step_again([_step(0.2, calm), _step(None, calm)], 0)  # failed on a quiet host: a verdict
    assert step_again([_step(0.2, stolen), _step(None, stolen)], 0)
    assert step_again([_step(None, stolen)], STOLEN_TRIES - 1) and not step_again([_step(None, stolen)], STOLEN_TRIES)
    assert _step(None, stolen).as_json()["host_steal_pct"] == pytest.approx(stolen)
