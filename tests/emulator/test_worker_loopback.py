"""The rank worker over loopback gloo (no root): 2-stage jobs run their 1F1B schedule, emulated and real compute."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from emulator.jobs import worker
from emulator.jobs.worker import RankSpec, nccl_env, rank_env

from .conftest import free_port

REPO = Path(__file__).resolve().parents[2]


def test_nccl_environment_stays_on_sockets():
    env = rank_env("c1-h0-eth0", "c1-h0", "nccl")
    assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == "c1-h0-eth0"
    assert (env["NCCL_IB_DISABLE"], env["NCCL_P2P_DISABLE"], env["NCCL_SHM_DISABLE"]) == ("1", "1", "1")
    assert nccl_env("x", "h7")["NCCL_HOSTID"] == "h7"
    assert "NCCL_SOCKET_IFNAME" not in rank_env("lo", "h", "gloo")


def test_two_stage_two_replica_job_over_loopback(tmp_path):
    # ranks: replica r, stage s -> rank 2r + s; sync of stage s across "clusters" {r=0} and {r=1}
    port, specs = free_port(), []
    sync_groups = [[[0], [2]], [[1], [3]]]
    for r in range(2):
        for s in range(2):
            rank = 2 * r + s
            spec = RankSpec(job_id="t", rank=rank, world_size=4, master_addr="127.0.0.1", master_port=port,
                            stage=s, depth=2, micro_batches=3, iterations=3, forward_s=0.01, backward_s=0.02,
                            activation_bytes=4096, grad_bytes=8192,
                            prev_rank=rank - 1 if s == 1 else None, next_rank=rank + 1 if s == 0 else None,
                            sync_groups=sync_groups, out=str(tmp_path / f"r{rank}.jsonl"), timeout_s=60)
            path = tmp_path / f"r{rank}.json"
            spec.dump(path)
            specs.append(path)
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-m", "emulator.jobs.worker", str(p)], cwd=REPO, env=env)
             for p in specs]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0, 0]
    for rank in range(4):
        lines = [json.loads(l) for l in (tmp_path / f"r{rank}.jsonl").read_text().splitlines()]
        ops = [l for l in lines if l["event"] == "op"]
        assert [l["event"] for l in lines][-1] == "done"
        assert sum(o["kind"] == "F" for o in ops) == 9 and sum(o["kind"] == "B" for o in ops) == 9
        assert sum(o["kind"] == "S" for o in ops) == 3
        # 1F1B on stage 0 of depth 2: one warm-up forward first
        assert [o["kind"] for o in ops[:3]] == (["F", "F", "B"] if rank % 2 == 0 else ["F", "B", "F"])
        assert all(o["end"] >= o["start"] for o in ops)


def test_two_stage_job_with_real_compute_over_loopback(tmp_path):
    """compute "real": each rank runs its proxy blocks (stage 1 with recomputation) in place of the sleeps;
    the tensors on the wire are still the spec's byte sizes."""
    port, paths = free_port(), []
    for rank in range(2):
        spec = RankSpec(job_id="t", rank=rank, world_size=2, master_addr="127.0.0.1", master_port=port,
                        stage=rank, depth=2, micro_batches=3, iterations=2, forward_s=0.001, backward_s=0.002,
                        activation_bytes=4096, grad_bytes=64, prev_rank=rank - 1 if rank else None,
                        next_rank=None if rank else 1, compute="real", recompute=rank == 1,
                        proxy={"layers": 2, "hidden": 32, "heads": 1, "seq_len": 16, "micro_batch": 1},
                        out=str(tmp_path / f"r{rank}.jsonl"), timeout_s=60)
        paths.append(tmp_path / f"r{rank}.json")
        spec.dump(paths[-1])
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-m", "emulator.jobs.worker", str(p)], cwd=REPO, env=env)
             for p in paths]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    for rank in range(2):
        lines = [json.loads(l) for l in (tmp_path / f"r{rank}.jsonl").read_text().splitlines()]
        assert lines[0]["event"] == "start" and lines[0]["proxy"]["hidden"] == 32
        assert lines[-1]["event"] == "done"
        ops = [l for l in lines if l["event"] == "op"]
        assert [sum(o["kind"] == k for o in ops) for k in "FBS"] == [6, 6, 2]
        assert all(o["end"] >= o["start"] for o in ops)


def test_real_compute_without_a_proxy_is_refused(tmp_path):
    spec = RankSpec(job_id="t", rank=0, world_size=1, master_addr="127.0.0.1", master_port=free_port(), stage=0,
                    depth=1, micro_batches=1, iterations=1, forward_s=0.0, backward_s=0.0, activation_bytes=4,
                    grad_bytes=4, prev_rank=None, next_rank=None, compute="real", out=str(tmp_path / "r0.jsonl"))
    with pytest.raises(SystemExit, match="needs the spec's proxy"):
        worker.run(spec)  # refused before joining any process group


def test_a_dead_peer_fails_the_rank_with_a_reason(tmp_path):
    port = free_port()
    spec = RankSpec(job_id="t", rank=0, world_size=2, master_addr="127.0.0.1", master_port=port, stage=0,
                    depth=2, micro_batches=1, iterations=1, forward_s=0.0, backward_s=0.0,
                    activation_bytes=64, grad_bytes=64, prev_rank=None, next_rank=1,
                    out=str(tmp_path / "r0.jsonl"), timeout_s=3)
    spec.dump(tmp_path / "r0.json")
    peer = RankSpec(**{**spec.__dict__, "rank": 1, "stage": 1, "prev_rank": 0, "next_rank": None,
                       "out": str(tmp_path / "r1.jsonl")})
    peer.dump(tmp_path / "r1.json")
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo"}
    p0 = subprocess.Popen([sys.executable, "-m", "emulator.jobs.worker", str(tmp_path / "r0.json")], cwd=REPO, env=env)
    p1 = subprocess.Popen([sys.executable, "-c", "import sys, time, torch.distributed as d, datetime as dt;"
                           f"d.init_process_group('gloo', init_method='tcp://127.0.0.1:{port}', rank=1,"
                           " world_size=2, timeout=dt.timedelta(seconds=3)); d.barrier(); sys.exit(0)"],
                          env=env)  # joins, then dies without ever receiving
    assert p1.wait(timeout=60) == 0
    assert p0.wait(timeout=60) == 3
    last = json.loads((tmp_path / "r0.jsonl").read_text().splitlines()[-1])
    assert last["event"] == "failed" and last["reason"]
