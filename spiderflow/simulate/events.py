"""A small deterministic event queue (after SimPy's ``Environment``, simpy/core.py).

A heap of ``(time_s, priority, seq, payload)``: earlier times first, then lower
``priority`` values, then insertion order (``seq`` from ``itertools.count``),
so a run is reproducible and payloads are never compared. ``push`` returns a
token; ``cancel(token)`` removes the event lazily (it stays in the heap until
it surfaces and is then dropped). ``now_s`` is the time of the last popped
event; pushing an event before it is an error, as is a negative, NaN or
infinite time.
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class Event(Generic[T]):
    time_s: float
    priority: int
    token: int  # the seq number push returned; unique, increasing
    payload: T


class EventQueue(Generic[T]):
    """Events in (time, priority, insertion) order, with cancellation by token."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, int, T]] = []
        self._pending: set[int] = set()
        self._seq = itertools.count()
        self.now_s = 0.0

    def push(self, time_s: float, payload: T, priority: int = 0) -> int:
        """Schedule ``payload`` at ``time_s``; returns the token that cancels it."""
        if isinstance(time_s, bool) or not isinstance(time_s, (int, float)) or not math.isfinite(time_s):
            raise ValueError(f"time_s must be a finite number (got {time_s!r})")
        if time_s < 0:
            raise ValueError(f"time_s must be >= 0 (got {time_s!r})")
        if time_s < self.now_s:
            raise ValueError(f"time_s={time_s!r} is before now_s={self.now_s!r}; events cannot be "
                             "scheduled in the past")
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise ValueError(f"priority must be an integer (got {priority!r})")
        token = next(self._seq)
        heapq.heappush(self._heap, (float(time_s), priority, token, payload))
        self._pending.add(token)
        return token

    def cancel(self, token: int) -> bool:
        """Forget a pending event; False if it already ran, was cancelled, or never existed."""
        if token in self._pending:
            self._pending.remove(token)
            return True
        return False

    def _drop_cancelled(self) -> None:
        heap = self._heap
        while heap and heap[0][2] not in self._pending:
            heapq.heappop(heap)

    def pop(self) -> Event[T]:
        """The next event; advances ``now_s`` to its time. IndexError when none is pending."""
        self._drop_cancelled()
        if not self._heap:
            raise IndexError("pop from an empty event queue")
        time_s, priority, token, payload = heapq.heappop(self._heap)
        self._pending.remove(token)
        self.now_s = time_s
        return Event(time_s=time_s, priority=priority, token=token, payload=payload)

    def peek_time(self) -> float | None:
        """Time of the next pending event, or None."""
        self._drop_cancelled()
        return self._heap[0][0] if self._heap else None

    def __len__(self) -> int:
        return len(self._pending)

    def __bool__(self) -> bool:
        return bool(self._pending)
