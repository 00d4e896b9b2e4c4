"""Topology -> network plan: names, addresses, link shapes, routes. Pure data.

Nothing here touches the system; :mod:`emulator.net.emulation` turns a
:class:`NetPlan` into namespaces, and :mod:`emulator.net.linkcmds` turns its parts
into command lines.

Layout of one cluster ``c`` (index ``i`` in the topology):

- hosts ``c-h0 .. c-h{K-1}``, each with one interface ``eth0`` at
  ``10.{1+i//256}.{i%256}.{10+j}/24`` and a default route via the gateway;
- a gateway router ``c-gw`` whose namespace holds a Linux bridge ``lan``
  (address ``.1``) with one port ``h{j}`` per host, and one interface
  ``w-<peer>`` per WAN link, on a /30 from ``10.0.0.0/16``.

Every name lives inside its own namespace, so none is longer than
``w-`` + 8 characters; nothing of ours appears in the root namespace.

Scale factor (DESIGN.md): wire rates are the topology's bandwidths divided by
``scale``; latencies are not scaled. Time dilation (DESIGN.md; Gupta et al.,
NSDI 2006): every wire rate is further divided by ``dilation`` K and every
delay (and jitter) multiplied by K, so the emulated world runs K times slower
than the real one it stands for; queue and TCP buffer sizes (bandwidth x
delay) stay the same. The topology's bandwidths are TCP goodput
(iperf-style figures), so htb is given the wire rate that carries that goodput:
``x (MTU + 14) / (MTU - 52)`` for the Ethernet header and IPv4 + TCP (with
timestamps) headers. Intra-cluster rates are scaled too and then capped at
``intra_cap_mbps`` (a 2-core machine cannot move 40 Gbit/s through veths);
the cap is reported wherever the rates are.

Routing follows ``Topology.path`` exactly: each router has a destination route
per remote cluster (next hop of ``path(router, dst)``) and, only where a
source's own path leaves a transit router by a different link (possible with
``widest`` routing or ties), a source-specific policy route.
"""

from __future__ import annotations

import ipaddress
import itertools
from dataclasses import dataclass

from spiderflow.errors import EmulatorError
from spiderflow.topology import Cluster, Link, Topology

MECHANISMS = ("auto", "netem", "nfqueue")
MTU = 1500
ETH_HEADER = 14
TCPIP_HEADERS = 52  # IPv4 20 + TCP 20 + timestamp option 12 (Linux default)
GOODPUT_TO_WIRE = (MTU + ETH_HEADER) / (MTU - TCPIP_HEADERS)
MAX_CLUSTERS = 199 * 256
MAX_HOSTS = 240
MIN_QUEUE_BYTES = 256 * 1024  # four 64 KiB GSO packets
# Kernel defaults of net.ipv4.tcp_rmem / tcp_wmem max in a fresh namespace.
DEFAULT_TCP_RMEM_MAX = 6 * 1024 * 1024
DEFAULT_TCP_WMEM_MAX = 4 * 1024 * 1024
LAN_BRIDGE = "lan"
HOST_INTF = "eth0"
POLICY_TABLE_BASE = 100
MAX_DILATION = 64.0


@dataclass(frozen=True, kw_only=True)
class NetConfig:
    """Knobs of one emulated network; every output states them."""

    hosts_per_cluster: int = 2
    scale: float = 10.0
    intra_cap_mbps: float = 1000.0
    delay: str = "auto"  # which mechanism delays WAN packets: auto | netem | nfqueue
    queue_bdp: float = 1.0  # router buffer per WAN direction, in bandwidth-delay products
    # time dilation K: wire rates / K, delays x K (and, in emulator run, compute x K, measured / K)
    dilation: float = 1.0

    def __post_init__(self) -> None:
        if isinstance(self.hosts_per_cluster, bool) or not isinstance(self.hosts_per_cluster, int) \
                or not 1 <= self.hosts_per_cluster <= MAX_HOSTS:
            raise EmulatorError(f"hosts_per_cluster must be an integer in 1..{MAX_HOSTS} "
                                f"(got {self.hosts_per_cluster!r})")
        if not self.scale > 0:
            raise EmulatorError(f"scale must be > 0 (got {self.scale!r}); 10 divides a "
                                "1 Gbit/s link to 100 Mbit/s on the wire")
        if not self.intra_cap_mbps > 0:
            raise EmulatorError(f"intra_cap_mbps must be > 0 (got {self.intra_cap_mbps!r})")
        if self.delay not in MECHANISMS:
            raise EmulatorError(f"delay must be one of {', '.join(MECHANISMS)} (got {self.delay!r})")
        if not self.queue_bdp > 0:
            raise EmulatorError(f"queue_bdp must be > 0 (got {self.queue_bdp!r})")
        if isinstance(self.dilation, bool) or not isinstance(self.dilation, (int, float)) \
                or not 1 <= self.dilation <= MAX_DILATION:
            raise EmulatorError(f"dilation must be a number in 1..{MAX_DILATION:g} (got {self.dilation!r}); "
                                "1 runs in real time, K runs K times slower")

    def buffers_note(self) -> str:
        """What an output's header says of the WAN buffers: nothing at the default 1 bandwidth-delay
        product, else ", WAN buffers Q bandwidth-delay products"."""
        return f", WAN buffers {self.queue_bdp:g} bandwidth-delay products" if self.queue_bdp != 1 else ""

    @property
    def wire_divisor(self) -> float:
        """Topology bandwidth / wire rate: the scale times the dilation."""
        return self.scale * self.dilation


@dataclass(frozen=True, kw_only=True)
class Shape:
    """One direction of one link as shaped on the wire."""

    goodput_mbps: float  # what TCP should measure (topology bandwidth / scale, capped)
    delay_ms: float  # one-way
    jitter_ms: float = 0.0
    loss_pct: float = 0.0
    queue_bytes: int = MIN_QUEUE_BYTES

    @property
    def wire_mbps(self) -> float:
        return self.goodput_mbps * GOODPUT_TO_WIRE


@dataclass(frozen=True, kw_only=True)
class HostPlan:
    name: str
    cluster: str
    index: int
    ip: str
    prefix_len: int
    gateway: str
    port: str  # the router-side veth (bridge port) facing this host
    intf: str = HOST_INTF


@dataclass(frozen=True, kw_only=True)
class WanPort:
    dev: str  # "w-<peer>"
    peer: str
    ip: str
    peer_ip: str
    prefix_len: int
    queue: int  # NFQUEUE number inside this router's namespace
    shape: Shape  # egress: this router -> peer


@dataclass(frozen=True, kw_only=True)
class Route:
    dst: str  # prefix
    via: str
    dev: str
    src: str | None = None  # source prefix, for policy routes
    table: int | None = None


@dataclass(frozen=True, kw_only=True)
class RouterPlan:
    name: str
    cluster: str
    lan_ip: str
    prefix_len: int
    wan: tuple[WanPort, ...]
    routes: tuple[Route, ...]


@dataclass(frozen=True, kw_only=True)
class ClusterPlan:
    name: str
    index: int
    subnet: str
    router: RouterPlan
    hosts: tuple[HostPlan, ...]
    intra: Shape
    tcp_max_bytes: int  # tcp_rmem / tcp_wmem max for every namespace of this cluster


@dataclass(frozen=True, kw_only=True)
class NetPlan:
    topology: str
    source: str
    config: NetConfig
    clusters: tuple[ClusterPlan, ...]
    links: tuple[Link, ...]

    def cluster(self, name: str) -> ClusterPlan:
        for c in self.clusters:
            if c.name == name:
                return c
        raise KeyError(f"no cluster named {name!r} in this emulation")

    def port(self, a: str, b: str) -> WanPort:
        """Router ``a``'s interface on its link to ``b``."""
        for port in self.cluster(a).router.wan:
            if port.peer == b:
                return port
        raise KeyError(f"no WAN link {a}-{b} in this emulation")

    def host(self, name: str) -> HostPlan:
        for c in self.clusters:
            for h in c.hosts:
                if h.name == name:
                    return h
        raise KeyError(f"no host named {name!r} in this emulation")


def lan_subnet(index: int) -> ipaddress.IPv4Network:
    if not 0 <= index < MAX_CLUSTERS:
        raise EmulatorError(f"the emulator addresses at most {MAX_CLUSTERS} clusters (got index {index})")
    return ipaddress.IPv4Network(f"10.{1 + index // 256}.{index % 256}.0/24")


def wan_subnet(index: int) -> ipaddress.IPv4Network:
    if not 0 <= index < 16384:
        raise EmulatorError(f"the emulator addresses at most 16384 WAN links (got index {index})")
    base = int(ipaddress.IPv4Address("10.0.0.0")) + 4 * index
    return ipaddress.IPv4Network((base, 30))


def host_name(cluster: str, index: int) -> str:
    return f"{cluster}-h{index}"


def router_name(cluster: str) -> str:
    return f"{cluster}-gw"


def wan_dev(peer: str) -> str:
    return f"w-{peer}"


def longest_rtt_ms(topo: Topology) -> dict[tuple[str, str], float]:
    """Per link: the longest round trip (real ms) of the routes that cross it. A router's buffer
    is sized to the flows it carries: a flow between far clusters over a short link needs its own
    path's bandwidth-delay product queued there, or TCP loses packets at every burst."""
    longest = {link.key: 2.0 * link.latency_ms for link in topo.links}
    for a, b in itertools.combinations(topo.names, 2):
        path = topo.path(a, b)
        for link in path.links:
            longest[link.key] = max(longest[link.key], 2.0 * path.latency_ms)
    return longest


def link_shape(link: Link, config: NetConfig, rtt_ms: float | None = None) -> Shape:
    """The shape of ``link`` on the wire; its queue holds ``queue_bdp`` bandwidth-delay products at
    the round trip ``rtt_ms`` (the longest route across it, :func:`longest_rtt_ms`; default its own)."""
    goodput = link.bandwidth_gbps * 1000.0 / config.wire_divisor
    delay_ms = link.latency_ms * config.dilation
    wire_bytes_per_s = goodput * GOODPUT_TO_WIRE * 1e6 / 8
    rtt_wire_ms = (2.0 * link.latency_ms if rtt_ms is None else rtt_ms) * config.dilation
    queue = int(config.queue_bdp * wire_bytes_per_s * rtt_wire_ms / 1e3)
    return Shape(goodput_mbps=goodput, delay_ms=delay_ms, jitter_ms=link.jitter_ms * config.dilation,
                 loss_pct=link.loss_pct, queue_bytes=max(queue, MIN_QUEUE_BYTES))


def emulated_intra_gbps(cluster: Cluster, config: NetConfig) -> float:
    """A cluster's intra-cluster bandwidth as emulated, in real-equivalent Gbit/s: the topology's,
    capped at what the wire cap ``intra_cap_mbps`` carries at this scale."""
    return min(cluster.intra_cluster_bandwidth_gbps, config.intra_cap_mbps * config.scale / 1000.0)


def intra_shape(topo: Topology, cluster: str, config: NetConfig) -> Shape:
    """Host-to-host inside a cluster: the capped bandwidth on the wire (so the cap / K when dilated)."""
    c = topo.cluster(cluster)
    return Shape(goodput_mbps=emulated_intra_gbps(c, config) * 1000.0 / config.wire_divisor,
                 delay_ms=c.intra_cluster_latency_ms * config.dilation)


def next_hops(topo: Topology) -> tuple[dict[str, dict[str, str]], dict[str, dict[tuple[str, str], str]]]:
    """Forwarding decisions that reproduce ``topo.path`` for every cluster pair.

    Returns ``(main, policy)``: ``main[r][d]`` is the next cluster from router
    ``r`` towards ``d`` (first hop of ``path(r, d)``); ``policy[r][(s, d)]``
    overrides it for traffic from cluster ``s`` where ``path(s, d)`` leaves
    ``r`` by another link.
    """
    names = topo.names
    main = {r: {d: topo.path(r, d).clusters[1] for d in names if d != r} for r in names}
    policy: dict[str, dict[tuple[str, str], str]] = {r: {} for r in names}
    for s in names:
        for d in names:
            if s == d:
                continue
            hops = topo.path(s, d).clusters
            for pos in range(1, len(hops) - 1):
                r, nxt = hops[pos], hops[pos + 1]
                if main[r][d] != nxt:
                    policy[r][(s, d)] = nxt
    return main, policy


def _max_bdp_bytes(topo: Topology, cluster: str, config: NetConfig) -> float:
    """Largest bandwidth x round-trip product a flow of this cluster can see (dilation divides the
    rate and multiplies the round trip: it leaves the product as it is)."""
    best = 0.0
    for other in topo.names:
        if other == cluster:
            continue
        there, back = topo.path(cluster, other), topo.path(other, cluster)
        wire = min(there.bandwidth_gbps, back.bandwidth_gbps) * 1e9 / config.scale * GOODPUT_TO_WIRE
        best = max(best, wire / 8 * (there.latency_ms + back.latency_ms) / 1e3)
    for _other, link in topo.neighbours(cluster):  # `emulator check` pins flows onto each link
        wire = link.bandwidth_gbps * 1e9 / config.scale * GOODPUT_TO_WIRE
        best = max(best, wire / 8 * 2 * link.latency_ms / 1e3)
    return best


def build_plan(topo: Topology, config: NetConfig, *, routing: Topology | None = None) -> NetPlan:
    """Names, addresses, shapes and routes of ``topo``'s emulation. ``routing``: route as this
    topology does instead (the same clusters and links, other figures: a link that is down has
    figures no route takes where another exists, while its shape keeps the last live ones)."""
    index = {name: i for i, name in enumerate(topo.names)}
    subnets = {name: lan_subnet(i) for name, i in index.items()}
    link_nets = {link.key: wan_subnet(k) for k, link in enumerate(topo.links)}
    main, policy = next_hops(routing or topo)
    rtt = longest_rtt_ms(topo)

    def wan_ip(a: str, b: str) -> str:
        link = topo.link(a, b)
        first, second = list(link_nets[link.key].hosts())
        return str(first if a == link.a else second)

    clusters = []
    for name in topo.names:
        net = subnets[name]
        gw = str(net.network_address + 1)
        hosts = tuple(
            HostPlan(name=host_name(name, j), cluster=name, index=j,
                     ip=str(net.network_address + 10 + j), prefix_len=net.prefixlen,
                     gateway=gw, port=f"h{j}")
            for j in range(config.hosts_per_cluster))
        wan = tuple(
            WanPort(dev=wan_dev(peer), peer=peer, ip=wan_ip(name, peer), peer_ip=wan_ip(peer, name),
                    prefix_len=30, queue=q, shape=link_shape(link, config, rtt[link.key]))
            for q, (peer, link) in enumerate(topo.neighbours(name)))
        routes = [Route(dst=str(subnets[d]), via=wan_ip(nh, name), dev=wan_dev(nh))
                  for d, nh in main[name].items()]
        for (s, d), nh in sorted(policy[name].items(), key=lambda kv: (index[kv[0][0]], index[kv[0][1]])):
            routes.append(Route(dst=str(subnets[d]), via=wan_ip(nh, name), dev=wan_dev(nh),
                                src=str(subnets[s]), table=POLICY_TABLE_BASE + index[s]))
        router = RouterPlan(name=router_name(name), cluster=name, lan_ip=gw, prefix_len=net.prefixlen,
                            wan=wan, routes=tuple(routes))
        bdp = _max_bdp_bytes(topo, name, config)
        tcp_max = int(max(DEFAULT_TCP_RMEM_MAX, 4 * bdp))
        clusters.append(ClusterPlan(name=name, index=index[name], subnet=str(net), router=router,
                                    hosts=hosts, intra=intra_shape(topo, name, config),
                                    tcp_max_bytes=tcp_max))
    return NetPlan(topology=topo.name, source=topo.source, config=config, clusters=tuple(clusters),
                   links=topo.links)
