"""Network plan: names, addresses, shapes, routes (pure, no root)."""

import argparse
import ipaddress
from pathlib import Path

import pytest

from spiderflow.errors import EmulatorError
from emulator.net.layout import GOODPUT_TO_WIRE, NetConfig, build_plan, next_hops
from spiderflow.topology import load_topology, parse_topology
from spiderflow.topology.generate import generate_topology

REPO = Path(__file__).resolve().parents[2]
SHIPPED = [REPO / "topologies" / "default.yaml", REPO / "topologies" / "paper8.yaml"]


def walk(topo, main, policy, src, dst):
    """Follow the routers' forwarding decisions from src's LAN to dst's LAN."""
    hops, here = [src], src
    while here != dst:
        here = policy[here].get((src, dst), main[here][dst])
        hops.append(here)
        assert len(hops) <= len(topo.clusters), "routing loop"
    return tuple(hops)


def all_topologies():
    for path in SHIPPED:
        topo = load_topology(path)
        yield topo
        yield topo.with_routing("widest")
    for seed in range(3):
        topo = generate_topology(12, seed)
        yield topo
        yield topo.with_routing("widest")


@pytest.mark.parametrize("topo", list(all_topologies()), ids=lambda t: f"{t.name}-{t.routing}")
def test_forwarding_follows_topology_paths(topo):
    main, policy = next_hops(topo)
    for s in topo.names:
        for d in topo.names:
            if s != d:
                assert walk(topo, main, policy, s, d) == topo.path(s, d).clusters


def test_widest_routing_needs_and_gets_policy_routes():
    # b's own widest route to d is b-c-d (9 Gbit/s); a's is a-b-d (both ways are 5 wide,
    # b-d is shorter), so router b must send a's traffic to d directly: a policy route.
    topo = parse_topology({
        "name": "p", "routing": "widest",
        "clusters": [{"name": n, "gpu": "a100-80gb", "nodes": 1, "gpus_per_node": 8} for n in "abcd"],
        "links": [{"a": "a", "b": "b", "bandwidth_gbps": 5, "latency_ms": 1},
                  {"a": "b", "b": "c", "bandwidth_gbps": 9, "latency_ms": 1},
                  {"a": "c", "b": "d", "bandwidth_gbps": 9, "latency_ms": 1},
                  {"a": "b", "b": "d", "bandwidth_gbps": 6, "latency_ms": 1}]})
    main, policy = next_hops(topo)
    assert topo.path("b", "d").clusters == ("b", "c", "d")
    assert topo.path("a", "d").clusters == ("a", "b", "d")
    assert policy["b"] == {("a", "d"): "d"}
    for s in "abcd":
        for d in "abcd":
            if s != d:
                assert walk(topo, main, policy, s, d) == topo.path(s, d).clusters
    plan = build_plan(topo, NetConfig())
    for c in plan.clusters:
        for route in c.router.routes:
            assert (route.table is None) == (route.src is None)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_names_fit_linux_and_addresses_are_unique(path):
    plan = build_plan(load_topology(path), NetConfig(hosts_per_cluster=4))
    addresses = []
    for c in plan.clusters:
        net = ipaddress.IPv4Network(c.subnet)
        assert ipaddress.IPv4Address(c.router.lan_ip) in net
        for h in c.hosts:
            assert len(h.intf) <= 15 and len(h.port) <= 15
            assert ipaddress.IPv4Address(h.ip) in net and h.gateway == c.router.lan_ip
            addresses.append(h.ip)
        addresses.append(c.router.lan_ip)
        for port in c.router.wan:
            assert len(port.dev) <= 15
            assert ipaddress.IPv4Network(f"{port.ip}/30", strict=False) == \
                ipaddress.IPv4Network(f"{port.peer_ip}/30", strict=False)
            addresses.append(port.ip)
        assert len({p.queue for p in c.router.wan}) == len(c.router.wan)
    assert len(addresses) == len(set(addresses))


def test_longest_cluster_name_fits():
    topo = parse_topology({
        "name": "long",
        "clusters": [{"name": "abcdefgh", "gpu": "a100-80gb", "nodes": 1, "gpus_per_node": 8},
                     {"name": "zyxwvuts", "gpu": "a100-80gb", "nodes": 1, "gpus_per_node": 8}],
        "links": [{"a": "abcdefgh", "b": "zyxwvuts", "bandwidth_gbps": 1, "latency_ms": 5}]})
    plan = build_plan(topo, NetConfig(hosts_per_cluster=240))
    assert max(len(p.dev) for c in plan.clusters for p in c.router.wan) == len("w-abcdefgh")
    assert max(len(h.port) for c in plan.clusters for h in c.hosts) <= 15


def test_scale_divides_bandwidth_not_latency_and_caps_intra():
    topo = load_topology(SHIPPED[0])
    plan = build_plan(topo, NetConfig(scale=10, intra_cap_mbps=500))
    port = plan.port("oregon", "virginia")
    assert port.shape.goodput_mbps == pytest.approx(79.0)
    assert port.shape.wire_mbps == pytest.approx(79.0 * 1514 / 1448)
    assert GOODPUT_TO_WIRE == pytest.approx(1514 / 1448)
    assert port.shape.delay_ms == 33.5
    assert plan.cluster("oregon").intra.goodput_mbps == 500  # 200 Gbit/s / 10, capped
    assert plan.cluster("oregon").intra.delay_ms == topo.cluster("oregon").intra_cluster_latency_ms


@pytest.mark.parametrize("k", [2, 4, 8])
def test_dilation_divides_rates_multiplies_delays_and_keeps_buffers(k):
    topo = load_topology(SHIPPED[0])
    base = build_plan(topo, NetConfig(scale=10, intra_cap_mbps=500))
    slow = build_plan(topo, NetConfig(scale=10, intra_cap_mbps=500, dilation=k))
    for c0, ck in zip(base.clusters, slow.clusters):
        assert ck.intra.goodput_mbps == pytest.approx(c0.intra.goodput_mbps / k)  # the cap / K too
        assert ck.intra.delay_ms == pytest.approx(c0.intra.delay_ms * k)
        assert ck.tcp_max_bytes == c0.tcp_max_bytes
        for p0, pk in zip(c0.router.wan, ck.router.wan):
            assert pk.shape.goodput_mbps == pytest.approx(p0.shape.goodput_mbps / k)
            assert pk.shape.delay_ms == pytest.approx(p0.shape.delay_ms * k)
            assert pk.shape.queue_bytes == pytest.approx(p0.shape.queue_bytes, rel=1e-6)  # rate x delay


def test_router_queue_is_one_bdp_and_tcp_buffers_cover_four():
    topo = load_topology(SHIPPED[0])
    plan = build_plan(topo, NetConfig(scale=10))
    port = plan.port("tokyo", "london")  # 35 Mbit/s goodput, 115 ms one-way
    bdp = port.shape.wire_mbps * 1e6 / 8 * 0.230
    assert port.shape.queue_bytes == pytest.approx(bdp, rel=1e-6)
    assert plan.cluster("tokyo").tcp_max_bytes >= 4 * bdp


def test_queue_bdp_scales_every_wan_buffer_and_the_option_sets_it():
    """--queue-bdp Q: each WAN direction's buffer is Q bandwidth-delay products (what a bulk flow can keep
    queued ahead of a pipeline's transfers there); the parser takes it into the NetConfig."""
    from emulator.net import check

    topo = load_topology(SHIPPED[0])
    parser = argparse.ArgumentParser()
    check.add_network_arguments(parser)
    config = check.network_config(parser.parse_args(["--queue-bdp", "0.25", "--dilation", "1"]))
    assert config.queue_bdp == 0.25 and config.buffers_note() == ", WAN buffers 0.25 bandwidth-delay products"
    assert NetConfig().buffers_note() == ""  # the default goes unsaid, as before the option
    whole, quarter = build_plan(topo, NetConfig(scale=10)), build_plan(topo, config)
    for a, b in (("tokyo", "london"), ("oregon", "virginia")):
        assert quarter.port(a, b).shape.queue_bytes == pytest.approx(whole.port(a, b).shape.queue_bytes / 4, abs=1)
        assert quarter.port(a, b).shape.wire_mbps == whole.port(a, b).shape.wire_mbps


def test_routes_cover_every_remote_cluster():
    plan = build_plan(load_topology(SHIPPED[1]), NetConfig())
    for c in plan.clusters:
        dsts = {r.dst for r in c.router.routes if r.table is None}
        assert dsts == {o.subnet for o in plan.clusters if o.name != c.name}


@pytest.mark.parametrize("kwargs, field", [
    ({"hosts_per_cluster": 0}, "hosts_per_cluster"),
    ({"hosts_per_cluster": 2.5}, "hosts_per_cluster"),
    ({"scale": 0}, "scale"),
    ({"intra_cap_mbps": -1}, "intra_cap_mbps"),
    ({"delay": "tbf"}, "delay"),
    ({"queue_bdp": 0}, "queue_bdp"),
    ({"dilation": 0.5}, "dilation"),
    ({"dilation": float("nan")}, "dilation"),
    ({"dilation": True}, "dilation"),
])
def test_config_validation_names_the_field(kwargs, field):
    with pytest.raises(EmulatorError, match=field):
        NetConfig(**kwargs)


def test_a_links_queue_holds_the_bdp_of_the_longest_route_across_it():
    """Line a - b - c: flows a <-> c cross b - c with the a - c round trip, so b - c's buffer is its
    rate x that round trip (a buffer of its own 2 x 5 ms dropped a -> c bursts, emulator-run.md)."""
    from emulator.net.layout import longest_rtt_ms

    topo = parse_topology({"name": "line", "clusters": [
        {"name": n, "gpu": "a100-80gb", "nodes": 1, "gpus_per_node": 8} for n in "abc"],
        "links": [{"a": "a", "b": "b", "bandwidth_gbps": 1.0, "latency_ms": 40.0},
                  {"a": "b", "b": "c", "bandwidth_gbps": 1.0, "latency_ms": 5.0}]})
    assert longest_rtt_ms(topo) == {("a", "b"): 90.0, ("b", "c"): 90.0}
    plan = build_plan(topo, NetConfig(scale=10, dilation=2))
    port = plan.port("b", "c")
    assert port.shape.queue_bytes == pytest.approx(port.shape.wire_mbps * 1e6 / 8 * 0.090 * 2, rel=1e-6)
    assert port.shape.delay_ms == pytest.approx(10.0)  # its own delay, x the dilation
