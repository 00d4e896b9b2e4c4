"""Lock, state file and removal by state (no root: uses processes of our own)."""

import json
import os
import subprocess
import sys
import uuid

import pytest

from spiderflow.errors import EmulatorError
from emulator.net.state import MARKER_ENV, ProcRecord, StateStore, how_it_ended, marked_pids, proc_has_marker, \
    proc_starttime, remove_leftovers


def test_how_a_process_ended_is_said_in_words():
    """Popen.returncode in the words of a job's reason and of a dead delay daemon's line."""
    assert how_it_ended(0) == "exited with 0" and how_it_ended(3) == "exited with 3"
    assert how_it_ended(-9) == "was killed by signal SIGKILL"
    assert how_it_ended(-40) == "was killed by signal 40"  # a real-time signal: no name, no ValueError


def test_second_lock_holder_is_refused_with_the_owner_named(tmp_path):
    first, second = StateStore(tmp_path), StateStore(tmp_path)
    first.acquire()
    first.write({"owner_pid": 4242, "topology": "paper8", "started": "2026-01-01T00:00:00"})
    try:
        with pytest.raises(EmulatorError, match=r"another emulation is running \(pid 4242, topology paper8"):
            second.acquire()
    finally:
        first.release()
    second.acquire()  # free again once released
    second.release()


def test_state_round_trip_and_unreadable_file(tmp_path):
    store = StateStore(tmp_path)
    assert store.read() is None
    store.write({"run_id": "x", "processes": []})
    assert store.read() == {"run_id": "x", "processes": []}
    store.path.write_text("{not json")
    with pytest.raises(EmulatorError, match="unreadable state file"):
        store.read()
    for bad, says in (([1], "the top level is a list"), ({"run_id": 5}, "run_id is 5"),
                      ({"processes": [{"pid": 1, "starttime": "x", "role": "shell"}]}, r"processes\[0\] is not"),
                      ({"processes": [{"pid": 1}]}, r"processes\[0\] is not"), ({"files": "/tmp"}, "files is not"),
                      ({"servers": [None]}, "servers is not"), ({"ssh": [1]}, "ssh is not")):
        store.path.write_text(json.dumps(bad))  # by hand, or by another version: never a traceback in clean
        with pytest.raises(EmulatorError, match=rf"^{store.path}: unreadable state file \({says}.*delete it by hand"):
            store.read()
    store.remove()
    assert store.read() is None


def sleeper(marker=None):
    """A process that sleeps, returned once it runs Python: Popen returns as soon as the exec closed its
    pipe, before the kernel has set up the new program's environment, and a /proc/PID/environ read in
    that window is empty (CI once found no marked sleeper here)."""
    env = dict(os.environ)
    if marker:
        env[MARKER_ENV] = marker
    proc = subprocess.Popen([sys.executable, "-c", "print('up', flush=True); import time; time.sleep(60)"], env=env,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "up\n"
    proc.stdout.close()
    return proc


def test_remove_leftovers_ends_recorded_and_marked_processes_only(tmp_path):
    # Run ids of this test alone: markers are machine-wide, so with a fixed "run-1" any other run of this
    # test on the machine at that moment could end our marked sleeper first. CI once counted 1 here, not 2.
    mine, other = f"run-{uuid.uuid4().hex}", f"run-{uuid.uuid4().hex}"
    recorded, marked, bystander = sleeper(), sleeper(mine), sleeper(other)
    try:
        run_dir = tmp_path / f"spiderflow-emu-{mine}-abc"
        run_dir.mkdir()
        state = {"run_id": mine, "files": [str(run_dir)], "processes": [
            {"pid": recorded.pid, "starttime": proc_starttime(recorded.pid), "role": "delayd"}]}
        assert marked_pids(mine) == [marked.pid], "the marked sleeper is not found by its marker"
        assert remove_leftovers(state, grace_s=1.0) == 2
        assert recorded.wait(5) is not None and marked.wait(5) is not None
        assert bystander.poll() is None and not run_dir.exists()
    finally:
        for p in (recorded, marked, bystander):
            p.kill()
            p.wait()


# A marked process that, when told to end, starts a child (which inherits the marker), writes the
# child's pid to argv[1] and exits: a rank pool that was starting a rank as the end came.
FORKS_ON_TERM = """
import signal, subprocess, sys, time
def forked(*_):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    open(sys.argv[1], "w").write(str(child.pid))
    sys.exit(0)
signal.signal(signal.SIGTERM, forked)
print("ready", flush=True)
time.sleep(60)
"""


def test_a_child_forked_while_its_parent_is_ended_is_ended_too(tmp_path):
    run_id, child_pid = f"run-{uuid.uuid4().hex}", tmp_path / "child.pid"
    parent = subprocess.Popen([sys.executable, "-c", FORKS_ON_TERM, str(child_pid)],
                              env={**os.environ, MARKER_ENV: run_id}, stdout=subprocess.PIPE, text=True)
    child = None
    try:
        assert parent.stdout.readline() == "ready\n"
        assert remove_leftovers({"run_id": run_id, "processes": []}, grace_s=2.0) == 2  # the parent, then its child
        assert parent.wait(5) == 0  # it ended on SIGTERM, after forking
        child = int(child_pid.read_text())
        assert proc_starttime(child) is None, "the child forked at the end outlived remove_leftovers"
        assert marked_pids(run_id) == []
    finally:
        parent.kill()
        parent.wait()
        if child is not None and proc_has_marker(child, run_id):  # ours still, not a recycled pid
            os.kill(child, 9)


def test_a_recycled_pid_is_not_killed():
    proc = sleeper()
    try:
        stale = ProcRecord(pid=proc.pid, starttime=proc_starttime(proc.pid) - 1, role="shell")
        assert not stale.alive()
        assert remove_leftovers({"run_id": f"nobody-{uuid.uuid4().hex}", "processes": [vars(stale)]}, grace_s=0.5) == 0
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()
