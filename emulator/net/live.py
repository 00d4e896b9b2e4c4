"""Change a running emulation's WAN as WAN events say (issue 19), and say when it took effect.

:class:`LiveNetwork` keeps every link's current figures
(:class:`spiderflow.simulate.changes.NetworkState`, the simulator's own), so
a change means: the topology with the new figures; its emulated plan (shapes
from the links' live figures, a link that is down keeping its last ones;
routes as the simulator routes, round a down link wherever another way
exists); the diff against the plan in force (:func:`emulator.net.reshape.plan_changes`),
run router by router; new delays handed to the delay daemons (``delayd
--control``, acknowledged with the moment they took effect). :meth:`apply`
returns that moment: the last command's return or daemon's acknowledgement,
on the machine-wide monotonic clock. A router on another server of a
:class:`emulator.net.multihost.ClusterEmulation` is changed there (:mod:`emulator.net.liveremote`),
its moment put on this machine's clock.

Use it from one thread at a time (a replay's event thread, or ``emulator check``'s step test); it
runs the routers' commands in parallel, each router's as ``tc -batch`` / ``ip -batch`` processes.
"""

from __future__ import annotations

import dataclasses
import itertools
import signal
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from emulator.net.delayd import write_control
from emulator.net.layout import build_plan
from emulator.net.liveremote import apply_remote, start_shells
from emulator.net.reshape import RouterChange, plan_changes
from spiderflow.errors import EmulatorError
from spiderflow.simulate.changes import NetworkState
from spiderflow.topology import Topology
from spiderflow.wan import WanEvent

ACK_TIMEOUT_S = 5.0


class LiveNetwork:
    def __init__(self, emu, topology: Topology | None = None) -> None:
        self.emu = emu
        base = topology or emu.topology
        self.state = NetworkState(base, base)
        self.down: frozenset = frozenset()
        self._seq = itertools.count(1)  # control-file sequence numbers (next() is atomic)
        self.commands = 0  # run so far (tc, ip)
        self._shells: dict = {}  # a shell ready in each router of another server (none on one server)
        start_shells(emu, self._shells)

    def live_topology(self) -> Topology:
        """Every link at its current figures, a down link at its last live ones (what is shaped)."""
        links = tuple(dataclasses.replace(l, bandwidth_gbps=self.state.links[l.key][0],
                                          latency_ms=self.state.links[l.key][1]) for l in self.state.base.links)
        return dataclasses.replace(self.state.base, links=links)

    def routing_topology(self) -> Topology:
        """The planners' topology now: a down link dead (spiderflow.simulate.changes), so routes avoid it."""
        return self.state.topologies()[0]

    def restore(self) -> float:
        """Back to the topology's own figures, every link up (a replay ends: the next one on this
        network, e.g. ``emulator compare``'s next planner, starts from the same network)."""
        self.state = NetworkState(self.state.base, self.state.base)
        return self._to(build_plan(self.state.base, self.emu.config))

    def apply(self, events: Sequence[WanEvent]) -> float:
        """Put ``events`` (due together) in force; the monotonic time they were."""
        for ev in events:
            self.state.apply(ev)
        return self._to(build_plan(self.live_topology(), self.emu.config, routing=self.routing_topology()))

    def _to(self, new) -> float:
        emu = self.emu
        changes = plan_changes(emu.plan, new, netem=emu.mechanism == "netem", down=self.state.down,
                               was_down=self.down)
        # routers in parallel (each its own tc / ip processes; subprocess waits release the GIL)
        with ThreadPoolExecutor(max_workers=max(1, len(changes))) as pool:
            acks = list(pool.map(self._run, changes))
        done = time.monotonic()
        self.commands += sum(len(c.commands) for c in changes)
        emu.plan, self.down = new, self.state.down
        # a router on another server answered with its moment on our clock (liveremote); `done` counts
        # when a router here changed (or nothing did), not the SSH calls' return
        here = [done] if not changes or any(not isinstance(a, float) for a in acks) else []
        return max([*here, *(a if isinstance(a, float) else self._ack(*a) for a in acks if a is not None)])

    def _run(self, change: RouterChange) -> tuple | float | None:
        emu = self.emu
        if emu.is_remote(change.router):
            return apply_remote(emu, change, next(self._seq), self._shells)
        pid = emu.node(change.router).pid
        emu.executor.run_batched(change.router, pid, [list(argv) for argv in change.commands])
        if not change.delays:
            return None
        cluster = next(c.name for c in emu.plan.clusters if c.router.name == change.router)
        daemon = emu.delay_daemons().get(change.router)
        if daemon is None or daemon.poll() is not None:
            raise EmulatorError(f"{change.router}: no delay daemon running to take the new delays")
        seq = next(self._seq)  # routers run in parallel threads: one number each, taken once
        path = emu.delay_control(cluster)
        write_control(str(path), seq, list(change.delays))
        daemon.send_signal(signal.SIGHUP)
        return change.router, path, seq

    @staticmethod
    def _ack(router: str, path, seq: int) -> float:
        ack = path.with_name(path.name + ".ack")
        deadline = time.monotonic() + ACK_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                text = ack.read_text().split()
            except OSError:
                text = []
            if text and text[0] == "error":
                raise EmulatorError(f"{router}: delay daemon refused the new delays: {' '.join(text[1:])}")
            if len(text) == 2 and text[0] == str(seq):
                return float(text[1])
            time.sleep(0.002)
        raise EmulatorError(f"{router}: delay daemon did not take the new delays in {ACK_TIMEOUT_S:g} s")
