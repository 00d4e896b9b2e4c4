"""`python -m spiderflow plan` end to end, and the estimate-vs-exact gap."""

import json
import subprocess
import sys

import pytest

from spiderflow.costmodel import TopologyView, estimate, predict
from spiderflow.parallel.tpa import plan_placement
from spiderflow.topology import load_topology
from spiderflow.topology.generate import generate_topology
from spiderflow.workload import Job

from .conftest import REPO


def run(*args):
    return subprocess.run([sys.executable, "-m", "spiderflow", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120)


def test_plan_json_default_gpt3_1_3b_16_gpus():
    proc = run("plan", "--topology", "topologies/default.yaml", "--model", "gpt3-1.3b", "--gpus", "16",
               "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert sum(out["placement"].values()) == 16
    assert {"iteration_s", "compute_s", "p2p_s", "dp_sync_s", "bubble_s"} <= set(out["predicted"])
    assert out["predicted"]["iteration_s"] > 0
    assert out["micro_batches"] * out["micro_batch_size"] * out["replicas"] * out["stages"][0]["dp"] == 256
    assert 0 < out["memory_gb_per_gpu"] < 80
    layers = sorted(tuple(s["layers"]) for s in out["stages"] if s["replica"] == 0)
    assert layers[0][0] == 0 and layers[-1][1] == 24


def test_plan_text_and_cluster_restriction():
    proc = run("plan", "--model", "gpt3-1.3b", "--gpus", "24", "--clusters", "oregon,tokyo")
    assert proc.returncode == 0, proc.stderr
    assert "placement: oregon=" in proc.stdout and "tokyo=" in proc.stdout


@pytest.mark.parametrize("args, message", [
    (("--model", "gpt3-175b", "--gpus", "8"), "does not fit in GPU memory"),
    (("--model", "gpt3-1.3b", "--gpus", "800"), "wants 800 GPUs, only 56 free"),
    (("--model", "gpt3-1.3b", "--gpus", "8", "--clusters", "mars"), "--clusters: 'mars' is not a cluster"),
])
def test_plan_infeasible_one_line_exit_2(args, message):
    proc = run("plan", *args)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "Traceback" not in proc.stderr


def test_bad_topology_one_line_exit_2(tmp_path):
    bad = (REPO / "topologies" / "default.yaml").read_text().replace("bandwidth_gbps: 0.79", "bandwidth_gbps: -1")
    path = tmp_path / "bad.yaml"
    path.write_text(bad)
    proc = run("plan", "--topology", str(path), "--model", "gpt3-1.3b", "--gpus", "16")
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"error: {path}: links[0].bandwidth_gbps must be > 0 (got -1)"


def test_import_leaves_mininet_and_torch_out():
    code = "import sys, spiderflow, spiderflow.cli, spiderflow.placement; " \
           "print(sorted(m for m in ('mininet', 'torch', 'emulator') if m in sys.modules))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert proc.stdout.strip() == "[]", proc.stderr


def test_fast_estimate_stays_close_to_exact_schedule():
    """The closed form the search loops use vs the exact 1F1B critical path, on TPA's plans."""
    gaps = []
    for topo_name in ("default", "paper8"):
        topo = load_topology(REPO / "topologies" / f"{topo_name}.yaml")
        view = TopologyView(topology=topo)
        names = topo.names
        for model, gpus in (("gpt3-1.3b", 16), ("gpt3-6.7b", 32), ("llama2-13b", 32), ("llama2-70b", 48)):
            job = Job(job_id="g", arrival_s=0, model=model, gpus=gpus, iterations=1, global_batch=512,
                      seq_len=2048)
            for start in range(len(names) - 1):
                segs, left = [], gpus
                for name in names[start:]:
                    take = min(left, topo.cluster(name).total_gpus)
                    segs.append((name, take))
                    left -= take
                    if not left:
                        break
                if left:
                    continue
                plan = plan_placement(job, segs, view)
                exact = predict(plan, view).iteration_s
                gaps.append(abs(estimate(plan, view) - exact) / exact)
    assert len(gaps) >= 10
    assert max(gaps) < 0.02, sorted(gaps)[-3:]  # measured: 0.9% worst over 35 plans (1.3% before the warm-up term)
    assert sorted(gaps)[len(gaps) // 2] < 0.01


def test_fast_estimate_stays_close_to_exact_schedule_across_thin_loaded_links():
    """Chains of the generated 64-cluster topology whose WAN boundaries are thin, with 0, 1 and 3 other
    flows on every link: TPA's plans there run deep pipelines whose warm-up forwards queue on the thin
    links. The estimate that left that queueing out was up to 5.0% off on TPA's plans here (and 13%
    under on plans of a simulated 64-cluster trace); measured now: 1.8% worst."""
    topo = generate_topology(64, 0)
    gaps = []
    for chain in ([("c004", 8), ("c020", 8), ("c026", 8), ("c062", 8)], [("c040", 24), ("c039", 8), ("c047", 32)]):
        for flows in (0, 1, 3):
            load = {link.key: float(flows) for link in topo.links} if flows else {}
            view = TopologyView(topology=topo, link_load=load)
            for model in ("llama2-7b", "gpt3-2.7b", "gpt3-1.3b"):
                job = Job(job_id="t", arrival_s=0, model=model, gpus=sum(g for _, g in chain), iterations=1,
                          global_batch=512, seq_len=2048)
                plan = plan_placement(job, chain, view, intra_ilp=False)
                exact = predict(plan, view).iteration_s
                gaps.append(abs(estimate(plan, view) - exact) / exact)
    assert len(gaps) == 18
    assert max(gaps) < 0.02, sorted(gaps)[-3:]


def test_plan_json_stdout_stays_json_when_an_ilp_solves():
    # The ILP planner solves with HiGHS, whose first solve in a process prints a banner (highspy 1.16);
    # stdout must still be the JSON document alone.
    proc = run("plan", "--planner", "ilp", "--model", "gpt3-1.3b", "--gpus", "24", "--time-limit", "2", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["planner"] == "ilp"
