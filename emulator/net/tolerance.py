"""The one tolerance rule for measured links (issue 5), shared by ``emulator
check`` and the tests: bandwidth within +-10 % of the configured (scaled)
goodput, one-way delay within +-2 ms of the configured latency.

A reading taken while the host (hypervisor) stole a noticeable share of this
machine's CPU (:mod:`emulator.net.hoststeal`) can be out of tolerance on a
link shaped right: a stolen virtual CPU stops the senders, the receivers and
the delay stage while the clocks run on, so it reads a rate low and a delay
high, never the other way. Such a reading is **no verdict** when it errs
that way by a bounded amount: a rate from half the configured rate up to the
tolerance, a delay over the tolerance by at most as much again. Out of
tolerance the other way, or further, is the link's fault whatever the host
did. (12-33 % stolen for minutes read shaped flows at 0.82-0.95 of their
rate, and a calibration fitted 12.39 ms to a 10 ms link while 19.4 % was
stolen: benchmarks/results/delay_stalls.md.)
"""

from __future__ import annotations

from dataclasses import dataclass

from emulator.net.hoststeal import noticeable

BANDWIDTH_REL = 0.10
DELAY_ABS_MS = 2.0
STOLEN_RATE_FLOOR = 0.5  # under steal, a rate under this share of the configured one still fails

OK, NO_VERDICT, FAIL = "ok", "no verdict", "fail"  # a reading's verdict, from best to worst


def bandwidth_ok(configured_mbps: float, measured_mbps: float, *, rel: float = BANDWIDTH_REL) -> bool:
    return abs(measured_mbps - configured_mbps) <= rel * configured_mbps


def delay_ok(configured_ms: float, measured_ms: float, *, abs_ms: float = DELAY_ABS_MS) -> bool:
    return abs(measured_ms - configured_ms) <= abs_ms


def rate_verdict(configured_mbps: float, measured_mbps: float, steal_pct: float) -> str:
    """OK within the tolerance; NO_VERDICT when low, but at least half the configured rate, while
    ``steal_pct`` percent of the CPU was stolen (noticeable); FAIL otherwise."""
    if bandwidth_ok(configured_mbps, measured_mbps):
        return OK
    if noticeable(steal_pct) and STOLEN_RATE_FLOOR * configured_mbps <= measured_mbps <= configured_mbps:
        return NO_VERDICT
    return FAIL


def delay_verdict(configured_ms: float, measured_ms: float, steal_pct: float) -> str:
    """OK within the tolerance; NO_VERDICT when high by at most twice the tolerance while
    ``steal_pct`` percent of the CPU was stolen (noticeable); FAIL otherwise."""
    if delay_ok(configured_ms, measured_ms):
        return OK
    if noticeable(steal_pct) and configured_ms < measured_ms <= configured_ms + 2 * DELAY_ABS_MS:
        return NO_VERDICT
    return FAIL


@dataclass(frozen=True)
class Assessment:
    """A measured direction's verdicts on its rate and its delay, and why, one phrase per reading out
    of tolerance."""

    rate: str
    delay: str
    reasons: tuple[str, ...] = ()

    @property
    def verdict(self) -> str:
        """The direction's verdict: the worse of its rate's and its delay's."""
        return worst((self.rate, self.delay))


def worst(verdicts) -> str:
    """The worst of ``verdicts`` (OK for none)."""
    order = (OK, NO_VERDICT, FAIL)
    return max(verdicts, key=order.index, default=OK)


def assess(configured_mbps: float, measured_mbps: float, configured_ms: float, measured_ms: float, *,
           rate_steal_pct: float = 0.0, delay_steal_pct: float = 0.0) -> Assessment:
    """The verdict on one measured direction of a link: its rate read while ``rate_steal_pct`` percent
    of the CPU was stolen, its delay while ``delay_steal_pct`` was."""
    rate = rate_verdict(configured_mbps, measured_mbps, rate_steal_pct)
    delay = delay_verdict(configured_ms, measured_ms, delay_steal_pct)
    reasons = []
    if rate != OK:
        reasons.append(f"bandwidth {measured_mbps:.1f} Mbit/s is not within {BANDWIDTH_REL:.0%} of "
                       f"{configured_mbps:.1f}" + (f" (the host stole {rate_steal_pct:.0f}% of the CPU)"
                                                   if rate == NO_VERDICT else ""))
    if delay != OK:
        reasons.append(f"delay {measured_ms:.2f} ms is not within {DELAY_ABS_MS:g} ms of {configured_ms:.2f}"
                       + (f" (the host stole {delay_steal_pct:.0f}% of the CPU)" if delay == NO_VERDICT else ""))
    return Assessment(rate, delay, tuple(reasons))

