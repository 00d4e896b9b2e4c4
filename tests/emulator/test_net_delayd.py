"""The delay stage's logic and its netlink messages (pure, no root)."""

import socket
import struct

import pytest

from emulator.net import nfq
from emulator.net.delayd import DelayStage, QueueSpec


class FakeSocket:
    def __init__(self):
        self.verdicts = []  # (queue, id, verdict, batch)

    def verdict(self, queue, packet_id, verdict, *, batch):
        self.verdicts.append((queue, packet_id, verdict, batch))


def stage(*specs, seed=1):
    sock = FakeSocket()
    return DelayStage(list(specs), sock, seed=seed), sock


def test_packets_released_after_delay_in_one_batch_verdict():
    s, sock = stage(QueueSpec(num=0, delay_ms=30.0))
    s.on_packets([(0, 1), (0, 2)], now=10.000)
    s.on_packets([(0, 3)], now=10.005)
    assert s.release_due(10.029) == pytest.approx(10.030)
    assert sock.verdicts == []
    assert s.release_due(10.030) == pytest.approx(10.035)
    assert sock.verdicts == [(0, 2, nfq.NF_ACCEPT, True)]  # accepts ids 1 and 2 at once
    assert s.release_due(10.040) == float("inf")
    assert sock.verdicts[-1] == (0, 3, nfq.NF_ACCEPT, True)


def test_queues_are_independent():
    s, sock = stage(QueueSpec(num=0, delay_ms=10.0), QueueSpec(num=1, delay_ms=50.0))
    s.on_packets([(0, 7), (1, 7)], now=0.0)
    s.release_due(0.020)
    assert sock.verdicts == [(0, 7, nfq.NF_ACCEPT, True)]
    s.release_due(0.050)
    assert sock.verdicts[-1] == (1, 7, nfq.NF_ACCEPT, True)


def test_jitter_never_reorders_and_keeps_the_mean_delay():
    s, _sock = stage(QueueSpec(num=0, delay_ms=20.0, jitter_ms=5.0))
    arrivals = [i * 0.001 for i in range(20000)]  # 1 packet per ms for 20 s
    for i, t in enumerate(arrivals):
        s.on_packets([(0, i + 1)], now=t)
    delays = [due - t for (due, _pid), t in zip(s.queues[0].pending, arrivals)]
    dues = [due for due, _pid in s.queues[0].pending]
    assert dues == sorted(dues)
    mean = sum(delays) / len(delays)
    std = (sum((d - mean) ** 2 for d in delays) / len(delays)) ** 0.5
    assert mean == pytest.approx(0.020, abs=0.002)
    assert std == pytest.approx(0.005, rel=0.4)


def test_loss_drops_about_the_configured_share_at_once():
    s, sock = stage(QueueSpec(num=0, delay_ms=5.0, loss_pct=10.0))
    s.on_packets([(0, i) for i in range(1, 5001)], now=0.0)
    drops = [v for v in sock.verdicts if v[2] == nfq.NF_DROP]
    assert all(not batch for *_x, batch in drops)
    assert 400 < len(drops) < 600
    assert len(s.queues[0].pending) == 5000 - len(drops)


def test_unknown_queue_is_passed_immediately():
    s, sock = stage(QueueSpec(num=0, delay_ms=5.0))
    s.on_packets([(3, 9)], now=0.0)
    assert sock.verdicts == [(3, 9, nfq.NF_ACCEPT, False)]


def test_stats_report_lateness():
    s, _sock = stage(QueueSpec(num=0, delay_ms=10.0))
    s.on_packets([(0, 1), (0, 2)], now=0.0)
    s.release_due(0.0115)  # 1.5 ms late
    st = s.stats()[0]
    assert st["packets"] == 2 and st["dropped"] == 0
    assert st["max_late_ms"] == pytest.approx(1.5)
    assert st["late_over_ms"]["1"] == 2 and st["late_over_ms"]["2"] == 0


@pytest.mark.parametrize("text, expected", [
    ("0:33.5", QueueSpec(num=0, delay_ms=33.5)),
    ("2:5:1:0.5", QueueSpec(num=2, delay_ms=5.0, jitter_ms=1.0, loss_pct=0.5)),
])
def test_queue_spec_round_trips(text, expected):
    assert QueueSpec.parse(text) == expected
    assert QueueSpec.parse(expected.arg()) == expected


@pytest.mark.parametrize("text", ["0", "0:-1", "0:1:2:100", "a:1"])
def test_queue_spec_rejects_bad_values(text):
    with pytest.raises(ValueError):
        QueueSpec.parse(text)


# --- netlink encoding ------------------------------------------------------------

def test_verdict_batch_message_layout():
    msg = nfq.verdict_message(5, 1234, nfq.NF_ACCEPT, batch=True)
    length, kind, flags, _seq, _pid = struct.unpack_from("=IHHII", msg)
    assert length == len(msg) == 16 + 4 + 12
    assert kind == (3 << 8) | nfq.NFQNL_MSG_VERDICT_BATCH and flags == nfq.NLM_F_REQUEST
    family, version, res_id = struct.unpack_from("!BBH", msg, 16)
    assert (family, version, res_id) == (socket.AF_UNSPEC, 0, 5)
    alen, atype = struct.unpack_from("=HH", msg, 20)
    assert (alen, atype) == (12, nfq.NFQA_VERDICT_HDR)
    assert struct.unpack_from("!II", msg, 24) == (nfq.NF_ACCEPT, 1234)


def test_config_messages_bind_copy_meta_and_gso():
    msgs = nfq.config_messages(2, maxlen=4096, gso=True, seq=10)
    assert len(msgs) == 3
    assert all(struct.unpack_from("=IHHII", m)[2] == nfq.NLM_F_REQUEST | nfq.NLM_F_ACK for m in msgs)
    assert [struct.unpack_from("=IHHII", m)[3] for m in msgs] == [10, 11, 12]
    params = msgs[1]
    # NFQA_CFG_PARAMS: copy_range 0, COPY_META (5 bytes, padded to 8) then QUEUE_MAXLEN 4096
    assert struct.unpack_from("=HH", params, 20) == (9, nfq.NFQA_CFG_PARAMS)
    assert struct.unpack_from("!IB", params, 24) == (0, nfq.NFQNL_COPY_META)
    assert struct.unpack_from("=HH", params, 32) == (8, nfq.NFQA_CFG_QUEUE_MAXLEN)
    assert struct.unpack_from("!I", params, 36) == (4096,)
    assert len(nfq.config_messages(2, maxlen=1, gso=False, seq=0)) == 2


def packet_message(queue, packet_id, extra_attrs=b""):
    hdr = struct.pack("!IHB", packet_id, 0x0800, 2) + b"\0"  # packed 7 bytes + pad
    attr = struct.pack("=HH", 4 + 7, nfq.NFQA_PACKET_HDR) + hdr
    body = struct.pack("!BBH", socket.AF_INET, 0, queue) + extra_attrs + attr
    return struct.pack("=IHHII", 16 + len(body), (3 << 8) | nfq.NFQNL_MSG_PACKET, 0, 0, 0) + body


def test_parse_packets_finds_queue_and_id_after_other_attributes():
    mark = struct.pack("=HH", 8, 3) + struct.pack("!I", 7)  # NFQA_MARK first
    data = packet_message(1, 42, mark) + packet_message(0, 43)
    assert nfq.parse_packets(data, len(data)) == [(1, 42), (0, 43)]
    assert nfq.parse_packets(data, 10) == []


def test_parse_ack():
    ack = struct.pack("=IHHII", 36, nfq.NLMSG_ERROR, 0, 1, 0) + struct.pack("=i", -1) + b"\0" * 16
    assert nfq.parse_ack(ack) == 1
    assert nfq.parse_ack(struct.pack("=IHHII", 36, 0x300, 0, 1, 0) + b"\0" * 20) == -1


def test_lateness_quantiles():
    s, _sock = stage(QueueSpec(num=0, delay_ms=10.0))
    s.on_packets([(0, i) for i in range(1, 101)], now=0.0)
    s.release_due(0.01012)  # all 0.12 ms late
    st = s.stats()[0]
    assert st["p50_late_ms"] == pytest.approx(0.15) and st["p99.9_late_ms"] == pytest.approx(0.15)
