"""Multi-server emulation (issue 20) for real: a second server on this machine (a network namespace
running its own sshd, emulator/net/localserver.py), two clusters split over both, the WAN link
between them through Mininet's SSH tunnel with real tc shaping and the delay stage, measured with
the check's own measurements and tolerance; then a crash of the first server, cleaned up by the
agent and `emulator clean`. Root only; about 40 s."""

import os
import signal
import subprocess
import sys
import time

import pytest

from emulator.net.layout import NetConfig
from emulator.net.localserver import LocalServer, down, up
from emulator.net.measure import measure_all
from emulator.net.multihost import ClusterEmulation
from emulator.net.multihost_check import summarize
from emulator.net.servers import ServerSet, Ssh, assign_clusters
from emulator.net.tolerance import bandwidth_ok, delay_ok

from .conftest import PYTHON, REPO, TWO_CLUSTER_YAML, two_cluster_topology

pytestmark = pytest.mark.root
NAME = "sf-srvt"  # not the script's sf-srv2: a test never meets a running multihost-test.sh


@pytest.fixture
def second_server(tmp_path):
    srv = up(LocalServer(name=NAME, dir=tmp_path / "srv", subnet="192.168.253"))
    yield srv
    removed = down(srv)
    assert f"namespace {NAME}" in removed
    assert not os.path.exists(f"/run/netns/{NAME}")
    assert subprocess.run(["ip", "link", "show", srv.veth_root], capture_output=True).returncode != 0


def _servers(srv):
    return ServerSet(names=("localhost", NAME), ssh=Ssh(config=str(srv.ssh_config)))


@pytest.mark.parametrize("tunnel", ["ssh", "vxlan"])
def test_cross_server_link_is_shaped_like_a_local_one(second_server, state_dir, assert_no_leak, tunnel):
    topo = two_cluster_topology(bandwidth_gbps=0.4, latency_ms=10.0)
    servers = _servers(second_server)
    servers.tunnel = tunnel
    assignment = assign_clusters(topo.names, servers.names)
    assert assignment == {"east": "localhost", "west": NAME}
    with ClusterEmulation(topo, NetConfig(hosts_per_cluster=1), servers=servers, assignment=assignment) as emu:
        assert emu.mechanism in ("netem", "nfqueue")
        # the WAN link is a tunnel (a tap, or a VXLAN device) named w-west in east's router, w-east in west's
        assert len(emu.tunnels) == 1 and emu.tunnels[0]["server"] == NAME and emu.tunnels[0]["kind"] == tunnel
        west_gw = emu.run("west-gw", ["ip", "-d", "link", "show", "w-east"]).stdout
        assert ("tun type tap" if tunnel == "ssh" else "vxlan id") in west_gw
        # the same shaping as a local link: htb at the wire rate on the tap
        qdisc = emu.run("west-gw", ["tc", "qdisc", "show", "dev", "w-east"]).stdout
        assert "htb" in qdisc
        assert emu.is_remote("west-gw") and not emu.is_remote("east-gw")
        results = measure_all(emu, wan_seconds=1.0, wan_omit_s=1.0)
        offset = servers.offsets[NAME]
    assert len(results) == 2
    for r in results:
        t = r.target
        assert bandwidth_ok(t.configured_mbps, r.measured_mbps), (t.a, t.b, r.measured_mbps)
        assert delay_ok(t.configured_delay_ms, r.measured_delay_ms), (t.a, t.b, r.measured_delay_ms)
    summary = summarize(results, assignment)
    assert summary["cross-server"]["directions"] == 2
    # one kernel, one CLOCK_MONOTONIC: the measured offset must be ~0 (within its own error bound + 1 ms)
    assert abs(offset.monotonic_ns) <= offset.error_ns + 1_000_000
    assert_no_leak()
    assert not list(state_dir.glob("remote-*/emulation.json")) and not (state_dir / "emulation.json").exists()


def test_crash_of_the_first_server_is_cleaned_everywhere(second_server, state_dir, assert_no_leak, tmp_path):
    topo_file = tmp_path / "two.yaml"
    topo_file.write_text(TWO_CLUSTER_YAML)
    argv = [PYTHON, "-m", "emulator", "check", "--topology", str(topo_file), "--hosts-per-cluster", "1",
            "--servers", f"localhost,{NAME}", "--ssh-config", str(second_server.ssh_config), "--no-overhead"]
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=os.environ)
    seen = []
    deadline = time.monotonic() + 60
    for line in proc.stderr:
        seen.append(line)
        if "network up" in line or time.monotonic() > deadline:
            break
    assert any("network up" in line for line in seen), "".join(seen)
    remote_state = state_dir / f"remote-{NAME}" / "emulation.json"
    assert remote_state.exists()
    os.kill(proc.pid, signal.SIGKILL)  # the first server "crashes": no teardown of its own
    proc.wait()
    proc.stderr.close()
    # its SSH connections closed: the agent on the other server removed its part by itself
    deadline = time.monotonic() + 20
    while remote_state.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not remote_state.exists()
    assert (state_dir / "emulation.json").exists()  # what was here: for `emulator clean`
    done = subprocess.run([PYTHON, "-m", "emulator", "clean"], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env=os.environ)
    assert done.returncode == 0, done.stderr
    assert "cleaned emulation" in done.stdout
    assert not (state_dir / "emulation.json").exists()
    assert_no_leak()


def test_bad_servers_touch_nothing(second_server, state_dir, assert_no_leak):
    done = subprocess.run([PYTHON, "-m", "emulator", "check", "--servers", f"localhost,{NAME}",
                           "--ssh-config", str(second_server.ssh_config), "--ssh-key", "/nonexistent"],
                          cwd=REPO, capture_output=True, text=True, timeout=60, env=os.environ)
    assert done.returncode == 2 and done.stderr.startswith("error: --ssh-key: no such file")
    # an unreachable server: one line, exit 2, nothing left behind
    done = subprocess.run([sys.executable, "-m", "emulator", "check", "--servers", "localhost,192.168.253.9",
                           "--hosts-per-cluster", "1", "--no-overhead"], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env=os.environ)
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "ssh failed" in errors[0] and "Traceback" not in done.stderr, done.stderr
    assert_no_leak()
