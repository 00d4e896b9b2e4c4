"""``wan generate``: a reproducible WAN events file with a diurnal bandwidth pattern and random outages.

**Diurnal pattern.** Inter-region links carry other tenants' traffic, which peaks in the evening
and ebbs at night (the daily cycle of Internet traffic that ISP and IXP measurements show, e.g.
Feldmann et al., IMC 2020). A link keeps the fraction

    f(t) = 1 - A * (1 + cos(2 pi (h(t) - BUSY_HOUR_LOCAL) / 24)) / 2

of its topology bandwidth, where ``A`` is ``--diurnal-amplitude`` and ``h(t)`` the link's local hour:
the trace starts at ``--start-hour-utc`` (default midnight UTC) and a link's local time is the mean
of its two clusters' UTC offsets when both are in :data:`UTC_OFFSET_H` (the region names our
topologies use); otherwise the link gets a random offset from the seed. So bandwidth is the
topology's figure in the small hours and ``1 - A`` of it at 20:00 local. Latency is left unchanged.

**Outages.** ``--outages N`` links (drawn uniformly, or ``--outage-link`` each time) go down for
``--outage-s`` seconds at a start drawn uniformly over the horizon; overlapping outages of one link
merge. Every row states the link's full state at its time (bandwidth and up), so rows can be read
alone. The same topology, seed and options give the same file.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from spiderflow.topology import Topology
from spiderflow.wan.events import WanEvent

BUSY_HOUR_LOCAL = 20.0  # the evening peak of Internet traffic (module docstring)
# rows a generated file may have: a day of 1 s steps on 11 links (about 6 s to write); 1e-300 s steps hung
MAX_GENERATED_ROWS = 1_000_000
# UTC offsets (standard time, hours) of the region names the shipped topologies use.
UTC_OFFSET_H = {"oregon": -8.0, "california": -8.0, "virginia": -5.0, "ohio": -5.0, "iowa": -6.0,
                "texas": -6.0, "saopaulo": -3.0, "london": 0.0, "ireland": 0.0, "paris": 1.0,
                "frankfurt": 1.0, "stockholm": 1.0, "mumbai": 5.5, "singapore": 8.0, "hongkong": 8.0,
                "tokyo": 9.0, "seoul": 9.0, "sydney": 10.0}


@dataclass(frozen=True, kw_only=True)
class WanPattern:
    hours: float = 24.0
    step_s: float = 900.0
    diurnal_amplitude: float = 0.3
    outages: int = 0
    outage_s: float = 1800.0
    outage_link: tuple[str, str] | None = None  # a topology link's (a, b); None: drawn
    start_hour_utc: float = 0.0

    def __post_init__(self) -> None:
        if not (self.hours > 0 and self.step_s > 0 and 0 <= self.diurnal_amplitude < 1 and self.outages >= 0
                and self.outage_s > 0 and 0 <= self.start_hour_utc < 24):
            raise ValueError(f"a WAN pattern out of range: {self}")
        if self.outages and self.outage_s >= self.hours * 3600:
            raise ValueError(f"outage_s={self.outage_s:g} must be shorter than the horizon ({self.hours:g} h); "
                             "shorten --outage-s or lengthen --hours")


def link_offset_h(a: str, b: str, rng: random.Random) -> float:
    """The link's local time offset from UTC (module docstring); ``rng`` is drawn from once either way."""
    drawn = rng.uniform(-12.0, 12.0)
    if a not in UTC_OFFSET_H or b not in UTC_OFFSET_H:
        return drawn
    x, y = UTC_OFFSET_H[a], UTC_OFFSET_H[b]
    if abs(x - y) > 12:  # the short way round the clock
        y += 24 if y < x else -24
    return (x + y) / 2


def fraction(t_s: float, offset_h: float, pattern: WanPattern) -> float:
    hour = (t_s / 3600 + pattern.start_hour_utc + offset_h) % 24
    return 1 - pattern.diurnal_amplitude * (1 + math.cos(2 * math.pi * (hour - BUSY_HOUR_LOCAL) / 24)) / 2


def merged_spans(spans: list[tuple[float, float]], lead: float = 0.0) -> list[tuple[float, float]]:
    """``(start, end)`` spans sorted and merged: a span whose start, less ``lead``, is not after the end
    of the one before joins it (outages of a link; a cluster's spot withdrawals, ``lead`` their notice)."""
    out: list[list[float]] = []
    for s, e in sorted(spans):
        if out and s - lead <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def generate_wan_events(topology: Topology, seed: int, pattern: WanPattern = WanPattern()) -> list[WanEvent]:
    """The events (module docstring), sorted by time, then by the topology's link order."""
    if not topology.links:
        raise ValueError(f"{topology.name} has no WAN links to generate events for; give a topology with links")
    horizon = pattern.hours * 3600
    n_steps = math.ceil(min(horizon / pattern.step_s, 1e18))  # clamped: a denormal step's count is infinite
    if n_steps * len(topology.links) + 2 * pattern.outages > MAX_GENERATED_ROWS:
        raise ValueError(f"a row every {pattern.step_s:g} s for {pattern.hours:g} h on {len(topology.links)} links is "
                         f"over {MAX_GENERATED_ROWS:,} rows; raise --step-s or shorten --hours")
    rng = random.Random(seed)
    offsets = {l.key: link_offset_h(l.a, l.b, rng) for l in topology.links}
    spans: dict[tuple[str, str], list[tuple[float, float]]] = {l.key: [] for l in topology.links}
    for _ in range(pattern.outages):
        link = topology.link(*pattern.outage_link) if pattern.outage_link else rng.choice(topology.links)
        start = round(rng.uniform(0.0, horizon - pattern.outage_s), 3)
        spans[link.key].append((start, start + pattern.outage_s))
    steps = [k * pattern.step_s for k in range(n_steps)]
    rows = []
    for order, link in enumerate(topology.links):
        down = merged_spans(spans[link.key])
        times = sorted(set(steps) | {t for span in down for t in span})
        for t in times:
            up = not any(s <= t < e for s, e in down)
            bw = float(f"{link.bandwidth_gbps * fraction(t, offsets[link.key], pattern):.6g}")
            rows.append((t, order, WanEvent(time_s=t, a=link.a, b=link.b, bandwidth_gbps=bw,
                                            latency_ms=None, up=up)))
    rows.sort(key=lambda r: (r[0], r[1]))
    return [ev for _, _, ev in rows]
