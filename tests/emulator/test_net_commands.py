"""tc / ip / iptables / sysctl command generation (pure, no root)."""

from pathlib import Path

import pytest

from emulator.net import linkcmds as cmd
from emulator.net.layout import NetConfig, Shape, build_plan
from spiderflow.topology import load_topology, parse_topology

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def plan():
    return build_plan(load_topology(REPO / "topologies" / "default.yaml"), NetConfig(hosts_per_cluster=2))


def test_htb_with_bfifo_leaf_when_delay_is_elsewhere():
    shape = Shape(goodput_mbps=100.0, delay_ms=30.0, queue_bytes=500_000)
    wire_bps = round(100e6 * 1514 / 1448)
    assert cmd.tc_commands("w-x", shape, netem=False) == [
        ["tc", "qdisc", "replace", "dev", "w-x", "root", "handle", "1:", "htb", "default", "1"],
        ["tc", "class", "add", "dev", "w-x", "parent", "1:", "classid", "1:1", "htb",
         "rate", f"{wire_bps}bit", "ceil", f"{wire_bps}bit", "burst", "3028", "cburst", "3028",
         "quantum", "13069"],
        ["tc", "qdisc", "add", "dev", "w-x", "parent", "1:1", "handle", "10:", "bfifo", "limit", "500000"],
    ]


def test_htb_burst_and_quantum_scale_with_rate():
    assert cmd.htb_burst_bytes(10_000) == 125_000  # 0.1 ms at 10 Gbit/s
    assert cmd.htb_burst_bytes(1) == 2 * 1514  # never below two full-size packets
    assert cmd.htb_quantum_bytes(1) == 1514
    assert cmd.htb_quantum_bytes(100_000) == 200_000  # htb's own upper bound


def test_rates_above_one_gigabit_are_not_capped():
    shape = Shape(goodput_mbps=9000.0, delay_ms=1.0)
    rate = cmd.tc_commands("w-x", shape, netem=False)[1]
    assert rate[rate.index("rate") + 1] == f"{round(9000e6 * 1514 / 1448)}bit"


def test_netem_leaf_carries_delay_jitter_loss():
    shape = Shape(goodput_mbps=50.0, delay_ms=33.5, jitter_ms=2.0, loss_pct=0.1, queue_bytes=300_000)
    leaf = cmd.tc_commands("w-x", shape, netem=True)[-1]
    assert leaf[:9] == ["tc", "qdisc", "add", "dev", "w-x", "parent", "1:1", "handle", "10:"]
    assert leaf[9:18] == ["netem", "delay", "33.5ms", "2ms", "distribution", "normal", "loss", "0.1%", "limit"]
    assert int(leaf[18]) >= cmd.netem_limit_packets(shape) >= 1000


def test_netem_without_delay_falls_back_to_bfifo():
    leaf = cmd.tc_commands("eth0", Shape(goodput_mbps=10.0, delay_ms=0.0), netem=True)[-1]
    assert "netem" not in leaf and "bfifo" in leaf


def test_nfqueue_rules_one_queue_per_wan_port(plan):
    router = plan.cluster("oregon").router
    assert cmd.nfqueue_commands(router.wan) == [
        ["iptables", "-w", "-A", "FORWARD", "-o", "w-virginia", "-j", "NFQUEUE", "--queue-num", "0"],
        ["iptables", "-w", "-A", "FORWARD", "-o", "w-tokyo", "-j", "NFQUEUE", "--queue-num", "1"],
    ]


def test_host_commands(plan):
    host = plan.cluster("virginia").hosts[1]
    assert cmd.host_commands(host) == [
        ["ip", "link", "set", "dev", "eth0", "gso_max_size", "16384"],  # see HOST_GSO_MAX_BYTES
        ["ip", "link", "set", "lo", "up"],
        ["ip", "addr", "add", "10.1.1.11/24", "dev", "eth0"],
        ["ip", "link", "set", "eth0", "up"],
        ["ip", "route", "add", "default", "via", "10.1.1.1", "dev", "eth0"],
    ]


def test_router_commands_bridge_addresses_routes(plan):
    cluster = plan.cluster("oregon")
    cmds = cmd.router_commands(cluster)
    assert ["ip", "link", "add", "lan", "type", "bridge", "stp_state", "0"] in cmds
    assert ["ip", "link", "set", "h1", "master", "lan"] in cmds
    assert ["ip", "addr", "add", "10.1.0.1/24", "dev", "lan"] in cmds
    assert ["ip", "addr", "add", "10.0.0.1/30", "dev", "w-virginia"] in cmds
    # london is two hops away (via virginia)
    assert ["ip", "route", "add", "10.1.2.0/24", "via", "10.0.0.2", "dev", "w-virginia"] in cmds
    assert not any(c[:2] == ["ip", "rule"] for c in cmds)


def test_policy_routes_get_a_table_and_a_rule():
    topo = parse_topology({
        "name": "p", "routing": "widest",
        "clusters": [{"name": n, "gpu": "a100-80gb", "nodes": 1, "gpus_per_node": 8} for n in "abcd"],
        "links": [{"a": "a", "b": "b", "bandwidth_gbps": 5, "latency_ms": 1},
                  {"a": "b", "b": "c", "bandwidth_gbps": 9, "latency_ms": 1},
                  {"a": "c", "b": "d", "bandwidth_gbps": 9, "latency_ms": 1},
                  {"a": "b", "b": "d", "bandwidth_gbps": 6, "latency_ms": 1}]})
    cmds = cmd.router_commands(build_plan(topo, NetConfig()).cluster("b"))
    a_lan, d_lan = "10.1.0.0/24", "10.1.3.0/24"
    assert ["ip", "route", "add", d_lan, "via", "10.0.0.14", "dev", "w-d", "table", "100"] in cmds
    assert ["ip", "rule", "add", "from", a_lan, "table", "100", "priority", "100"] in cmds


def test_sysctls_size_tcp_buffers_and_enable_forwarding_on_routers():
    host = cmd.namespace_sysctls(8_000_000, router=False)
    router = cmd.namespace_sysctls(8_000_000, router=True)
    assert host["net.ipv4.tcp_rmem"] == "4096 131072 8000000"
    assert host["net.ipv4.tcp_wmem"] == "4096 16384 8000000"
    assert "net.ipv4.ip_forward" not in host and router["net.ipv4.ip_forward"] == "1"
    assert cmd.sysctl_command({"a.b": "1", "c": "x y"}) == ["sysctl", "-q", "-w", "a.b=1", "c=x y"]


def test_pin_routes_a_host_over_one_port(plan):
    port = plan.port("oregon", "virginia")
    assert cmd.pin_commands("10.1.1.10", port) == [
        ["ip", "route", "replace", "10.1.1.10/32", "via", "10.0.0.2", "dev", "w-virginia"]]


@pytest.mark.parametrize("netem", [False, True])
def test_every_command_is_an_argument_list_of_strings(plan, netem):
    per_node = cmd.plan_commands(plan, netem=netem)
    assert set(per_node) == {n for c in plan.clusters for n in [c.router.name] + [h.name for h in c.hosts]}
    for commands in per_node.values():
        for argv in commands:
            assert isinstance(argv, list) and argv and all(isinstance(a, str) and a for a in argv)
            assert argv[0] in {"ip", "tc", "iptables", "sysctl"}
    has_nfqueue = any("NFQUEUE" in argv for cmds in per_node.values() for argv in cmds)
    has_netem = any("netem" in argv for cmds in per_node.values() for argv in cmds)
    assert has_nfqueue == (not netem) and has_netem == netem


def test_number_formatting():
    assert cmd.fmt(33.5) == "33.5" and cmd.fmt(4.0) == "4" and cmd.fmt(0.005) == "0.005"
    assert cmd.fmt(0) == "0" and "e" not in cmd.fmt(1e-7)
