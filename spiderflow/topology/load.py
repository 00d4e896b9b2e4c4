"""Load and validate a YAML topology file into a :class:`Topology`.

Every problem is one :class:`ConfigError` line naming the file, the field path,
the value and the fix, e.g.
``topologies/x.yaml: links[3].bandwidth_gbps must be > 0 (got -1)``.
"""

from __future__ import annotations

import math
import re
from pathlib import Path as FsPath
from typing import Any

import yaml

from spiderflow.errors import ConfigError
from spiderflow.hardware import GPUS
from spiderflow.topology.model import ROUTING_RULES, Cluster, Link, Topology

# Short, shell- and interface-safe: the emulator derives Linux interface names
# (15 characters at most) such as "<cluster>-g<k>" from these.
CLUSTER_NAME = re.compile(r"^[a-z][a-z0-9]{0,7}$")

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
            raise self.fail(field, f"must be a mapping (got {value!r})")
        return value

    def keys(self, value: dict, allowed: set[str], field: str) -> None:
        for key in value:
            if key not in allowed:
                raise self.fail(f"{field}.{key}" if field else str(key),
                                f"is not a known key; allowed: {', '.join(sorted(allowed))}")

    def number(self, value: Any, field: str, *, minimum: float = 0.0, strict: bool = True,
               integer: bool = False, below: float | None = None) -> float:
        kind = "an integer" if integer else "a number"
        ok_type = isinstance(value, int) if integer else isinstance(value, (int, float))
        if isinstance(value, bool) or not ok_type or not math.isfinite(value):
            raise self.fail(field, f"must be {kind} (got {value!r})")
        if (strict and value <= minimum) or (not strict and value < minimum):
            raise self.fail(field, f"must be {'>' if strict else '>='} {minimum:g} (got {value!r})")
        if below is not None and value >= below:
            raise self.fail(field, f"must be < {below:g} (got {value!r})")
        return value


def load_topology(path: str | FsPath, *, routing: str | None = None) -> Topology:
    """Read ``path``; ``routing`` overrides the file's routing rule."""
    source = str(path)
    try:
        text = FsPath(path).read_text()
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read topology file ({exc.strerror})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{source}:{where} is not valid YAML ({getattr(exc, 'problem', exc)})") from None
    return parse_topology(data, source=source, routing=routing)


def parse_topology(data: Any, *, source: str = "<memory>", routing: str | None = None) -> Topology:
    chk = _Checker(source)
    top = chk.mapping(data, "top level")
    chk.keys(top, TOP_KEYS, "")
    rule = routing or top.get("routing", "shortest")
    if rule not in ROUTING_RULES:
        raise chk.fail("routing", f"must be one of {', '.join(ROUTING_RULES)} (got {rule!r})")
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
    raw_links = top.get("links") or []
    if not isinstance(raw_links, list):
        raise chk.fail("links", f"must be a list of links (got {raw_links!r})")
    links: list[Link] = []
    link_at: dict[tuple[str, str], int] = {}
    for i, raw in enumerate(raw_links):
        link = _link(chk, raw, f"links[{i}]", seen)
        if link.key in link_at:
            raise chk.fail(f"links[{i}]", f"duplicates links[{link_at[link.key]}] "
                           f"({link.a}-{link.b}); keep one link per cluster pair")
        link_at[link.key] = i
        links.append(link)
    topo = Topology(name=str(top.get("name", FsPath(source).stem)), clusters=tuple(clusters),
                    links=tuple(links), routing=rule, source=source)
    _check_connected(chk, topo)
    return topo


def _cluster(chk: _Checker, raw: Any, field: str) -> Cluster:
    raw = chk.mapping(raw, field)
    chk.keys(raw, CLUSTER_KEYS, field)
    for key in ("name", "gpu", "nodes", "gpus_per_node"):
        if key not in raw:
            raise chk.fail(f"{field}.{key}", "is missing")
    name = raw["name"]
    if not isinstance(name, str) or not CLUSTER_NAME.match(name):
        raise chk.fail(f"{field}.name", f"must be 1-8 characters of [a-z0-9] starting with a "
                       f"letter, so emulator interface names fit in 15 (got {name!r})")
    gpu = raw["gpu"]
    if gpu not in GPUS:
        raise chk.fail(f"{field}.gpu", f"must be one of {', '.join(sorted(GPUS))} (got {gpu!r})")
    profile = GPUS[gpu]
    location = raw.get("location")
    if location is not None:
        if not (isinstance(location, list) and len(location) == 2):
            raise chk.fail(f"{field}.location", f"must be a [x, y] pair (got {location!r})")
        location = tuple(chk.number(v, f"{field}.location[{j}]", minimum=-math.inf)
                         for j, v in enumerate(location))
    return Cluster(
        name=name, gpu=gpu,
        nodes=int(chk.number(raw["nodes"], f"{field}.nodes", integer=True)),
        gpus_per_node=int(chk.number(raw["gpus_per_node"], f"{field}.gpus_per_node", integer=True)),
        intra_node_bandwidth_gbps=chk.number(raw.get("intra_node_bandwidth_gbps", profile.nvlink_gbps),
                                             f"{field}.intra_node_bandwidth_gbps"),
        intra_cluster_bandwidth_gbps=chk.number(
            raw.get("intra_cluster_bandwidth_gbps", profile.network_gbps),
            f"{field}.intra_cluster_bandwidth_gbps"),
        intra_cluster_latency_ms=chk.number(
            raw.get("intra_cluster_latency_ms", profile.intra_cluster_latency_ms),
            f"{field}.intra_cluster_latency_ms"),
        location=location,
    )


def _link(chk: _Checker, raw: Any, field: str, names: dict[str, int]) -> Link:
    raw = chk.mapping(raw, field)
    chk.keys(raw, LINK_KEYS, field)
    for key in ("a", "b", "bandwidth_gbps", "latency_ms"):
        if key not in raw:
            raise chk.fail(f"{field}.{key}", "is missing")
    for end in ("a", "b"):
        if raw[end] not in names:
            raise chk.fail(f"{field}.{end}", f"names no cluster (got {raw[end]!r}); "
                           f"known: {', '.join(names)}")
    if raw["a"] == raw["b"]:
        raise chk.fail(field, f"joins {raw['a']!r} to itself; a link needs two different clusters")
    return Link(
        a=raw["a"], b=raw["b"],
        bandwidth_gbps=chk.number(raw["bandwidth_gbps"], f"{field}.bandwidth_gbps"),
        latency_ms=chk.number(raw["latency_ms"], f"{field}.latency_ms"),
        jitter_ms=chk.number(raw.get("jitter_ms", 0.0), f"{field}.jitter_ms", strict=False),
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
