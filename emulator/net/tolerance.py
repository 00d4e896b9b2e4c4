"""The one tolerance rule for measured links (issue 5), shared by ``emulator
check`` and the tests: bandwidth within +-10 % of the configured (scaled)
goodput, one-way delay within +-2 ms of the configured latency."""

from __future__ import annotations

BANDWIDTH_REL = 0.10
DELAY_ABS_MS = 2.0


def bandwidth_ok(configured_mbps: float, measured_mbps: float, *, rel: float = BANDWIDTH_REL) -> bool:
    return abs(measured_mbps - configured_mbps) <= rel * configured_mbps


def delay_ok(configured_ms: float, measured_ms: float, *, abs_ms: float = DELAY_ABS_MS) -> bool:
    return abs(measured_ms - configured_ms) <= abs_ms


def problems(configured_mbps: float, measured_mbps: float, configured_ms: float,
             measured_ms: float) -> list[str]:
    """Human-readable reasons a measurement is out of tolerance (empty when it is fine)."""
    out = []
    if not bandwidth_ok(configured_mbps, measured_mbps):
        out.append(f"bandwidth {measured_mbps:.1f} Mbit/s is not within {BANDWIDTH_REL:.0%} "
                   f"of {configured_mbps:.1f}")
    if not delay_ok(configured_ms, measured_ms):
        out.append(f"delay {measured_ms:.2f} ms is not within {DELAY_ABS_MS:g} ms of {configured_ms:.2f}")
    return out
