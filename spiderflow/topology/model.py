"""Cluster graph: frozen clusters and WAN links, plus routing over them.

Routing rule (``Topology.routing``):

- ``shortest`` (default): the path of least summed one-way latency, ties broken
  by the wider bottleneck. This is what IGP/BGP-style WAN routing does.
- ``widest``: the path of greatest bottleneck bandwidth. Among equally wide
  paths the label-setting search keeps the lower-latency one it meets first;
  this tie-break is a heuristic (widest-then-shortest is not isotonic, so
  Dijkstra cannot guarantee it), the bottleneck itself is exact.

Routes are computed once per source (Dijkstra, O(E log V)) and cached, so all
pairs cost O(V E log V) on first use and nothing afterwards.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import TypeVar

import networkx as nx

from spiderflow.hardware import gpu_profile

ROUTING_RULES = ("shortest", "widest")
DERIVED_KEPT = 200_000  # Topology.derived's entries at most
T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class Cluster:
    name: str
    gpu: str
    nodes: int
    gpus_per_node: int
    intra_node_bandwidth_gbps: float
    intra_cluster_bandwidth_gbps: float
    intra_cluster_latency_ms: float
    location: tuple[float, float] | None = None  # (x_km, y_km) or (lat, lon); informative

    @property
    def total_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def profile(self):
        return gpu_profile(self.gpu)


@dataclass(frozen=True, kw_only=True)
class Link:
    a: str
    b: str
    bandwidth_gbps: float
    latency_ms: float  # one-way
    jitter_ms: float = 0.0
    loss_pct: float = 0.0

    @cached_property
    def key(self) -> tuple[str, str]:
        """Orientation-free identity of the link."""
        return (self.a, self.b) if self.a < self.b else (self.b, self.a)


@dataclass(frozen=True, kw_only=True)
class Path:
    clusters: tuple[str, ...]
    links: tuple[Link, ...]

    # cached: the cost model reads them for every transfer it prices (a Path never changes)
    @cached_property
    def latency_ms(self) -> float:
        return sum(link.latency_ms for link in self.links)

    @cached_property
    def bandwidth_gbps(self) -> float:
        return min((link.bandwidth_gbps for link in self.links), default=float("inf"))

    @property
    def hops(self) -> int:
        return len(self.links)

    @cached_property
    def hop_pairs(self) -> tuple[tuple[str, str], ...]:
        """Each hop as (from, to), in path order."""
        return tuple(zip(self.clusters, self.clusters[1:]))


@dataclass(frozen=True, kw_only=True)
class Topology:
    name: str
    clusters: tuple[Cluster, ...]
    links: tuple[Link, ...]
    routing: str = "shortest"
    source: str = "<memory>"
    # route cache; init=False so that dataclasses.replace (a topology with other links) starts a fresh one
    _routes: dict = field(default_factory=dict, init=False, repr=False, compare=False, hash=False)
    _rings: dict = field(default_factory=dict, init=False, repr=False, compare=False, hash=False)
    # facts the routes alone decide, memoised by the modules that derive them (:meth:`derived`)
    _derived: dict = field(default_factory=dict, init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        if self.routing not in ROUTING_RULES:
            raise ValueError(f"routing must be one of {ROUTING_RULES} (got {self.routing!r})")

    @cached_property
    def _by_name(self) -> dict[str, Cluster]:
        return {c.name: c for c in self.clusters}

    @cached_property
    def _adjacency(self) -> dict[str, list[tuple[str, Link]]]:
        adj: dict[str, list[tuple[str, Link]]] = {c.name: [] for c in self.clusters}
        for link in self.links:
            adj[link.a].append((link.b, link))
            adj[link.b].append((link.a, link))
        return adj

    @cached_property
    def _link_by_key(self) -> dict[tuple[str, str], Link]:
        return {link.key: link for link in self.links}

    @cached_property
    def graph(self) -> nx.Graph:
        g = nx.Graph(name=self.name)
        for c in self.clusters:
            g.add_node(c.name, cluster=c)
        for link in self.links:
            g.add_edge(link.a, link.b, link=link, bandwidth_gbps=link.bandwidth_gbps,
                       latency_ms=link.latency_ms)
        return g

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.clusters)

    def cluster(self, name: str) -> Cluster:
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"{self.source}: no cluster named {name!r}") from None

    def link(self, a: str, b: str) -> Link | None:
        return self._link_by_key.get((a, b) if a < b else (b, a))

    def neighbours(self, name: str) -> list[tuple[str, Link]]:
        return self._adjacency[name]

    @cached_property
    def total_gpus(self) -> int:
        # cached: admission's weight reads it for every waiting job at every end it passes
        return sum(c.total_gpus for c in self.clusters)

    def path(self, a: str, b: str) -> Path:
        """The route from ``a`` to ``b`` under this topology's routing rule."""
        if a == b:
            return Path(clusters=(a,), links=())
        routes = self._routes.get(a)
        if routes is None:
            routes = self._routes[a] = self._routes_from(a)
        return routes[b]

    def derived(self, key: tuple, make: Callable[[], T]) -> T:
        """``make()``, memoised under ``key`` for this topology: for facts its routes alone decide
        (a chain's crowded hops, the links its crowded sends read), which every network state on it
        shares. Callers key by what they compute (a tuple whose first item names it). At most
        ``DERIVED_KEPT`` entries: past that the memo starts again."""
        hit = self._derived.get(key)
        if hit is None:
            if len(self._derived) >= DERIVED_KEPT:
                self._derived.clear()
            hit = self._derived[key] = make()
        return hit

    def ring_hops(self, clusters: tuple[str, ...]) -> tuple[tuple[str, str, int], ...]:
        """A ring over ``clusters`` (in order), hop by hop: (from, to, the most of the ring's hops
        that share one directed link of this hop's route, 1 without links). Memoised: a ring's
        routes never change."""
        hit = self._rings.get(clusters)
        if hit is None:
            n = len(clusters)
            hops = [(clusters[i], clusters[(i + 1) % n]) for i in range(n)]
            routes = [self.path(a, b) for a, b in hops]
            use: dict[tuple[str, str], int] = {}
            for path in routes:
                for hop in path.hop_pairs:
                    use[hop] = use.get(hop, 0) + 1
            hit = self._rings[clusters] = tuple((a, b, max((use[h] for h in path.hop_pairs), default=1))
                                                for (a, b), path in zip(hops, routes))
        return hit

    def _routes_from(self, src: str) -> dict[str, Path]:
        widest = self.routing == "widest"
        tie = itertools.count()
        # label: (primary, secondary) to minimise
        start = (float("-inf"), 0.0) if widest else (0.0, float("-inf"))
        best: dict[str, tuple[float, float]] = {src: start}
        parent: dict[str, tuple[str, Link] | None] = {src: None}
        heap = [(start, next(tie), src)]
        done: set[str] = set()
        while heap:
            label, _, node = heapq.heappop(heap)
            if node in done:
                continue
            done.add(node)
            for nxt, link in self._adjacency[node]:
                if nxt in done:
                    continue
                if widest:
                    bw = min(-label[0], link.bandwidth_gbps)
                    cand = (-bw, label[1] + link.latency_ms)
                else:
                    bw = min(-label[1], link.bandwidth_gbps)
                    cand = (label[0] + link.latency_ms, -bw)
                if nxt not in best or cand < best[nxt]:
                    best[nxt] = cand
                    parent[nxt] = (node, link)
                    heapq.heappush(heap, (cand, next(tie), nxt))
        paths: dict[str, Path] = {}
        for dst in parent:
            nodes, links = [dst], []
            cur = dst
            while parent[cur] is not None:
                prev, link = parent[cur]
                links.append(link)
                nodes.append(prev)
                cur = prev
            paths[dst] = Path(clusters=tuple(reversed(nodes)), links=tuple(reversed(links)))
        return paths

    @cached_property
    def sha256(self) -> str:
        """Hash of the network itself: clusters and links with every default resolved, in a canonical
        order and orientation, floats as floats. Not of the file's bytes, so comments, key order,
        ``1`` vs ``1.0``, link direction, ``location``, ``name`` and ``routing`` leave it unchanged.
        A calibration file records it (spiderflow.costmodel.calibration)."""
        clusters = [[c.name, c.gpu, c.nodes, c.gpus_per_node, float(c.intra_node_bandwidth_gbps),
                     float(c.intra_cluster_bandwidth_gbps), float(c.intra_cluster_latency_ms)]
                    for c in sorted(self.clusters, key=lambda c: c.name)]
        links = [[*link.key, float(link.bandwidth_gbps), float(link.latency_ms), float(link.jitter_ms),
                  float(link.loss_pct)] for link in sorted(self.links, key=lambda link: link.key)]
        canonical = json.dumps({"clusters": clusters, "links": links}, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    def with_routing(self, routing: str) -> "Topology":
        return Topology(name=self.name, clusters=self.clusters, links=self.links,
                        routing=routing, source=self.source)
