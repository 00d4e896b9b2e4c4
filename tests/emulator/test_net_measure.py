"""Measurement helpers, the tolerance rule and the check table (no root)."""

import json
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from emulator.net.check import format_table
from spiderflow.errors import EmulatorError
from emulator.net.measure import Result, receiver_goodput_mbps, targets
from emulator.net.layout import NetConfig, build_plan
from emulator.net.tolerance import bandwidth_ok, delay_ok, problems
from spiderflow.topology import load_topology

REPO = Path(__file__).resolve().parents[2]


def fake_emu(k=2, mechanism="nfqueue"):
    plan = build_plan(load_topology(REPO / "topologies" / "default.yaml"), NetConfig(hosts_per_cluster=k))
    return SimpleNamespace(plan=plan, mechanism=mechanism)


def test_tolerance_boundaries():
    assert bandwidth_ok(100, 90) and bandwidth_ok(100, 110) and not bandwidth_ok(100, 89.9)
    assert delay_ok(33.5, 35.5) and delay_ok(33.5, 31.5) and not delay_ok(33.5, 35.6)
    assert problems(100, 100, 10, 10) == []
    assert len(problems(100, 50, 10, 20)) == 2


def test_targets_cover_both_directions_of_every_link_and_one_pair_per_cluster():
    emu = fake_emu()
    ts = targets(emu)
    wan = [t for t in ts if t.kind == "wan"]
    assert {(t.a, t.b) for t in wan} == {(l.a, l.b) for l in emu.plan.links} | {(l.b, l.a) for l in emu.plan.links}
    assert all(t.src.startswith(t.a + "-") and t.dst.startswith(t.b + "-") for t in ts)
    ov = next(t for t in wan if (t.a, t.b) == ("oregon", "virginia"))
    assert (ov.configured_mbps, ov.configured_delay_ms, ov.mechanism) == (pytest.approx(79.0), 33.5, "htb+nfqueue")
    intra = [t for t in ts if t.kind == "intra"]
    assert len(intra) == 2 * len(emu.plan.clusters)
    assert all(t.kind == "wan" for t in targets(fake_emu(k=1)))  # one host per cluster: no intra pair


def interval(start, end, mbps, omitted=False):
    return {"sum": {"start": start, "end": end, "seconds": end - start, "bytes": mbps * 1e6 / 8 * (end - start),
                    "omitted": omitted}}


def test_receiver_goodput_uses_only_whole_steady_intervals():
    report = {"server_output_json": {"intervals": [
        interval(0, 1, 40), interval(1, 2, 90),  # warm-up
        interval(2, 3, 79), interval(3, 4, 80), interval(4, 5, 78), interval(5, 6, 79),
        interval(6, 6.1, 300),  # tail: bytes that were queued at the bottleneck
    ]}}
    assert receiver_goodput_mbps(report, 2, 4) == pytest.approx(79.0)
    burst = {"server_output_json": {"intervals": [  # a backlog read after loss recovery
        interval(4, 5, 45.3), interval(5, 6, 35), interval(6, 7, 35), interval(7, 8, 35.1)]}}
    assert receiver_goodput_mbps(burst, 4, 4) == pytest.approx(35.05)
    with pytest.raises(EmulatorError, match="no receiver intervals"):
        receiver_goodput_mbps({"server_output_json": {"intervals": [interval(0, 1, 5)]}}, 2, 4)


def test_table_states_scale_mechanism_and_verdicts():
    emu = fake_emu()
    ts = targets(emu)
    results = [Result(target=t, measured_mbps=t.configured_mbps, measured_delay_ms=t.configured_delay_ms + 0.2)
               for t in ts]
    results[0] = Result(target=ts[0], measured_mbps=ts[0].configured_mbps * 0.5, measured_delay_ms=33.6,
                        remeasured=True)
    text = format_table("topologies/default.yaml", emu.plan.config, "nfqueue", results, ok=False)
    assert "scale 10: wire bandwidth = topology bandwidth / 10" in text
    assert "delay by nfqueue" in text and "NOT all within tolerance" in text
    assert text.count("FAIL") == 1 and "oregon -> virginia" in text and "(re-measured alone)" in text
    assert json.loads(json.dumps(results[0].as_json()))["mechanism"] == "htb+nfqueue"


def test_probe_measures_one_way_delay_on_loopback():
    echo = subprocess.Popen([sys.executable, "-m", "emulator.net.probe", "echo", "--port", "47311",
                             "--idle-timeout", "20"], stdout=subprocess.PIPE, cwd=REPO)
    try:
        assert echo.stdout.readline().strip() == b"ready"
        t0 = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "emulator.net.probe", "send", "--to", "127.0.0.1",
                               "--port", "47311", "--count", "5", "--interval", "0.01"],
                              capture_output=True, text=True, cwd=REPO, timeout=30)
        report = json.loads(done.stdout)
        assert report["lost"] == 0 and len(report["forward_ms"]) == 5
        assert all(0 <= d < 50 for d in report["forward_ms"] + report["reverse_ms"])
        assert time.monotonic() - t0 < 10
    finally:
        echo.kill()
        echo.wait()


def test_warmup_grows_with_round_trip_time():
    from emulator.net.measure import warmup_s

    t = targets(fake_emu())[0]
    assert warmup_s(t, 2.0) == 2.0  # 67 ms RTT
    far = next(x for x in targets(fake_emu()) if (x.a, x.b) == ("tokyo", "london"))  # 230 ms RTT
    assert warmup_s(far, 2.0) == 4.0
