"""Load and validate a YAML topology file into a :class:`Topology`.

Every problem is one :class:`ConfigError` line naming the file, the field path,
the value and the fix, e.g.
``topologies/x.yaml: links[3].bandwidth_gbps must be > 0 (got -1)``.
The file is read through :mod:`spiderflow.inputs` (size, UTF-8, nesting,
YAML aliases, duplicate keys); every number must be finite and within the
generous maxima below, and every name a string.
"""

from __future__ import annotations

import re
from pathlib import Path as FsPath
from typing import Any

from spiderflow import shipped
from spiderflow.errors import ConfigError
from spiderflow.hardware import GPUS
from spiderflow.inputs import finite, load_yaml, read_text
from spiderflow.topology.model import ROUTING_RULES, Cluster, Link, Topology

# Short, shell- and interface-safe: the emulator derives Linux interface names
# (15 characters at most) such as "<cluster>-g<k>" from these.
CLUSTER_NAME = re.compile(r"^[a-z][a-z0-9]{0,7}$")
# The topology name becomes part of file names (`emulator calibrate` writes
# calibration-<name>.json), so no "/", ".." or leading "." or "-".
TOPOLOGY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")

# Generous maxima: beyond them a value is a typo, and products of such values
# overflow or make the planner loop for ever. Largest machines today: ~100k
# GPUs, 72 GPUs per NVLink domain (GB200 NVL72).
MAX_NODES = 1_000_000
MAX_GPUS_PER_NODE = 1024
MAX_BANDWIDTH_GBPS = 1e6  # 1 Pbit/s; NVLink 5 is 14.4 Tbit/s per GPU
MIN_BANDWIDTH_GBPS = 1e-6  # 1 kbit/s: times are bytes / bandwidth
MAX_LATENCY_MS = 60_000.0  # one minute one way; a geostationary hop is ~270 ms
MAX_LOCATION = 1e6  # km or degrees

TOP_KEYS = {"name", "description", "routing", "clusters", "links"}
CLUSTER_KEYS = {"name", "gpu", "nodes", "gpus_per_node", "intra_node_bandwidth_gbps",
                "intra_cluster_bandwidth_gbps", "intra_cluster_latency_ms", "location", "region"}
LINK_KEYS = {"a", "b", "bandwidth_gbps", "latency_ms", "jitter_ms", "loss_pct"}


class _Checker:
    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, field: str, message: str) -> ConfigError:
        return ConfigError(f"{self.source}: {field} {message}")

    def mapping(self, value: Any, field: str) -> dict:
        if not isinstance(value, dict):
            raise self.fail(field, f"must be a mapping (got {_short(value)})")
        return value

    def keys(self, value: dict, allowed: set[str], field: str) -> None:
        for key in value:
            if key not in allowed:
                raise self.fail(f"{field}.{key}" if field else str(key),
                                f"is not a known key; allowed: {', '.join(sorted(allowed))}")

    def string(self, value: Any, field: str) -> str:
        if not isinstance(value, str):
            raise self.fail(field, f"must be a string (got {_short(value)})")
        return value

    def number(self, value: Any, field: str, *, minimum: float = 0.0, strict: bool = True,
               integer: bool = False, below: float | None = None, maximum: float | None = None,
               least: float | None = None) -> float:
        """``value`` checked: > ``minimum`` (>= unless ``strict``), >= ``least``, <= ``maximum``,
        < ``below``."""
        kind = "an integer" if integer else "a number"
        ok_type = isinstance(value, int) if integer else isinstance(value, (int, float))
        if isinstance(value, bool) or not ok_type or (isinstance(value, float) and value != value):
            raise self.fail(field, f"must be {kind} (got {_short(value)})")
        if not finite(value):  # inf, or an integer beyond 1e300: its comparisons overflow
            limit = (f"<= {maximum:g}" if value > 0 and maximum is not None else
                     f"{'>' if strict else '>='} {minimum:g}" if value < 0 else "finite and within +-1e300")
            raise self.fail(field, f"must be {limit} (got {_short(value)}); is it a typo?")
        if (strict and value <= minimum) or (not strict and value < minimum):
            raise self.fail(field, f"must be {'>' if strict else '>='} {minimum:g} (got {_short(value)})")
        if least is not None and value < least:
            raise self.fail(field, f"must be >= {least:g} (got {_short(value)})")
        if maximum is not None and value > maximum:
            raise self.fail(field, f"must be <= {maximum:g} (got {_short(value)}); is it a typo?")
        if below is not None and value >= below:
            raise self.fail(field, f"must be < {below:g} (got {_short(value)})")
        return value


def _short(value: Any, limit: int = 60) -> str:
    """repr of ``value``, cut to ``limit`` characters (a 400-digit number stays one short line)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10 ** limit:
        return f"an integer of {len(str(abs(value)))} digits"  # str() of 4300+ digits raises: YAML stops those
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def load_topology(path: str | FsPath, *, routing: str | None = None) -> Topology:
    """Read ``path`` (or a shipped topology's name, see :mod:`spiderflow.shipped`); ``routing``
    overrides the file's routing rule."""
    data, source = read_topology_data(path)
    return parse_topology(data, source=source, routing=routing)


def read_topology_data(path: str | FsPath) -> tuple[Any, str]:
    """The parsed YAML of ``path`` (or a shipped topology's name) and its name for messages,
    before any schema check (:func:`parse_topology` does those)."""
    if isinstance(path, (str, FsPath)) and "\x00" not in str(path):
        path = shipped.find(path, "topology")
        if not shipped.exists(path):
            raise ConfigError(f"{path}: no such topology file; give a path or a shipped name "
                              f"({', '.join(shipped.names('topology'))})")
    source = str(path)
    return load_yaml(read_text(path, what="topology file"), source), source


def parse_topology(data: Any, *, source: str = "<memory>", routing: str | None = None) -> Topology:
    chk = _Checker(source)
    top = chk.mapping(data, "top level")
    chk.keys(top, TOP_KEYS, "")
    rule = routing or top.get("routing", "shortest")
    if not isinstance(rule, str) or rule not in ROUTING_RULES:
        raise chk.fail("routing", f"must be one of {', '.join(ROUTING_RULES)} (got {_short(rule)})")
    name = _topology_name(chk, top)
    if top.get("description") is not None:
        chk.string(top["description"], "description")
    raw_clusters = top.get("clusters")
    if not isinstance(raw_clusters, list) or not raw_clusters:
        raise chk.fail("clusters", "must be a non-empty list of clusters")
    clusters = [_cluster(chk, raw, f"clusters[{i}]") for i, raw in enumerate(raw_clusters)]
    seen: dict[str, int] = {}
    for i, c in enumerate(clusters):
        if c.name in seen:
            raise chk.fail(f"clusters[{i}].name", f"duplicates clusters[{seen[c.name]}] "
                           f"(got {c.name!r}); give each cluster a unique name")
        seen[c.name] = i
    raw_links = top.get("links")
    if raw_links is None:
        raw_links = []
    if not isinstance(raw_links, list):
        raise chk.fail("links", f"must be a list of links (got {_short(raw_links)})")
    links: list[Link] = []
    link_at: dict[tuple[str, str], int] = {}
    for i, raw in enumerate(raw_links):
        link = _link(chk, raw, f"links[{i}]", seen)
        if link.key in link_at:
            raise chk.fail(f"links[{i}]", f"duplicates links[{link_at[link.key]}] "
                           f"({link.a}-{link.b}); keep one link per cluster pair")
        link_at[link.key] = i
        links.append(link)
    topo = Topology(name=name, clusters=tuple(clusters),
                    links=tuple(links), routing=rule, source=source)
    _check_connected(chk, topo)
    return topo


def _topology_name(chk: _Checker, top: dict) -> str:
    """The ``name`` field, or the file's stem made safe; either way it matches :data:`TOPOLOGY_NAME`."""
    if "name" not in top:
        stem = re.sub(r"[^A-Za-z0-9._-]", "-", FsPath(chk.source).stem).lstrip("._-")[:64]
        return stem if TOPOLOGY_NAME.match(stem) else "topology"
    name = chk.string(top["name"], "name")
    if not TOPOLOGY_NAME.match(name):
        raise chk.fail("name", f"must be 1-64 characters of [A-Za-z0-9._-] starting with a letter or digit, "
                       f"since file names are made from it (got {_short(name)})")
    return name


def _cluster(chk: _Checker, raw: Any, field: str) -> Cluster:
    raw = chk.mapping(raw, field)
    chk.keys(raw, CLUSTER_KEYS, field)
    for key in ("name", "gpu", "nodes", "gpus_per_node"):
        if key not in raw:
            raise chk.fail(f"{field}.{key}", "is missing")
    name = raw["name"]
    if not isinstance(name, str) or not CLUSTER_NAME.match(name):
        raise chk.fail(f"{field}.name", f"must be 1-8 characters of [a-z0-9] starting with a "
                       f"letter, so emulator interface names fit in 15 (got {_short(name)})")
    gpu = raw["gpu"]
    if not isinstance(gpu, str) or gpu not in GPUS:
        raise chk.fail(f"{field}.gpu", f"must be one of {', '.join(sorted(GPUS))} (got {_short(gpu)})")
    if raw.get("region") is not None:
        chk.string(raw["region"], f"{field}.region")
    profile = GPUS[gpu]
    location = raw.get("location")
    if location is not None:
        if not (isinstance(location, list) and len(location) == 2):
            raise chk.fail(f"{field}.location", f"must be a [x, y] pair (got {_short(location)})")
        location = tuple(chk.number(v, f"{field}.location[{j}]", minimum=-MAX_LOCATION, strict=False,
                                    maximum=MAX_LOCATION)
                         for j, v in enumerate(location))
    bandwidth = dict(least=MIN_BANDWIDTH_GBPS, maximum=MAX_BANDWIDTH_GBPS)
    return Cluster(
        name=name, gpu=gpu,
        nodes=int(chk.number(raw["nodes"], f"{field}.nodes", integer=True, maximum=MAX_NODES)),
        gpus_per_node=int(chk.number(raw["gpus_per_node"], f"{field}.gpus_per_node", integer=True,
                                     maximum=MAX_GPUS_PER_NODE)),
        intra_node_bandwidth_gbps=chk.number(raw.get("intra_node_bandwidth_gbps", profile.nvlink_gbps),
                                             f"{field}.intra_node_bandwidth_gbps", **bandwidth),
        intra_cluster_bandwidth_gbps=chk.number(
            raw.get("intra_cluster_bandwidth_gbps", profile.network_gbps),
            f"{field}.intra_cluster_bandwidth_gbps", **bandwidth),
        intra_cluster_latency_ms=chk.number(
            raw.get("intra_cluster_latency_ms", profile.intra_cluster_latency_ms),
            f"{field}.intra_cluster_latency_ms", maximum=MAX_LATENCY_MS),
        location=location,
    )


def _link(chk: _Checker, raw: Any, field: str, names: dict[str, int]) -> Link:
    raw = chk.mapping(raw, field)
    chk.keys(raw, LINK_KEYS, field)
    for key in ("a", "b", "bandwidth_gbps", "latency_ms"):
        if key not in raw:
            raise chk.fail(f"{field}.{key}", "is missing")
    for end in ("a", "b"):
        if not isinstance(raw[end], str) or raw[end] not in names:
            raise chk.fail(f"{field}.{end}", f"names no cluster (got {_short(raw[end])}); "
                           f"known: {', '.join(names)}")
    if raw["a"] == raw["b"]:
        raise chk.fail(field, f"joins {raw['a']!r} to itself; a link needs two different clusters")
    return Link(
        a=raw["a"], b=raw["b"],
        bandwidth_gbps=chk.number(raw["bandwidth_gbps"], f"{field}.bandwidth_gbps", least=MIN_BANDWIDTH_GBPS,
                                  maximum=MAX_BANDWIDTH_GBPS),
        latency_ms=chk.number(raw["latency_ms"], f"{field}.latency_ms", maximum=MAX_LATENCY_MS),
        jitter_ms=chk.number(raw.get("jitter_ms", 0.0), f"{field}.jitter_ms", strict=False,
                             maximum=MAX_LATENCY_MS),
        loss_pct=chk.number(raw.get("loss_pct", 0.0), f"{field}.loss_pct", strict=False, below=100.0),
    )


def _check_connected(chk: _Checker, topo: Topology) -> None:
    import networkx as nx

    if len(topo.clusters) < 2:
        return
    parts = sorted((sorted(p) for p in nx.connected_components(topo.graph)), key=lambda p: p[0])
    if len(parts) > 1:
        desc = " | ".join(",".join(p) for p in parts)
        raise chk.fail("links", f"leave the cluster graph disconnected ({desc}); "
                       "add a link joining these groups")
