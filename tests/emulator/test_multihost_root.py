"""Multi-server emulation (issue 20) for real: a second server on this machine (a network namespace
running its own sshd, emulator/net/localserver.py), two clusters split over both, the WAN link
between them through Mininet's SSH tunnel with real tc shaping and the delay stage, measured with
the check's own measurements and tolerance; then a crash of the first server, cleaned up by the
agent and `emulator clean` (the second server seeing a /tmp and state directory of its own); then
`emulator run --servers`: a rank pool over SSH, a run whose WAN job spans both servers (warm, on a
second server that shares no files with this one, and with --cold-start), and a crash of the first
server in the middle of a run, the remote ranks' lines kept; live WAN changes, a link between the
servers going down and coming back. Root only; about 250 s."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from emulator.net.check import EXIT_NO_VERDICT
from emulator.net.layout import NetConfig
from emulator.net.localserver import LocalServer, down, up
from emulator.net.measure import measure_all
from emulator.net.multihost import ClusterEmulation
from emulator.net.multihost_check import summarize
from emulator.net.servers import ServerSet, Ssh, assign_clusters
from emulator.net.state import RUN_DIR_PREFIX
from emulator.net.tolerance import DELAY_ABS_MS, delay_ok

from spiderflow.errors import EmulatorError

from .conftest import (PYTHON, REPO, TWO_CLUSTER_1G_YAML, TWO_CLUSTER_YAML, delay_ok_under_steal, rate_ok,
                       two_cluster_topology)

pytestmark = pytest.mark.root
NAME = "sf-srvt"  # not the script's sf-srv2: a test never meets a running multihost-test.sh


@pytest.fixture
def second_server(tmp_path):
    srv = up(LocalServer(name=NAME, dir=tmp_path / "srv", subnet="192.168.253"))
    yield srv
    _assert_down(srv, down(srv))


def _assert_down(srv, removed):
    assert f"namespace {NAME}" in removed
    assert not os.path.exists(f"/run/netns/{NAME}")
    assert subprocess.run(["ip", "link", "show", srv.veth_root], capture_output=True).returncode != 0


def _private(state_dir):
    """The second server with a view of its own of /tmp (and the temp dir) and of the test's state
    directory: nothing either server writes there is seen by the other. Its --dir (sshd's config and
    keys) is outside them, under /run. (None, why) when that view would hide this checkout (a clone
    under /tmp)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    private = (Path("/tmp"), Path(tempfile.gettempdir()), state_dir)
    try:
        return LocalServer(name=NAME, dir=Path("/run") / f"sf-srvp-{uuid.uuid4().hex[:8]}", subnet="192.168.253",
                           private=private), ""
    except EmulatorError as exc:
        if "would hide" not in str(exc):
            raise
        return None, str(exc)


@contextlib.contextmanager
def _running_private(srv):
    up(srv)
    mntns = json.loads(srv.record.read_text())["made"][-1]
    assert mntns["kind"] == "private-view"
    yield srv
    removed = down(srv)
    _assert_down(srv, removed)
    assert any(r.startswith("private view of /tmp") for r in removed) and not srv.dir.exists()
    for pid in filter(str.isdigit, os.listdir("/proc")):  # the mount namespace ended with its last process
        try:
            inode = os.stat(f"/proc/{pid}/ns/mnt").st_ino
        except OSError:
            continue
        assert inode != mntns["mntns"], f"pid {pid} is still in the private view"


@pytest.fixture
def private_server(state_dir):
    srv, why = _private(state_dir)
    if srv is None:
        pytest.skip(f"this checkout cannot run under a second server with a private /tmp ({why})")
    with _running_private(srv):
        yield srv


@pytest.fixture
def far_server(state_dir, request):
    """The private second server where this checkout allows it, else one that shares files
    (``second_server``): the tests that use it look at the far side over ssh either way."""
    srv, _why = _private(state_dir)
    if srv is None:
        yield request.getfixturevalue("second_server")
        return
    with _running_private(srv):
        yield srv


def _there(srv, script: str) -> subprocess.CompletedProcess:
    """``script`` run by sh on the second server, over ssh."""
    return subprocess.run(["ssh", "-F", str(srv.ssh_config), "-o", "BatchMode=yes", srv.name, script],
                          capture_output=True, text=True, timeout=30)


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
        assert rate_ok(t.configured_mbps, r.measured_mbps, r.host_steal_pct, r), r
        assert delay_ok_under_steal(t.configured_delay_ms, r.measured_delay_ms, r.host_steal_pct, r), \
            (t.a, t.b, r.measured_delay_ms)
    summary = summarize(results, assignment)
    assert summary["cross-server"]["directions"] == 2
    # one kernel, one CLOCK_MONOTONIC: the measured offset must be ~0 (within its own error bound + 1 ms)
    assert abs(offset.monotonic_ns) <= offset.error_ns + 1_000_000
    assert_no_leak()
    assert not list(state_dir.glob("remote-*/emulation.json")) and not (state_dir / "emulation.json").exists()


def test_crash_of_the_first_server_is_cleaned_everywhere(far_server, state_dir, assert_no_leak, tmp_path):
    """kill -9 of the first server's process: the agent removes the far part by itself, `emulator clean`
    the rest. The second server sees a /tmp and state directory of its own where this checkout allows
    (not under /tmp), so its state file is looked at over ssh (nothing here may rely on seeing it)."""
    private_server = far_server
    topo_file = tmp_path / "two.yaml"
    topo_file.write_text(TWO_CLUSTER_YAML)
    argv = [PYTHON, "-m", "emulator", "check", "--topology", str(topo_file), "--hosts-per-cluster", "1",
            "--servers", f"localhost,{NAME}", "--ssh-config", str(private_server.ssh_config), "--no-overhead"]
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

    def there_state():
        return _there(private_server, f"test -e {remote_state}").returncode == 0

    assert there_state() and (not private_server.private or not remote_state.exists())
    os.kill(proc.pid, signal.SIGKILL)  # the first server "crashes": no teardown of its own
    proc.wait()
    proc.stderr.close()
    # its SSH connections closed: the agent on the other server removed its part by itself
    deadline = time.monotonic() + 20
    while there_state() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not there_state()
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


# ------------------------------------------------------------------ emulator run --servers
TARGETS = "tests.emulator.pool_targets"
RUN_TRACE = """\
job_id,arrival_s,model,gpus,iterations,global_batch,seq_len
wan,0.0,gpt3-125m,12,20,32,1024
local,0.0,gpt3-125m,4,50,32,1024
"""


def test_a_rank_pool_on_the_other_server(second_server, tmp_path):
    """The fork server over SSH: its children run on the other server (its network namespace here),
    their files are sent and fetched through it, signals go through it; a pool that cannot start
    there is one line naming the server."""
    from emulator.jobs.remotepool import ServerRankPool

    ssh = Ssh(config=str(second_server.ssh_config))
    there = tmp_path / "there"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    with ServerRankPool(server=NAME, ssh=ssh, files_dir=str(there), marker="t@x", preload=(TARGETS,)) as pool:
        assert pool.remote and pool.clock_offset_ns == 0
        report = there / "report.json"
        child = pool.start(module=TARGETS, args=["report", str(report)], env=env, log_path=str(there / "r.log"),
                           ns_pid=None, files={str(there / "in.json"): "{}"})
        assert child.wait(timeout=30) == 0
        seen = json.loads(pool.fetch([str(report)])[str(report)])
        assert seen["ns"]["net"] == f"net:[{os.stat(f'/run/netns/{NAME}').st_ino}]"  # the other server's
        assert seen["env"]["PYTHONPATH"] == str(REPO)  # the environment travels with the request
        assert pool.stat([str(there / "in.json")]) == {str(there / "in.json"): 2}
        sleeper = pool.start(module=TARGETS, args=["sleep", "60"], env=env, log_path=str(there / "s.log"),
                             ns_pid=None)
        sleeper.killpg(signal.SIGTERM)
        assert sleeper.wait(timeout=15) == -signal.SIGTERM
    with pytest.raises(EmulatorError) as err:
        ServerRankPool(server=NAME, ssh=ssh, files_dir=str(there), marker="t@x", preload=("no_such_module_x",),
                       stderr_path=str(tmp_path / "pool.log"))
    assert str(err.value).startswith(f"{NAME}: the rank pool did not start over ssh") and "\n" not in str(err.value)


def test_the_servers_pools_start_together(second_server, state_dir, assert_no_leak):
    """ServerPools spawns every server's fork server before it waits for any: the other server's
    pool was started before this one had imported its modules (torch: seconds of CPU each, which
    now overlap instead of adding up), and each serves ranks in its own server's hosts."""
    from emulator.jobs.remotepool import ServerPools

    topo = two_cluster_topology()
    servers = _servers(second_server)
    servers.tunnel = "vxlan"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    with ClusterEmulation(topo, NetConfig(hosts_per_cluster=1), servers=servers,
                          assignment={"east": "localhost", "west": NAME}) as emu:
        with ServerPools(emu, preload=("torch", TARGETS)) as pools:
            here, there = pools.for_host("east-h0"), pools.for_host("west-h0")
            assert not here.remote and there.remote
            assert there._started < here.ready_at and here._started < there.ready_at
            for pool, host in ((here, "east-h0"), (there, "west-h0")):
                files = pool.files_dir or str(state_dir)
                child = pool.start(module=TARGETS, args=["sleep", "0"], env=env, log_path=f"{files}/{host}.log",
                                   ns_pid=emu.node(host).pid if not pool.remote else None)
                assert child.wait(timeout=30) == 0
    assert_no_leak()


def test_run_over_two_servers_cold(second_server, state_dir, assert_no_leak, tmp_path):
    """`emulator run --servers --cold-start`: the WAN job's ranks on both servers, each exec'd as a new
    interpreter from its server's cold pool, every job ok and within the bound of the one-server root
    test, the remote ranks' files copied back, nothing left on either server. (The warm run, the
    default, is the next test's, on a second server that shares no files with this one.)"""
    _run_over_two_servers(second_server, tmp_path, ["--cold-start"])
    assert not list(state_dir.glob("remote-*/emulation.json")) and not (state_dir / "emulation.json").exists()
    assert not marked_for(NAME)
    assert_no_leak()


def test_run_over_two_servers_sharing_no_files(private_server, state_dir, assert_no_leak, tmp_path):
    """The same run with a second server that sees a /tmp and a state directory of its own (nothing the
    two write there is seen by the other): every job ok, the remote ranks' lines copied back here, and
    nothing left on either server -- the far side's state and scratch directories and processes asked
    over ssh, since its files are not visible here; `emulator check --servers` in the same set-up."""
    srv = private_server
    here = tmp_path / "written-here"
    here.write_text("here\n")
    written_there = Path(tempfile.gettempdir()) / f"sf-written-there-{uuid.uuid4().hex[:8]}"
    seen = _there(srv, f"test ! -e {here} && test -z \"$(ls -A {state_dir} 2>/dev/null)\" && touch {written_there} "
                       f"&& test -e {written_there} && echo private")
    assert seen.stdout == "private\n" and not written_there.exists(), (seen.stdout, seen.stderr)
    _run_over_two_servers(srv, tmp_path, [])
    (tmp_path / "two0.6.yaml").write_text(TWO_CLUSTER_YAML)
    check = subprocess.run([PYTHON, "-m", "emulator", "check", "--topology", str(tmp_path / "two0.6.yaml"), "--json",
                            "--hosts-per-cluster", "1", "--seconds", "1", "--no-overhead", "--servers",
                            f"localhost,{NAME}", "--ssh-config", str(srv.ssh_config), "--tunnel", "vxlan"],
                           cwd=REPO, capture_output=True, text=True, timeout=120, env=os.environ)
    assert check.returncode in (0, 1, EXIT_NO_VERDICT), check.stderr[-3000:]
    links = json.loads(check.stdout)["links"]
    assert len(links) == 2 and all(link["cross_server"] for link in links)
    for link in links:
        assert rate_ok(link["configured_mbps"], link["measured_mbps"], link["host_steal_pct"], link), link
        assert delay_ok_under_steal(link["configured_delay_ms"], link["measured_delay_ms"], link["host_steal_pct"],
                                    link), link
    # the far side, asked there: its state directory holds at most the (free) lock, no scratch directory
    # and no process carrying a marker for it are left
    left = _there(srv, f"ls -A {state_dir}/remote-{NAME}; ls -d {tempfile.gettempdir()}/{RUN_DIR_PREFIX}* "
                       f"{written_there} 2>/dev/null; for p in /proc/[0-9]*; do tr '\\0' '\\n' <$p/environ "
                       f"2>/dev/null | grep -q '^SPIDERFLOW_EMULATION=.*@{NAME}$' && echo $p; done; true")
    assert left.returncode == 0 and left.stdout.split() == ["emulator.lock", str(written_there)], left
    assert not list(state_dir.glob("remote-*")) and not (state_dir / "emulation.json").exists()
    assert not marked_for(NAME)
    assert_no_leak()


def _run_over_two_servers(srv, tmp_path, start):
    """`emulator run --servers localhost,NAME --tunnel vxlan` on the two-cluster trace: every job ok within
    the one-server root test's bound, the remote ranks' JSON lines back in --out here."""
    (tmp_path / "two.yaml").write_text(TWO_CLUSTER_1G_YAML)
    (tmp_path / "two.csv").write_text(RUN_TRACE)
    out = tmp_path / "out"
    argv = [PYTHON, "-m", "emulator", "run", "--topology", str(tmp_path / "two.yaml"), "--trace",
            str(tmp_path / "two.csv"), "--hosts-per-cluster", "3", "--out", str(out), "--json",
            "--servers", f"localhost,{NAME}", "--ssh-config", str(srv.ssh_config), "--tunnel", "vxlan", *start]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=240, env=os.environ)
    assert done.returncode == 0, done.stderr[-3000:]
    jobs = {j["job_id"]: j for j in json.loads(done.stdout)["jobs"]}
    assert set(jobs) == {"wan", "local"}
    for j in jobs.values():
        assert j["status"] == "ok" and abs(j["error_pct"]) < 35.0, j
    launched = [json.loads(line) for line in (out / "launched.jsonl").read_text().splitlines()]
    remote = [r for r in launched if r.get("server") == NAME]
    assert remote and all(r["host"].startswith("west-") for r in remote)
    for r in remote:  # copied back into the run directory here, with the iterations measured there
        lines = [json.loads(x) for x in (out / "ranks" / f"{r['job_id']}-r{r['rank']}.jsonl").read_text().splitlines()]
        assert lines[0]["event"] == "start" and lines[-1]["event"] == "done"
    config = json.loads((out / "config.json").read_text())
    assert config["servers"] == ["localhost", NAME] and NAME in config["clock_offsets"]
    assert config["rank_start"] == ("cold (exec from each server's pool)" if start else "warm pool")
    if start:  # every server's pool is cold, this one's too
        assert done.stderr.count("cold: each rank execs python -m MODULE") == 2, done.stderr[-3000:]


def test_a_move_ends_and_starts_ranks_on_both_servers(second_server, state_dir, assert_no_leak, tmp_path):
    """SpinSearch's voluntary re-planning with --servers: the three-cluster move of test_run_root.py, its
    clusters split over the two servers. The moved job's ranks on the other server are ended and their
    lines copied back, its iterations left counted from the copies, and its new ranks run the rest."""
    from .test_run_root import MOVE_EVENTS, MOVE_TRACE, THREE_CLUSTERS_YAML, iterations_logged

    (tmp_path / "three.yaml").write_text(THREE_CLUSTERS_YAML)
    (tmp_path / "move.csv").write_text(MOVE_TRACE)
    (tmp_path / "events.csv").write_text(MOVE_EVENTS)
    out = tmp_path / "out"
    argv = [PYTHON, "-m", "emulator", "run", "--topology", str(tmp_path / "three.yaml"), "--trace",
            str(tmp_path / "move.csv"), "--hosts-per-cluster", "3", "--out", str(out), "--json", "--iterations", "40",
            "--no-wait", "--dilation", "2", "--wan-events", str(tmp_path / "events.csv"),
            "--servers", f"localhost,{NAME}", "--ssh-config", str(second_server.ssh_config), "--tunnel", "vxlan"]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=240, env=os.environ)
    assert done.returncode == 0, done.stderr[-3000:]
    wan = {j["job_id"]: j for j in json.loads(done.stdout)["jobs"]}["wan"]
    assert wan["status"] == "ok" and wan["placement"] == {"north": 16} and wan["replanned"] == 1, wan
    assert "wan: moved after" in done.stderr, done.stderr[-3000:]
    launched = [json.loads(line) for line in (out / "launched.jsonl").read_text().splitlines()]
    servers = {r.get("server", "localhost") for r in launched if r["job_id"] in ("wan", "wan.1")}
    assert servers == {"localhost", NAME}, launched  # the move involved ranks on both servers
    ranks = out / "ranks"
    first, second = iterations_logged(ranks / "wan-r0.jsonl"), iterations_logged(ranks / "wan.1-r0.jsonl")
    assert 0 < first < 40 and first + second == 40
    assert not marked_for(NAME)
    assert_no_leak()


def marked_for(server: str) -> list[str]:
    """Live processes carrying any emulation's marker for ``server`` (``<run id>@<server>``)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
        except OSError:
            continue
        if any(e.startswith(b"SPIDERFLOW_EMULATION=") and e.endswith(f"@{server}".encode()) for e in env):
            found.append(pid)
    return found


def test_crash_of_the_first_server_during_a_run(second_server, state_dir, assert_no_leak, tmp_path):
    """kill -9 of `emulator run --servers` while ranks run on the other server: what they had written is
    in --out here already (their lines are copied while they run), the remote pool and its ranks end
    with the SSH connection (and the agent), `emulator clean` removes the rest here."""
    (tmp_path / "two.yaml").write_text(TWO_CLUSTER_1G_YAML)
    (tmp_path / "two.csv").write_text(RUN_TRACE)
    out = tmp_path / "out"
    argv = [PYTHON, "-m", "emulator", "run", "--topology", str(tmp_path / "two.yaml"), "--trace",
            str(tmp_path / "two.csv"), "--hosts-per-cluster", "3", "--out", str(out), "--dilation", "2",
            "--servers", f"localhost,{NAME}", "--ssh-config", str(second_server.ssh_config), "--tunnel", "vxlan"]
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=os.environ)
    deadline = time.monotonic() + 90
    launched, copied = out / "launched.jsonl", None
    while time.monotonic() < deadline and proc.poll() is None and copied is None:
        remote = [json.loads(x) for x in launched.read_text().splitlines()] if launched.exists() else []
        for r in remote:
            copy = out / "ranks" / f"{r['job_id']}-r{r['rank']}.jsonl"
            text = copy.read_text() if r.get("server") == NAME and copy.exists() else ""
            if text.count("\n") >= 2 and '"done"' not in text:
                copied = copy  # a remote rank's lines, here while it runs (its end not written yet)
        time.sleep(0.1)
    assert proc.poll() is None and marked_for(NAME) and copied is not None, "no remote rank's lines came back"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert json.loads(copied.read_text().splitlines()[0])["event"] == "start"  # and kept after the crash
    deadline = time.monotonic() + 20
    while (marked_for(NAME) or list(state_dir.glob("remote-*/emulation.json"))) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not marked_for(NAME) and not list(state_dir.glob("remote-*/emulation.json"))
    done = subprocess.run([PYTHON, "-m", "emulator", "clean"], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env=os.environ)
    assert done.returncode == 0 and "cleaned emulation" in done.stdout, done.stderr
    assert_no_leak()


# ------------------------------------------------------------ emulator calibrate --servers
def test_calibrate_over_two_servers(second_server, state_dir, assert_no_leak, tmp_path):
    """`emulator calibrate --servers`: west's bench ranks start from the other server's pool and write
    in its scratch directory, never in --out; their lines come back here, so the cross-server p2p and
    ring records are there at every size, and the WAN link fits its configured bandwidth and delay."""
    from spiderflow.costmodel import load_calibration

    (tmp_path / "two.yaml").write_text(TWO_CLUSTER_1G_YAML)
    out = tmp_path / "cal"
    # the shipped default of 3 samples, a median per size: with 1, one slow 16 MB transfer under the
    # suite's load fitted the 1 Gbit/s link at 0.80 Gbit/s in a CI run
    argv = [PYTHON, "-m", "emulator", "calibrate", "--topology", str(tmp_path / "two.yaml"), "--no-plans",
            "--samples", "3", "--out", str(out), "--json", "--servers", f"localhost,{NAME}",
            "--ssh-config", str(second_server.ssh_config), "--tunnel", "vxlan"]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=240, env=os.environ)
    assert done.returncode == 0, done.stderr[-3000:]
    config = json.loads((out / "config.json").read_text())
    source = str(tmp_path / "two.yaml")
    assert config["servers"] == ["localhost", NAME] and config["tunnel"] == "vxlan"
    assert config["assignment"] == {source: {"east": "localhost", "west": NAME}}
    assert NAME in config["clock_offsets"][source]
    records = [json.loads(x) for x in (out / "microbench.jsonl").read_text().splitlines()]
    cross = {(r["op"], r["bytes"]) for r in records if sorted(r["clusters"]) == ["east", "west"]}
    sizes = [4096 * 16 ** k for k in range(5)]
    assert {("p2p", s) for s in sizes} <= cross and {("all_reduce", s) for s in sizes} <= cross
    assert {r["name"] for r in records if r["scope"] == "intra" and r["op"] == "p2p"} == {"east", "west"}
    bench = out / "bench-two" / "bench"
    for rank in (2, 3):  # west's ranks: on the other server, their files copied back
        spec = json.loads((bench / f"r{rank}.json").read_text())
        assert spec["out"].endswith(f"/ranks/bench-two-r{rank}.jsonl") and not spec["out"].startswith(str(out))
        lines = [json.loads(x) for x in (bench / f"r{rank}.jsonl").read_text().splitlines()]
        assert lines[-1] == {"event": "done", "rank": rank} and (bench / f"r{rank}.log").exists()
    wan = load_calibration(json.loads(done.stdout)["calibration"][0]).path("east", "west")
    assert rate_ok(1000.0, wan.beta_gbps * 1000, config["host_steal_pct"], wan), wan
    assert delay_ok_under_steal(10.0, wan.alpha_s * 1e3, config["host_steal_pct"], wan), wan
    assert not list(state_dir.glob("remote-*/emulation.json")) and not (state_dir / "emulation.json").exists()
    assert not marked_for(NAME)
    assert_no_leak()


# ------------------------------------------------------------ live WAN changes on another server
def _default_split(srv):
    """The default topology split over this server and ``srv`` as `run` splits it (oregon, virginia
    here; london, tokyo there), tunnelled with VXLAN: (topology, servers, assignment)."""
    from spiderflow.topology import load_topology

    topo = load_topology(str(REPO / "topologies/default.yaml"))
    servers = _servers(srv)
    servers.tunnel = "vxlan"
    assignment = assign_clusters(topo.names, servers.names)
    assert assignment == {"oregon": "localhost", "virginia": "localhost", "london": NAME, "tokyo": NAME}
    return topo, servers, assignment


def test_live_wan_changes_on_the_other_servers_routers(second_server, state_dir, assert_no_leak):
    """--wan-events with --servers (issue 20): the default topology split as `run` splits it (oregon,
    virginia here; london, tokyo there), a change of the tunnelled virginia-london link and of
    tokyo-london (both ends on the other server) is made there: the htb rate read back in the remote
    routers' namespaces, the new delay measured end to end through the remote delay daemons (its
    control file written there, acknowledged, the moment put on our clock)."""
    from spiderflow.wan import WanEvent

    from emulator.net.live import LiveNetwork
    from emulator.net.liveremote import run_in_shell
    from emulator.net.measure import measure_delays, targets

    topo, servers, assignment = _default_split(second_server)

    def ev(a, b, gbps, ms):
        return WanEvent(time_s=0.0, a=a, b=b, bandwidth_gbps=gbps, latency_ms=ms, up=True)

    with ClusterEmulation(topo, NetConfig(hosts_per_cluster=1), servers=servers, assignment=assignment) as emu:
        live = LiveNetwork(emu)
        # its remote shells are up when it returns: a line each answers at once (an SSH session
        # starting takes ~0.25 s here, and the first change used to pay for it)
        ready = time.monotonic()
        for shell in live._shells.values():
            run_in_shell(shell, ":", 5.0)
        ready = time.monotonic() - ready
        before = emu.run("london-gw", ["tc", "class", "show", "dev", "w-tokyo"]).stdout
        t0 = time.monotonic()
        applied = live.apply([ev("virginia", "london", 0.3, 45.0), ev("tokyo", "london", 0.3, 60.0)])
        t1 = time.monotonic()
        rates = {(gw, dev): emu.run(gw, ["tc", "class", "show", "dev", dev]).stdout
                 for gw, dev in [("london-gw", "w-virginia"), ("london-gw", "w-tokyo"), ("tokyo-gw", "w-london"),
                                 ("virginia-gw", "w-london")]}
        pairs = [t for t in targets(emu) if t.kind == "wan" and {t.a, t.b} in ({"virginia", "london"},
                                                                                {"tokyo", "london"})]
        delays = measure_delays(emu, pairs, count=10)
        mechanism = emu.mechanism
        restored = live.restore()
        after = emu.run("london-gw", ["tc", "class", "show", "dev", "w-tokyo"]).stdout
    assert "rate 31367Kbit" not in before
    for where, line in rates.items():  # 0.3 Gbit/s / scale 10, on the wire (framing): as on one server
        assert "rate 31367Kbit" in line, (where, line)
    # in force before apply() returned (the remote daemons' acks, on our clock), well under the 0.44-1.2 s an
    # SSH session per change took (the step test's 100 ms holds on an idle machine; with the other core busy
    # it took 147 ms once, so the bound here is the mechanism's, not a timing target)
    assert len(live._shells) == 2 and ready < 0.1, ready
    assert t0 <= applied <= t1 and applied - t0 <= 0.3 and restored > applied, (t0, applied, t1)
    assert "rate 31367Kbit" not in after
    assert len(delays) == 4  # both directions of both links
    for pair, (fwd, rev) in delays.items():
        want = 45.0 if "virginia-h0" in pair else 60.0
        assert delay_ok(want, fwd) and delay_ok(want, rev), (mechanism, pair, fwd, rev)
    assert_no_leak()
    assert not list(state_dir.glob("remote-*/emulation.json")) and not (state_dir / "emulation.json").exists()


def test_a_link_between_servers_goes_down_and_comes_back(second_server, state_dir, assert_no_leak):
    """A WAN event taking down the tunnelled virginia-london link (virginia here, london on the other
    server): both ends' devices go down (the remote one in the other server's router), traffic
    between them takes the way round the ring (virginia-oregon here, the tunnelled oregon-tokyo,
    tokyo-london there: 33.5 + 48.5 + 115 ms one way), and when the link comes back up the direct
    route and its 38 ms are in force again."""
    from spiderflow.wan import WanEvent

    from emulator.net.live import LiveNetwork
    from emulator.net.measure import measure_delays, targets

    topo, servers, assignment = _default_split(second_server)

    def link(up):
        return WanEvent(time_s=0.0, a="virginia", b="london", bandwidth_gbps=None, latency_ms=None, up=up)

    def state(emu, gw, dev):
        return emu.run(gw, ["ip", "-o", "link", "show", "dev", dev]).stdout

    with ClusterEmulation(topo, NetConfig(hosts_per_cluster=1), servers=servers, assignment=assignment) as emu:
        live = LiveNetwork(emu)
        pair = [t for t in targets(emu) if t.kind == "wan" and (t.a, t.b) == ("virginia", "london")]
        direct = measure_delays(emu, pair, count=10)
        live.apply([link(False)])
        down_here, down_there = state(emu, "virginia-gw", "w-london"), state(emu, "london-gw", "w-virginia")
        round_ = measure_delays(emu, pair, count=10)
        live.apply([link(True)])
        up_here, up_there = state(emu, "virginia-gw", "w-london"), state(emu, "london-gw", "w-virginia")
        back = measure_delays(emu, pair, count=10)
        mechanism = emu.mechanism
    for text in (down_here, down_there):  # "<BROADCAST,MULTICAST> ... state DOWN"
        assert ",UP" not in text.split(">")[0] and "state DOWN" in text, text
    for text in (up_here, up_there):  # "<BROADCAST,MULTICAST,UP,LOWER_UP>"
        assert ",UP," in text.split(">")[0], text
    ((fwd, rev),) = direct.values()
    assert delay_ok(38.0, fwd) and delay_ok(38.0, rev), (mechanism, fwd, rev)
    ((fwd, rev),) = round_.values()
    # three WAN links in series, each with its own delay element: each is allowed the one-link
    # tolerance (2 ms; with NFQUEUE each hop adds its processing: 199.04 ms measured once in CI)
    detour = 3 * DELAY_ABS_MS
    assert delay_ok(197.0, fwd, abs_ms=detour) and delay_ok(197.0, rev, abs_ms=detour), (mechanism, fwd, rev)
    ((fwd, rev),) = back.values()
    assert delay_ok(38.0, fwd) and delay_ok(38.0, rev), (mechanism, fwd, rev)
    assert_no_leak()
    assert not list(state_dir.glob("remote-*/emulation.json")) and not (state_dir / "emulation.json").exists()


def test_check_step_over_two_servers(second_server, state_dir, assert_no_leak, tmp_path):
    """`emulator check --servers --step`: the tunnelled east-west link (west on the other server) halved
    and restored under one flow towards east (its bytes read here), the change made in both routers,
    the remote one through its kept shell: in force within the step test's 100 ms, and the rate settled."""
    (tmp_path / "two.yaml").write_text(TWO_CLUSTER_YAML)
    argv = [PYTHON, "-m", "emulator", "check", "--topology", str(tmp_path / "two.yaml"), "--json",
            "--hosts-per-cluster", "1", "--seconds", "2", "--step", "--no-overhead",
            "--servers", f"localhost,{NAME}", "--ssh-config", str(second_server.ssh_config), "--tunnel", "vxlan"]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=240, env=os.environ)
    assert done.returncode in (0, 1, EXIT_NO_VERDICT), done.stderr[-3000:]
    report = json.loads(done.stdout)
    down, up = report["steps"]
    assert down["direction"] == "west -> east" and (down["from_gbps"], down["to_gbps"], up["to_gbps"]) == (0.6, 0.3, 0.6)
    for step in (down, up):
        assert step["apply_ms"] <= 100 and step["settle_s"] is not None, step
        expected = step["rate_before_mbps"] * step["to_gbps"] / step["from_gbps"]
        assert step["rate_after_mbps"] == pytest.approx(expected, rel=0.1), step
    assert not list(state_dir.glob("remote-*/emulation.json")) and not (state_dir / "emulation.json").exists()
    assert_no_leak()
