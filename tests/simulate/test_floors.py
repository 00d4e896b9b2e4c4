"""Floors under a trace's completions (spiderflow.simulate.floors): checked by hand, against an
exhaustive search over every assignment of jobs to the gaps between exclusive jobs, and against
real replays on paper8."""

import itertools
import json
import math
import random
from pathlib import Path

import pytest

from spiderflow.simulate.engine import SimConfig, simulate
from spiderflow.simulate.floors import MAX_EXCLUSIVE, exclusive_jobs, schedule_floors
from spiderflow.topology import load_topology
from spiderflow.traces.planned import PlannedGpuTime
from spiderflow.workload import Job

REPO = Path(__file__).resolve().parents[2]


def test_without_exclusive_jobs_every_job_ends_at_its_arrival_plus_its_run():
    jobs = [(0.0, 10.0, 8), (5.0, 2.0, 16), (3.0, 7.0, 8)]
    f = schedule_floors(jobs, 128)
    assert (f.completion_sum_s, f.last_end_s, f.exclusive) == (10.0 + 7.0 + 10.0, 10.0, 0)


def test_a_job_arriving_during_a_whole_topology_run_waits_or_the_run_waits_for_it():
    # the 128-GPU run arrives at 0 for 100 s; an 8-GPU job arrives at 10 for 5 s. Started at once, the run ends
    # at 100 and the job at 105 (sum 205); started at 15, after the job, 10 + 5 and 115 (sum 130, last 115)
    f = schedule_floors([(0.0, 100.0, 128), (10.0, 5.0, 8)], 128)
    assert (f.completion_sum_s, f.last_end_s, f.exclusive) == (130.0, 105.0, 2)
    # a job that leaves room for the other is not exclusive: 64 + 64 GPUs fit on 128
    assert exclusive_jobs([64, 64, 8], 128) == []
    assert exclusive_jobs([128, 64, 8], 128) == [0]
    assert exclusive_jobs([124, 8, 16], 128) == [0]  # not even the smallest other job fits beside it
    assert exclusive_jobs([128], 128) == []


def _exhaustive(jobs, total, foresight=True):
    """The same relaxation by brute force: every order of the exclusive jobs and every assignment of each
    other job to a gap (before the m-th exclusive job, or after the last); given those, every start as early
    as it can be. Without foresight an exclusive job waits only for jobs that had arrived by its earliest
    start (one that arrives later must end before it starts), and never waits for another exclusive job to
    arrive while one that had arrived waits."""
    excl = exclusive_jobs([g for _, _, g in jobs], total)
    others = [j for i, j in enumerate(jobs) if i not in excl]
    best_sum = best_last = math.inf
    for order in itertools.permutations(excl):
        for gaps in itertools.product(range(len(order) + 1), repeat=len(others)):
            ends, prev_end, ok = [], -math.inf, True
            for m in range(len(order) + 1):
                mine = [(a, max(a, prev_end) + r) for (a, r, _), g in zip(others, gaps) if g == m]
                ends += [e for _, e in mine]
                if m < len(order):
                    a, r, _ = jobs[order[m]]
                    lo = max(a, prev_end)
                    if foresight:
                        start = max([lo, *(e for _, e in mine)])
                    else:
                        start = max([lo, *(e for aj, e in mine if aj <= lo)])
                        held = a > prev_end and any(jobs[w][0] < a for w in order[m + 1:])
                        ok = ok and not held and all(e <= start for _, e in mine)
                    prev_end = start + r
                    ends.append(prev_end)
            if ok:
                best_sum, best_last = min(best_sum, sum(ends)), min(best_last, max(ends))
    return best_sum, best_last


@pytest.mark.parametrize("seed", range(40))
def test_equal_to_an_exhaustive_search_on_small_traces(seed):
    rng = random.Random(seed)
    jobs = [(rng.choice([0.0, rng.uniform(0, 100)]), rng.uniform(1, 60), rng.choice([8, 16, 64, 128]))
            for _ in range(rng.randint(2, 7))]
    if sum(g == 128 for _, _, g in jobs) > MAX_EXCLUSIVE:
        jobs = [(a, r, 8 if g == 128 else g) for a, r, g in jobs[:2]] + jobs[2:]
    f = schedule_floors(jobs, 128)
    assert (f.completion_sum_s, f.last_end_s) == pytest.approx(_exhaustive(jobs, 128), rel=1e-12)
    assert f.completion_sum_s >= sum(a + r for a, r, _ in jobs) - 1e-9  # never below the queue-less floor
    no_foresight = schedule_floors(jobs, 128, foresight=False)
    assert (no_foresight.completion_sum_s, no_foresight.last_end_s) == pytest.approx(_exhaustive(jobs, 128, False),
                                                                                    rel=1e-12)
    assert no_foresight.completion_sum_s >= f.completion_sum_s - 1e-9 and no_foresight.last_end_s >= f.last_end_s - 1e-9


def test_without_foresight_a_whole_topology_run_does_not_wait_for_a_job_yet_to_arrive():
    # the run arrives at 0 for 100 s, a job at 10 for 5 s: holding the run until 15 is foresight; without it
    # the run starts at 0 and the job waits for its end (100 + 105); a job there at 0 for 30 s it may wait for
    jobs = [(0.0, 100.0, 128), (10.0, 5.0, 8)]
    assert schedule_floors(jobs, 128, foresight=False).completion_sum_s == 205.0
    jobs = [(1.0, 100.0, 128), (0.0, 30.0, 8)]  # waiting for it: 30 + 130; not waiting: 101 + 131
    assert schedule_floors(jobs, 128, foresight=False).completion_sum_s == 160.0


def test_more_exclusive_jobs_than_ordered_exactly_keeps_a_valid_bound():
    jobs = [(10.0 * i, 50.0 + i, 128) for i in range(MAX_EXCLUSIVE + 2)]
    f = schedule_floors(jobs, 128)
    assert f.exclusive == MAX_EXCLUSIVE
    # run one after another in arrival order, the real minimum; the bound is below it and above no queue
    end, total = 0.0, 0.0
    for a, r, _ in jobs:
        end = max(end, a) + r
        total += end
    assert sum(a + r for a, r, _ in jobs) < f.completion_sum_s <= total + 1e-9


def test_a_long_trace_keeps_fewer_exclusive_jobs_within_the_work_budget():
    jobs = [(float(i), 10.0, 8) for i in range(4_999)] + [(5.0, 100.0, 128)]
    f = schedule_floors(jobs, 128)
    assert f.exclusive == 0 and f.completion_sum_s == sum(a + r for a, r, _ in jobs)  # 1! 5001 5000 > WORK
    assert schedule_floors(jobs[-2_000:], 128).exclusive == 1


def test_no_replay_on_paper8_ends_its_jobs_sooner_than_the_floors():
    """A 128-GPU run among small jobs on paper8's 128 GPUs, replayed by SpinSearch and the topology-blind
    baseline: neither's sum of completions nor last end is below the floors (within a prediction's 1%)."""
    topo = load_topology(REPO / "topologies/paper8.yaml")
    jobs = (Job(job_id="pre", arrival_s=0.0, model="gpt3-1.3b", gpus=128, iterations=400, global_batch=512,
                seq_len=1024),
            Job(job_id="a", arrival_s=60.0, model="gpt3-350m", gpus=8, iterations=40, global_batch=32, seq_len=1024),
            Job(job_id="b", arrival_s=90.0, model="gpt3-1.3b", gpus=16, iterations=30, global_batch=64, seq_len=1024))
    sizer = PlannedGpuTime(topo)
    f = schedule_floors([(j.arrival_s, sizer.run_s(j), j.gpus) for j in jobs], topo.total_gpus)
    assert f.exclusive == 1 and f.completion_sum_s > sum(j.arrival_s + sizer.run_s(j) for j in jobs)
    for planner in ("spinsearch", "blind"):
        recs = simulate(topo, jobs, SimConfig(planner=planner))
        assert all(r.completed for r in recs)
        assert sum(r.end_s for r in recs) >= 0.99 * f.completion_sum_s, planner
        assert max(r.end_s for r in recs) >= 0.99 * f.last_end_s, planner


TRACE = """\
job_id,arrival_s,model,gpus,iterations,global_batch,seq_len
pre,0,gpt3-1.3b,128,400,512,1024
a,60,gpt3-350m,8,40,32,1024
b,90,gpt3-1.3b,16,30,64,1024
"""


def test_compare_reports_each_planners_distance_to_the_floors(tmp_path, capsys):
    """`spiderflow compare`: the floors of its trace in the JSON and headline.md, and per planner its avg JCT
    over the JCT floor and the throughput ceiling over its throughput, none under 1 (within a prediction's 1%)."""
    from spiderflow.cli import main
    from spiderflow.simulate.floors import trace_floors
    from spiderflow.traces import load_trace

    (tmp_path / "t.csv").write_text(TRACE)
    argv = ["compare", "--topology", "topologies/paper8.yaml", "--trace", str(tmp_path / "t.csv"), "--planners",
            "spinsearch,blind", "--json", "--out", str(tmp_path / "out")]
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    topo = load_topology(REPO / "topologies/paper8.yaml")
    floors = trace_floors(load_trace(tmp_path / "t.csv").jobs, PlannedGpuTime(topo))
    assert result["floors"] == pytest.approx(floors) and floors["exclusive_jobs"] == 1  # the 128-GPU run
    assert floors["jct_no_foresight_s"] >= floors["jct_floor_s"] > floors["jct_floor_alone_s"]
    table = (tmp_path / "out" / "headline.md").read_text()
    assert "| avg JCT / floor | ceiling / throughput |" in table and "Floors (3 of 3 jobs" in table
    for name, s in result["planners"].items():
        jct = s["avg_jct_s"] / floors["jct_floor_s"]
        thr = floors["throughput_ceiling_tokens_per_s"] / s["throughput_tokens_per_s"]
        assert jct > 0.99 and thr > 0.99, (name, jct, thr)
        row = next(ln for ln in table.splitlines() if ln.startswith(f"| {name} |"))
        assert row.endswith(f"| {jct:.2f}x | {thr:.2f}x |"), row
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["floors"] == result["floors"]


def test_compare_with_a_wan_event_faster_than_the_topology_gives_no_floors_and_says_why(tmp_path, capsys):
    from spiderflow.cli import main

    (tmp_path / "t.csv").write_text(TRACE)
    (tmp_path / "wan.csv").write_text("time_s,link,bandwidth_gbps,latency_ms,up\n"
                                      "30,virginia-london,1.0,,1\n40,virginia-london,5.0,,1\n")  # 1.15 Gbit/s
    argv = ["compare", "--topology", "topologies/paper8.yaml", "--trace", str(tmp_path / "t.csv"), "--planners",
            "blind", "--wan-events", str(tmp_path / "wan.csv")]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "avg JCT / floor" not in out
    assert ("No floors: a WAN event makes a link faster than the topology's figures, which the floors plan on "
            "(virginia-london at 40 s has 5 Gbit/s, over the topology's 1.15).") in out
    (tmp_path / "wan.csv").write_text("time_s,link,bandwidth_gbps,latency_ms,up\n30,london-paris,,3.5,1\n")
    assert main(argv) == 0
    assert "(london-paris at 30 s has 3.5 ms, under the topology's 4)." in capsys.readouterr().out


def test_the_floors_hold_under_events_that_only_slow_links_and_take_gpus(tmp_path, capsys):
    """Thinner links, a longer round trip, an outage and spot GPUs taken away: the floors are those of the
    unchanged topology, and every planner's replay under the events stays above them."""
    from spiderflow.cli import main
    from spiderflow.simulate.floors import trace_floors
    from spiderflow.traces import load_trace

    (tmp_path / "t.csv").write_text(TRACE)
    (tmp_path / "wan.csv").write_text("time_s,link,bandwidth_gbps,latency_ms,up\n"
                                      "30,virginia-london,0.3,60,1\n100,ohio-virginia,,,0\n5000,ohio-virginia,,,1\n")
    (tmp_path / "cap.csv").write_text("time_s,cluster,gpus,notice_s,return_s\n70,virginia,8,30,9000\n")
    argv = ["compare", "--topology", "topologies/paper8.yaml", "--trace", str(tmp_path / "t.csv"), "--planners",
            "spinsearch,blind", "--wan-events", str(tmp_path / "wan.csv"), "--capacity-events",
            str(tmp_path / "cap.csv"), "--json"]
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    topo = load_topology(REPO / "topologies/paper8.yaml")
    floors = trace_floors(load_trace(tmp_path / "t.csv").jobs, PlannedGpuTime(topo))
    assert result["floors"] == pytest.approx(floors)
    for name, s in result["planners"].items():
        assert s["completed"] == 3, name
        assert s["avg_jct_s"] >= 0.99 * floors["jct_floor_s"], name
        assert s["throughput_tokens_per_s"] <= floors["throughput_ceiling_tokens_per_s"] / 0.99, name
    assert main(argv[:-1]) == 0
    assert "This run's WAN and capacity events only slow links and take GPUs away" in capsys.readouterr().out
