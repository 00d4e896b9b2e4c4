"""CPU time the hypervisor took from this virtual machine (``steal`` in /proc/stat).

On a shared host a virtual CPU is now and then not run for tens of
milliseconds while it has work. Everything emulated on it stops at once --
senders, receivers, the delay stage -- while the clocks that pace the
shapers run on, so a link measured then carries less than it is shaped to,
and packets leave the delay stage late. The measurements take the share
stolen while they ran (:class:`StealMeter`), to tell such a reading from a
badly shaped link, say so, and measure again.
"""

from __future__ import annotations

import bisect
import os
import time
from collections.abc import Callable

PROC_STAT = "/proc/stat"
STOLEN_SHARE = 0.02  # stolen this share of the CPU or more, a measurement may read low: say so (and measure again)
USER_HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def steal_s(path: str = PROC_STAT) -> float | None:
    """Seconds of CPU time stolen from all of this machine's CPUs since boot (None: not told)."""
    try:
        with open(path) as fh:
            fields = fh.readline().split()
        return int(fields[8]) / USER_HZ if fields and fields[0] == "cpu" else None
    except (OSError, ValueError, IndexError):
        return None


def noticeable(pct: float) -> bool:
    """Whether ``pct`` percent stolen is worth saying (:data:`STOLEN_SHARE` or more)."""
    return pct >= 100 * STOLEN_SHARE


def stolen_sentence(amount: str, during: str) -> str:
    """The start of every report's line about steal; the caller says what it did to its figures."""
    return (f"the host (hypervisor) stole {amount} of this machine's CPU {during} (/proc/stat steal): "
            "every emulated process stops meanwhile")


class StealLog:
    """Samples of the stolen time, to ask afterwards how much was stolen over any window (a job's
    measured iterations). :meth:`sample` costs one read of /proc/stat; steal counts in 10 ms ticks,
    so a window of a second on 2 CPUs reads to about half a percent."""

    def __init__(self, *, path: str = PROC_STAT, cpus: int | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path, self.clock = path, clock
        self.cpus = cpus or os.cpu_count() or 1
        self.times: list[float] = []
        self.stolen: list[float] = []

    def sample(self) -> None:
        s = steal_s(self.path)
        if s is not None:
            self.times.append(self.clock())
            self.stolen.append(s)

    def share(self, t0: float, t1: float) -> float | None:
        """The share stolen from the last sample at or before ``t0`` to the first at or after ``t1``
        (a window a little wider than asked); None where the samples do not cover it."""
        i = bisect.bisect_right(self.times, t0) - 1
        j = bisect.bisect_left(self.times, t1)
        if i < 0 or j >= len(self.times) or self.times[j] <= self.times[i]:
            return None
        return max(0.0, (self.stolen[j] - self.stolen[i]) / ((self.times[j] - self.times[i]) * self.cpus))


class StealMeter:
    """The share of the machine's CPU time stolen since it was made (0.0 where nothing tells):
    a :class:`StealLog` sampled when made and when asked."""

    def __init__(self, *, path: str = PROC_STAT, cpus: int | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.log = StealLog(path=path, cpus=cpus, clock=clock)
        self.log.sample()

    def share(self) -> float:
        self.log.sample()
        times = self.log.times
        return (self.log.share(times[0], times[-1]) if len(times) > 1 else None) or 0.0
