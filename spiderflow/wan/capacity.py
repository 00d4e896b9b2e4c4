"""Capacity events: GPUs of a cluster withdrawn after a notice, and returned later (spot capacity).

CSV, header exactly ``time_s,cluster,gpus,notice_s,return_s`` (any column order)::

    time_s,cluster,gpus,notice_s,return_s
    7200,tokyo,16,120,14400     # at 2 h, 16 of tokyo's GPUs go (notice at 2 h - 120 s); back at 4 h
    9000,seoul,8,0,             # at 2.5 h all 8 of seoul's GPUs go without notice, for good

- ``time_s``: when the GPUs are gone (trace clock, >= 0); rows sorted by it.
- ``cluster``: a cluster of the topology; ``gpus``: 1 up to the cluster's GPUs.
- ``notice_s``: seconds of warning before ``time_s`` (0: none; at most ``time_s``, since the trace
  starts at 0). AWS gives two minutes for a spot interruption ("Spot Instance interruption
  notices", EC2 user guide).
- ``return_s``: when the GPUs come back (after ``time_s``); empty: never.

Withdrawals of one cluster that overlap add up, to at most its GPUs. Every bad value is one
ConfigError line, ``FILE: row N: field must be ... (got X); fix``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from spiderflow.errors import ConfigError
from spiderflow.topology import Topology
from spiderflow.traces.common import RowError, int_field, shown
from spiderflow.wan.rows import csv_text, fail, number, rows, timed

COLUMNS = ("time_s", "cluster", "gpus", "notice_s", "return_s")


@dataclass(frozen=True, kw_only=True)
class CapacityEvent:
    """``gpus`` GPUs of ``cluster`` announced at ``time_s - notice_s``, gone at ``time_s``, back at
    ``return_s`` (None: never)."""

    time_s: float
    cluster: str
    gpus: int
    notice_s: float
    return_s: float | None

    @property
    def notice_at_s(self) -> float:
        return self.time_s - self.notice_s


def load_capacity_events(path: str | Path, topology: Topology) -> tuple[CapacityEvent, ...]:
    """Read and check a capacity events file against ``topology`` (module docstring)."""
    source, records = rows(path, what="capacity events file", columns=COLUMNS)
    events: list[CapacityEvent] = []
    for line, row, time_s in timed(source, records):
        name = row["cluster"]
        if name not in topology.names:
            raise fail(source, line, "cluster", f"names no cluster of {topology.name} (got {shown(name)}); "
                       f"known: {', '.join(topology.names)}")
        total = topology.cluster(name).total_gpus
        try:
            gpus = int_field(row, "gpus", maximum=total)
        except RowError as err:
            raise fail(source, line, "gpus", f"{err.message}; {name} has {total} GPUs") from None
        notice = number(source, line, row, "notice_s", fix="give the seconds of warning before time_s (0: none)")
        if notice > time_s:
            raise fail(source, line, "notice_s", f"must be at most time_s={row['time_s']} (got {shown(row['notice_s'])}); "
                       "the notice cannot come before the trace starts at 0 s")
        back = number(source, line, row, "return_s", optional=True, fix="give a time after time_s, or leave "
                      "it empty (never)")
        if back is not None and back <= time_s:
            raise fail(source, line, "return_s", f"must be after time_s={row['time_s']} (got {shown(row['return_s'])}); "
                       "it is an absolute time on the trace's clock, not a duration")
        events.append(CapacityEvent(time_s=time_s, cluster=name, gpus=gpus, notice_s=notice, return_s=back))
    if not events:
        raise ConfigError(f"{source}: has a header but no rows; add at least one event under it")
    return tuple(events)


def format_capacity_events(events: list[CapacityEvent], *, comment: str = "") -> str:
    """The CSV text of ``events`` (``comment`` lines first, each behind ``# ``), times as written."""
    return csv_text(COLUMNS, ([repr(float(ev.time_s)), ev.cluster, str(ev.gpus), repr(float(ev.notice_s)),
                               "" if ev.return_s is None else repr(float(ev.return_s))] for ev in events),
                    comment=comment)
