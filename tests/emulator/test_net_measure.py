"""Measurement helpers, the tolerance rule and the check table (no root)."""

import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from emulator.net.check import EXIT_NO_VERDICT, exit_code, format_table, link_json, overall
from spiderflow.errors import EmulatorError
from emulator.net.measure import Result, receiver_goodput_mbps, targets
from emulator.net.layout import NetConfig, build_plan
from emulator.net.tolerance import FAIL, NO_VERDICT, OK, assess, bandwidth_ok, delay_ok, delay_verdict, rate_verdict
from spiderflow.topology import load_topology

from .conftest import delay_ok_under_steal, rate_ok

REPO = Path(__file__).resolve().parents[2]


def fake_emu(k=2, mechanism="nfqueue"):
    plan = build_plan(load_topology(REPO / "topologies" / "default.yaml"), NetConfig(hosts_per_cluster=k))
    return SimpleNamespace(plan=plan, mechanism=mechanism)


def test_tolerance_boundaries():
    assert bandwidth_ok(100, 90) and bandwidth_ok(100, 110) and not bandwidth_ok(100, 89.9)
    assert delay_ok(33.5, 35.5) and delay_ok(33.5, 31.5) and not delay_ok(33.5, 35.6)
    assert assess(100, 100, 10, 10).reasons == ()
    assert len(assess(100, 50, 10, 20).reasons) == 2


def test_a_low_rate_is_no_verdict_only_while_the_host_stole_the_cpu():
    assert rate_verdict(100, 95, 0.0) == OK and rate_verdict(100, 85, 1.9) == FAIL
    assert rate_verdict(100, 85, 12.0) == NO_VERDICT and rate_verdict(100, 50, 12.0) == NO_VERDICT
    # over the rate, or far under it, is the link's fault whatever the host did
    assert rate_verdict(100, 115, 12.0) == FAIL and rate_verdict(100, 45, 30.0) == FAIL
    # the root tests take the same rule, and warn where it gave no verdict
    assert rate_ok(100, 95, 0.0, "quiet") and not rate_ok(100, 85, 1.9, "quiet")
    with pytest.warns(UserWarning, match="stole 12% of the CPU: no verdict"):
        assert rate_ok(100, 85, 12.0, "stolen")
    assert not rate_ok(100, 115, 12.0, "over")


def test_a_high_delay_is_no_verdict_only_while_the_host_stole_the_cpu():
    assert delay_verdict(10, 11.9, 0.0) == OK and delay_verdict(10, 12.4, 1.9) == FAIL
    assert delay_verdict(10, 12.39, 19.4) == NO_VERDICT and delay_verdict(10, 14.0, 19.4) == NO_VERDICT
    # under the delay, or over it by more than twice the tolerance, is the link's fault whatever the host did
    assert delay_verdict(10, 7.9, 19.4) == FAIL and delay_verdict(10, 14.1, 30.0) == FAIL
    assert delay_ok_under_steal(10, 11.9, 0.0, "quiet") and not delay_ok_under_steal(10, 12.4, 1.9, "quiet")
    with pytest.warns(UserWarning, match="stole 19% of the CPU: no verdict on its delay"):
        assert delay_ok_under_steal(10, 12.39, 19.4, "stolen")
    assert not delay_ok_under_steal(10, 7.9, 19.4, "under")


def test_a_link_takes_the_worse_verdict_of_its_rate_and_its_delay_each_with_its_own_steal():
    assert assess(100, 100, 10, 10) == assess(100, 100, 10, 10, rate_steal_pct=50, delay_steal_pct=50)
    assert assess(100, 100, 10, 10).verdict == OK and assess(100, 100, 10, 10).reasons == ()
    low = assess(100, 80, 10, 10, rate_steal_pct=9.0)
    assert low.verdict == NO_VERDICT and low.reasons == ("bandwidth 80.0 Mbit/s is not within 10% of 100.0 "
                                                         "(the host stole 9% of the CPU)",)
    # the steal while its rate was measured says nothing of its delay, probed at another time
    assert assess(100, 100, 10, 13, rate_steal_pct=9.0).verdict == FAIL
    assert assess(100, 100, 10, 13, delay_steal_pct=9.0).verdict == NO_VERDICT
    assert assess(100, 80, 10, 7, rate_steal_pct=9.0, delay_steal_pct=9.0).verdict == FAIL
    assert assess(100, 80, 10, 10).reasons == ("bandwidth 80.0 Mbit/s is not within 10% of 100.0",)


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
    text = format_table("topologies/default.yaml", emu.plan.config, "nfqueue", results, FAIL)
    assert "scale 10: wire bandwidth = topology bandwidth / 10" in text
    assert "delay by nfqueue" in text and "NOT all within tolerance" in text
    assert text.count("FAIL") == 1 and "oregon -> virginia" in text and "(re-measured alone)" in text
    assert json.loads(json.dumps(results[0].as_json()))["mechanism"] == "htb+nfqueue"


def free_udp_port() -> str:
    """A UDP port nobody holds now (a fixed one fails the test on a machine where something has it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("0.0.0.0", 0))
        return str(s.getsockname()[1])


def test_probe_measures_one_way_delay_on_loopback():
    port = free_udp_port()
    echo = subprocess.Popen([sys.executable, "-m", "emulator.net.probe", "echo", "--port", port,
                             "--idle-timeout", "20"], stdout=subprocess.PIPE, cwd=REPO)
    try:
        assert echo.stdout.readline().strip() == b"ready"
        t0 = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "emulator.net.probe", "send", "--to", "127.0.0.1",
                               "--port", port, "--count", "5", "--interval", "0.01"],
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


# --- the host's steal (emulator.net.hoststeal) -------------------------------------

def proc_stat(tmp_path, steal_jiffies):
    path = tmp_path / "stat"
    path.write_text(f"cpu  100 0 50 900 3 0 7 {steal_jiffies} 0 0\ncpu0 50 0 25 450 1 0 3 0 0 0\n")
    return str(path)


def test_steal_meter_reads_the_share_of_all_cpus_stolen(tmp_path):
    from emulator.net.hoststeal import USER_HZ, StealMeter, steal_s

    path = proc_stat(tmp_path, 1000)
    assert steal_s(path) == pytest.approx(1000 / USER_HZ)
    clock = iter([10.0, 12.0])
    meter = StealMeter(path=path, cpus=2, clock=lambda: next(clock))
    proc_stat(tmp_path, 1000 + int(0.4 * USER_HZ))  # 0.4 s stolen over 2 s on 2 CPUs
    assert meter.share() == pytest.approx(0.1)
    (tmp_path / "stat").write_text("intr 1 2 3\n")  # no cpu line: nothing to tell
    assert steal_s(path) is None
    assert StealMeter(path=str(tmp_path / "missing"), cpus=2).share() == 0.0


def test_a_flow_out_of_tolerance_is_measured_again_while_the_host_steals():
    from emulator.net.hoststeal import STOLEN_SHARE
    from emulator.net.measure import STOLEN_TRIES, another_try

    t = targets(fake_emu())[0]
    low, calm, stolen = t.configured_mbps * 0.8, 0.0, STOLEN_SHARE * 2
    assert not another_try(t, t.configured_mbps, 0, stolen)  # within tolerance: never
    assert another_try(t, low, 0, calm)  # out of it: once, whatever the host did
    assert not another_try(t, low, 1, calm)
    assert another_try(t, low, 1, stolen) and another_try(t, low, STOLEN_TRIES - 1, stolen)
    assert not another_try(t, low, STOLEN_TRIES, stolen)


def test_a_delay_out_of_tolerance_is_probed_again_while_the_host_steals():
    from emulator.net.hoststeal import STOLEN_SHARE
    from emulator.net.measure import STOLEN_TRIES, another_probe

    t = targets(fake_emu())[0]
    high, calm, stolen = t.configured_delay_ms + 3.0, 0.0, STOLEN_SHARE * 2
    assert not another_probe(t, t.configured_delay_ms + 1.0, 0, stolen)  # within tolerance: never
    assert another_probe(t, high, 0, calm) and not another_probe(t, high, 1, calm)  # once, whatever the host did
    assert another_probe(t, high, STOLEN_TRIES - 1, stolen) and not another_probe(t, high, STOLEN_TRIES, stolen)


def test_table_says_when_the_host_stole_cpu_during_a_measurement():
    emu = fake_emu()
    ts = targets(emu)
    results = [Result(target=t, measured_mbps=t.configured_mbps, measured_delay_ms=t.configured_delay_ms)
               for t in ts]
    assert overall(results, []) == OK and exit_code(OK) == 0
    assert overall(results, [SimpleNamespace(ok=False)]) == FAIL  # a step that failed fails the check
    assert "stole" not in format_table("topologies/default.yaml", emu.plan.config, "nfqueue", results, OK)
    results[2] = Result(target=ts[2], measured_mbps=ts[2].configured_mbps * 0.95,
                        measured_delay_ms=ts[2].configured_delay_ms, host_steal_pct=3.2)
    results[1] = Result(target=ts[1], measured_mbps=ts[1].configured_mbps * 0.85,
                        measured_delay_ms=ts[1].configured_delay_ms, remeasured=True, host_steal_pct=9.4)
    # read low while the host stole the CPU: no verdict, and the check says so in its exit status
    verdict = overall(results, [])
    assert verdict == NO_VERDICT and exit_code(verdict) == EXIT_NO_VERDICT == 3
    text = format_table("topologies/default.yaml", emu.plan.config, "nfqueue", results, verdict)
    assert "(the host stole 9% of the CPU) (re-measured alone)" in text and "no verdict: bandwidth" in text
    assert "ok (host stole 3% of the CPU)" in text and "FAIL" not in text
    assert "no verdict: none of 16 measurements failed, but 1 was out of tolerance (bandwidth +-10%" in text
    assert "the way a host stealing the CPU reads a link" in text and "(exit 3)" in text
    assert "stole up to 9% of this machine's CPU while measuring" in text
    assert results[1].as_json()["host_steal_pct"] == 9.4
    assert link_json(results[1])["verdict"] == NO_VERDICT and link_json(results[0])["problems"] == []
    # a delay without a verdict names its own steal; the rate's, read at another time, is still said
    delayed = Result(target=ts[3], measured_mbps=ts[3].configured_mbps, measured_delay_ms=ts[3].configured_delay_ms + 3,
                     host_steal_pct=5.0, delay_steal_pct=9.0)
    row = format_table("topologies/default.yaml", emu.plan.config, "nfqueue", [delayed], NO_VERDICT).splitlines()[5]
    assert "(the host stole 9% of the CPU) (host stole 5% of the CPU)" in row, row
    # a failed measurement decides, whatever the others gave
    results[0] = Result(target=ts[0], measured_mbps=ts[0].configured_mbps * 1.2,
                        measured_delay_ms=ts[0].configured_delay_ms, host_steal_pct=9.4)
    verdict = overall(results, [])
    assert verdict == FAIL and exit_code(verdict) == 1
    text = format_table("topologies/default.yaml", emu.plan.config, "nfqueue", results, verdict)
    assert "NOT all within tolerance" in text and "; 1 gave no verdict" in text
    assert text.count("FAIL: bandwidth") == 1 and "(host stole 9% of the CPU)" in text


def test_steal_log_answers_for_any_window_its_samples_cover(tmp_path):
    from emulator.net.hoststeal import USER_HZ, StealLog

    now = iter([0.0, 1.0, 2.0, 3.0])
    log = StealLog(path=proc_stat(tmp_path, 0), cpus=2, clock=lambda: next(now))
    for stolen_s in (0.0, 0.0, 0.2, 0.2):  # 0.2 s stolen between t = 1 and t = 2
        proc_stat(tmp_path, int(stolen_s * USER_HZ))
        log.sample()
    assert log.share(1.0, 2.0) == pytest.approx(0.1)  # of 2 CPUs for 1 s
    assert log.share(1.5, 1.6) == pytest.approx(0.1)  # widened to the samples around it
    assert log.share(2.0, 3.0) == 0.0 and log.share(0.0, 1.0) == 0.0
    assert log.share(2.5, 3.5) is None and log.share(-1.0, 0.5) is None  # not covered
