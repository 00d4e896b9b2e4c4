"""Topology loading, validation messages, routing and generation."""

import pytest
import yaml

from spiderflow.errors import ConfigError
from spiderflow.topology import load_topology, parse_topology
from spiderflow.topology.generate import generate_topology, topology_to_yaml

from .conftest import REPO, line_topology

GOOD = """
name: t
clusters:
  - {name: a, gpu: a100-80gb, nodes: 1, gpus_per_node: 8}
  - {name: b, gpu: h100, nodes: 2, gpus_per_node: 8}
links:
  - {a: a, b: b, bandwidth_gbps: 1.0, latency_ms: 10}
"""


def test_shipped_topologies_load():
    for name, clusters, links in (("default", 4, 4), ("paper8", 8, 9)):
        topo = load_topology(REPO / "topologies" / f"{name}.yaml")
        assert (len(topo.clusters), len(topo.links)) == (clusters, links)
        assert topo.graph.number_of_edges() == links


def test_defaults_come_from_gpu_profile(write_yaml):
    topo = load_topology(write_yaml(GOOD))
    b = topo.cluster("b")
    assert b.total_gpus == 16
    assert b.intra_node_bandwidth_gbps == 3600.0  # H100 NVLink 450 GB/s per direction
    assert b.intra_cluster_bandwidth_gbps == 400.0


@pytest.mark.parametrize("edit, message", [
    (lambda d: d["links"][0].update(bandwidth_gbps=-1),
     "links[0].bandwidth_gbps must be > 0 (got -1)"),
    (lambda d: d["links"][0].update(latency_ms="ten"), "links[0].latency_ms must be a number (got 'ten')"),
    (lambda d: d["links"][0].update(latency_ms=True), "links[0].latency_ms must be a number (got True)"),
    (lambda d: d["links"][0].update(colour="red"), "links[0].colour is not a known key"),
    (lambda d: d.update(extra=1), "extra is not a known key"),
    (lambda d: d["clusters"][1].update(name="a"), "clusters[1].name duplicates clusters[0]"),
    (lambda d: d["links"][0].update(b="zz"), "links[0].b names no cluster (got 'zz')"),
    (lambda d: d["links"][0].update(b="a"), "links[0] joins 'a' to itself"),
    (lambda d: d["links"].append({"a": "b", "b": "a", "bandwidth_gbps": 2, "latency_ms": 1}),
     "links[1] duplicates links[0] (b-a)"),
    (lambda d: d["clusters"][0].update(nodes=0), "clusters[0].nodes must be > 0 (got 0)"),
    (lambda d: d["clusters"][0].update(nodes=1.5), "clusters[0].nodes must be an integer (got 1.5)"),
    (lambda d: d["clusters"][0].update(gpu="tpu"), "clusters[0].gpu must be one of"),
    (lambda d: d["clusters"][0].update(name="Frankfurt-1"), "clusters[0].name must be 1-8 characters"),
    (lambda d: d["clusters"][0].update(name="frankfurt"), "clusters[0].name must be 1-8 characters"),
    (lambda d: d["clusters"][0].pop("gpu"), "clusters[0].gpu is missing"),
    (lambda d: d["links"][0].update(loss_pct=100), "links[0].loss_pct must be < 100 (got 100)"),
    (lambda d: d["links"][0].update(jitter_ms=-1), "links[0].jitter_ms must be >= 0 (got -1)"),
    (lambda d: (d["clusters"].append({"name": "c", "gpu": "v100", "nodes": 1, "gpus_per_node": 8})),
     "links leave the cluster graph disconnected (a,b | c)"),
    (lambda d: d.update(routing="fastest"), "routing must be one of shortest, widest (got 'fastest')"),
    (lambda d: d.update(clusters=[]), "clusters must be a non-empty list"),
])
def test_loader_errors_name_file_field_value(write_yaml, edit, message):
    data = yaml.safe_load(GOOD)
    edit(data)
    path = write_yaml(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as err:
        load_topology(path)
    text = str(err.value)
    assert text.startswith(f"{path}: ")
    assert message in text
    assert "\n" not in text


def test_yaml_syntax_and_missing_file(write_yaml, tmp_path):
    with pytest.raises(ConfigError, match=r"line 2: is not valid YAML"):
        load_topology(write_yaml("a: [1,\nb: }"))
    with pytest.raises(ConfigError, match="no such topology file; give a path or a shipped name"):
        load_topology(tmp_path / "nope.yaml")


def test_multi_hop_route_sums_latency_and_takes_bottleneck():
    topo = line_topology(bw=(1.0, 2.0), lat=(10.0, 20.0))
    path = topo.path("a", "c")
    assert path.clusters == ("a", "b", "c")
    assert path.latency_ms == 30.0
    assert path.bandwidth_gbps == 1.0
    assert topo.path("c", "a").clusters == ("c", "b", "a")


def test_routing_rule_shortest_vs_widest():
    # a-c direct: thin but short; a-b-c: wide but long
    data = {"name": "tri",
            "clusters": [{"name": n, "gpu": "v100", "nodes": 1, "gpus_per_node": 8} for n in "abc"],
            "links": [{"a": "a", "b": "c", "bandwidth_gbps": 0.5, "latency_ms": 5},
                      {"a": "a", "b": "b", "bandwidth_gbps": 10, "latency_ms": 10},
                      {"a": "b", "b": "c", "bandwidth_gbps": 8, "latency_ms": 10}]}
    short = parse_topology(data)
    assert short.path("a", "c").clusters == ("a", "c")
    wide = parse_topology(data, routing="widest")
    assert wide.path("a", "c").clusters == ("a", "b", "c")
    assert wide.path("a", "c").bandwidth_gbps == 8


def test_generator_reproducible_connected_sparse():
    t1, t2 = generate_topology(64, seed=3), generate_topology(64, seed=3)
    assert topology_to_yaml(t1) == topology_to_yaml(t2)
    assert topology_to_yaml(generate_topology(64, seed=4)) != topology_to_yaml(t1)
    reloaded = parse_topology(yaml.safe_load(topology_to_yaml(t1)))  # passes validation: connected
    assert len(reloaded.links) < 64 * 63 / 2 / 4  # sparse
    for link in reloaded.links:
        assert 0.3 <= link.bandwidth_gbps <= 10.0
        assert link.latency_ms >= 1.0
