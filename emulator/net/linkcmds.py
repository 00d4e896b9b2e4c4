"""Command lines that configure one namespace, as argument lists. Pure.

Each function returns ``list[list[str]]`` to be run, in order, inside the
named node by :class:`emulator.net.executor.Executor` (which checks every exit
code). Nothing here is ever joined into a shell string.

Shaping (per direction, on the egress of the interface that sends):

- rate: ``htb`` root ``1:`` with one class ``1:1`` at the wire rate, an
  explicit ``quantum`` (so htb prints no quantum warnings) and a small burst
  (:func:`htb_burst_bytes`); htb takes 64-bit rates, so no 1 Gbit/s cap
  applies. htb sends a packet whenever its bucket is not empty and charges
  it afterwards, so on an idle link the burst *and* the next packet leave at
  once: a transfer starting on an idle link gains (burst + one packet) / rate
  over ``latency + bytes / bandwidth``. Hosts therefore cap their GSO packets
  at :data:`HOST_GSO_MAX_BYTES` (:func:`host_commands`) and the burst is a
  tenth of a millisecond at the rate: with 64 KiB packets and a 64 KiB burst,
  intra-cluster pipelines ran 5% and thin WAN pipelines 6-8% faster than
  predicted (docs/emulator-run.md).
- queue: the class's leaf is a ``bfifo`` sized to ``Shape.queue_bytes`` (a
  bandwidth-delay product: a drop-tail router buffer, not an unbounded one).
- delay: with ``netem`` the leaf is ``netem delay D [J distribution normal]
  [loss L%]`` instead (rate, then delay, as Mininet's TCIntf does); without
  it, :func:`nfqueue_commands` sends the router's forwarded WAN egress to a
  queue that :mod:`emulator.net.delayd` holds for the delay.
"""

from __future__ import annotations

from emulator.net.layout import LAN_BRIDGE, ClusterPlan, HostPlan, NetPlan, RouterPlan, Route, Shape, WanPort

MTU_PACKET = 1514
# Hosts' GSO packet cap (``ip link set eth0 gso_max_size``, 64 KiB by default). Smaller means
# less head start per transfer on an idle htb class (see the module docstring) but more packets
# per second through the veths, bridges and qdiscs of a 2-core machine: at 3000 bytes
# intra-cluster pipelines ran 17% slower than predicted, at 16 KiB within 1.5%.
HOST_GSO_MAX_BYTES = 16384
HTB_BURST_S = 1e-4  # htb burst: this long at the rate (at least two full-size packets)


def fmt(value: float) -> str:
    """A number as tc/ip want it: no exponent, no trailing zeros."""
    text = f"{value:.6f}".rstrip("0").rstrip(".")
    return text or "0"


def sysctl_command(values: dict[str, str]) -> list[str]:
    return ["sysctl", "-q", "-w", *(f"{key}={value}" for key, value in values.items())]


def local_resolver_commands(resolv_conf: str) -> list[list[str]]:
    """Inside one host's own mount namespace: ``/etc/resolv.conf`` -> a file naming only 127.0.0.1.

    torch's TCPStore looks up each connecting peer's hostname; in a host namespace that DNS query
    goes to the gateway, which answers "unreachable" about once a second per host, so most lookups
    wait out glibc's 5 s timeout and a job's start-up with them. With no server on 127.0.0.1 the
    lookup fails at once. The namespace is made private first, so the bind mount can never
    propagate to the machine's own /etc/resolv.conf."""
    return [["mount", "--make-rprivate", "/"], ["mount", "--bind", resolv_conf, "/etc/resolv.conf"]]


def namespace_sysctls(tcp_max_bytes: int, *, router: bool) -> dict[str, str]:
    """Per-namespace settings: TCP autotuning room for the largest BDP, no IPv6 chatter.

    ``net.core.rmem_max``/``wmem_max`` are left alone: they only cap explicit
    SO_RCVBUF/SO_SNDBUF requests, they are global on most kernels (read-only
    in a child namespace), and autotuning is bounded by tcp_rmem/tcp_wmem.
    ``tcp_no_metrics_save`` stops one measurement's ssthresh from shaping the
    next one's slow start.
    """
    values = {
        "net.ipv6.conf.all.disable_ipv6": "1",
        "net.ipv6.conf.default.disable_ipv6": "1",
        "net.ipv4.tcp_rmem": f"4096 131072 {tcp_max_bytes}",
        "net.ipv4.tcp_wmem": f"4096 16384 {tcp_max_bytes}",
        "net.ipv4.tcp_no_metrics_save": "1",
    }
    if router:
        values.update({
            "net.ipv4.ip_forward": "1",
            "net.ipv4.conf.all.rp_filter": "0",  # routes may be asymmetric (path(a,b) != path(b,a))
            "net.ipv4.conf.default.rp_filter": "0",
        })
    return values


def host_commands(host: HostPlan) -> list[list[str]]:
    return [
        ["ip", "link", "set", "dev", host.intf, "gso_max_size", str(HOST_GSO_MAX_BYTES)],
        ["ip", "link", "set", "lo", "up"],
        ["ip", "addr", "add", f"{host.ip}/{host.prefix_len}", "dev", host.intf],
        ["ip", "link", "set", host.intf, "up"],
        ["ip", "route", "add", "default", "via", host.gateway, "dev", host.intf],
    ]


def route_command(route: Route, verb: str = "add") -> list[str]:
    cmd = ["ip", "route", verb, route.dst, "via", route.via, "dev", route.dev]
    if route.table is not None:
        cmd += ["table", str(route.table)]
    return cmd


def router_commands(cluster: ClusterPlan) -> list[list[str]]:
    """Bridge the hosts' ports, address the LAN and WAN interfaces, install routes."""
    r: RouterPlan = cluster.router
    cmds = [["ip", "link", "set", "lo", "up"],
            ["ip", "link", "add", LAN_BRIDGE, "type", "bridge", "stp_state", "0"]]
    for host in cluster.hosts:
        cmds.append(["ip", "link", "set", host.port, "master", LAN_BRIDGE])
        cmds.append(["ip", "link", "set", host.port, "up"])
    cmds.append(["ip", "addr", "add", f"{r.lan_ip}/{r.prefix_len}", "dev", LAN_BRIDGE])
    cmds.append(["ip", "link", "set", LAN_BRIDGE, "up"])
    for port in r.wan:
        cmds.append(["ip", "addr", "add", f"{port.ip}/{port.prefix_len}", "dev", port.dev])
        cmds.append(["ip", "link", "set", port.dev, "up"])
    tables: dict[int, str] = {}
    for route in r.routes:
        cmds.append(route_command(route))
        if route.table is not None:
            tables[route.table] = route.src
    for table, src in sorted(tables.items()):
        cmds.append(["ip", "rule", "add", "from", src, "table", str(table), "priority", str(table)])
    return cmds


def htb_burst_bytes(wire_mbps: float) -> int:
    """``HTB_BURST_S`` at the rate, or two full-size packets, whichever is larger."""
    return max(2 * MTU_PACKET, int(wire_mbps * 1e6 / 8 * HTB_BURST_S))


def htb_quantum_bytes(wire_mbps: float) -> int:
    """Explicit quantum: htb warns only about quanta it derives from r2q itself."""
    return min(200_000, max(MTU_PACKET, int(wire_mbps * 1e6 / 8 / 1000)))


def netem_limit_packets(shape: Shape) -> int:
    """Packets netem must hold: those in flight for the delay plus the buffer."""
    in_flight = shape.wire_mbps * 1e6 / 8 * (shape.delay_ms + 4 * shape.jitter_ms) / 1e3
    return int(1.5 * (in_flight + shape.queue_bytes) / MTU_PACKET) + 1000


def htb_class_command(dev: str, shape: Shape, verb: str) -> list[str]:
    """``tc class add|change`` of the link's one htb class at the shape's wire rate."""
    bps = int(round(shape.wire_mbps * 1e6))
    burst = str(htb_burst_bytes(shape.wire_mbps))
    return ["tc", "class", verb, "dev", dev, "parent", "1:", "classid", "1:1", "htb",
            "rate", f"{bps}bit", "ceil", f"{bps}bit", "burst", burst, "cburst", burst,
            "quantum", str(htb_quantum_bytes(shape.wire_mbps))]


def tc_commands(dev: str, shape: Shape, *, netem: bool) -> list[list[str]]:
    """Shape ``dev``'s egress to ``shape`` (rate; and delay/jitter/loss if ``netem``)."""
    cmds = [
        ["tc", "qdisc", "replace", "dev", dev, "root", "handle", "1:", "htb", "default", "1"],
        htb_class_command(dev, shape, "add"),
    ]
    leaf = ["tc", "qdisc", "add", "dev", dev, "parent", "1:1", "handle", "10:"]
    cmds.append(leaf + leaf_qdisc(shape, netem=netem))
    return cmds


def delays(shape: Shape) -> bool:
    """Whether the link delays, jitters or loses packets (with netem: a netem leaf, else a bfifo)."""
    return shape.delay_ms > 0 or shape.jitter_ms > 0 or shape.loss_pct > 0


def leaf_qdisc(shape: Shape, *, netem: bool) -> list[str]:
    """The htb class's leaf: ``netem`` (delay, jitter, loss, limit) or a ``bfifo`` router buffer."""
    if not (netem and delays(shape)):
        return ["bfifo", "limit", str(shape.queue_bytes)]
    leaf = ["netem", "delay", f"{fmt(shape.delay_ms)}ms"]
    if shape.jitter_ms > 0:
        leaf += [f"{fmt(shape.jitter_ms)}ms", "distribution", "normal"]
    if shape.loss_pct > 0:
        leaf += ["loss", f"{fmt(shape.loss_pct)}%"]
    return leaf + ["limit", str(netem_limit_packets(shape))]


def host_tc_commands(host: HostPlan, intra: Shape) -> list[list[str]]:
    """A host's own egress: the intra-cluster rate, no delay (delay at the sender stalls TCP)."""
    return tc_commands(host.intf, Shape(goodput_mbps=intra.goodput_mbps, delay_ms=0.0,
                                        queue_bytes=intra.queue_bytes), netem=False)


def router_tc_commands(cluster: ClusterPlan, *, netem: bool) -> list[list[str]]:
    """Each bridge port (towards a host) at the intra rate and delay; each WAN port at its link."""
    cmds: list[list[str]] = []
    for host in cluster.hosts:
        cmds += tc_commands(host.port, cluster.intra, netem=netem)
    for port in cluster.router.wan:
        cmds += tc_commands(port.dev, port.shape, netem=netem)
    return cmds


def nfqueue_commands(ports: tuple[WanPort, ...]) -> list[list[str]]:
    """Send each WAN port's forwarded egress to its queue (no --queue-bypass:
    if the delay daemon is gone the link stops, rather than silently losing its delay)."""
    return [["iptables", "-w", "-A", "FORWARD", "-o", port.dev, "-j", "NFQUEUE",
             "--queue-num", str(port.queue)] for port in ports]


def pin_commands(dst_ip: str, port: WanPort, verb: str = "replace") -> list[list[str]]:
    """Route one host address over one WAN port (``emulator check`` measures links this way)."""
    return [["ip", "route", verb, f"{dst_ip}/32", "via", port.peer_ip, "dev", port.dev]]


def netem_probe_commands() -> list[list[str]]:
    """Run in a scratch namespace: succeeds only where the kernel has sch_netem."""
    return [["ip", "link", "add", "sfprobe0", "type", "veth", "peer", "name", "sfprobe1"],
            ["tc", "qdisc", "add", "dev", "sfprobe0", "root", "netem", "delay", "1ms"]]


def plan_commands(plan: NetPlan, *, netem: bool) -> dict[str, list[list[str]]]:
    """Every node's configuration, keyed by node name (for review: ``--dry-run``-style dumps)."""
    out: dict[str, list[list[str]]] = {}
    for cluster in plan.clusters:
        for host in cluster.hosts:
            out[host.name] = ([sysctl_command(namespace_sysctls(cluster.tcp_max_bytes, router=False))]
                              + host_commands(host) + host_tc_commands(host, cluster.intra))
        r = cluster.router
        cmds = [sysctl_command(namespace_sysctls(cluster.tcp_max_bytes, router=True))]
        cmds += router_commands(cluster) + router_tc_commands(cluster, netem=netem)
        if not netem:
            cmds += nfqueue_commands(r.wan)
        out[r.name] = cmds
    return out

