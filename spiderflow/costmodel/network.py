"""How a planner sees the network: the knowledge split the paper is about.

- :class:`TopologyView` sees the cluster graph: routes, which physical links
  several transfers share, and the load other jobs already put on each link
  (``link_load``: competing flows per link; a new flow expects a max-min fair
  share ``capacity / (load + 1)``). SpinSearch, ``ilp-topo`` and the
  simulator's ground truth use it; ``link_gbps`` lets the simulator impose
  the bandwidth a job's flows actually got.
- :class:`MatrixView` sees what published cross-cluster planners see: a matrix
  of pairwise bandwidth and latency (computed from the routes), blind to
  multi-hop sharing and to current load.

Both return ``(alpha_s, bytes_per_s)`` pairs, DESIGN.md's p2p physics:
``t(n) = alpha + n / beta`` with alpha the summed one-way latency plus a
per-message overhead, and beta the bottleneck bandwidth.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass, field, replace

from spiderflow.costmodel.calibration import NO_CALIBRATION, Calibration
from spiderflow.topology import Topology

GBPS = 1e9 / 8  # bytes/s per Gbit/s


@dataclass(frozen=True)
class Channel:
    alpha_s: float
    bytes_per_s: float

    def time(self, nbytes: float) -> float:
        return self.alpha_s + nbytes / self.bytes_per_s


class Figures(tuple):
    """:meth:`TopologyView.figures`' tuple, which hashes its items once: TPA's memo key and
    SpinSearch's memoised orders hash it on every look-up, and a set of 20 clusters holds 380
    pairs. Equal to, and hashed as, the plain tuple of the same items."""

    def __hash__(self) -> int:
        try:
            return self._hash
        except AttributeError:
            h = self._hash = tuple.__hash__(self)
            return h


@dataclass(frozen=True, kw_only=True)
class TopologyView:
    topology: Topology
    calibration: Calibration = NO_CALIBRATION
    link_load: Mapping[tuple[str, str], float] = field(default_factory=dict)
    link_gbps: Mapping[tuple[str, str], float] = field(default_factory=dict)
    shares_links: bool = True
    name: str = "topology"
    _memo: dict = field(default_factory=dict, repr=False, compare=False, hash=False)

    def _share(self, key: tuple[str, str], raw_gbps: float) -> float:
        """Fraction of a link's raw capacity a new flow expects."""
        cap = self.link_gbps.get(key, raw_gbps)
        return cap / (self.link_load.get(key, 0.0) + 1.0) / raw_gbps

    def p2p(self, a: str, b: str) -> Channel:
        key = ("p2p", a, b)
        chan = self._memo.get(key)
        if chan is None:
            chan = self._memo[key] = self._p2p(a, b)
        return chan

    def _p2p(self, a: str, b: str) -> Channel:
        if a == b:
            return self.intra(a, spans_nodes=True)
        path = self.topology.path(a, b)
        cal = self.calibration.path(a, b)
        base_gbps = cal.beta_gbps if cal else path.bandwidth_gbps
        alpha = cal.alpha_s if cal else path.latency_ms / 1e3
        load, gbps = self.link_load, self.link_gbps
        lowest = math.inf  # the least of each link's share x its capacity (a link nobody loads: its capacity)
        for link in path.links:
            key, raw = link.key, link.bandwidth_gbps
            got = raw if key not in load and key not in gbps else self._share(key, raw) * raw
            if got < lowest:
                lowest = got
        frac = lowest / path.bandwidth_gbps
        return Channel(alpha + self.calibration.per_message_overhead_s, base_gbps * frac * GBPS)

    def figures(self, names: tuple[str, ...]) -> tuple[tuple[float, float], ...]:
        """``(bytes_per_s, -alpha_s)`` of :meth:`p2p` for every ordered pair of distinct ``names``, in
        ``names`` x ``names`` order (memoised per ``names``): what SpinSearch's chain orders read of a
        set of clusters, and TPA's memo key of a chain on them (one tuple for both, made once)."""
        key = ("figures", names)
        hit = self._memo.get(key)
        if hit is None:
            memo, out = self._memo, []
            for a in names:
                # per cluster, its pairs' figures by the other's name (a look-up by name, not by a new tuple)
                row = memo.get(("figures from", a))
                if row is None:
                    row = memo["figures from", a] = {}
                for b in names:
                    if b != a:
                        fig = row.get(b)
                        if fig is None:
                            ch = self.p2p(a, b)
                            fig = row[b] = (ch.bytes_per_s, -ch.alpha_s)
                        out.append(fig)
            hit = self._memo[key] = Figures(out)
        return hit

    def p2p_crowded(self, a: str, b: str, crowd: tuple[tuple[tuple[str, str], int], ...]) -> Channel:
        """``p2p(a, b)`` when the job's own transfers crowd its route: ``crowd`` maps a directed hop
        ``(from, to)`` to how many of the job's transfers cross it in that direction (see
        :func:`spiderflow.costmodel.work.self_crowd`); on a hop crossed by k of them each gets 1/k
        of what the view gives that link, as on a ring (:meth:`ring`). The published planners'
        matrix view does not see it (``shares_links`` False). No crowd: ``p2p(a, b)``."""
        if not crowd:
            return self.p2p(a, b)
        return self.crowded(crowd).get(self, a, b)

    def crowded(self, crowd: tuple[tuple[tuple[str, str], int], ...]) -> Crowded:
        """:meth:`p2p_crowded` with this ``crowd``, for many pairs: the crowd hashed once per view
        (a long pipeline prices the same few pairs at every stage; memoised on the view)."""
        key = ("crowded", crowd)
        hit = self._memo.get(key)
        if hit is None:
            hit = self._memo[key] = Crowded(crowd)
        return hit

    def intra(self, cluster: str, *, spans_nodes: bool) -> Channel:
        key = ("intra", cluster, spans_nodes)
        chan = self._memo.get(key)
        if chan is None:
            chan = self._memo[key] = self._intra(cluster, spans_nodes)
        return chan

    def _intra(self, cluster: str, spans_nodes: bool) -> Channel:
        # A calibration's intra entry is the inter-node network it measured (the emulator's hosts),
        # never NVLink inside a node.
        cal = self.calibration.intra.get(cluster) if spans_nodes else None
        c = self.topology.cluster(cluster)
        if cal:
            return Channel(cal.alpha_s, cal.beta_gbps * GBPS)
        if spans_nodes:
            return Channel(c.intra_cluster_latency_ms / 1e3, c.intra_cluster_bandwidth_gbps * GBPS)
        return Channel(0.0, c.intra_node_bandwidth_gbps * GBPS)

    def ring(self, clusters: Sequence[str]) -> Channel:
        """One ring over ``clusters`` (in order): per-step alpha and the ring's bottleneck rate.

        With ``shares_links`` a physical link carrying k ring hops in the same
        direction gives each hop 1/k of its (shared) capacity. A calibration's
        ``rings`` entry for exactly these clusters replaces what the paths give.
        """
        key = ("ring", *clusters)
        chan = self._memo.get(key)
        if chan is None:
            chan = self._memo[key] = self._ring(tuple(clusters))
        return chan

    def _ring(self, clusters: tuple[str, ...]) -> Channel:
        chan = self._ring_of_paths(clusters)
        cal = self.calibration.ring(clusters)
        if cal is None:
            return chan
        # A measured ring replaces the paths' alpha and beta. Other jobs' load scales it as it scales
        # the ring of paths: by the ratio of that ring loaded to the same ring unloaded.
        share = 1.0
        if self.link_load or self.link_gbps:
            unloaded = replace(self, link_load={}, link_gbps={}, _memo={})._ring_of_paths(clusters)
            share = min(1.0, chan.bytes_per_s / unloaded.bytes_per_s)
        return Channel(cal.alpha_s + self.calibration.per_message_overhead_s, cal.beta_gbps * GBPS * share)

    def _ring_of_paths(self, clusters: tuple[str, ...]) -> Channel:
        n = len(clusters)
        hops = [(clusters[i], clusters[(i + 1) % n]) for i in range(n)]
        if not self.shares_links:
            chans = [self.p2p(a, b) for a, b in hops]
            return Channel(max(c.alpha_s for c in chans), min(c.bytes_per_s for c in chans))
        alpha = 0.0
        rate = float("inf")
        for a, b, worst in self.topology.ring_hops(clusters):
            chan = self.p2p(a, b)
            alpha = max(alpha, chan.alpha_s)
            rate = min(rate, chan.bytes_per_s / worst)
        return Channel(alpha, rate)


class Crowded:
    """The channels of one view under one crowd (:meth:`TopologyView.crowded`), each pair priced
    once (:meth:`TopologyView.p2p_crowded`'s figures). It keeps no reference to its view (which
    keeps it in its memo): ``get`` is handed it."""

    __slots__ = ("crowd", "_counts", "_known")

    def __init__(self, crowd: tuple) -> None:
        # the hops more than one transfer crosses (chains_crowd keeps no others); the rest cost nothing
        self.crowd, self._counts, self._known = crowd, {h: k for h, k in crowd if k > 1}, {}

    def get(self, view: TopologyView, a: str, b: str) -> Channel:
        chan = self._known.get((a, b))
        if chan is None:
            chan = self._known[a, b] = self._price(view, a, b)
        return chan

    def _crowded_route(self, view: TopologyView, a: str, b: str):
        """The route ``a -> b`` when it crosses a hop more than one transfer of the crowd crosses
        (priced link by link), else None (priced as ``view.p2p``)."""
        if a == b or not view.shares_links or not self._counts:
            return None
        return crowded_route(view.topology, self._counts.keys(), a, b)

    def _price(self, view: TopologyView, a: str, b: str) -> Channel:
        base = view.p2p(a, b)
        path = self._crowded_route(view, a, b)
        if path is None:
            return base
        counts = self._counts
        gbps = [view._share(l.key, l.bandwidth_gbps) * l.bandwidth_gbps for l in path.links]
        crowded = min(g / max(1, counts.get(h, 1)) for g, h in zip(gbps, path.hop_pairs))
        return Channel(base.alpha_s, base.bytes_per_s * crowded / min(gbps))


def crowded_route(topology: Topology, hops: Set[tuple[str, str]], a: str, b: str):
    """The route ``a -> b`` (``a != b``) when it crosses one of the crowded directed ``hops``, else
    None: such a send is priced link by link (:meth:`Crowded.get`), so every link of that route is
    read, with its own load and rate; any other is priced as ``p2p``, on the pair's figures."""
    path = topology.path(a, b)
    return None if hops.isdisjoint(path.hop_pairs) else path


def MatrixView(topology: Topology, calibration: Calibration = NO_CALIBRATION) -> TopologyView:
    """The pairwise-matrix view of published planners: no load, no shared links."""
    return TopologyView(topology=topology, calibration=calibration, shares_links=False, name="matrix")
