"""The warm rank pool: forked ranks run real jobs, report their exit like Popen, die with the pool;
as root, a child joins a Mininet host's namespaces and nothing of the pool outlives the emulation."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spiderflow.errors import EmulatorError
from emulator.jobs.pool import RankPool
from emulator.jobs.worker import RankSpec

from .conftest import REPO, free_port, two_cluster_topology

TARGETS = "tests.emulator.pool_targets"


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


@pytest.fixture(scope="module")
def pool():
    with RankPool(preload=("torch", "torch.distributed", "emulator.jobs.worker")) as p:
        yield p


def target(pool, tmp_path, *args, **kwargs):
    return pool.start(module=TARGETS, args=list(args), env=dict(os.environ), log_path=str(tmp_path / "child.log"),
                      ns_pid=None, **kwargs)


def test_a_two_rank_worker_job_over_loopback(pool, tmp_path):
    port, procs = free_port(), []
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    for rank in range(2):
        spec = RankSpec(job_id="t", rank=rank, world_size=2, master_addr="127.0.0.1", master_port=port,
                        stage=rank, depth=2, micro_batches=2, iterations=2, forward_s=0.01, backward_s=0.02,
                        activation_bytes=4096, grad_bytes=64, prev_rank=rank - 1 if rank else None,
                        next_rank=None if rank else 1, out=str(tmp_path / f"r{rank}.jsonl"), timeout_s=60)
        spec.dump(tmp_path / f"r{rank}.json")
        procs.append(pool.start(module="emulator.jobs.worker", args=[str(tmp_path / f"r{rank}.json")], env=env,
                                log_path=str(tmp_path / f"r{rank}.log"), ns_pid=None, nice=5))
    assert [p.wait(timeout=60) for p in procs] == [0, 0]
    for rank in range(2):
        lines = [json.loads(line) for line in (tmp_path / f"r{rank}.jsonl").read_text().splitlines()]
        assert lines[0]["event"] == "start" and lines[-1]["event"] == "done"
        assert [sum(o.get("kind") == k for o in lines) for k in "FBS"] == [4, 4, 2]


def test_the_child_gets_its_own_group_env_cwd_and_nice(pool, tmp_path):
    env = {"ONLY_THIS": "1", "PATH": os.environ["PATH"]}
    proc = pool.start(module=TARGETS, args=["report", str(tmp_path / "seen.json")], env=env,
                      log_path=str(tmp_path / "child.log"), ns_pid=None, nice=7, cwd=str(tmp_path))
    assert proc.wait(timeout=10) == 0
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert seen["pid"] == proc.pid == seen["pgid"] and seen["sid"] == pool.pid  # the server leads the session
    assert seen["env"] == env and seen["cwd"] == str(tmp_path) and seen["nice"] == 7
    assert seen["ns"]["net"] == os.readlink("/proc/self/ns/net")
    assert (tmp_path / "child.log").read_text() == "reported\n"


def test_exit_status_and_traceback_of_a_failing_child(pool, tmp_path):
    assert target(pool, tmp_path, "exit", "3").wait(timeout=10) == 3
    assert target(pool, tmp_path, "raise").wait(timeout=10) == 1
    log = (tmp_path / "child.log").read_text()
    assert "Traceback" in log and "RuntimeError: boom from a pooled child" in log
    assert target(pool, tmp_path, "nope").wait(timeout=10) == 1  # SystemExit("...") as a script's
    assert "unknown target 'nope'" in (tmp_path / "child.log").read_text()


def test_a_cold_pools_child_execs_a_new_interpreter(pool, tmp_path):
    """A cold pool's child is `python -m MODULE ARGS`, which imports what it needs itself (the warm
    pool's child has torch and the pool's imports from its server), with a warm child's group, session,
    environment, cwd, nice, exit statuses, and death with its server (PR_SET_PDEATHSIG survives execve)."""
    env = {"ONLY_THIS": "1", "PATH": os.environ["PATH"], "PYTHONPATH": str(REPO)}
    seen = {}
    cold = RankPool(cold=True)
    try:
        for name, p in (("warm", pool), ("cold", cold)):
            proc = p.start(module=TARGETS, args=["report", str(tmp_path / f"{name}.json")], env=env,
                           log_path=str(tmp_path / f"{name}.log"), ns_pid=None, nice=7, cwd=str(tmp_path))
            assert proc.wait(timeout=30) == 0, (tmp_path / f"{name}.log").read_text()
            seen[name] = json.loads((tmp_path / f"{name}.json").read_text())
        warm_seen, cold_seen = seen["warm"], seen["cold"]
        assert warm_seen["imported"] == {"torch": True, "spiderflow.errors": True}
        assert warm_seen["cmdline"][1:4] == ["-m", "emulator.jobs.pool", "--serve"]  # the server's, forked
        assert cold_seen["imported"] == {"torch": False, "spiderflow.errors": False}
        assert cold_seen["cmdline"] == [sys.executable, "-m", TARGETS, "report", str(tmp_path / "cold.json")]
        assert cold_seen["pid"] == cold_seen["pgid"] and cold_seen["sid"] == cold.pid
        cold_seen["env"].pop("LC_CTYPE", None)  # PEP 538: a new interpreter in the C locale sets it
        assert cold_seen["env"] == env and cold_seen["cwd"] == str(tmp_path) and cold_seen["nice"] == 7
        assert (tmp_path / "cold.log").read_text() == "reported\n"
        assert target(cold, tmp_path, "exit", "3").wait(timeout=30) == 3
        assert target(cold, tmp_path, "raise").wait(timeout=30) == 1
        assert "RuntimeError: boom from a pooled child" in (tmp_path / "child.log").read_text()
        sleeper = target(cold, tmp_path, "sleep", "60")
        os.kill(cold.pid, signal.SIGKILL)
        assert sleeper.wait(timeout=10) == -signal.SIGKILL
        deadline = time.monotonic() + 10
        while alive(sleeper.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(sleeper.pid)  # its death signal, not the server's shutdown
    finally:
        cold.close()


def test_a_cold_pool_preloads_nothing():
    with pytest.raises(ValueError, match="a cold rank pool preloads nothing"):
        RankPool(cold=True, preload=("torch",))


def test_a_killed_child_reports_minus_9_and_the_server_serves_on(pool, tmp_path):
    proc = target(pool, tmp_path, "sleep", "60")
    assert proc.poll() is None
    os.killpg(proc.pid, signal.SIGKILL)  # as the runner ends a job's ranks
    assert proc.wait(timeout=10) == -signal.SIGKILL
    assert alive(pool.pid)
    proc = target(pool, tmp_path, "sleep", "60")
    proc.terminate()
    assert proc.wait(timeout=10) == -signal.SIGTERM
    assert target(pool, tmp_path, "exit", "0").wait(timeout=10) == 0


def test_closing_the_pool_ends_its_children(tmp_path):
    pool = RankPool(preload=())
    proc = target(pool, tmp_path, "sleep", "60")
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=0.2)
    pool.close()
    assert proc.poll() == -signal.SIGKILL
    assert not alive(proc.pid) and not alive(pool.pid)


def test_a_server_killed_from_outside_fails_its_children_with_minus_9(tmp_path):
    pool = RankPool(preload=())
    proc = target(pool, tmp_path, "sleep", "60")
    pool.check()  # alive: says nothing
    os.kill(pool.pid, signal.SIGKILL)
    assert proc.wait(timeout=10) == -signal.SIGKILL
    with pytest.raises(EmulatorError, match=rf"^the rank pool \(pid {pool.pid}\) was killed by signal SIGKILL: "):
        pool.check()  # what emulator run asks every poll
    with pytest.raises(EmulatorError, match=rf"^the rank pool \(pid {pool.pid}\) was killed by signal SIGKILL: "):
        target(pool, tmp_path, "exit", "0")  # a launch says the same
    pool.close()


def test_a_launch_that_meets_a_dead_server_says_how_it_ended(tmp_path):
    """Before anything has read the server's end (the run's poll checks between scheduling passes)."""
    pool = RankPool(preload=())
    os.kill(pool.pid, signal.SIGKILL)
    with pytest.raises(EmulatorError, match=rf"^the rank pool \(pid {pool.pid}\) was killed by signal SIGKILL: "
                                            "the ranks it started died with it and no other can start; run again$"):
        target(pool, tmp_path, "exit", "0")
    pool.close()
    with pytest.raises(EmulatorError, match=r"was closed; start a new RankPool"):
        target(pool, tmp_path, "exit", "0")


def test_a_failed_preload_is_one_clear_error():
    with pytest.raises(EmulatorError, match="preloading failed: ModuleNotFoundError.*no_such_module"):
        RankPool(preload=("no_such_module",))


@pytest.mark.root
def test_a_child_joins_the_hosts_namespaces_and_nothing_outlives_the_emulation(tmp_path, state_dir,
                                                                               assert_no_leak):
    from emulator.net.emulation import Emulation
    from emulator.net.layout import NetConfig

    with Emulation(two_cluster_topology(), NetConfig(hosts_per_cluster=1)) as emu:
        pool = RankPool(emu, preload=("torch",))  # not closed: the emulation's teardown must end it
        shell = emu.node("east-h0").pid
        proc = pool.start(module=TARGETS, args=["report", str(tmp_path / "seen.json")], env=dict(os.environ),
                          log_path=str(tmp_path / "child.log"), ns_pid=shell, role="j0/r0")
        assert proc.wait(timeout=20) == 0, (tmp_path / "child.log").read_text()
        seen = json.loads((tmp_path / "seen.json").read_text())
        assert seen["ns"] == {ns: os.readlink(f"/proc/{shell}/ns/{ns}") for ns in ("net", "mnt")}
        assert seen["ns"]["net"] != os.readlink("/proc/self/ns/net")
        sleeper = pool.start(module=TARGETS, args=["sleep", "300"], env=dict(os.environ),
                             log_path=str(tmp_path / "child.log"), ns_pid=emu.node("west-h0").pid, role="j0/r1")
        roles = {p["role"] for p in json.loads((state_dir / "emulation.json").read_text())["processes"]}
        assert {"rank-pool", "j0/r1"} <= roles
    assert sleeper.poll() is not None and not alive(sleeper.pid) and not alive(pool.pid)
    assert_no_leak()
