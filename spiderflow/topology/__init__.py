"""Cluster-graph topologies: data model, YAML loading, routing, generation."""

from spiderflow.topology.load import load_topology, parse_topology
from spiderflow.topology.model import ROUTING_RULES, Cluster, Link, Path, Topology

__all__ = ["Cluster", "Link", "Path", "Topology", "ROUTING_RULES", "load_topology", "parse_topology"]
