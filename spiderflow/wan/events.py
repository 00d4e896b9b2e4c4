"""WAN events: a link's bandwidth and latency over time, and its outages.

CSV, header exactly ``time_s,link,bandwidth_gbps,latency_ms,up`` (any column order)::

    # lines starting with '#' and blank lines are skipped
    time_s,link,bandwidth_gbps,latency_ms,up
    3600,oregon-virginia,0.40,,1        # halve the link's bandwidth at 1 h, latency unchanged
    7200,virginia-oregon,,,0            # the same link goes down at 2 h
    9000,oregon-virginia,0.79,33.5,1    # and comes back with its figures at 2.5 h

- ``time_s``: seconds on the trace's clock (the one job arrivals use), >= 0; rows sorted by it
  (equal times apply in file order; a row earlier than the one above is refused).
- ``link``: ``a-b``, a link of the topology written in either order. Cluster names are
  ``[a-z][a-z0-9]{0,7}`` (spiderflow.topology.load), so the one ``-`` splits it unambiguously.
- ``bandwidth_gbps`` (>= 1e-6, 1 kbit/s, as in topology files), ``latency_ms`` (one-way, >= 0):
  the link's new figures from ``time_s`` on; an **empty cell means unchanged** (the last value
  set, else the topology's).
- ``up``: 1 (carries traffic) or 0 (down: no route may use it until a row sets it up again).

Every bad value is one ConfigError line, ``FILE: row N: field must be ... (got X); fix``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from spiderflow.errors import ConfigError
from spiderflow.topology import Topology
from spiderflow.topology.load import MAX_BANDWIDTH_GBPS, MAX_LATENCY_MS, MIN_BANDWIDTH_GBPS
from spiderflow.traces.common import shown
from spiderflow.wan.rows import csv_text, fail, number, rows, timed

COLUMNS = ("time_s", "link", "bandwidth_gbps", "latency_ms", "up")


@dataclass(frozen=True, kw_only=True)
class WanEvent:
    """From ``time_s`` on, link ``a``-``b`` (the topology's orientation) has these figures; None
    means unchanged. ``up`` False: the link is down."""

    time_s: float
    a: str
    b: str
    bandwidth_gbps: float | None
    latency_ms: float | None
    up: bool

    @property
    def key(self) -> tuple[str, str]:
        return (self.a, self.b) if self.a < self.b else (self.b, self.a)


def resolve_link(text: str, topology: Topology) -> tuple[str, str] | str:
    """``a-b`` -> the topology link's ``(a, b)``; or the reason it names none."""
    parts = text.split("-")
    if len(parts) != 2 or not all(parts):
        return f"must be two cluster names joined by '-', e.g. {_example(topology)} (got {shown(text)})"
    a, b = parts
    for end in (a, b):
        if end not in topology.names:
            return (f"names no cluster of {topology.name}: {shown(end)} (got {shown(text)}); "
                    f"known: {', '.join(topology.names)}")
    link = topology.link(a, b)
    if link is None:
        return f"is not a link of {topology.name} (got {shown(text)}); its links: {_links(topology)}"
    return link.a, link.b


def _example(topology: Topology) -> str:
    return f"{topology.links[0].a}-{topology.links[0].b}" if topology.links else "a-b"


def _links(topology: Topology, limit: int = 12) -> str:
    names = [f"{link.a}-{link.b}" for link in topology.links]
    return ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")


def load_wan_events(path: str | Path, topology: Topology) -> tuple[WanEvent, ...]:
    """Read and check a WAN events file against ``topology`` (module docstring)."""
    source, records = rows(path, what="WAN events file", columns=COLUMNS)
    events: list[WanEvent] = []
    for line, row, time_s in timed(source, records):
        link = resolve_link(row["link"], topology)
        if isinstance(link, str):
            raise fail(source, line, "link", link)
        bandwidth = number(source, line, row, "bandwidth_gbps", low=MIN_BANDWIDTH_GBPS, high=MAX_BANDWIDTH_GBPS,
                           optional=True, fix="give Gbit/s, or leave it empty; a link that carries nothing "
                                              "is down: up=0")
        latency = number(source, line, row, "latency_ms", high=MAX_LATENCY_MS, optional=True,
                         fix="give one-way milliseconds, or leave it empty")
        if row["up"] not in ("0", "1"):
            raise fail(source, line, "up", f"must be 1 (up) or 0 (down) (got {shown(row['up'])}); write 1 or 0")
        events.append(WanEvent(time_s=time_s, a=link[0], b=link[1], bandwidth_gbps=bandwidth,
                               latency_ms=latency, up=row["up"] == "1"))
    if not events:
        raise ConfigError(f"{source}: has a header but no rows; add at least one event under it")
    return tuple(events)


def format_wan_events(events: list[WanEvent], *, comment: str = "") -> str:
    """The CSV text of ``events`` (``comment`` lines first, each behind ``# ``)."""
    return csv_text(COLUMNS, ([repr(float(ev.time_s)), f"{ev.a}-{ev.b}",
                               "" if ev.bandwidth_gbps is None else repr(ev.bandwidth_gbps),
                               "" if ev.latency_ms is None else repr(ev.latency_ms), "1" if ev.up else "0"]
                              for ev in events), comment=comment)

