"""`plan`'s additive breakdown, the human units of `plan`/`simulate` text, and the JCT CDF figure."""

import json
import re
import subprocess
import sys

import pytest

from spiderflow.costmodel import TopologyView, _exposed_p2p, predict
from spiderflow.costmodel.schedule import simulate_1f1b
from spiderflow.costmodel.stages import StageCost
from spiderflow.parallel.tpa import plan_placement
from spiderflow.simulate.metrics import human_count, human_duration, human_pct, jct_cdf_png, rounded_parts
from spiderflow.topology import load_topology
from spiderflow.workload import Job

from .conftest import REPO

BREAKDOWN = re.compile(r"^predicted iteration (\S+) (\S+) = compute (\S+) \2 \((\d+)%\) \+ exposed p2p (\S+) \2 "
                       r"\((\d+)%\) \+ bubble (\S+) \2 \((\d+)%\) \+ exposed dp sync (\S+) \2 \((\d+)%\)$")


def run(*args):
    return subprocess.run([sys.executable, "-m", "spiderflow", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120)


def test_exposed_p2p_hand_traced():
    """S=2, m=2, F=B=1 s, 3 s per transfer (test_costmodel's hand trace): stage 0 computes 0-2, waits
    2-9 for B0 (gradient in flight 6-9, activation F0 in flight 2-4: 5 s of transfers; stage 1's F0
    and B0 4-6: 2 s of compute), then 10-12 for B1 (its gradient on the link 9-12): 7 s of p2p, 2 s
    of waiting on compute, 4 s computing: 13 s."""
    costs = [StageCost(1.0, 1.0, 3.0, 0.0, 0.0), StageCost(1.0, 1.0, 0.0, 3.0, 0.0)]
    tl = simulate_1f1b(costs, 2)
    assert tl.pipeline_s == 13.0
    assert _exposed_p2p(costs, tl, 0) == 7.0
    # stage 1 waits 0-4 (F0 in flight 1-4), 6-7 (F1 on the link) and 9-13 (B1 in flight 9-12, stage 0's B1)
    assert _exposed_p2p(costs, tl, 1) == 7.0


def test_no_transfers_no_exposed_p2p():
    costs = [StageCost(1.0, 2.0, 0.0, 0.0, 0.0)] * 4
    tl = simulate_1f1b(costs, 8)
    assert [_exposed_p2p(costs, tl, i) for i in range(4)] == [0.0] * 4


@pytest.mark.parametrize("topo_name, model, gpus", [("default", "gpt3-1.3b", 16), ("paper8", "gpt3-6.7b", 32),
                                                    ("paper8", "llama2-13b", 48)])
def test_breakdown_adds_up_to_the_iteration(topo_name, model, gpus):
    topo = load_topology(REPO / "topologies" / f"{topo_name}.yaml")
    view = TopologyView(topology=topo)
    names = topo.names
    job = Job(job_id="g", arrival_s=0, model=model, gpus=gpus, iterations=1, global_batch=512, seq_len=2048)
    for order in (names, names[::-1]):  # spread over two or more clusters, so transfers cross the WAN
        segs, left = [], gpus
        for name in order:
            take = min(left, topo.cluster(name).total_gpus, gpus // 2)
            segs.append((name, take))
            left -= take
            if not left:
                break
        p = predict(plan_placement(job, segs, view), view)
        parts = (p.compute_s, p.exposed_p2p_s, p.compute_wait_s, p.dp_sync_s)
        assert min(parts) >= 0 and p.exposed_p2p_s <= p.bubble_s
        assert sum(parts) == pytest.approx(p.iteration_s, rel=1e-12)
        assert p.exposed_p2p_s + p.compute_wait_s == pytest.approx(p.bubble_s, rel=1e-12, abs=1e-12)
        assert p.dp_sync_total_s >= p.dp_sync_s


def test_plan_text_is_additive_half_open_and_json_keeps_seconds():
    args = ("plan", "--topology", "topologies/paper8.yaml", "--model", "gpt3-6.7b", "--gpus", "48",
            "--clusters", "oregon,tokyo", "--planner", "blind", "--time-limit", "5")
    proc = run(*args)
    assert proc.returncode == 0, proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("predicted iteration"))
    m = BREAKDOWN.match(line)
    assert m, line
    total, parts, pcts = m[1], [m[3], m[5], m[7], m[9]], [int(m[i]) for i in (4, 6, 8, 10)]
    places = len(total.split(".")[1]) if "." in total else 0
    assert all((len(p.split(".")[1]) if "." in p else 0) == places for p in parts)
    assert round(sum(float(p) for p in parts), places) == float(total)  # adds up as printed
    assert sum(pcts) == 100
    assert re.search(r"^overlapped \(not added above\): p2p .+, dp sync .+$", proc.stdout, re.M)
    assert re.search(r"^  0     0 oregon +\[0, \d+\) ", proc.stdout, re.M) and "half-open" in proc.stdout
    assert not re.search(r"\d-\d+ ", proc.stdout.split("(layers")[0].split("gpus\n")[1])
    out = json.loads(run(*args, "--json").stdout)
    pred = out["predicted"]
    assert float(total) == pytest.approx(pred["iteration_s"] / {"s": 1, "ms": 1e-3, "min": 60, "h": 3600}[m[2]],
                                         abs=10 ** -places)
    assert sum(pred[k] for k in ("compute_s", "exposed_p2p_s", "compute_wait_s", "dp_sync_s")) == \
        pytest.approx(pred["iteration_s"], rel=1e-12)
    assert pred["exposed_p2p_s"] > pred["compute_s"]  # two stages across the thin oregon-tokyo path


def test_human_units():
    assert human_duration(67.6) == "67.6 s"
    assert human_duration(11556.0) == "3.21 h"
    assert human_duration(0.85) == "850 ms"
    assert human_duration(300.0) == "5.00 min"
    assert human_duration(0.0) == "0 s" and human_duration(None) == "n/a"
    assert human_count(2.872e5, "tokens/s") == "287k tokens/s" and human_count(350.6) == "351"
    assert human_pct(0.1402) == "14.0%" and human_pct(None) == "n/a"
    assert rounded_parts(1.0, [1 / 3] * 3, 2) == [0.34, 0.33, 0.33]
    assert sum(rounded_parts(67.6, [9.54, 40.08, 17.98, 0.0], 1)) == pytest.approx(67.6)


def test_simulate_text_in_human_units_and_json_in_si():
    base = ("simulate", "--topology", "topologies/default.yaml", "--trace", "traces/default.csv",
            "--search-budget", "20", "--time-limit", "1")
    text = run(*base)
    assert text.returncode == 0, text.stderr
    assert not re.search(r"\de[+-]\d", text.stdout), text.stdout  # no e-notation
    lines = dict(ln.strip().split(": ", 1) for ln in text.stdout.splitlines())
    assert re.fullmatch(r"\d+\.\d%", lines["GPU utilisation"])
    assert re.fullmatch(r"[\d.]+ (ms|s|min|h)", lines["avg JCT"])
    assert lines["throughput"].endswith("tokens/s")
    summary = json.loads(run(*base, "--json").stdout)
    assert human_pct(summary["gpu_utilization"]) == lines["GPU utilisation"]
    assert human_duration(summary["avg_jct_s"]) == lines["avg JCT"]


def test_jct_cdf_png_and_pdf(tmp_path):
    jcts = {"spinsearch": [3600.0, 7200.0, 36000.0], "blind": [3600.0, 7200.0, 36000.0], "ilp": []}
    written = jct_cdf_png(jcts, tmp_path / "jct_cdf.png", "JCT CDF: 3 jobs of t.csv replayed on x (seed 0)",
                          jobs=3)
    assert written == [tmp_path / "jct_cdf.png", tmp_path / "jct_cdf.pdf"]
    assert (tmp_path / "jct_cdf.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "jct_cdf.pdf").read_bytes()[:5] == b"%PDF-"


def test_cdf_title_states_the_jobs_replayed():
    from spiderflow.simulate.commands import cdf_title

    assert cdf_title(150, "traces/synthetic-1000.csv", "geo64", 0) == \
        "JCT CDF: 150 jobs of synthetic-1000.csv replayed on geo64 (seed 0)"


def test_a_plan_handed_to_another_job_is_the_plan_replace_makes_and_hashes_as_one():
    """Plan.for_job (memoised plans handed to a job of the same shape) gives what
    ``dataclasses.replace(plan, job=job)`` gives, hashed and pickled alike, though it skips the checks;
    a job of other layers goes through them. The cached hash is the dataclass fields' hash."""
    import dataclasses
    import pickle

    from spiderflow.plan import Plan, Stage

    first = Job(job_id="a", arrival_s=0.0, model="gpt3-1.3b", gpus=2, iterations=5, global_batch=8, seq_len=2048)
    layers = first.spec.layers
    plan = Plan(job=first, replicas=((Stage(cluster="x", layer_start=0, layer_end=layers // 2),
                                      Stage(cluster="y", layer_start=layers // 2, layer_end=layers)),),
                dp=1, micro_batch_size=1, micro_batches=8)
    fields = (plan.job, plan.replicas, plan.dp, plan.micro_batch_size, plan.micro_batches, plan.recompute,
              plan.zero1)
    assert hash(plan) == hash(fields) == hash(plan)  # (the second from the cache)
    other = dataclasses.replace(first, job_id="b", arrival_s=3.0)
    moved = plan.for_job(other)
    assert moved == dataclasses.replace(plan, job=other) and moved.job is other and moved != plan
    assert hash(moved) == hash(dataclasses.replace(plan, job=other)) != hash(plan)
    again = pickle.loads(pickle.dumps(moved))
    assert again == moved and hash(again) == hash(moved) and "_hash" not in pickle.dumps(moved).decode("latin-1")
    bigger = Job(job_id="c", arrival_s=0.0, model="llama2-13b", gpus=2, iterations=5, global_batch=8, seq_len=2048)
    assert bigger.spec.layers != layers
    with pytest.raises(ValueError, match="stages must cover layers"):
        plan.for_job(bigger)
