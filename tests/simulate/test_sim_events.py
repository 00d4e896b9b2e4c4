"""The deterministic event queue: order, ties, cancellation, and refusals."""

import math

import pytest

from spiderflow.simulate.events import Event, EventQueue


def drain(q):
    out = []
    while q:
        e = q.pop()
        out.append((e.time_s, e.payload))
    return out


def test_time_then_priority_then_insertion_order():
    q = EventQueue()
    q.push(5.0, "late")
    q.push(1.0, "b", priority=1)
    q.push(1.0, "a", priority=0)
    q.push(1.0, "c", priority=1)
    q.push(0.0, "first")
    assert len(q) == 5 and q.peek_time() == 0.0
    assert drain(q) == [(0.0, "first"), (1.0, "a"), (1.0, "b"), (1.0, "c"), (5.0, "late")]
    assert q.now_s == 5.0 and len(q) == 0 and q.peek_time() is None


def test_pop_returns_the_event_with_its_token():
    q = EventQueue()
    token = q.push(2.5, {"job": "x"}, priority=-1)
    assert q.pop() == Event(time_s=2.5, priority=-1, token=token, payload={"job": "x"})


def test_payloads_are_never_compared():
    q = EventQueue()
    for _ in range(3):
        q.push(1.0, object())  # objects without ordering: ties go by insertion order
    assert len(drain(q)) == 3


def test_cancel_by_token_is_lazy_and_exact():
    q = EventQueue()
    a = q.push(1.0, "a")
    b = q.push(2.0, "b")
    c = q.push(3.0, "c")
    assert q.cancel(a) and not q.cancel(a)  # a second cancel is a no-op
    assert len(q) == 2 and q.peek_time() == 2.0  # the cancelled head is skipped
    assert q.pop().payload == "b"
    assert not q.cancel(b)  # already ran
    assert not q.cancel(12345)  # never existed
    assert q.cancel(c) and len(q) == 0 and not q
    with pytest.raises(IndexError, match="empty event queue"):
        q.pop()


@pytest.mark.parametrize("time_s, message", [
    (-1.0, "time_s must be >= 0 (got -1.0)"),
    (math.nan, "time_s must be a finite number (got nan)"),
    (math.inf, "time_s must be a finite number (got inf)"),
    ("3", "time_s must be a finite number (got '3')"),
])
def test_bad_times_are_refused(time_s, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        EventQueue().push(time_s, "x")


def test_no_scheduling_into_the_past():
    q = EventQueue()
    q.push(10.0, "x")
    q.pop()
    q.push(10.0, "now is fine")
    with pytest.raises(ValueError, match=r"time_s=9.5 is before now_s=10.0"):
        q.push(9.5, "too late")
    with pytest.raises(ValueError, match="priority must be an integer"):
        q.push(11.0, "x", priority=0.5)


def test_deterministic_across_runs():
    def run():
        q = EventQueue()
        tokens = [q.push(float(i % 7), i, priority=i % 3) for i in range(200)]
        for t in tokens[::5]:
            q.cancel(t)
        order = []
        while q:
            e = q.pop()
            order.append(e.payload)
            if e.payload >= 0 and e.payload % 11 == 0:
                q.push(e.time_s + 0.5, -1 - e.payload)  # follow-ups are negative: no chain
        return order

    first = run()
    assert first == run()
    assert len(first) == 160 + sum(1 for i in range(200) if i % 5 and i % 11 == 0)
    assert 0 not in first and 5 not in first  # their tokens were cancelled
