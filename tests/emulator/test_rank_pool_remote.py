"""The pieces of `emulator run --servers` that need no second machine (issue 20): rank times put on one
clock with a server's measured offset, and the pool's file and signal requests (what a remote pool's
owner uses instead of its own filesystem and os.kill), on a real pool server process. No root.
The same over SSH to a second server, and a whole run: tests/emulator/test_multihost_root.py."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from emulator.jobs.pool import REPO as POOL_REPO
from emulator.jobs.pool import RankPool, _die_with_parent
from emulator.jobs.remotepool import ServerRankPool
from emulator.jobs.replay import local_mono_s, rank_ends
from emulator.net.servers import Ssh
from spiderflow.errors import EmulatorError

from .conftest import REPO

TARGETS = "tests.emulator.pool_targets"


# ------------------------------------------------------------------------------------ clocks
def lines(mono_s, ends):
    return [{"event": "start", "mono": mono_s}] + [{"event": "iteration", "it": i, "end": e}
                                                     for i, e in enumerate(ends)]


def test_local_mono_subtracts_the_servers_offset():
    assert local_mono_s(105.25, 100_000_000_000) == pytest.approx(5.25)
    assert local_mono_s(5.0, -2_500_000_000) == pytest.approx(7.5)


def test_rank_ends_put_a_remote_rank_on_our_clock():
    # rank A here: iteration ends 10.0, 10.5, 11.0 on our clock. Rank B on a server whose monotonic clock
    # is 100 s ahead: ends 10.1, 10.4, 11.2 on our clock, stamped 110.1, 110.4, 111.2 on its own.
    a_starts, a = rank_ends(lines(10.0, [0.0, 0.5, 1.0]))
    b_starts, b = rank_ends(lines(110.0, [0.1, 0.4, 1.2]), offset_ns=100_000_000_000)
    assert a_starts == [10.0] and b_starts == [pytest.approx(10.0)]
    last = {it: max(e for i, e in a + b if i == it) for it in range(3)}  # the job's end of each iteration
    intervals = [last[1] - last[0], last[2] - last[1]]
    assert intervals == [pytest.approx(0.4), pytest.approx(0.7)]
    # unconverted, the remote rank's stamps would win every max and give 0.3 and 0.8
    _, raw = rank_ends(lines(110.0, [0.1, 0.4, 1.2]))
    raw_last = {it: max(e for i, e in a + raw if i == it) for it in range(3)}
    assert [raw_last[1] - raw_last[0], raw_last[2] - raw_last[1]] == [pytest.approx(0.3), pytest.approx(0.8)]


def test_rank_ends_without_offset_keeps_the_stamps_exactly():
    starts, ends = rank_ends(lines(1234.5678, [0.25, 0.75]))
    assert starts == [1234.5678] and ends == [(0, 1234.5678 + 0.25), (1, 1234.5678 + 0.75)]


# ------------------------------------------------------------------------- the pool's requests
class FilesPool(RankPool):
    """The pool server with a files directory, here, with the remote pool's signal routing: what
    ServerRankPool runs over SSH, without the SSH."""

    remote = True
    role = "rank-pool@test"

    def __init__(self, files_dir, **kwargs):
        self.files_dir = str(files_dir)
        super().__init__(**kwargs)

    def _spawn(self, preload):
        return subprocess.Popen([sys.executable, "-m", "emulator.jobs.pool", "--serve", "--files", self.files_dir,
                                 *preload], stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=POOL_REPO,
                                env={**os.environ, "OPENBLAS_NUM_THREADS": "1"}, start_new_session=True,
                                preexec_fn=lambda parent=os.getpid(): _die_with_parent(parent))


@pytest.fixture(params=["warm", "cold"])
def files_pool(request, tmp_path):
    """The pool warm, and cold (``--servers --cold-start``: each child execs ``python -m``), whose
    children take the same file and signal requests."""
    kwargs = {"cold": True} if request.param == "cold" else {"preload": (TARGETS,)}
    with FilesPool(tmp_path / "there", **kwargs) as pool:
        yield pool, tmp_path / "there"


def test_files_travel_with_the_start_request_and_come_back(files_pool):
    pool, there = files_pool
    (there / "old.log").write_text("stale")
    proc = pool.start(module=TARGETS, args=["exit", "0"], env=dict(os.environ, PYTHONPATH=str(REPO)),
                      log_path=str(there / "child.log"), ns_pid=None,
                      files={str(there / "sub" / "spec.json"): '{"x": 1}'}, unlink=[str(there / "old.log")])
    assert proc.wait(timeout=30) == 0
    assert (there / "sub" / "spec.json").read_text() == '{"x": 1}' and not (there / "old.log").exists()
    sizes = pool.stat([str(there / "sub" / "spec.json"), str(there / "none.jsonl")])
    assert sizes == {str(there / "sub" / "spec.json"): 8, str(there / "none.jsonl"): -1}
    got = pool.fetch([str(there / "sub" / "spec.json"), str(there / "none.jsonl")], max_bytes=4, remove=True)
    assert got == {str(there / "sub" / "spec.json"): b'{"x"', str(there / "none.jsonl"): None}
    assert not (there / "sub" / "spec.json").exists()


def test_paths_outside_the_files_directory_are_refused(files_pool, tmp_path):
    pool, there = files_pool
    secret = tmp_path / "secret.txt"
    secret.write_text("no")
    with pytest.raises(EmulatorError, match="not under the pool's files directory"):
        pool.fetch([str(there / ".." / "secret.txt")])
    with pytest.raises(EmulatorError, match="not under"):
        pool.start(module=TARGETS, args=["exit", "0"], env=dict(os.environ), log_path=str(there / "c.log"),
                   ns_pid=None, files={str(secret): "overwritten"})
    assert secret.read_text() == "no"


def test_signals_go_through_the_server(files_pool, monkeypatch):
    pool, there = files_pool

    def never(*_args):
        raise AssertionError("the owner signalled a remote pool's pid itself")

    monkeypatch.setattr(os, "kill", never)  # a remote pid means nothing here: only its server signals it
    monkeypatch.setattr(os, "killpg", never)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    one = pool.start(module=TARGETS, args=["sleep", "60"], env=env, log_path=str(there / "a.log"), ns_pid=None)
    two = pool.start(module=TARGETS, args=["sleep", "60"], env=env, log_path=str(there / "b.log"), ns_pid=None)
    one.killpg(signal.SIGTERM)  # as Runner._end_ranks ends a remote rank
    two.send_signal(signal.SIGUSR1)
    assert one.wait(timeout=10) == -signal.SIGTERM
    assert two.wait(timeout=10) == -signal.SIGUSR1
    # a pid that is not one of its live children is never signalled (it may be another process by now)
    pool._signal("kill", os.getpid(), signal.SIGTERM)
    # the server still answers (a file of the test's own: a child killed before it opened its log leaves none)
    (there / "alive").write_text("yes")
    assert pool.stat([str(there / "alive")]) == {str(there / "alive"): 3}


def test_a_remote_ranks_lines_are_copied_here_while_it_runs(files_pool, tmp_path):
    """What the runner does for a rank on another server (emulator/jobs/remotepool.py): its JSON lines
    are appended here as they grow (fetched from an offset), so what it wrote survives a crash of this
    server; at the job's end the rest and its log come back and are removed there."""
    from types import SimpleNamespace

    from emulator.jobs.remotepool import ask_sizes, collect, copy_lines

    pool, there = files_pool
    here = tmp_path / "here"
    here.mkdir()
    out, gate = there / "j-r0.jsonl", tmp_path / "gate"
    proc = pool.start(module=TARGETS, args=["lines", str(out), "3", str(gate)],
                      env=dict(os.environ, PYTHONPATH=str(REPO)), log_path=str(there / "j-r0.log"), ns_pid=None)
    rank = SimpleNamespace(spec=SimpleNamespace(out=str(out), rank=0), pool=pool, remote_log=str(there / "j-r0.log"),
                           log=here / "j-r0.log", remote_sizes={}, copied=0)
    expected = [{"line": k} for k in range(6)]
    copy = here / "j-r0.jsonl"
    deadline = time.monotonic() + 30
    while rank.copied < 3 * len('{"line": 0}\n') and time.monotonic() < deadline:
        ask_sizes([rank], log=print)
        copy_lines([rank], here, prefix="j", log=print)
        time.sleep(0.02)
    assert proc.poll() is None  # still running, waiting at its gate
    assert [json.loads(x) for x in copy.read_text().splitlines()] == expected[:3]
    copy_lines([rank], here, prefix="j", log=print)  # nothing new: nothing asked, nothing appended
    assert [json.loads(x) for x in copy.read_text().splitlines()] == expected[:3]
    gate.touch()
    assert proc.wait(timeout=30) == 0
    ask_sizes([rank], log=print)
    collect([rank], here, prefix="j", max_log_bytes=2**20, log=print)
    assert [json.loads(x) for x in copy.read_text().splitlines()] == expected  # each line once, in order
    assert not out.exists() and rank.remote_log is None


def test_a_pool_without_files_directory_refuses_file_requests():
    with RankPool(preload=()) as pool:
        with pytest.raises(EmulatorError, match="serves no files"):
            pool.stat(["/etc/hostname"])


class LostSsh(ServerRankPool):
    """A remote pool whose ssh client gives up as ssh does when the connection is lost: a line on its
    stderr and exit status 255 (here a Python child in its place, no SSH)."""

    def _spawn(self, preload):
        with open(self._stderr_path, "ab") as stderr:
            return subprocess.Popen([sys.executable, "-c", "import sys; sys.stderr.write("
                                     "'Timeout, server west not responding.\\n'); sys.exit(255)"],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr)


def test_a_remote_pool_whose_ssh_ends_says_what_ssh_said(tmp_path):
    pool = LostSsh(server="west", ssh=Ssh(), files_dir=str(tmp_path), marker="t@x",
                   stderr_path=str(tmp_path / "pool.log"), wait=False)
    pool._server.wait(timeout=30)
    line = (rf"^the rank pool on west \(pid {pool.pid}\) exited with 255 \(ssh: Timeout, server west not "
            r"responding\.\): the ranks it started died with it and no other can start; run again$")
    with pytest.raises(EmulatorError, match=line):
        pool.check()
    with pytest.raises(EmulatorError, match=line):  # a launch says the same
        pool.start(module=TARGETS, args=["exit", "0"], env={}, log_path=str(tmp_path / "c.log"), ns_pid=None)
    pool.close()
