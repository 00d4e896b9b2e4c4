"""The delay stage's logic and its netlink messages (pure, no root)."""

import json
import signal
import socket
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from emulator.net import nfq
from emulator.net.delayd import DelayStage, QueueSpec, StallLog

REPO = Path(__file__).resolve().parents[2]


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
    s.on_packets([(0, 1, 0.0), (0, 2, 0.0)], now=10.000)
    s.on_packets([(0, 3, 0.0)], now=10.005)
    assert s.release_due(10.029) == pytest.approx(10.030)
    assert sock.verdicts == []
    assert s.release_due(10.030) == pytest.approx(10.035)
    assert sock.verdicts == [(0, 2, nfq.NF_ACCEPT, True)]  # accepts ids 1 and 2 at once
    assert s.release_due(10.040) == float("inf")
    assert sock.verdicts[-1] == (0, 3, nfq.NF_ACCEPT, True)


def test_queues_are_independent():
    s, sock = stage(QueueSpec(num=0, delay_ms=10.0), QueueSpec(num=1, delay_ms=50.0))
    s.on_packets([(0, 7, 0.0), (1, 7, 0.0)], now=0.0)
    s.release_due(0.020)
    assert sock.verdicts == [(0, 7, nfq.NF_ACCEPT, True)]
    s.release_due(0.050)
    assert sock.verdicts[-1] == (1, 7, nfq.NF_ACCEPT, True)


def test_jitter_never_reorders_and_keeps_the_mean_delay():
    s, _sock = stage(QueueSpec(num=0, delay_ms=20.0, jitter_ms=5.0))
    arrivals = [i * 0.001 for i in range(20000)]  # 1 packet per ms for 20 s
    for i, t in enumerate(arrivals):
        s.on_packets([(0, i + 1, 0.0)], now=t)
    delays = [due - t for (due, _pid), t in zip(s.queues[0].pending, arrivals)]
    dues = [due for due, _pid in s.queues[0].pending]
    assert dues == sorted(dues)
    mean = sum(delays) / len(delays)
    std = (sum((d - mean) ** 2 for d in delays) / len(delays)) ** 0.5
    assert mean == pytest.approx(0.020, abs=0.002)
    assert std == pytest.approx(0.005, rel=0.4)


def test_loss_drops_about_the_configured_share_at_once():
    s, sock = stage(QueueSpec(num=0, delay_ms=5.0, loss_pct=10.0))
    s.on_packets([(0, i, 0.0) for i in range(1, 5001)], now=0.0)
    drops = [v for v in sock.verdicts if v[2] == nfq.NF_DROP]
    assert all(not batch for *_x, batch in drops)
    assert 400 < len(drops) < 600
    assert len(s.queues[0].pending) == 5000 - len(drops)


def test_unknown_queue_is_passed_immediately():
    s, sock = stage(QueueSpec(num=0, delay_ms=5.0))
    s.on_packets([(3, 9, 0.0)], now=0.0)
    assert sock.verdicts == [(3, 9, nfq.NF_ACCEPT, False)]


def test_stats_report_lateness():
    s, _sock = stage(QueueSpec(num=0, delay_ms=10.0))
    s.on_packets([(0, 1, 0.0), (0, 2, 0.0)], now=0.0)
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
    assert nfq.parse_packets(data, len(data)) == [(1, 42, 0.0), (0, 43, 0.0)]
    assert nfq.parse_packets(data, 10) == []


def test_parse_packets_reads_the_kernels_arrival_stamp():
    stamp = struct.pack("=HH", 4 + 16, nfq.NFQA_TIMESTAMP) + struct.pack("!QQ", 1_700_000_000, 250_000)
    data = packet_message(2, 7, stamp)
    assert nfq.parse_packets(data, len(data)) == [(2, 7, pytest.approx(1_700_000_000.25))]


def test_a_stamped_packet_is_held_from_its_arrival_not_from_its_read():
    s, _sock = stage(QueueSpec(num=0, delay_ms=20.0))
    # read at 10.030 (wall 1000.030): it arrived 25 ms earlier while the loop was stalled
    s.on_packets([(0, 1, 1000.005)], now=10.030, real_now=1000.030)
    assert s.queues[0].pending[0][0] == pytest.approx(10.025)  # not 10.050
    s.on_packets([(0, 2, 0.0)], now=10.031, real_now=1000.031)  # no stamp: from its read
    s.on_packets([(0, 3, 990.0)], now=10.032, real_now=1000.032)  # 10 s old: a clock step, not a wait
    assert [due for due, _pid in s.queues[0].pending][1:] == [pytest.approx(10.051), pytest.approx(10.052)]
    st = s.stats()[0]
    assert st["stamped"] == 1 and st["max_read_wait_ms"] == pytest.approx(25.0)


def test_parse_ack():
    ack = struct.pack("=IHHII", 36, nfq.NLMSG_ERROR, 0, 1, 0) + struct.pack("=i", -1) + b"\0" * 16
    assert nfq.parse_ack(ack) == 1
    assert nfq.parse_ack(struct.pack("=IHHII", 36, 0x300, 0, 1, 0) + b"\0" * 20) == -1


def test_lateness_quantiles():
    s, _sock = stage(QueueSpec(num=0, delay_ms=10.0))
    s.on_packets([(0, i, 0.0) for i in range(1, 101)], now=0.0)
    s.release_due(0.01012)  # all 0.12 ms late
    st = s.stats()[0]
    assert st["p50_late_ms"] == pytest.approx(0.15) and st["p99.9_late_ms"] == pytest.approx(0.15)


# --- the host's stalls, apart from the stage's own lateness ------------------------

def test_stall_log_charges_only_the_stall_time_after_a_moment():
    log = StallLog()
    log.note(1.030, 0.030)  # [1.000, 1.030]
    log.note(2.010, 0.010)  # [2.000, 2.010]
    log.note(3.0, 0.00005)  # under STALL_MIN_S: not a stall
    assert log.count == 2 and log.max_s == pytest.approx(0.030)
    assert log.since(0.5) == pytest.approx(0.040)
    assert log.since(1.010) == pytest.approx(0.020 + 0.010)
    assert log.since(1.5) == pytest.approx(0.010)
    assert log.since(2.010) == 0.0
    log.forget_before(1.5)
    assert log.ends == [2.010] and log.since(1.5) == pytest.approx(0.010)


def test_a_packet_held_up_by_a_host_stall_is_not_the_stages_own_lateness():
    s, _sock = stage(QueueSpec(num=0, delay_ms=10.0))
    s.on_packets([(0, 1, 0.0)], now=0.0)  # due 0.010
    s.on_packets([(0, 2, 0.0)], now=0.032)  # due 0.042
    s.stalls.note(0.040, 0.035)  # the loop was off the CPU from 0.005 to 0.040
    s.release_due(0.0405)  # packet 1: 30.5 ms late, 30 of them the host's
    s.release_due(0.0450)  # packet 2: due after the stall, 3 ms late: the stage's own
    st = s.stats()[0]
    assert st["max_late_ms"] == pytest.approx(30.5)
    assert st["host_delayed"] == 1
    assert st["p50_own_late_ms"] == pytest.approx(0.55)  # packet 1: 0.5 ms, in the 0.50-0.55 bin
    assert st["max_own_late_ms"] == pytest.approx(3.0)
    assert st["stage_stalls"] == {"count": 1, "total_ms": pytest.approx(35.0), "max_ms": pytest.approx(35.0)}


def test_a_stall_that_ended_before_the_due_time_excuses_nothing():
    s, _sock = stage(QueueSpec(num=0, delay_ms=10.0))
    s.on_packets([(0, 1, 0.0)], now=0.0)
    s.stalls.note(0.005, 0.004)
    s.release_due(0.013)
    st = s.stats()[0]
    assert st["host_delayed"] == 0 and st["max_own_late_ms"] == pytest.approx(3.0)


# The real loop in a child process, stopped from outside (SIGSTOP) for 80 ms while packets were
# due: the stall is measured, and the packets it held are charged to it, not to the stage.
LOOP_CHILD = textwrap.dedent("""
    import json, os, signal, sys, time
    from emulator.net.delayd import DelayStage, QueueSpec

    class Idle:  # a socket that never has packets: the loop only releases
        def __init__(self):
            self.r, self.w = os.pipe()
        def fileno(self):
            return self.r
        def verdict(self, *a, **k):
            pass

    stage = DelayStage([QueueSpec(num=0, delay_ms=20.0)], Idle())
    t0 = time.monotonic()
    for i in range(1000):  # one packet due every 0.5 ms for 0.5 s
        stage.on_packets([(0, i + 1, 0.0)], now=t0 + i * 0.0005)
    signal.signal(signal.SIGTERM, lambda *_: setattr(stage, "stopping", True))
    print("ready", flush=True)
    stage.run()
    print(json.dumps(stage.stats()[0]), flush=True)
""")


def test_the_loop_measures_a_stall_and_charges_it_to_the_host():
    proc = subprocess.Popen([sys.executable, "-c", LOOP_CHILD], stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.15)
        proc.send_signal(signal.SIGSTOP)
        time.sleep(0.08)
        proc.send_signal(signal.SIGCONT)
        time.sleep(0.6)  # every packet due by now
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=10)
    finally:
        proc.kill()
    st = json.loads(out)
    assert st["stage_stalls"]["max_ms"] >= 70, st
    assert st["max_late_ms"] >= 60 and st["host_delayed"] >= 100, st  # ~160 packets fell due while stopped
    assert st["p99_own_late_ms"] < 2.0, st
