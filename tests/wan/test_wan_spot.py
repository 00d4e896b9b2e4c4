"""`wan spot`: reproducible by seed, its output loads, withdrawals as documented (inside the horizon
after their notice, merged per cluster, the share rounded up), bad options one line; and a simulation
under its file gives the GPUs back when it says."""

import subprocess
import sys
from pathlib import Path

import pytest

from spiderflow.simulate.engine import SimConfig, simulate
from spiderflow.topology import load_topology, parse_topology
from spiderflow.wan import load_capacity_events
from spiderflow.wan.spot import SpotPattern, generate_spot_events
from spiderflow.workload import Job

REPO = Path(__file__).resolve().parents[2]
PAPER8 = load_topology(REPO / "topologies" / "paper8.yaml")


def test_same_seed_same_file_and_it_loads(seeded):
    a, info = seeded("spot", "--topology", "paper8", "--hours", "48", "--withdrawals", "12")
    assert a.read_text().startswith("# python -m spiderflow wan spot --topology paper8 --seed 3 --hours 48 "
                                    "--withdrawals 12 --notice-s 120")
    events = load_capacity_events(a, PAPER8)
    assert len(events) == info["rows"] and info["drawn"] == 12
    assert events == tuple(generate_spot_events(PAPER8, 3, SpotPattern(hours=48, withdrawals=12)))
    assert info["gpu_hours"] == pytest.approx(sum(e.gpus * (e.return_s - e.time_s) for e in events) / 3600, abs=1e-3)


def test_withdrawals_start_after_their_notice_in_the_horizon_and_a_clusters_do_not_overlap():
    pattern = SpotPattern(hours=24, withdrawals=200, notice_s=600, min_hours=1, max_hours=3, share=0.3)
    events = generate_spot_events(PAPER8, 7, pattern)
    assert 0 < len(events) < 200  # 200 draws over 8 clusters and 24 h overlap, and merge
    assert [e.time_s for e in events] == sorted(e.time_s for e in events)
    for e in events:
        total = PAPER8.cluster(e.cluster).total_gpus
        assert e.gpus == -(-3 * total // 10) and e.notice_s == 600  # ceil(0.3 x the cluster's GPUs)
        assert 600 <= e.time_s < 24 * 3600 and e.return_s - e.time_s >= 3600
    for c in PAPER8.names:
        mine = [e for e in events if e.cluster == c]
        # the next one's notice comes after the one ahead has returned
        assert all(b.time_s - b.notice_s > a.return_s for a, b in zip(mine, mine[1:]))


def _one_cluster(gpus: int = 8):
    seoul = {"name": "seoul", "gpu": "h100", "nodes": 1, "gpus_per_node": gpus}
    return parse_topology({"name": "one", "clusters": [seoul], "links": []})


@pytest.mark.parametrize("gpus, share, taken", [(25, 0.28, 7), (50, 0.56, 28), (8, 0.3, 3), (7, 1.0, 7), (3, 0.1, 1)])
def test_a_share_of_the_gpus_is_rounded_up_and_exact_shares_are_not(gpus, share, taken):
    (ev,) = generate_spot_events(_one_cluster(gpus), 0, SpotPattern(hours=1, withdrawals=1, share=share))
    assert ev.gpus == taken


def test_withdrawals_that_overlap_merge_into_one():
    """One cluster, a 1 h horizon, withdrawals of exactly 2 h: every start falls in [120, 3600) s, so
    all three overlap and merge into one, from the first start to the last return."""
    (only,) = generate_spot_events(_one_cluster(), 5, SpotPattern(hours=1, withdrawals=3, min_hours=2, max_hours=2))
    assert 120 <= only.time_s < 3600 and only.gpus == 8
    assert only.time_s + 7200 <= only.return_s < 3600 + 7200
    (single,) = generate_spot_events(_one_cluster(), 5, SpotPattern(hours=1, withdrawals=1, min_hours=2, max_hours=2))
    assert single.return_s - single.time_s == pytest.approx(7200, abs=1e-3)


@pytest.mark.parametrize("extra, says", [
    (["--min-hours", "9"], "error: wan spot: --min-hours 9 is more than --max-hours 8; raise --max-hours"),
    (["--hours", "0.01"], "error: wan spot: --notice-s 120 must be shorter than --hours 0.01"),
    (["--share", "1.5"], "error: argument --share: must be a finite number in (0, 1]"),
    (["--withdrawals", "0"], "error: argument --withdrawals:"),
])
def test_bad_options_are_one_line(tmp_path, extra, says):
    proc = subprocess.run([sys.executable, "-m", "spiderflow", "wan", "spot", "--topology", "paper8",
                           "--out", str(tmp_path / "x.csv"), *extra], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and proc.stderr.startswith(says), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "x.csv").exists()


def test_a_job_arriving_while_the_only_cluster_is_withdrawn_starts_when_the_file_gives_it_back():
    (ev,) = generate_spot_events(_one_cluster(), 2, SpotPattern(hours=1, withdrawals=1))
    job = Job(job_id="j", arrival_s=ev.time_s + 1.0, model="gpt3-125m", gpus=8, iterations=10, global_batch=32,
              seq_len=1024)
    (rec,) = simulate(_one_cluster(), [job], SimConfig(planner="spinsearch", capacity_events=(ev,)))
    assert rec.status == "done" and rec.start_s == pytest.approx(ev.return_s)
