"""Real networks (root): shaping within tolerance, teardown that never leaks, the lock."""

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from emulator.net.linkcmds import HOST_GSO_MAX_BYTES
from spiderflow.errors import EmulatorError
from emulator.net.measure import measure_all
from emulator.net.emulation import Emulation
from emulator.net.layout import NetConfig
from emulator.net.state import RUN_DIR_PREFIX
from emulator.net.tolerance import DELAY_ABS_MS

from .conftest import delay_ok_under_steal, rate_ok

pytestmark = pytest.mark.root
REPO = Path(__file__).resolve().parents[2]

# Builds the two-cluster network in a child process, starts a worker that forks
# a grandchild (which PR_SET_PDEATHSIG does not reach), says "ready", waits.
CHILD = textwrap.dedent("""
    import sys, time
    from spiderflow.topology import parse_topology
    from emulator.net.emulation import Emulation
    topo = parse_topology({"name": "two",
        "clusters": [{"name": "east", "gpu": "a100-80gb", "nodes": 1, "gpus_per_node": 8},
                     {"name": "west", "gpu": "a100-80gb", "nodes": 1, "gpus_per_node": 8}],
        "links": [{"a": "east", "b": "west", "bandwidth_gbps": 0.6, "latency_ms": 20}]})
    with Emulation(topo) as emu:
        emu.popen("east-h0", ["sh", "-c", "sleep 300 & exec sleep 300"])
        print("ready", flush=True)
        time.sleep(120)
""")


def start_child(state_dir, hangup=signal.SIG_DFL):
    """The child, with SIGHUP's disposition ``hangup`` (the suite itself may run under nohup)."""
    proc = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=REPO, env={**os.environ, "SPIDERFLOW_STATE_DIR": str(state_dir)},
                            preexec_fn=lambda: signal.signal(signal.SIGHUP, hangup))
    line = proc.stdout.readline()
    assert line.strip() == b"ready", proc.stderr.read().decode()
    return proc


def test_two_cluster_network_is_within_tolerance(two_cluster, state_dir, assert_no_leak):
    # intra capped at 300 Mbit/s: shaped and measured all the same, but cheap enough on 2 cores
    # that a busy CI machine cannot starve it; three whole 1-s intervals per flow, so a one-second stall
    # of the machine cannot decide its median rate (with one interval, 253 of 300 Mbit/s failed a CI run)
    with Emulation(two_cluster, NetConfig(hosts_per_cluster=2, intra_cap_mbps=300)) as emu:
        assert emu.mechanism in ("netem", "nfqueue")
        results = measure_all(emu, wan_seconds=3, wan_omit_s=1, intra_seconds=3, intra_omit_s=1)
        stats = emu.delay_stats()
        link = emu.run("east-h0", ["ip", "-d", "link", "show", "eth0"]).stdout
        burst = emu.run("east-gw", ["tc", "-d", "class", "show", "dev", "w-west"]).stdout
    assert {(r.target.a, r.target.b) for r in results} == {("east", "west"), ("west", "east"), ("east", "east"),
                                                          ("west", "west")}
    for r in results:
        t = r.target
        assert rate_ok(t.configured_mbps, r.measured_mbps, r.host_steal_pct, r), r
        assert delay_ok_under_steal(t.configured_delay_ms, r.measured_delay_ms, r.host_steal_pct, r), r
    wan = [r for r in results if r.target.kind == "wan"]
    assert all(r.target.configured_mbps == pytest.approx(60.0) for r in wan)
    # small GSO packets and a small htb burst: no head start for a transfer on an idle link
    assert f"gso_max_size {HOST_GSO_MAX_BYTES} " in link, link
    # tc stores the burst in its own time ticks, so it prints 3019b for 2 x 1514
    assert 2900 <= int(re.search(r" burst (\d+)b", burst).group(1)) <= 2 * 1514, burst
    if emu.mechanism == "nfqueue":  # the delay stage kept its delay under the full-rate streams
        queues = [q for per_router in stats.values() for q in per_router]
        assert len(queues) == 2 and all(q["packets"] > 1000 for q in queues)
        # its own lateness: what the host's stalls of its loop (a virtual CPU stolen for tens of ms,
        # which failed this test on busy hours) add is counted apart, in stage_stalls and host_delayed
        assert all(q["p99_own_late_ms"] < DELAY_ABS_MS for q in queues), queues
        assert all(q["p99_own_late_ms"] <= q["p99_late_ms"] for q in queues), queues
        # held from the kernel's arrival stamp, every one (delayd keeps receive timestamps on)
        assert all(q["stamped"] == q["packets"] for q in queues), queues
    assert_no_leak()


def test_teardown_after_normal_exit(two_cluster, state_dir, assert_no_leak):
    with Emulation(two_cluster) as emu:
        worker = emu.popen("east-h0", ["sleep", "300"], env={**os.environ, "WORKER_VAR": "1"})
        assert "10.1.0.10/24" in emu.run("east-h0", ["ip", "-o", "addr", "show", "eth0"]).stdout
        assert emu.hosts["west"][1].ip == "10.1.1.11"
        assert (state_dir / "emulation.json").exists()
    assert worker.poll() is not None
    assert not (state_dir / "emulation.json").exists()
    assert_no_leak()


def test_teardown_after_exception(two_cluster, state_dir, assert_no_leak):
    with pytest.raises(RuntimeError, match="boom"):
        with Emulation(two_cluster) as emu:
            emu.popen("west-h1", ["sleep", "300"])
            raise RuntimeError("boom")
    assert not (state_dir / "emulation.json").exists()
    assert_no_leak()


@pytest.mark.parametrize("sig, exit_codes", [(signal.SIGTERM, {128 + signal.SIGTERM}),
                                               (signal.SIGHUP, {128 + signal.SIGHUP}),
                                               (signal.SIGINT, {-signal.SIGINT, 1, 130})],
                         ids=["SIGTERM", "SIGHUP", "SIGINT"])
def test_teardown_after_signal(state_dir, assert_no_leak, sig, exit_codes):
    child = start_child(state_dir)
    child.send_signal(sig)
    assert child.wait(timeout=30) in exit_codes
    assert not (state_dir / "emulation.json").exists()
    assert_no_leak()


def test_under_nohup_a_hangup_is_ignored(state_dir, assert_no_leak):
    """Started with SIGHUP ignored (`nohup`, to outlive the terminal): the emulation keeps it ignored, so a
    hang-up leaves it running; SIGTERM still tears it down."""
    child = start_child(state_dir, hangup=signal.SIG_IGN)
    child.send_signal(signal.SIGHUP)
    with pytest.raises(subprocess.TimeoutExpired):
        child.wait(timeout=1.0)
    child.send_signal(signal.SIGTERM)
    assert child.wait(timeout=30) == 128 + signal.SIGTERM
    assert not (state_dir / "emulation.json").exists()
    assert_no_leak()


def test_sigkill_leaves_a_state_file_that_clean_finishes(state_dir, assert_no_leak):
    child = start_child(state_dir)
    child.kill()
    child.wait(timeout=10)
    state = json.loads((state_dir / "emulation.json").read_text())
    assert state["owner_pid"] == child.pid and len(state["processes"]) >= 6
    # the scratch dir it lists, and one named after its run id that a kill could leave unlisted
    unlisted = Path(tempfile.mkdtemp(prefix=f"{RUN_DIR_PREFIX}{state['run_id']}-"))
    scratch = [Path(f) for f in state["files"]] + [unlisted]
    assert all(d.is_dir() for d in scratch), scratch
    done = subprocess.run([sys.executable, "-m", "emulator", "clean", "--state-dir", str(state_dir)],
                          capture_output=True, text=True, cwd=REPO, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "cleaned emulation" in done.stdout
    assert not (state_dir / "emulation.json").exists()
    assert not any(d.exists() for d in scratch), scratch
    assert_no_leak()
    again = subprocess.run([sys.executable, "-m", "emulator", "clean", "--state-dir", str(state_dir)],
                           capture_output=True, text=True, cwd=REPO, timeout=60)
    assert again.returncode == 0 and "nothing to clean" in again.stdout


def test_next_emulation_removes_what_a_killed_one_left(two_cluster, state_dir, assert_no_leak):
    child = start_child(state_dir)
    child.kill()
    child.wait(timeout=10)
    notes = []
    with Emulation(two_cluster, log=notes.append):
        pass
    assert any("did not tear down" in n for n in notes)
    assert_no_leak()


def test_netem_command_lines_parse(tmp_path):
    """tc accepts our netem syntax (this kernel may then refuse the qdisc kind itself)."""
    from emulator.net.linkcmds import tc_commands
    from emulator.net.layout import Shape

    scratch = subprocess.Popen(["unshare", "--net", "--", "sleep", "30"])
    try:
        import time

        time.sleep(0.2)
        enter = ["mnexec", "-a", str(scratch.pid)]
        subprocess.run(enter + ["ip", "link", "add", "v0", "type", "veth", "peer", "name", "v1"], check=True)
        shape = Shape(goodput_mbps=50.0, delay_ms=33.5, jitter_ms=2.0, loss_pct=0.1, queue_bytes=300_000)
        *rate, leaf = tc_commands("v0", shape, netem=True)
        for argv in rate:
            subprocess.run(enter + argv, check=True)
        done = subprocess.run(enter + leaf, capture_output=True, text=True)
        assert done.returncode == 0 or "Specified qdisc kind is unknown" in done.stderr, done.stderr
    finally:
        scratch.kill()
        scratch.wait()


def test_a_second_emulation_is_refused_while_one_runs(two_cluster, state_dir, assert_no_leak):
    with Emulation(two_cluster):
        with pytest.raises(EmulatorError, match="another emulation is running"):
            Emulation(two_cluster).__enter__()
        done = subprocess.run([sys.executable, "-m", "emulator", "clean", "--state-dir", str(state_dir)],
                              capture_output=True, text=True, cwd=REPO, timeout=60)
        assert done.returncode == 2 and "another emulation is running" in done.stderr
    assert_no_leak()
