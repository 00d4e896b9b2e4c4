"""benchmarks/headline.py on a tiny case: its tables agree with its rows, every run completed jobs.

2 seeds x 6 jobs on paper8 at load 0.5, SpinSearch against the topology-blind
baseline (the fast ones: a few seconds in all).
"""

import csv
import importlib.util
import json
import math
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("headline_bench", REPO / "benchmarks" / "headline.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


@pytest.fixture(scope="module")
def result(bench, tmp_path_factory):
    out = tmp_path_factory.mktemp("headline")
    res = bench.run_benchmark(out, seeds=(2, {}), jobs=(6, {}), topologies=[str(REPO / "topologies/paper8.yaml")],
                              loads=[0.5], planners=["spinsearch", "blind"], real=None, log=lambda _s: None,
                              argv=["headline.py", "--seeds", "2"])
    return out, res


def _rows(out):
    with open(out / "rows.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def test_one_row_per_seed_and_planner_every_job_done(result):
    out, _ = result
    rows = _rows(out)
    assert [(r["topology"], r["load"], r["seed"], r["planner"]) for r in rows] == [
        ("paper8", "0.5", s, p) for s in ("0", "1") for p in ("spinsearch", "blind")]
    for r in rows:
        assert int(r["jobs"]) == 6 and int(r["completed"]) == 6 and int(r["rejected"]) == 0
        assert float(r["avg_jct_s"]) > 0 and float(r["throughput_tokens_per_s"]) > 0
        assert int(r["planner_calls"]) >= 6  # at least one decision per job
        assert abs(float(r["offered_load"]) - 0.5) < 1e-6  # arrivals sized to the load
    # the same seed is the same trace for every planner
    assert rows[0]["mean_interarrival_s"] == rows[1]["mean_interarrival_s"]


def test_ratios_in_the_table_match_rows_csv(result):
    out, res = result
    rows = {(r["seed"], r["planner"]): r for r in _rows(out)}
    jct = [float(rows[(s, "blind")]["avg_jct_s"]) / float(rows[(s, "spinsearch")]["avg_jct_s"]) for s in ("0", "1")]
    thr = [float(rows[(s, "spinsearch")]["throughput_tokens_per_s"]) / float(rows[(s, "blind")]["throughput_tokens_per_s"])
           for s in ("0", "1")]
    gmean = lambda xs: math.exp(sum(map(math.log, xs)) / len(xs))  # noqa: E731
    (r,) = res["ratios"]
    assert r["other"] == "blind" and r["seeds"] == 2
    assert r["jct"] == pytest.approx(gmean(jct)) and r["thr"] == pytest.approx(gmean(thr))
    assert r["jct_min"] == pytest.approx(min(jct)) and r["thr_min"] == pytest.approx(min(thr))
    assert r["jct_lo"] <= r["jct"] <= r["jct_hi"] and r["thr_lo"] <= r["thr"] <= r["thr_hi"]
    # t-interval on the logs, 1 degree of freedom: t = 12.706
    half = 12.706 * abs(math.log(jct[0]) - math.log(jct[1])) / math.sqrt(2) / math.sqrt(2)
    assert r["jct_hi"] == pytest.approx(gmean(jct) * math.exp(half))
    table = (out / "headline.md").read_text()
    line = next(ln for ln in table.splitlines() if ln.startswith("| paper8 | 0.5 | blind |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[3:5] == ["2", f"{gmean(jct):.2f}"] and cells[6] == f"{min(jct):.2f}"
    assert cells[7] == f"{gmean(thr):.2f}" and cells[9] == f"{min(thr):.2f}"


def test_overhead_table_and_calls_csv_agree(result):
    out, _ = result
    with open(out / "calls.csv", newline="") as fh:
        calls = list(csv.DictReader(fh))
    rows = _rows(out)
    for p in ("spinsearch", "blind"):
        mine = [float(c["call_s"]) for c in calls if c["planner"] == p]
        assert len(mine) == sum(int(r["planner_calls"]) for r in rows if r["planner"] == p)
        line = next(ln for ln in (out / "headline.md").read_text().splitlines()
                    if re.match(rf"\| paper8 \| {p} \| \d+ \|", ln))
        assert line.split("|")[3].strip() == str(len(mine))
        assert line.split("|")[4].strip() == f"{sum(mine) / len(mine) * 1e3:.1f}"


def test_config_records_provenance_and_settings(result):
    out, _ = result
    cfg = json.loads((out / "config.json").read_text())
    for key in ("version", "git_commit", "argv", "python", "started", "machine", "wall_s"):
        assert key in cfg
    assert cfg["sim"]["charge_overhead"] is True and cfg["sim"]["time_limit_s"] == 10.0
    assert cfg["planners"]["spinsearch"] == {"planner": "spinsearch", "wait": True}
    assert [c["seed"] for c in cfg["cases"]] == [0, 1] and all(c["jobs"] == 6 for c in cfg["cases"])


def test_planner_registry_restored(bench):
    from spiderflow import placement

    before = dict(placement.PLANNERS)
    with pytest.raises(RuntimeError):
        with bench.timed_planner("blind", []):
            assert placement.PLANNERS["blind"] is not before["blind"]
            raise RuntimeError("boom")
    assert placement.PLANNERS == before


def test_render_rewrites_the_same_tables(bench, result):
    out, _ = result
    before = (out / "headline.md").read_text()
    (out / "headline.md").unlink()
    assert bench.main(["headline.py", "--render", str(out)]) == 0
    assert (out / "headline.md").read_text() == before


def _copy_run(out: Path, to: Path) -> Path:
    """A copy of the files --render reads, for a test that edits them."""
    to.mkdir()
    for name in ("rows.csv", "calls.csv", "config.json"):
        (to / name).write_bytes((out / name).read_bytes())
    return to


def test_render_describes_the_run_as_recorded_not_todays_code(bench, result, tmp_path):
    """The settings line comes from config.json: a re-render of an older run keeps that run's settings."""
    copy = _copy_run(result[0], tmp_path / "run")
    cfg = json.loads((copy / "config.json").read_text())
    assert cfg["sim"]["ilp_pool"] == {"size": bench.ilp.POOL_SIZE, "gap": bench.ilp.POOL_GAP,
                                      "budget": "as many as the decision's time limit allows"}
    assert cfg["sim"]["queue"] == bench.QUEUE
    cfg["sim"].update(time_limit_s=3.0, genetic_trials=7, queue="a queue of another day",
                      ilp_pool={"size": 2, "gap": 0.5, "budget": "for 1 s"})
    (copy / "config.json").write_text(json.dumps(cfg))

    def settings() -> str:
        assert bench.main(["headline.py", "--render", str(copy)]) == 0
        return next(ln for ln in (copy / "headline.md").read_text().splitlines() if ln.startswith("Settings:"))

    line = settings()
    assert "(a queue of another day; ILP time limit 3 s per decision" in line
    assert "a pool of up to 2 MILP chains within 50% of the optimum, for 1 s; genetic's default 7 trials" in line
    del cfg["sim"]["ilp_pool"], cfg["sim"]["queue"]  # a run from before these were recorded
    (copy / "config.json").write_text(json.dumps(cfg))
    line = settings()
    assert bench.QUEUE_UNRECORDED in line and "pool of MILP chains is not recorded" in line


def test_a_rendered_note_is_recorded_for_the_next_render(bench, result, tmp_path):
    copy = _copy_run(result[0], tmp_path / "run")
    assert bench.main(["headline.py", "--render", str(copy), "--note", "Sized by hand."]) == 0
    first = (copy / "headline.md").read_text()
    assert "## Sizing\n\nSized by hand.\n" in first
    assert json.loads((copy / "config.json").read_text())["note"] == "Sized by hand."
    assert bench.main(["headline.py", "--render", str(copy)]) == 0
    assert (copy / "headline.md").read_text() == first


def test_floors_are_each_jobs_run_alone_from_its_arrival(bench):
    """The floors of a two-job case, checked against SpinSearch's plans asked directly."""
    from spiderflow.placement import PlacementRequest, run_planner
    from spiderflow.topology import load_topology
    from spiderflow.workload import Job

    topo = load_topology(REPO / "topologies/paper8.yaml")
    jobs = (Job(job_id="a", arrival_s=100.0, model="gpt3-1.3b", gpus=16, iterations=50, global_batch=64, seq_len=1024),
            Job(job_id="b", arrival_s=400.0, model="gpt3-350m", gpus=8, iterations=20, global_batch=32, seq_len=1024))
    case = bench.Case(topology=topo.name, load="0.5", seed=0, jobs=jobs, offered_load=0.5, mean_interarrival_s=300.0)
    free = {c.name: c.total_gpus for c in topo.clusters}
    run = [j.iterations * run_planner("spinsearch", PlacementRequest(job=j, topology=topo, free_gpus=free))
           .prediction.iteration_s for j in jobs]
    f = bench.floors(topo, case)
    assert f["jct_floor_s"] == pytest.approx(sum(run) / 2)
    span = max(100.0 + run[0], 400.0 + run[1]) - 100.0
    assert f["makespan_floor_s"] == pytest.approx(span)
    tokens = sum(j.iterations * j.global_batch * j.seq_len for j in jobs)
    assert f["throughput_ceiling_tokens_per_s"] == pytest.approx(tokens / span)


def test_no_replay_beats_its_floor_and_the_ceiling_table_agrees(result):
    out, _ = result
    cfg = json.loads((out / "config.json").read_text())
    floor = {c["seed"]: c for c in cfg["cases"]}
    ratios = {}
    for r in _rows(out):
        f = floor[int(r["seed"])]
        jct = float(r["avg_jct_s"]) / f["jct_floor_s"]
        thr = f["throughput_ceiling_tokens_per_s"] / float(r["throughput_tokens_per_s"])
        no_foresight = float(r["avg_jct_s"]) / f["jct_no_foresight_s"]
        assert jct > 0.99 and thr > 0.99, (r["planner"], jct, thr)  # a prediction: a replay may land just under
        assert f["jct_no_foresight_s"] >= f["jct_floor_s"] >= f["jct_floor_alone_s"]
        ratios.setdefault(r["planner"], []).append((jct, thr, no_foresight))
    gmean = lambda xs: math.exp(sum(map(math.log, xs)) / len(xs))  # noqa: E731
    text = (out / "headline.md").read_text()
    table = text[text.index("## How far from what any planner could show"):].splitlines()
    line = next(ln for ln in table if ln.startswith("| paper8 | 0.5 | blind |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[3] == f"{gmean([j for j, _, _ in ratios['spinsearch']]):.3f}"
    assert cells[4] == f"{gmean([j for j, _, _ in ratios['blind']]):.3f}"
    assert cells[7] == f"{gmean([o for _, _, o in ratios['spinsearch']]):.3f}"
    assert cells[8] == f"{gmean([o for _, _, o in ratios['blind']]):.2f}"
    assert cells[9] == f"{gmean([t for _, t, _ in ratios['spinsearch']]):.3f}"
    assert cells[10] == f"{gmean([t for _, t, _ in ratios['blind']]):.3f}"


def test_a_goal_out_of_any_planners_reach_says_so(bench):
    row = {"jct": 1.2, "thr": 1.07, "jct_min": 1.0, "thr_min": 1.0}
    assert bench.goal(row) == "missed: JCT 1.20x < 1.3x; thr 1.07x < 1.25x"
    assert bench.goal(row, {"jct": 1.95, "thr": 1.074}) == "missed: JCT 1.20x < 1.3x; thr 1.07x < 1.25x (ceiling 1.07x)"
    assert bench.goal(row, {"jct": 1.55, "thr": 1.074, "jct_no_foresight": 1.22}) == (
        "missed: JCT 1.20x < 1.3x (ceiling 1.55x, 1.22x without foresight); thr 1.07x < 1.25x (ceiling 1.07x)")
    assert bench.goal(row, {"jct": 1.55, "thr": 1.074, "jct_no_foresight": 1.31}) == (
        "missed: JCT 1.20x < 1.3x; thr 1.07x < 1.25x (ceiling 1.07x)")


def test_the_figure_draws_the_tables_ratios_and_ceilings(bench, result):
    out, res = result
    assert (out / "headline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "headline.pdf").read_bytes()[:5] == b"%PDF-"
    rows, config = bench.read_results(out)
    drawn = {d[:4]: d[4:] for d in bench.write_figure(out, rows, config)}
    ceilings = {(c["topology"], c["load"], c["planner"]): c for c in bench.ceiling_rows(rows, config["cases"])}
    expected = {(k, r["topology"], r["load"], r["other"]): (r[k], r[f"{k}_lo"], r[f"{k}_hi"],
                                                            ceilings[r["topology"], r["load"], r["other"]][k])
                for r in res["ratios"] for k in ("jct", "thr")}
    assert drawn.keys() == expected.keys() and len(drawn) == 2  # JCT and throughput against blind, one cell
    for key, values in expected.items():
        assert drawn[key] == pytest.approx(values), key
