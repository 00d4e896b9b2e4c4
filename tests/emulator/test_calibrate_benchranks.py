"""Microbenchmark ranks started from the rank pool of their host's server, files back here (issue 20).

Real pool servers and real opbench_worker ranks over loopback gloo, no root: one pool here (a plain
RankPool) and one with a files directory that is not the run directory (what a remote server's pool
is; tests/emulator/test_rank_pool_remote.py's FilesPool, without the SSH). The whole `calibrate
--servers` on a split network: tests/emulator/test_multihost_root.py."""

import errno
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from emulator.calibrate.benchranks import (MODULE, BenchHost, BenchRank, failed, newest_test, on_our_clock, run_ranks,
                                           written_bytes)
from emulator.calibrate.opbench_worker import PEER_FAILED, UNWRITABLE, unwritable_errno
from emulator.calibrate.opbench import combine
from emulator.jobs.launch import emulated_view
from emulator.jobs.pool import RankPool
from emulator.jobs.worker import rank_env
from emulator.net.layout import NetConfig
from spiderflow.errors import EmulatorError

from .conftest import REPO, free_port, two_cluster_topology
from .test_rank_pool_remote import FilesPool

PRELOAD = ("torch", "torch.distributed", "emulator.calibrate.opbench_worker")
TESTS = [{"id": 0, "op": "p2p", "scope": "wan", "name": "east->west", "clusters": ["east", "west"], "ranks": [0, 1],
          "sizes": [4096, 65536], "samples": 2, "warmup": 1, "samples_large": 1, "large_bytes": 2 ** 26},
         {"id": 1, "op": "all_reduce", "scope": "pair", "name": "east+west", "clusters": ["east", "west"],
          "ranks": [0, 1], "sizes": [4096, 65536], "samples": 2, "warmup": 1, "samples_large": 1,
          "large_bytes": 2 ** 26}]


@pytest.fixture(scope="module")
def pools(tmp_path_factory):
    there = tmp_path_factory.mktemp("server2") / "ranks"
    with RankPool(preload=PRELOAD) as here, FilesPool(there, preload=PRELOAD) as far:
        yield here, far, there


def env_of(host: BenchHost) -> dict[str, str]:
    return {**os.environ, **rank_env(host.intf, host.name, "gloo"), "PYTHONPATH": str(REPO)}


def two_servers(here, far, names: tuple[str, str]):
    """Two loopback hosts, the first on this server's pool and the second on the other's: the
    hosts and ``pool_of``."""
    hosts = [BenchHost(name=name, ip="127.0.0.1", intf="lo", ns_pid=None) for name in names]
    return hosts, {names[0]: here, names[1]: far}.__getitem__


def spec_of(tests: list[dict]) -> dict:
    return {"master_addr": "127.0.0.1", "master_port": free_port(), "scale": 10.0, "timeout_s": 60, "tests": tests}


def test_a_rank_on_another_server_starts_from_its_pool_and_its_files_come_back(pools, tmp_path):
    here, far, there = pools
    hosts, pool_of = two_servers(here, far, ("east-h0", "west-h0"))
    work = tmp_path / "bench-two" / "bench"
    messages = []
    lines = run_ranks(hosts, spec_of(TESTS), pool_of=pool_of, work=work, env_of=env_of, stall_s=60,
                      describe=str, log=messages.append)
    assert "1 on other servers" in messages[0]
    # rank 1 wrote under the far pool's directory (spec sent with the start request); its lines and log
    # were copied here and removed there; rank 0 wrote here directly
    assert json.loads((work / "r1.json").read_text())["out"] == f"{there}/bench-two-r1.jsonl"
    assert not (there / "bench-two-r1.jsonl").exists() and not (there / "bench-two-r1.log").exists()
    assert (there / "bench-two-r1.json").exists() and not list(there.glob("r0*"))
    far_lines = [json.loads(x) for x in (work / "r1.jsonl").read_text().splitlines()]
    assert far_lines[-1] == {"event": "done", "rank": 1} and (work / "r1.log").exists()
    assert any(ln.get("rank") == 1 and "t_end" in ln for ln in lines)
    topo = two_cluster_topology(bandwidth_gbps=1.0, latency_ms=10.0)
    records = combine(TESTS, lines, topology="two.yaml", view=emulated_view(topo, NetConfig()))
    assert [(r["op"], r["bytes"]) for r in records] == [("p2p", 4096), ("p2p", 65536), ("all_reduce", 4096),
                                                        ("all_reduce", 65536)]
    assert all(len(r["samples_s"]) == 2 and 0 < r["time_s"] < 5 for r in records), records


def test_a_failed_rank_on_another_server_is_one_line_with_its_log_here(pools, tmp_path):
    here, far, _there = pools
    hosts, pool_of = two_servers(here, far, ("a", "b"))
    work = tmp_path / "bench-bad" / "bench"
    spec = spec_of([{**TESTS[0], "op": "no_such_op"}])  # both ranks fail on it
    with pytest.raises(EmulatorError) as err:
        run_ranks(hosts, spec, pool_of=pool_of, work=work, env_of=env_of, stall_s=60, describe=str)
    assert str(err.value).startswith("microbenchmark rank ") and "\n" not in str(err.value)
    assert "no_such_op" in (work / "r1.log").read_text() + (work / "r0.log").read_text()


def test_progress_counts_bytes_here_and_there_and_reads_the_newest_test(pools, tmp_path):
    here, far, there = pools
    host = BenchHost(name="h", ip="127.0.0.1", intf="lo", ns_pid=None)
    local = tmp_path / "r0.jsonl"
    remote = there / "progress-r1.jsonl"
    ranks = [BenchRank(rank=0, host=host, pool=here, proc=None, out=str(local), log=""),
             BenchRank(rank=1, host=host, pool=far, proc=None, out=str(remote), log="")]
    assert written_bytes(ranks) == 0 and newest_test(ranks) is None  # no rank has started
    local.write_text('{"test": 3, "rep": 0}\n{"test": 4, "rep": 0}\n')
    remote.write_text('{"test": 2, "rep": 1}\n{"test": 7, "re')  # a line half written, on the other server
    assert written_bytes(ranks) == local.stat().st_size + remote.stat().st_size
    assert newest_test(ranks) == 4  # rank 1's finished line is older; its half line is skipped
    remote.write_text('{"test": 2, "rep": 1}\n{"test": 7, "rep": 0}\n')
    assert newest_test(ranks) == 7 and remote.exists()  # read there, left there


def test_remote_stamps_go_on_our_clock_before_they_are_combined():
    # a p2p sample: sent here at 10.000 s, received on a server whose monotonic clock runs 100 s ahead
    # at 110.045 s on its clock (10.045 s on ours): 45 ms, not 100.045 s
    test = {**TESTS[0], "sizes": [4096]}
    common = {"test": 0, "bytes": 4096, "count": 102, "rep": 1, "warmup": False}
    sender = [{**common, "rank": 0, "t_start": 10.0}]
    receiver = [{**common, "rank": 1, "t_end": 110.045}, {"event": "done", "rank": 1}]
    view = emulated_view(two_cluster_topology(bandwidth_gbps=1.0, latency_ms=10.0), NetConfig())
    [rec] = combine([test], sender + on_our_clock(receiver, 100_000_000_000), topology="t", view=view)
    assert rec["time_s"] == pytest.approx(0.045)
    [raw] = combine([test], sender + receiver, topology="t", view=view)
    assert raw["time_s"] == pytest.approx(100.045)  # unconverted: the offset ends up in the time
    assert on_our_clock(receiver, 0) is receiver


def test_a_rank_that_cannot_write_its_lines_says_why_in_its_exit_code(tmp_path):
    """A full disk under a rank's JSON lines (/dev/full: every write is ENOSPC): the rank exits with
    100 + errno, since its log is most likely on the same disk; before, the traceback went to that log
    and its peers' "Connection closed by peer" was what `calibrate` said."""
    spec = {**spec_of([{"id": 0, "op": "all_reduce", "ranks": [0], "sizes": [4096], "samples": 1, "warmup": 0,
                        "samples_large": 1, "large_bytes": 2 ** 26}]), "rank": 0, "world_size": 1}
    path = tmp_path / "r0.json"
    for out, code in (("/dev/full", UNWRITABLE + errno.ENOSPC), (str(tmp_path / "r0.jsonl"), 0)):
        path.write_text(json.dumps({**spec, "out": out, "master_port": free_port()}))
        done = subprocess.run([sys.executable, "-m", MODULE, str(path)], cwd=REPO, capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == code, done.stderr[-2000:]
        assert "Traceback" not in done.stderr
    assert unwritable_errno(UNWRITABLE + errno.ENOSPC) == errno.ENOSPC and unwritable_errno(PEER_FAILED) is None
    assert json.loads((tmp_path / "r0.jsonl").read_text().splitlines()[-1]) == {"event": "done", "rank": 0}


def ended(rank: int, code: int, pool=None) -> BenchRank:
    """A bench rank that exited with ``code`` (its process reduced to its exit status)."""
    host = BenchHost(name=f"h{rank}", ip="127.0.0.1", intf="lo", ns_pid=None)
    return BenchRank(rank=rank, host=host, pool=pool or SimpleNamespace(files_dir=None),
                     proc=SimpleNamespace(returncode=code), out=f"/x/r{rank}.jsonl", log=f"/x/r{rank}.log")


def test_the_failure_named_is_the_rank_that_ended_for_its_own_reason(tmp_path):
    """Rank 0 only saw its peer go (exit 3, gloo's "Connection closed by peer"): the line names rank 1,
    which could not write, or which crashed; each rank's own reason goes with it."""
    work = tmp_path / "bench"
    lost = [{"event": "failed", "rank": 0, "reason": "Connection closed by peer"}]
    assert str(failed([ended(0, PEER_FAILED), ended(1, UNWRITABLE + errno.ENOSPC)], lost, work)) == (
        f"{work}: microbenchmark rank 1 on h1 cannot write its measurements there (No space left on device); "
        "free space there, or pass --out DIR on another file system, and run again")
    assert str(failed([ended(0, PEER_FAILED), ended(1, 1)], lost, work)) == (
        f"microbenchmark rank 1 on h1 exited with 1; see {work}/r1.log")
    own = lost + [{"event": "failed", "rank": 1, "reason": "timed out after 60 s"}]
    assert str(failed([ended(0, PEER_FAILED), ended(1, PEER_FAILED)], own[::-1], work)) == (
        "microbenchmark rank 0 on h0 exited with 3: Connection closed by peer")  # rank order, its own reason
    far = SimpleNamespace(files_dir="/srv/ranks", server="west")
    assert str(failed([ended(2, UNWRITABLE + errno.EDQUOT, far)], [], work)) == (
        "west:/x: microbenchmark rank 2 on h2 cannot write its measurements there (Disk quota exceeded); free "
        "space there and run again")
