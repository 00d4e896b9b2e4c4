"""Emulated compute on a GPU stream's clock (emulator.jobs.worker.GpuStream): the host's own cost
per op does not add up over back-to-back ops; a wait for input, or for anything outside the stream,
starts the next op from when it ended."""

import time
import types

import pytest

from emulator.jobs import worker
from emulator.jobs.worker import GpuStream


class Clock:
    """A clock that moves only when the code under test sleeps or the test says the host worked."""

    def __init__(self):
        self.now, self.slept = 100.0, []

    def monotonic(self):
        return self.now

    def sleep(self, s):
        assert s > 0
        self.slept.append(s)
        self.now += s


def fake_clock(monkeypatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(worker, "time", types.SimpleNamespace(monotonic=clock.monotonic, sleep=clock.sleep))
    return clock


def test_back_to_back_ops_end_their_predicted_times_after_each_other_whatever_the_host_costs(monkeypatch):
    clock = fake_clock(monkeypatch)
    stream = GpuStream()
    for _ in range(5):
        clock.now += 0.0003  # the host's Python and JSON line between ops
        stream.run(0.002)
    assert clock.now == stream.free_at == pytest.approx(100.0 + 5 * 0.002)  # not 100 + 5 x 0.0023
    assert len(clock.slept) == 5 and all(s < 0.002 for s in clock.slept)


def test_a_host_late_by_more_than_an_op_sleeps_less_on_the_next_ones(monkeypatch):
    clock = fake_clock(monkeypatch)
    stream = GpuStream()
    stream.run(0.002)
    clock.now += 0.005  # descheduled for 5 ms
    stream.run(0.002)  # its end has passed: no sleep
    assert clock.now == pytest.approx(100.007) and len(clock.slept) == 1
    stream.run(0.002)
    stream.run(0.002)  # caught up: the stream's clock again
    assert clock.now == stream.free_at == pytest.approx(100.008)


def test_a_wait_for_input_or_outside_the_stream_starts_the_next_op_from_its_end(monkeypatch):
    clock = fake_clock(monkeypatch)
    stream = GpuStream()
    stream.run(0.002)
    clock.now += 0.010  # waited 10 ms for its input
    stream.run(0.002, waited=True)
    assert clock.now == pytest.approx(100.014)
    clock.now += 0.003  # a collective, or real compute run by the host itself
    stream.reset()
    stream.run(0.001)
    assert clock.now == pytest.approx(100.018)
    slept = len(clock.slept)
    stream.run(0.0)  # nothing to run: no sleep
    assert len(clock.slept) == slept


def test_on_the_real_clock_the_hosts_cost_between_ops_does_not_add_up():
    def busy(s):
        end = time.perf_counter() + s
        while time.perf_counter() < end:
            pass

    worker.tight_timers()
    ops, op_s, host_s = 40, 0.001, 0.0005
    t0 = time.monotonic()
    stream = GpuStream()
    for _ in range(ops):
        busy(host_s)
        stream.run(op_s)
    elapsed = time.monotonic() - t0
    # sleeps one after the other would take ops x (op_s + host_s) = 60 ms and more; the stream's clock
    # 40 ms and the last wake-up's lateness (slack for a busy machine: 10 ms)
    assert ops * op_s <= elapsed < ops * op_s + 0.010, elapsed
