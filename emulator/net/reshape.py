"""What to run on a live network when the topology changes under it. Pure.

A WAN event (issue 19: a link's bandwidth or latency moves, a link goes down
or comes back) gives a new :class:`~spiderflow.topology.Topology` with the
same clusters and the same links in the same order, so :func:`build_plan`
gives the same interfaces and addresses, only other shapes and routes.
:func:`plan_changes` diffs the two plans, per router:

- a WAN port whose rate or buffer changed: ``tc class change`` on its htb
  class (rate, ceil, burst, quantum as :func:`tc_commands` sets them) and
  ``tc qdisc change`` on its leaf (the ``bfifo`` limit, or with netem the
  whole ``netem`` line, which also carries the delay);
- a WAN port whose delay, jitter or loss changed, without netem: the delay
  daemon's new :class:`QueueSpec` for that queue (see ``delayd --control``);
- a route whose next hop changed: ``ip route replace``; one that is gone:
  ``ip route del``; a policy table used for the first time: its ``ip rule``;
- a link that went down or came back: ``ip link set DEV down|up`` on both
  ends, first (the routes already avoid a down link: the new topology routes
  round it); the kernel drops a down interface's routes, so one that comes
  back up gets every route the new plan sends over it again.

Packets already queued keep the delay they were given, as on a real path; a
rate change applies to the next packet htb dequeues.
"""

from __future__ import annotations

from dataclasses import dataclass

from emulator.net.delayd import QueueSpec
from emulator.net.layout import NetPlan, Route, RouterPlan, Shape
from emulator.net.linkcmds import delays, htb_class_command, leaf_qdisc, route_command


@dataclass(frozen=True)
class RouterChange:
    """Everything one router needs: commands to run (in order) and its delay daemon's new specs."""

    router: str
    commands: tuple[tuple[str, ...], ...] = ()
    delays: tuple[QueueSpec, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.commands or self.delays)


def _delay_of(shape: Shape) -> tuple[float, float, float]:
    """What the delay stage (netem or the daemon) applies: delay, jitter, loss."""
    return shape.delay_ms, shape.jitter_ms, shape.loss_pct


def shape_change_commands(dev: str, old: Shape, new: Shape, *, netem: bool) -> list[list[str]]:
    """Commands that take ``dev``'s egress from ``old`` to ``new`` (rate and buffer; the delay too
    with netem). Nothing when only the delay changed and the daemon carries it."""
    cmds: list[list[str]] = []
    if new.wire_mbps != old.wire_mbps:
        cmds.append(htb_class_command(dev, new, "change"))
    leaf = ["tc", "qdisc", "change", "dev", dev, "parent", "1:1", "handle", "10:"]
    delayed = _delay_of(old) != _delay_of(new)
    if new.queue_bytes != old.queue_bytes or (netem and (delayed or new.wire_mbps != old.wire_mbps)):
        if netem and delays(old) != delays(new):  # a netem leaf for a bfifo one or back: replace it
            leaf[2] = "replace"
        cmds.append(leaf + leaf_qdisc(new, netem=netem))
    return cmds


def _route_key(route: Route) -> tuple:
    return route.dst, route.src, route.table


def route_change_commands(old: RouterPlan, new: RouterPlan) -> list[list[str]]:
    """Replace changed routes, add new ones (and a new policy table's rule), delete dropped ones."""
    before = {_route_key(r): r for r in old.routes}
    after = {_route_key(r): r for r in new.routes}
    cmds: list[list[str]] = []
    tables_before = {r.table for r in old.routes if r.table is not None}
    for key, route in after.items():
        if before.get(key) != route:
            cmds.append(route_command(route, "replace"))
    for key, route in before.items():
        if key not in after:
            cmds.append(route_command(route, "del"))
    for table, src in sorted({(r.table, r.src) for r in new.routes if r.table is not None}):
        if table not in tables_before:
            cmds.append(["ip", "rule", "add", "from", src, "table", str(table), "priority", str(table)])
    return cmds


def plan_changes(old: NetPlan, new: NetPlan, *, netem: bool,
                 down: frozenset[tuple[str, str]] = frozenset(),
                 was_down: frozenset[tuple[str, str]] = frozenset()) -> list[RouterChange]:
    """Per router, what takes ``old`` to ``new``. ``down`` / ``was_down``: link keys (a, b) down
    after / before the change. Links go down before routes move and come up before routes use them."""
    changes = []
    for c_old, c_new in zip(old.clusters, new.clusters, strict=True):
        if c_old.name != c_new.name:
            raise ValueError(f"clusters differ: {c_old.name} vs {c_new.name} (a change keeps the topology's clusters)")
        r_old, r_new = c_old.router, c_new.router
        first: list[list[str]] = []
        cmds: list[list[str]] = []
        delays: list[QueueSpec] = []
        came_up: set[str] = set()  # devices of links that are up again
        for p_old, p_new in zip(r_old.wan, r_new.wan, strict=True):
            key = tuple(sorted((c_new.name, p_new.peer)))  # Link.key: orientation-free
            if key in down and key not in was_down:
                first.append(["ip", "link", "set", "dev", p_new.dev, "down"])
            elif key in was_down and key not in down:
                first.append(["ip", "link", "set", "dev", p_new.dev, "up"])
                came_up.add(p_new.dev)
            cmds += shape_change_commands(p_new.dev, p_old.shape, p_new.shape, netem=netem)
            if not netem and _delay_of(p_old.shape) != _delay_of(p_new.shape):
                s_new = p_new.shape
                delays.append(QueueSpec(num=p_new.queue, delay_ms=s_new.delay_ms, jitter_ms=s_new.jitter_ms,
                                        loss_pct=s_new.loss_pct))
        routes = route_change_commands(r_old, r_new)
        # the kernel flushed the routes over a link when it went down: one that comes back up
        # gets every route the new plan sends over it, changed or not
        for r in r_new.routes:
            cmd = route_command(r, "replace")
            if r.dev in came_up and cmd not in routes:
                routes.append(cmd)
        cmds = first + cmds + routes
        change = RouterChange(r_new.name, tuple(tuple(c) for c in cmds), tuple(delays))
        if change:
            changes.append(change)
    return changes
