"""``emulator run --wan-events``: put WAN events in force on the live network at their times.

Events are on the trace's clock, like arrivals, and are compressed and
dilated like them: an event at ``t`` s is due ``t / time_scale x K`` wall
seconds after the replay started. A thread of its own sleeps until each due
time and applies the events due together through
:class:`~emulator.net.live.LiveNetwork` (so a planner call of seconds in the
replay's main thread does not delay them); the main thread picks up what was
applied (:meth:`WanPlayer.take`) and re-plans on the new network.

Each applied batch is recorded for ``result.json``'s ``wan_events``: ``time_s``
(when it was due) and ``applied_s`` (when it was in force on the wire), both
wall seconds since the network came up, as issue 19 asks; and
``in_force_t``, the latter on the replay's real-equivalent clock (wall / K
since the replay started), which the per-job split before / after uses.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from emulator.net.live import LiveNetwork
from spiderflow.wan import WanEvent


@dataclass(frozen=True, kw_only=True)
class Applied:
    index: int
    events: tuple[WanEvent, ...]
    due_wall_s: float  # since the network came up
    applied_wall_s: float
    in_force_t: float  # the replay's clock (real-equivalent s since it started)
    topology: object  # the routing topology from then on (spiderflow Topology)
    down: frozenset

    def as_json(self) -> dict:
        return {"time_s": round(self.due_wall_s, 4), "applied_s": round(self.applied_wall_s, 4),
                "late_ms": round((self.applied_wall_s - self.due_wall_s) * 1e3, 2),
                "trace_time_s": self.events[0].time_s,
                "events": [{"link": f"{e.a}-{e.b}", "bandwidth_gbps": e.bandwidth_gbps,
                            "latency_ms": e.latency_ms, "up": e.up} for e in self.events]}


class WanPlayer:
    def __init__(self, live: LiveNetwork, events: Sequence[WanEvent], *, time_scale: float, dilation: float,
                 log: Callable[[str], None] = lambda _m: None) -> None:
        self.live, self.k, self.time_scale, self.log = live, dilation, time_scale, log
        self.batches = [tuple(g) for _t, g in itertools.groupby(events, key=lambda e: e.time_s)]
        self.applied: list[Applied] = []
        self.error: BaseException | None = None
        self._queue: queue.Queue[Applied] = queue.Queue()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0

    def start(self, t0: float) -> None:
        """Play from ``t0`` (the replay's start, monotonic)."""
        self._t0 = t0
        self._thread = threading.Thread(target=self._play, name="wan-events", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def take(self) -> list[Applied]:
        """What was applied since the last call (the main thread re-plans on it); re-raises an error."""
        if self.error is not None:
            raise self.error
        out = []
        while True:
            try:
                out.append(self._queue.get_nowait())
            except queue.Empty:
                return out

    def _play(self) -> None:
        up_at = self.live.emu.up_at
        try:
            for i, batch in enumerate(self.batches):
                due = self._t0 + batch[0].time_s / self.time_scale * self.k
                if self._stop.wait(max(0.0, due - time.monotonic())):
                    return
                at = self.live.apply(batch)
                rec = Applied(index=i, events=batch, due_wall_s=due - up_at, applied_wall_s=at - up_at,
                              in_force_t=(at - self._t0) / self.k,
                              topology=self.live.routing_topology(), down=self.live.down)
                self.applied.append(rec)
                self._queue.put(rec)
                what = "; ".join(_describe(e) for e in batch)
                self.log(f"WAN: {what} (trace {batch[0].time_s:g} s; in force {(at - due) * 1e3:.0f} ms after due)")
        except BaseException as exc:  # the main thread raises it (take)
            self.error = exc


def _describe(e: WanEvent) -> str:
    if not e.up:
        return f"{e.a}-{e.b} down"
    parts = [f"{e.bandwidth_gbps:g} Gbit/s" if e.bandwidth_gbps is not None else "",
             f"{e.latency_ms:g} ms" if e.latency_ms is not None else ""]
    figures = ", ".join(p for p in parts if p)
    return f"{e.a}-{e.b} up" + (f" {figures}" if figures else "")
