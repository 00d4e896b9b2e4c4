"""Multi-server emulation (issue 20), the pure parts: --servers, cluster assignment, the
topology's ``server:`` keys, SSH command lines, clock-offset arithmetic, the summary of
cross-server vs local links. Fixtures small enough to check by hand; no root, no network."""

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from emulator.net.localserver import SSHD, LocalServer, main as localserver_main, ssh_client_config, \
    sshd_argv, sshd_config
from emulator.net.measure import Result, Target
from emulator.net.multihost import check_assignment, crossing_links
from emulator.net.multihost_check import summarize, target_problems
from emulator.net.servers import ClockSample, Ssh, assign_clusters, load_topology_with_servers, \
    offset_from_samples, one_way_ms, parse_servers, remote_command
from spiderflow.errors import ConfigError, EmulatorError
from spiderflow.topology import load_topology

from .conftest import REPO, TWO_CLUSTER_YAML

DEFAULT = ("oregon", "virginia", "london", "tokyo")


# ------------------------------------------------------------------------------------ --servers
def test_parse_servers_keeps_order_and_strips():
    assert parse_servers("localhost, gpu2 ,root@10.0.0.3") == ("localhost", "gpu2", "root@10.0.0.3")
    assert parse_servers(None) == ()


@pytest.mark.parametrize("text, what", [
    ("", "empty server name"), ("a,,b", "empty server name"), ("a,", "empty server name"),
    ("a,a", "named twice"), ("a,-oProxyCommand=x", "not a host name"), ("a,b c", "not a host name"),
    ("a,$(reboot)", "not a host name"), ("gpu1,localhost", "names this machine"),
    ("gpu1,root@127.0.0.1", "names this machine"),
])
def test_parse_servers_rejects_with_one_line_naming_flag_and_fix(text, what):
    with pytest.raises(ConfigError) as err:
        parse_servers(text)
    msg = str(err.value)
    assert msg.startswith("--servers:") and what in msg and "HOST[,HOST...]" in msg and "\n" not in msg


def test_cli_bad_servers_exits_2_with_one_line():
    done = subprocess.run([sys.executable, "-m", "emulator", "check", "--servers", "localhost,,gpu2"],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --servers:"), done.stderr
    assert "Traceback" not in done.stderr


def test_cli_bad_tunnel_exits_2_with_one_line():
    done = subprocess.run([sys.executable, "-m", "emulator", "check", "--servers", "localhost,gpu2",
                           "--tunnel", "gre"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 2 and "--tunnel" in done.stderr and "vxlan" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_cli_step_on_a_link_with_no_end_here_exits_2_with_one_line(tmp_path):
    """`check --servers --step A-B` reads the receiver's bytes on this machine: a link whose two ends
    are on other servers (london-tokyo of the default topology split over two) is refused before
    anything is built, naming the option and the fix."""
    config = tmp_path / "ssh_config"
    config.write_text("Host gpu2\n  HostName 192.0.2.1\n")
    done = subprocess.run([sys.executable, "-m", "emulator", "check", "--servers", "localhost,gpu2",
                           "--ssh-config", str(config), "--step", "london-tokyo"],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --step: link london-tokyo has no end on this machine")
    assert "first server" in lines[0] and "Traceback" not in done.stderr


def test_cli_missing_ssh_config_exits_2():
    done = subprocess.run([sys.executable, "-m", "emulator", "check", "--servers", "localhost,gpu2",
                           "--ssh-config", "/nonexistent/ssh_config"], capture_output=True, text=True,
                          cwd=REPO, timeout=120)
    assert done.returncode == 2 and done.stderr.startswith("error: --ssh-config: no such file"), done.stderr


# ----------------------------------------------------------------------------------- assignment
def test_default_rule_is_contiguous_balanced_blocks():
    assert assign_clusters(DEFAULT, ("a", "b")) == {"oregon": "a", "virginia": "a", "london": "b", "tokyo": "b"}
    assert assign_clusters(DEFAULT, ("a", "b", "c")) == {"oregon": "a", "virginia": "a", "london": "b", "tokyo": "c"}
    assert assign_clusters(DEFAULT, ("a",)) == dict.fromkeys(DEFAULT, "a")
    # more servers than clusters: one each, the last servers empty
    assert assign_clusters(("x", "y"), ("a", "b", "c")) == {"x": "a", "y": "b"}


def test_rule_balances_ranks_not_clusters():
    # 8 + 1 + 1 + 1 + 1 ranks over two servers: the big cluster alone fills the first
    weights = {"oregon": 8, "virginia": 1, "london": 1, "tokyo": 1}
    got = assign_clusters(DEFAULT, ("a", "b"), weights=weights)
    assert got == {"oregon": "a", "virginia": "b", "london": "b", "tokyo": "b"}


def test_pins_win_and_count_towards_the_balance():
    got = assign_clusters(DEFAULT, ("a", "b"), pins={"tokyo": "a"})
    assert got["tokyo"] == "a"
    assert sorted(got.values()).count("a") == 2  # tokyo pinned + oregon
    assert got == {"oregon": "a", "virginia": "b", "london": "b", "tokyo": "a"}


def test_pin_to_unknown_server_names_file_field_and_fix():
    with pytest.raises(ConfigError) as err:
        assign_clusters(DEFAULT, ("a", "b"), pins={"london": "gpu9"}, source="topo.yaml")
    msg = str(err.value)
    assert msg == ("topo.yaml: clusters[2].server 'gpu9' is not one of --servers (a, b); "
                   "add it to --servers or remove the key")


def test_assignment_is_deterministic():
    assert all(assign_clusters(DEFAULT, ("a", "b", "c")) == assign_clusters(DEFAULT, ("a", "b", "c"))
               for _ in range(5))


def test_crossing_links_and_unsupported_tunnels():
    topo = load_topology(REPO / "topologies/default.yaml")
    two = assign_clusters(topo.names, ("a", "b"))
    assert sorted(crossing_links(topo, two)) == [("oregon", "tokyo"), ("virginia", "london")]
    check_assignment(topo, two, "a")
    # london-tokyo would join servers b and c, neither of them the first
    three = {"oregon": "a", "virginia": "a", "london": "b", "tokyo": "c"}
    with pytest.raises(EmulatorError, match="must have the first server"):
        check_assignment(topo, three, "a")


# --------------------------------------------------------------------- topology `server:` keys
def test_topology_server_keys_are_read_and_removed(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text("name: t\nclusters:\n"
                    "  - {name: east, gpu: a100-80gb, nodes: 1, gpus_per_node: 8, server: gpu2}\n"
                    "  - {name: west, gpu: a100-80gb, nodes: 1, gpus_per_node: 8}\n"
                    "links:\n  - {a: east, b: west, bandwidth_gbps: 1, latency_ms: 5}\n")
    topo, pins = load_topology_with_servers(path)
    assert topo.names == ("east", "west") and pins == {"east": "gpu2"}
    # and the planner's own loader still refuses the key (the planner knows nothing of servers)
    with pytest.raises(ConfigError, match="server is not a known key"):
        load_topology(path)


def test_topology_bad_server_value(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text("name: t\nclusters:\n"
                    "  - {name: east, gpu: a100-80gb, nodes: 1, gpus_per_node: 8, server: 3}\n"
                    "links: []\n")
    with pytest.raises(ConfigError) as err:
        load_topology_with_servers(path)
    assert f"{path}: clusters[0].server must be a host name" in str(err.value)


def test_topology_without_server_keys_is_what_the_planner_loads():
    topo, pins = load_topology_with_servers(REPO / "topologies/default.yaml")
    assert pins == {} and topo == load_topology(REPO / "topologies/default.yaml")


# ----------------------------------------------------------------------------------------- ssh
def test_ssh_argv_batchmode_timeout_key_config_and_master():
    ssh = Ssh(config="/c/ssh_config", key="/c/id", connect_timeout_s=7, control_dir="/run/x")
    argv = ssh.argv("gpu2")
    assert argv[0] == "ssh" and argv[-1] == "gpu2" and "-T" in argv
    text = " ".join(argv)
    for part in ("-o BatchMode=yes", "-o ConnectTimeout=7", "-F /c/ssh_config", "-i /c/id",
                 "-o ControlPath=/run/x/cm-gpu2", "-o ControlMaster=no"):
        assert part in text
    tunnel = " ".join(ssh.argv("root@gpu2", mux=False, options=("-w", "9:9")))
    assert "ControlPath=none" in tunnel and "-w 9:9" in tunnel
    master = ssh.master_argv("root@gpu2")
    assert "-M" in master and "-N" in master and "ControlPath=/run/x/cm-root_gpu2" in " ".join(master)
    assert master.index("ControlPath=/run/x/cm-root_gpu2") < len(master) - 1
    assert "-tt" in Ssh().argv("h", tty=True)


def test_remote_command_quotes_so_the_remote_shell_sees_the_argv():
    argv = ["mnexec", "-cn", "env", "PS1=\x7f", "bash", "-is", "mininet:a b"]
    cmd = remote_command(argv, env={"SPIDERFLOW_EMULATION": "1-x@gpu2"}, cwd="/work/my repo")
    assert shlex.split(cmd) == ["env", "--chdir=/work/my repo", "SPIDERFLOW_EMULATION=1-x@gpu2", *argv]
    assert shlex.split(remote_command(["echo", "$(reboot)"])) == ["echo", "$(reboot)"]


# -------------------------------------------------------------------------------------- clocks
def test_offset_takes_the_least_round_trip_sample():
    # server clock = ours + 1000 ns. Sample 1: symmetric 200 ns each way. Sample 2: 50 ns out, 5 us back
    # (asymmetric, long round trip): ignored.
    samples = [ClockSample(t0=10_000, t1=10_000 + 200 + 1000, t3=10_400),
               ClockSample(t0=20_000, t1=20_000 + 50 + 1000, t3=20_000 + 50 + 5000)]
    got = offset_from_samples(samples)
    assert got.monotonic_ns == 1000 and got.rtt_ns == 400 and got.error_ns == 200 and got.samples == 2


def test_offset_negative_and_wall_clock():
    s = ClockSample(t0=0, t1=-5_000_000 + 100, t3=200, r0=10**18, r1=10**18 + 3_000_100, r3=10**18 + 200)
    got = offset_from_samples([s])
    assert got.monotonic_ns == -5_000_000 and got.realtime_ns == 3_000_000
    assert got.as_json()["monotonic_offset_ms"] == -5.0


def test_offset_needs_a_usable_sample():
    with pytest.raises(EmulatorError):
        offset_from_samples([ClockSample(t0=10, t1=5, t3=5)])


def test_one_way_delay_on_one_clock():
    # sent at 1 s on our clock; stamped 1.020 s + 7 ms offset on the server's: 20 ms one way
    assert one_way_ms(1_000_000_000, 1_027_000_000, 7_000_000) == pytest.approx(20.0)


# ---------------------------------------------------------------------------- check's summary
def _result(a, b, mbps, delay, conf_mbps=100.0, conf_delay=20.0):
    t = Target(a=a, b=b, src=f"{a}-h0", dst=f"{b}-h0", src_ip="", dst_ip="", kind="wan",
               configured_mbps=conf_mbps, configured_delay_ms=conf_delay, mechanism="htb+nfqueue")
    return Result(target=t, measured_mbps=mbps, measured_delay_ms=delay)


def test_summary_splits_cross_server_from_local_and_applies_issue_targets():
    assignment = {"x": "s1", "y": "s1", "z": "s2"}
    results = [_result("x", "y", 99.0, 20.3), _result("y", "z", 97.5, 20.9), _result("z", "y", 96.9, 20.1)]
    got = summarize(results, assignment)
    assert got["local"]["directions"] == 1 and got["local"]["meets_targets"]
    cross = got["cross-server"]
    assert cross["directions"] == 2 and cross["bandwidth_min_pct"] == 96.9 and not cross["meets_targets"]
    assert list(cross["misses"]) == ["z->y"]
    assert target_problems(_result("a", "b", 100.0, 21.2)) == ["delay off by +1.20 ms"]
    assert target_problems(_result("a", "b", 97.0, 19.0)) == []


# ------------------------------------------------------------------------------- local server
def test_local_server_configs(tmp_path):
    srv = LocalServer(name="sf-t", dir=tmp_path, subnet="192.168.77")
    conf = sshd_config(srv)
    for line in ("ListenAddress 192.168.77.2", "PermitRootLogin prohibit-password", "PasswordAuthentication no",
                 "PermitTunnel ethernet", f"AuthorizedKeysFile {tmp_path}/authorized_keys",
                 f"HostKey {tmp_path}/host_ed25519", "UsePAM no"):
        assert line in conf.splitlines()
    client = ssh_client_config(srv)
    assert "Host sf-t" in client and "HostName 192.168.77.2" in client and "StrictHostKeyChecking yes" in client


@pytest.mark.parametrize("hides, what", [("repo", "the project"), ("repo-parent", "the project"), ("root", "the project"),
                                         ("venv", "its venv"), ("dir", "--dir"), ("dir-parent", "--dir")])
def test_local_server_refuses_a_private_path_that_hides_what_it_needs(tmp_path, hides, what):
    """--private must leave the second server the project, its venv and --dir (sshd's config and keys):
    refused in one line naming the path, what it would hide and the fix, before anything is made
    (no root needed: the check is the dataclass's)."""
    srv_dir = tmp_path / "srv"
    path = {"repo": REPO, "repo-parent": REPO.parent, "root": Path("/"), "venv": Path(sys.prefix),
            "dir": srv_dir, "dir-parent": tmp_path}[hides]
    srv_dir.mkdir()
    with pytest.raises(EmulatorError) as err:
        LocalServer(name="sf-t", dir=srv_dir, private=(path,))
    msg = str(err.value)
    assert f"--private {path} would hide {what}" in msg and "\n" not in msg and "pick a path" in msg, msg


def test_local_server_private_paths_and_sshd_argv(tmp_path, capsys):
    """Private paths are resolved and sorted, one inside another is private with it (one tmpfs), sshd
    starts in a mount namespace of its own whose tmpfs mounts cover them, exec'd in place; a relative
    or missing path is one line; the CLI refuses before needing root (exit 2, one line)."""
    a = tmp_path / "a"
    (a / "b").mkdir(parents=True)
    a.chmod(0o1777)
    srv_dir = tmp_path / "srv"
    srv = LocalServer(name="sf-t", dir=srv_dir, private=(str(a / "b"), a, a))
    assert srv.private == (a, a / "b") and srv.private_mounts == (a,)
    argv = sshd_argv(srv)
    assert argv[:8] == ["ip", "netns", "exec", "sf-t", "unshare", "--mount", "--propagation", "private"]
    assert argv[-5:] == [SSHD, "-D", "-e", "-f", str(srv_dir / "sshd_config")]
    script = argv[argv.index("-c") + 1]
    st = a.stat()  # the tmpfs keeps the path's mode and owner; a/b is inside a: no mount of its own
    assert script == f'mount -t tmpfs -o mode=1777,uid={st.st_uid},gid={st.st_gid} sf-private {a} && exec "$@"'
    assert sshd_argv(LocalServer(name="sf-t", dir=srv_dir)) == ["ip", "netns", "exec", "sf-t", SSHD, "-D", "-e", "-f",
                                                                str(srv_dir / "sshd_config")]
    for bad, why in (("tmp", "not an absolute path"), (str(tmp_path / "none"), "no such directory here")):
        with pytest.raises(EmulatorError, match=f"--private {bad}: {why}"):
            LocalServer(name="sf-t", dir=srv_dir, private=(bad,))
    assert localserver_main(["up", "--dir", str(srv_dir), "--private", str(REPO)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: localserver: --private {REPO} would hide the project") and err.count("\n") == 1
    assert not srv_dir.exists()


def test_remote_shell_that_never_starts_fails_in_time(monkeypatch):
    """Mininet waits for a shell's prompt for ever; ours gives up after SHELL_TIMEOUT_S with one line."""
    import time

    from mininet.net import Mininet

    import emulator.net.remote as remote

    monkeypatch.setattr(remote, "SHELL_TIMEOUT_S", 2.0)
    monkeypatch.setattr(Mininet, "inited", True)
    net = Mininet(topo=None, build=False, controller=None)
    t0 = time.monotonic()
    with pytest.raises(EmulatorError, match="did not start within 2 s over ssh"):
        net.addHost("x1", cls=remote.ServerHost, ip=None, dest="nosuch.invalid", ssh=Ssh(connect_timeout_s=1),
                    marker="t@x", serverIP="192.0.2.99")
    assert time.monotonic() - t0 < 10


@pytest.mark.parametrize("command", ["run", "compare"])
def test_run_and_compare_take_servers_and_check_them_before_root_in_one_line(command, tmp_path):
    """Both commands parse --servers and check it before root: a bad server name is one line and exit 2,
    with nothing written. --wan-events is taken with --servers (issue 20): a bad events file is that
    file's own one-line error, not a refusal of the option; so is `run --cold-start` (its ranks exec from
    a cold pool on each server): a bad server name is still the error."""
    def cli(*args):
        return subprocess.run([sys.executable, "-m", "emulator", command, "--out", str(tmp_path / "o"), *args],
                              capture_output=True, text=True, timeout=120, cwd=REPO)

    bad = cli("--servers", "localhost,-oProxyCommand=x")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--servers" in bad.stderr, bad.stderr
    events = cli("--servers", "localhost,gpu2", "--wan-events", str(REPO / "topologies/default.yaml"))
    assert events.returncode == 2 and events.stderr.count("\n") == 1, events.stderr
    assert "not supported" not in events.stderr and "header lacks column(s) time_s" in events.stderr
    if command == "run":
        cold = cli("--servers", "localhost,-oProxyCommand=x", "--cold-start")
        assert cold.returncode == 2 and cold.stderr == bad.stderr, cold.stderr
    assert not (tmp_path / "o").exists()


def test_rank_start_names_warm_and_cold():
    """config.json's rank_start: a warm pool, or a cold one on each server (this one alone too)."""
    from emulator.run import rank_start

    assert [rank_start(False), rank_start(True)] == ["warm pool", "cold (exec from each server's pool)"]


CHAIN_YAML = """\
name: chain
clusters:
  - {name: x, gpu: a100-80gb, nodes: 1, gpus_per_node: 8}
  - {name: y, gpu: a100-80gb, nodes: 1, gpus_per_node: 8, server: s2}
  - {name: z, gpu: a100-80gb, nodes: 1, gpus_per_node: 8, server: s3}
links:
  - {a: x, b: y, bandwidth_gbps: 1, latency_ms: 10}
  - {a: y, b: z, bandwidth_gbps: 1, latency_ms: 10}
"""


def test_calibrate_takes_servers_and_checks_every_topologys_split_in_one_line(tmp_path):
    """calibrate parses --servers and splits each --topology before root: a bad server name, a `server:`
    pin that is not one of --servers, or a second topology whose split puts a link between two other
    servers is one line and exit 2, with nothing written."""
    def cli(*args):
        return subprocess.run([sys.executable, "-m", "emulator", "calibrate", "--out", str(tmp_path / "o"),
                               "--no-plans", *args], capture_output=True, text=True, timeout=120, cwd=REPO)

    (tmp_path / "chain.yaml").write_text(CHAIN_YAML)
    bad = cli("--servers", "localhost,-oProxyCommand=x")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--servers" in bad.stderr, bad.stderr
    pin = cli("--servers", "localhost,s2", "--topology", str(tmp_path / "chain.yaml"))
    assert pin.returncode == 2 and pin.stderr.count("\n") == 1, pin.stderr
    assert "clusters[2].server 's3' is not one of --servers (localhost, s2)" in pin.stderr
    (tmp_path / "two.yaml").write_text(TWO_CLUSTER_YAML)  # east here, west on s2: buildable
    split = cli("--servers", "localhost,s2,s3", "--topology", str(tmp_path / "two.yaml"),
                "--topology", str(tmp_path / "chain.yaml"))
    assert split.returncode == 2 and split.stderr.count("\n") == 1, split.stderr
    assert "chain.yaml: link y-z joins servers s2 and s3" in split.stderr
    assert not (tmp_path / "o").exists()


DAEMON = """\
import os, signal, sys, time
from emulator.net.delayd import DelayStage, QueueSpec, _apply_control
stage = DelayStage([QueueSpec(num=1, delay_ms=10.0)], None)
signal.signal(signal.SIGHUP, lambda *_: _apply_control(sys.argv[1], stage))
open(sys.argv[2], "w").write(str(os.getpid()))
print("ready", flush=True)
while True:
    time.sleep(1)
"""


def test_remote_change_script_hands_delays_to_the_daemon_and_reads_its_ack(tmp_path):
    """The script a remote router's live change runs on its server (emulator.net.liveremote), run here
    without commands against delayd's own control handling: the control file is read and acknowledged
    (`ack SEQ TIME`, TIME on the daemon's monotonic clock), a queue the daemon lacks is exit 3 with
    the daemon's reason, and an unanswered signal is exit 4 when the ack does not come."""
    from emulator.net.liveremote import remote_script

    ctl, pidfile = str(tmp_path / "d.ctl"), str(tmp_path / "pid")
    daemon = subprocess.Popen([sys.executable, "-c", DAEMON, ctl, pidfile], cwd=REPO, stdout=subprocess.PIPE)
    try:
        assert daemon.stdout.readline().strip() == b"ready"
        t0 = time.monotonic()
        done = subprocess.run(["sh", "-c", remote_script(1, [], ctl, pidfile, 7, ["1:45:0:0"])],
                              capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        word, seq, at = done.stdout.split()
        assert (word, seq) == ("ack", "7") and t0 <= float(at) <= time.monotonic()
        assert open(ctl).read() == "7\n1:45:0:0\n" and not os.path.exists(ctl + ".tmp")
        refused = subprocess.run(["sh", "-c", remote_script(1, [], ctl, pidfile, 8, ["2:45:0:0"])],
                                 capture_output=True, text=True, timeout=30)
        assert refused.returncode == 3 and "no queue 2 in this delay stage" in refused.stderr, refused
    finally:
        daemon.kill()
        daemon.wait()
    lost = subprocess.run(["sh", "-c", remote_script(1, [], ctl, pidfile, 9, ["1:5:0:0"]).replace("n=2500", "n=5")],
                          capture_output=True, text=True, timeout=30)
    assert lost.returncode != 0 and "ack" not in lost.stdout
