"""What a live WAN change runs on the routers (emulator/net/reshape.py): pure, no root."""

import dataclasses

import pytest

from emulator.net.delayd import DelayStage, QueueSpec, _apply_control, read_control, write_control
from emulator.net.layout import NetConfig, build_plan
from emulator.net.reshape import plan_changes
from spiderflow.topology import parse_topology

TRIANGLE = parse_topology({"name": "tri", "clusters": [
    {"name": n, "gpu": "a100-80gb", "nodes": 1, "gpus_per_node": 8} for n in ("east", "west", "north")],
    "links": [{"a": "east", "b": "west", "bandwidth_gbps": 0.6, "latency_ms": 20},
              {"a": "east", "b": "north", "bandwidth_gbps": 0.6, "latency_ms": 30},
              {"a": "north", "b": "west", "bandwidth_gbps": 0.6, "latency_ms": 30}]})
CONFIG = NetConfig(hosts_per_cluster=1)


def with_link(topo, key, **figures):
    return dataclasses.replace(topo, links=tuple(dataclasses.replace(l, **figures) if l.key == key else l
                                                 for l in topo.links))


def by_router(changes):
    return {c.router: c for c in changes}


def test_no_change_runs_nothing():
    plan = build_plan(TRIANGLE, CONFIG)
    assert plan_changes(plan, build_plan(TRIANGLE, CONFIG), netem=False) == []


def test_a_bandwidth_change_changes_the_htb_class_and_buffer_on_both_ends_only():
    old = build_plan(TRIANGLE, CONFIG)
    new = build_plan(with_link(TRIANGLE, ("east", "west"), bandwidth_gbps=0.3), CONFIG)
    changes = by_router(plan_changes(old, new, netem=False))
    assert set(changes) == {"east-gw", "west-gw"}
    east = [list(c) for c in changes["east-gw"].commands]
    rate = int(round(new.port("east", "west").shape.wire_mbps * 1e6))
    assert east[0][:8] == ["tc", "class", "change", "dev", "w-west", "parent", "1:", "classid"]
    assert east[0][east[0].index("rate") + 1] == f"{rate}bit" and rate == pytest.approx(31.37e6, rel=0.01)
    # the router buffer is a bandwidth-delay product: half the rate, half the bytes
    assert east[1] == ["tc", "qdisc", "change", "dev", "w-west", "parent", "1:1", "handle", "10:", "bfifo",
                       "limit", str(new.port("east", "west").shape.queue_bytes)]
    assert len(east) == 2 and not changes["east-gw"].delays


def test_a_latency_change_goes_to_the_delay_daemon_or_to_netem():
    old = build_plan(TRIANGLE, CONFIG)
    new = build_plan(with_link(TRIANGLE, ("east", "north"), latency_ms=45), CONFIG)
    daemon = by_router(plan_changes(old, new, netem=False))
    port = new.port("east", "north")
    assert daemon["east-gw"].delays == (QueueSpec(num=port.queue, delay_ms=45.0),)
    assert daemon["north-gw"].delays == (QueueSpec(num=new.port("north", "east").queue, delay_ms=45.0),)
    netem = by_router(plan_changes(old, new, netem=True))
    assert not netem["east-gw"].delays
    leaf = [c for c in netem["east-gw"].commands if c[:3] == ("tc", "qdisc", "change")]
    assert leaf and leaf[0][leaf[0].index("delay") + 1] == "45ms"


def test_a_link_down_goes_down_first_and_routes_go_round_it_and_come_back():
    from spiderflow.simulate.changes import DEAD_BANDWIDTH_GBPS, DEAD_LATENCY_MS

    old = build_plan(TRIANGLE, CONFIG)
    dead = with_link(TRIANGLE, ("east", "west"), bandwidth_gbps=DEAD_BANDWIDTH_GBPS, latency_ms=DEAD_LATENCY_MS)
    down = build_plan(TRIANGLE, CONFIG, routing=dead)
    key = frozenset({("east", "west")})
    changes = by_router(plan_changes(old, down, netem=False, down=key))
    east = [list(c) for c in changes["east-gw"].commands]
    assert east[0] == ["ip", "link", "set", "dev", "w-west", "down"]
    west_subnet = down.cluster("west").subnet
    via_north = down.port("north", "east").ip
    assert ["ip", "route", "replace", west_subnet, "via", via_north, "dev", "w-north"] in east
    assert changes["west-gw"].commands[0] == ("ip", "link", "set", "dev", "w-east", "down")
    assert "north-gw" not in changes  # its routes never used east-west
    back = by_router(plan_changes(down, old, netem=False, down=frozenset(), was_down=key))
    east = [list(c) for c in back["east-gw"].commands]
    assert east[0] == ["ip", "link", "set", "dev", "w-west", "up"]
    assert ["ip", "route", "replace", west_subnet, "via", old.port("west", "east").ip, "dev", "w-west"] in east


def test_delay_stage_takes_new_delays_for_packets_from_then_on(tmp_path):
    class Sock:
        def __init__(self):
            self.verdicts = []

        def verdict(self, queue, packet_id, verdict, *, batch):
            self.verdicts.append((queue, packet_id))

    sock = Sock()
    stage = DelayStage([QueueSpec(num=0, delay_ms=30.0), QueueSpec(num=1, delay_ms=5.0)], sock)
    stage.on_packets([(0, 1, 0.0)], now=0.0)
    control = str(tmp_path / "d.ctl")
    write_control(control, 7, [QueueSpec(num=0, delay_ms=10.0)])
    assert read_control(control) == ("7", [QueueSpec(num=0, delay_ms=10.0)])
    _apply_control(control, stage)
    seq, when = (tmp_path / "d.ctl.ack").read_text().split()
    assert seq == "7" and float(when) > 0
    stage.on_packets([(0, 2, 0.0)], now=0.001)
    assert stage.release_due(0.0115) == pytest.approx(0.030)  # packet 2 (due 0.011) waits behind packet 1
    assert sock.verdicts == []
    stage.release_due(0.030)
    assert sock.verdicts == [(0, 2)]  # both released together, in order
    assert stage.queues[1].spec.delay_ms == 5.0  # the other queue untouched
    write_control(control, 8, [QueueSpec(num=5, delay_ms=1.0)])
    _apply_control(control, stage)
    assert (tmp_path / "d.ctl.ack").read_text().startswith("error no queue 5")
