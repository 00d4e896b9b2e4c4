"""The ring all-reduce over loopback gloo (no root): every rank ends with the exact sum."""

import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import free_port

REPO = Path(__file__).resolve().parents[2]
RANK = """
import sys, torch, torch.distributed as d
from emulator.jobs.collectives import ring_all_reduce
rank, p, port = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
d.init_process_group('gloo', init_method=f'tcp://127.0.0.1:{port}', rank=rank, world_size=p)
ranks = list(range(p))[::-1]  # a ring order other than the rank order
group = d.new_group(ranks)
t = torch.arange(6 * p, dtype=torch.float64) * (rank + 1) + rank
ring_all_reduce(t, ranks, rank, d, group)
want = torch.arange(6 * p, dtype=torch.float64) * sum(range(1, p + 1)) + sum(range(p))
d.destroy_process_group()
sys.exit(0 if torch.equal(t, want) else 1)
"""


@pytest.mark.parametrize("p", [2, 3, 4])
def test_ring_all_reduce_sums_exactly(p):
    port = str(free_port())
    env = {"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    procs = [subprocess.Popen([sys.executable, "-c", RANK, str(r), str(p), port], cwd=REPO, env=env)
             for r in range(p)]
    assert [proc.wait(timeout=120) for proc in procs] == [0] * p
