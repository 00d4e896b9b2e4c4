"""The benchmark scripts refuse bad input in one line (exit 2, no traceback, nothing written; the root
ones before they build anything), and a tiny simulator_speed.py run writes its table and a recording of
its planner calls replays."""

import json
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def script(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "benchmarks" / name), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("name, args, says", [
    ("simulator_speed.py", ("--jobs", "0"), "argument --jobs: must be an integer in 1..1,000,000 (got '0')"),
    ("simulator_speed.py", ("--load", "-1"), "argument --load: must be a finite number in (0, 2] (got '-1')"),
    ("simulator_speed.py", ("--clusters", "1"), "argument --clusters: must be an integer in 2..4,096 (got '1')"),
    ("simulator_speed.py", ("--planner", "nope"), "argument --planner: invalid choice: 'nope'"),
    ("simulator_speed.py", ("--out", "/nonexistent-dir/x.md"), "/nonexistent-dir does not exist; make the directory"),
    ("simulator_speed.py", ("--jobs", "1", "--load", "0.5"), "error: trace generate: load needs at least 2 jobs"),
    ("planner_replay.py", ("record", "--load", "9", "--out", "x.pkl"), "argument --load: must be a finite number"),
    ("trace_jct.py", ("run", "{tmp}/out", "--traces", "0.5:x"),
     "argument --traces: must be LOAD:SEED items, comma-separated, each load in (0, 2]"),
    ("trace_jct.py", ("run", "/proc/out", "--traces", "0.5:0"),  # root may write there, but /proc takes no directory
     ("DIR '/proc/out': cannot make the directory", "DIR: cannot write in /proc (permission denied)")),
    ("estimate_gap.py", ("--traces", "64:600"),
     "argument --traces: must be CLUSTERS:JOBS:SEED items, comma-separated, with 2..4,096 clusters"),
    ("headline.py", ("--loads", "0.5,9"), "argument --loads: must be offered loads, comma-separated, each in (0, 2]"),
    ("headline.py", ("--note", "@{tmp}/missing.txt"), "--note @{tmp}/missing.txt: cannot read (No such file"),
    ("headline.py", ("--render", "{tmp}"), "--render {tmp}: cannot read a run's results"),
    ("fuzz_inputs.py", ("--examples", "-1"), "argument --examples: must be an integer in 1..1,000,000 (got '-1')"),
    ("fuzz_inputs.py", ("--replay", "nope:1"), "argument --replay: must be FAMILY:INDEX with FAMILY one of"),
    ("dilation.py", ("--dilations", "1,0.5"), "argument --dilations: must be 'auto' or numbers in 1..64"),
    ("rank_startup.py", ("--topology", "{tmp}/none.yaml"), "{tmp}/none.yaml: no such topology file"),
    ("delay_stalls.py", ("--busy-ms", "300"), "--busy-ms (300) must be less than --period-ms (200)"),
    ("replan_on_return.py", ("--withdrawals", "8,x"), "argument --withdrawals: must be comma-separated integers"),
    ("thin_link_transfer.py", ("--bogus",), "unrecognized arguments: --bogus"),  # it ignored them, even --help
    ("emulated_orders.py", ("--seeds", "1,1"), "argument --seeds: has a value twice (got '1,1'); give each once"),
    ("emulated_orders.py", ("--planners", "ilp,blind"),
     "argument --planners: must name spinsearch and at least one other planner (got 'ilp,blind')"),
    ("emulated_orders.py", ("--planners", "spinsearch,nope"), "argument --planners: unknown planner 'nope'"),
    ("queue_delay.py", ("--queue-bdp", "1,1"), "argument --queue-bdp: must be buffer sizes in bandwidth-delay "
     "products, comma-separated, each in (0, 100], none twice (got '1,1')"),
    ("queue_delay.py", ("--queue-bdp", "nan"), "argument --queue-bdp: must be buffer sizes"),
    ("queue_delay.py", ("--repeats", "0"), "argument --repeats: must be an integer in 1..100 (got '0')"),
    ("shared_link_model.py", ("--orders", "{tmp}/none"), "{tmp}/none: no such directory; give one emulated_orders.py"),
    ("shared_link_model.py", ("--orders", "{tmp}"), "{tmp}: no order's config.json in it or in a seed-* directory"),
])
def test_a_benchmark_script_refuses_bad_arguments_in_one_line(name, args, says, tmp_path):
    done = script(name, *(a.format(tmp=tmp_path) for a in args))
    assert done.returncode == 2 and done.stdout == ""
    said = [s.format(tmp=tmp_path) for s in ((says,) if isinstance(says, str) else says)]  # (any of them)
    assert len(done.stderr.splitlines()) == 1 and any(s in done.stderr for s in said), done.stderr
    assert list(tmp_path.iterdir()) == []  # nothing written, no directory left


def test_planner_replay_refuses_a_file_it_did_not_record(tmp_path):
    for path, why in ((tmp_path / "missing.pkl", "No such file or directory"),
                      (REPO / "README.md", "invalid load key")):
        done = script("planner_replay.py", "replay", str(path))
        assert done.returncode == 2 and done.stdout == ""
        assert done.stderr.startswith(f"error: {path}: cannot read a recording (") and why in done.stderr
        assert len(done.stderr.splitlines()) == 1 and "give a file that `record --out` wrote" in done.stderr


def test_a_tiny_run_writes_its_table_and_a_recording_replays(tmp_path):
    out = tmp_path / "speed.md"
    done = script("simulator_speed.py", "--jobs", "20", "--out", str(out))
    assert done.returncode == 0, done.stderr
    row = next(line for line in out.read_text().splitlines() if line.startswith("| 20 | 64 | 1944 |"))
    assert row.split("|")[9].strip() == "20"  # completed
    calls = tmp_path / "calls.pkl"
    done = script("planner_replay.py", "record", "--jobs", "20", "--out", str(calls))
    said = re.fullmatch(r"(\d+) SpinSearch calls recorded in (.+)\n", done.stdout)
    assert done.returncode == 0 and said and int(said[1]) >= 20 and said[2] == str(calls), done.stderr
    done = script("planner_replay.py", "replay", str(calls))
    assert done.returncode == 0 and done.stdout.startswith(f"{said[1]} calls: "), done.stderr


def test_emulated_orders_deals_the_same_jobs_to_the_same_times():
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        from emulated_orders import reordered
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    from spiderflow.traces import load_trace

    jobs = load_trace(REPO / "traces" / "paper8-16.csv").jobs
    assert reordered(jobs, 0) == list(jobs)
    for seed in (1, 2):
        order = reordered(jobs, seed)
        assert [j.arrival_s for j in order] == [j.arrival_s for j in jobs]
        assert sorted(j.job_id for j in order) == sorted(j.job_id for j in jobs)
        assert [j.job_id for j in order] != [j.job_id for j in jobs]
        same = {j.job_id: j for j in jobs}
        assert all(o == replace(same[o.job_id], arrival_s=o.arrival_s) for o in order)  # only the time moved
    assert [j.job_id for j in reordered(jobs, 1)] != [j.job_id for j in reordered(jobs, 2)]


def test_emulated_orders_renders_the_seeds_it_finds(tmp_path):
    committed = REPO / "benchmarks" / "results" / "emulated-headline-paper8"
    for seed in (4, 7):
        shutil.copytree(committed, tmp_path / f"seed-{seed}")
        (tmp_path / f"seed-{seed}" / "trace.csv").write_text((REPO / "traces" / "paper8-16.csv").read_text())
    done = script("emulated_orders.py", "--render", "--seeds", "4,7", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "orders.md").read_text()
    # the committed run's measured ratios (README's table), each seed alike, so the means and minima too
    assert text.count("| 2.31x (2.30x) | 1.56x (1.51x) |") == 3  # each seed's row, and once in the row over the seeds
    assert "| ilp | 2.31x (2.30x) | 2.31x (2.30x) | 1.56x (1.51x) | 1.56x (1.51x) |" in text
    assert "| blind | 3.30x (3.49x) | 3.30x (3.49x) | 3.55x (3.76x) | 3.55x (3.76x) |" in text
    assert "| 4 | w1-350m-24g, w2-1.3b-24g, s1-2.7b-8g |" in text and "| 1.63x |" in text
    assert "## How far each prediction of a job's iteration time was from what it measured" in text
    done = script("emulated_orders.py", "--render", "--seeds", "5", "--out", str(tmp_path))
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1
    assert f"{tmp_path}/seed-5/summary.json: cannot read a compare's summary" in done.stderr
    (tmp_path / "seed-7" / "genetic" / "result.json").unlink()
    done = script("emulated_orders.py", "--render", "--seeds", "4,7", "--out", str(tmp_path))
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1
    assert f"{tmp_path}/seed-7: cannot read genetic's jobs" in done.stderr and "genetic/result.json" in done.stderr


def test_emulated_orders_tells_each_prediction_error_by_where_the_job_ran(tmp_path):
    """Five jobs by hand: one in one cluster, one over WAN links of its own, one over shared links whose
    simulation placed it elsewhere, one placed again and one that did not complete (both left out)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        from emulated_orders import error_rows, job_errors
    finally:
        sys.path.remove(str(REPO / "benchmarks"))

    def job(job_id, placement, measured, launch_pct, alone, shared):
        return {"job_id": job_id, "placement": placement, "measured_iteration_s": measured, "error_pct": launch_pct,
                "predicted_alone_iteration_s": alone, "predicted_shared_iteration_s": shared}

    (tmp_path / "ilp").mkdir()
    (tmp_path / "ilp" / "result.json").write_text(json.dumps({"jobs": [
        job("one", {"a": 4}, 2.0, -1.0, 1.98, 1.98),
        job("own", {"a": 4, "b": 4}, 1.0, 10.0, 1.1, 1.1),
        job("shared", {"a": 4, "b": 4}, 1.0, -20.0, 0.8, 1.5),
        job("again", {"a": 8, "b": 8}, 1.0, 50.0, 1.5, None),
        job("failed", {"a": 2}, None, None, 1.0, 1.0)]}))
    (tmp_path / "jobs-ilp.csv").write_text(
        "job_id,placement,simulated_placement,simulated_iteration_s\n"
        "one,a:4,a:4,1.9\nown,a:4 b:4,a:4 b:4,1.05\nshared,a:4 b:4,a:8,1.2\nagain,a:8 b:8,a:8 b:8,1.0\n")
    got = job_errors(tmp_path, "ilp")
    assert [kind for kind, _ in got] == ["one cluster", "over the WAN, its links its own",
                                         "over the WAN, links shared with another job"]
    (_, e1), (_, e2), (_, e3) = got
    assert e1 == pytest.approx({"at launch (the planner's)": -1.0, "simulated replay": -5.0, "`shared`": -1.0})
    assert e2 == pytest.approx({"at launch (the planner's)": 10.0, "simulated replay": 5.0, "`shared`": 10.0})
    assert e3 == pytest.approx({"at launch (the planner's)": -20.0, "`shared`": 50.0})  # simulated elsewhere
    (tmp_path / "seed-3").mkdir()
    for name in ("ilp", "jobs-ilp.csv"):
        (tmp_path / name).rename(tmp_path / "seed-3" / name)
    rows = error_rows(tmp_path, [3], ["ilp"])
    assert "| one cluster | simulated replay | 1 | -5.0% | 5.0% | -5.0% to -5.0% |" in rows
    assert "| over the WAN, links shared with another job | simulated replay | 0 | n/a | n/a | n/a |" in rows
    assert "| over the WAN, links shared with another job | `shared` | 1 | +50.0% | 50.0% | +50.0% to +50.0% |" in rows


def test_emulated_orders_says_n_a_where_a_planner_completed_nothing():
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        from emulated_orders import table
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    summary = json.loads((REPO / "benchmarks" / "results" / "emulated-headline-paper8" / "summary.json").read_text())
    summary["planners"]["blind"]["measured"].update(avg_jct_s=None, throughput_tokens_per_s=0.0)
    rows = table({1: {"summary": summary, "first": ["w1"]}}, ["spinsearch", "ilp", "blind"])
    assert rows[2].endswith("| 2.31x (2.30x) | 1.56x (1.51x) | n/a (3.49x) | n/a (3.76x) |")
    assert "| blind | n/a (3.49x) | n/a (3.49x) | n/a (3.76x) | n/a (3.76x) |" in rows


def test_queue_delay_tells_each_shared_jobs_error_per_buffer_size():
    """Runs by hand: a WAN job another job's traffic crossed (shared above alone) in every run, once
    placed elsewhere; a WAN job on links of its own and a one-cluster job are not in the table."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        from queue_delay import table
    finally:
        sys.path.remove(str(REPO / "benchmarks"))

    def run(measured, placement=None):
        return {"jobs": [
            {"job_id": "w4", "placement": placement or {"ohio": 12, "virginia": 8}, "measured_iteration_s": measured,
             "predicted_alone_iteration_s": 1.2, "predicted_shared_iteration_s": 2.0},
            {"job_id": "own", "placement": {"a": 4, "b": 4}, "measured_iteration_s": 1.0,
             "predicted_alone_iteration_s": 1.0, "predicted_shared_iteration_s": 1.0},
            {"job_id": "one", "placement": {"a": 4}, "measured_iteration_s": 1.0,
             "predicted_alone_iteration_s": 1.0, "predicted_shared_iteration_s": 1.5}]}

    rows = table({1.0: [run(2.5), run(2.6), run(2.4)], 0.1: [run(2.0), run(1.0, {"ohio": 20})]})
    assert rows[2:] == ["| w4 | ohio:12 virginia:8 | 2.500 (3) | -20.0% | 2.000 (1) | +0.0% |"]
    assert rows[0].startswith("| job | placement | 1 BDP: measured (s) | error vs `shared` | 0.1 BDP:")


def test_shared_link_model_reads_every_committed_plan_back_and_orders_the_loads():
    """Every plan of the committed emulated orders reads back from its text and prices as recorded
    alone (rows_of raises otherwise); a job on WAN links of its own prices alike under every load and
    as the run's own ``shared`` figure; a job that shared is priced no lower counted than weighted by
    duty (each other flow's duty is at most 1) and no lower weighted than alone, and counted for the
    moments it shared no higher than the run's ``shared``, which counts every overlap for the whole run."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        from shared_link_model import ORDERS, rows_of
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    rows = rows_of(ORDERS)
    shared = [r for r in rows if r["shared_link"]]
    assert shared and len(rows) > len(shared)  # (53 and 26 on the orders committed at 34a9c23)
    for r in rows:
        e = r["err"]
        assert 0 < r["duty"] <= 1
        if r["shared_link"]:
            assert e["alone"] < e["duty"] < e["counted"] <= e["shared"] + 1e-9, r
        else:
            assert max(e.values()) - min(e.values()) < 1e-6, r
