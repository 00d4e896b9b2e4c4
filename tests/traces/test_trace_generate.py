"""The synthetic generator and the shipped traces."""

import dataclasses
import statistics
from pathlib import Path

import pytest

from spiderflow.errors import ConfigError
from spiderflow.traces import generate_trace, load_trace
from spiderflow.traces.generate import CLASSES, fits, gpu_seconds, mean_gap_for_load, offered_load
from spiderflow.traces.mapping import reference_iteration_time_s

TRACES = Path(__file__).resolve().parents[2] / "traces"


def kind(job):
    return job.job_id.split("-")[0]


def run_s(job):
    """Run time alone on A100s, the generator's target."""
    return job.iterations * reference_iteration_time_s(job.model, job.gpus, job.global_batch, job.seq_len)


def test_reproducible_for_a_seed():
    assert generate_trace(200, 7) == generate_trace(200, 7)
    assert generate_trace(200, 7) != generate_trace(200, 8)
    assert generate_trace(50, 7) == generate_trace(200, 7)[:50]  # a prefix does not depend on the length


def test_shape_of_a_trace():
    jobs = generate_trace(2000, 1)
    assert len({j.job_id for j in jobs}) == 2000
    assert jobs[0].arrival_s == 0.0
    assert all(a.arrival_s <= b.arrival_s for a, b in zip(jobs, jobs[1:]))
    assert {j.gpus for j in jobs} <= {8, 16, 32, 64, 128, 256, 512}
    assert {8, 512} <= {j.gpus for j in jobs}
    assert all(fits(j.model, j.gpus) for j in jobs)
    assert all(j.iterations >= 1 for j in jobs)
    counts = {k: sum(kind(j) == k for j in jobs) for k in CLASSES}
    assert counts["eval"] > 0.55 * 2000 and 0.03 * 2000 < counts["pretrain"] < 0.12 * 2000
    gpu_s = {k: sum(run_s(j) * j.gpus for j in jobs if kind(j) == k) for k in CLASSES}
    total = sum(gpu_s.values())
    assert gpu_s["pretrain"] > 0.7 * total and gpu_s["eval"] < 0.05 * total  # few jobs, most GPU time
    runs = sorted(run_s(j) for j in jobs)
    assert runs[0] < 10 * 60 and runs[-1] > 86400  # JCTs from minutes to days
    assert 60 < statistics.median(runs) < 3600  # most jobs are short


def gaps(jobs):
    return [b.arrival_s - a.arrival_s for a, b in zip(jobs, jobs[1:])]


def test_poisson_and_bursty_arrivals_keep_the_mean_gap():
    poisson = gaps(generate_trace(6000, 3, mean_interarrival_s=100.0))
    bursty = gaps(generate_trace(6000, 3, arrival="bursty", mean_interarrival_s=100.0))
    for g in (poisson, bursty):
        assert statistics.mean(g) == pytest.approx(100.0, rel=0.15)
    cv = [statistics.stdev(g) / statistics.mean(g) for g in (poisson, bursty)]
    assert cv[0] == pytest.approx(1.0, abs=0.1)  # exponential gaps
    assert cv[1] > 1.8  # bursts: many short gaps, a few long ones


def test_max_gpus_and_mix_options():
    small = generate_trace(300, 2, max_gpus=64)
    assert max(j.gpus for j in small) == 64
    assert all(fits(j.model, j.gpus) for j in small)
    only = generate_trace(50, 2, mix={"pretrain": 1.0})
    assert {kind(j) for j in only} == {"pretrain"}
    assert min(j.gpus for j in only) >= 64


@pytest.mark.parametrize("kwargs, message", [
    ({"jobs": 0}, "jobs must be a positive integer"),
    ({"arrival": "uniform"}, "arrival must be one of poisson, bursty"),
    ({"mean_interarrival_s": 0}, "mean_interarrival_s must be a number > 0"),
    ({"max_gpus": 100}, "max_gpus must be a power of two >= 8"),
    ({"mix": {"training": 1.0}}, "mix must be keyed by eval, finetune, pretrain"),
    ({"mix": {"eval": 0.0}}, "mix must be a mapping with some share > 0"),
])
def test_bad_arguments(kwargs, message):
    args = {"jobs": 10, "seed": 0, **kwargs}
    with pytest.raises(ConfigError, match=message):
        generate_trace(**args)


def test_shipped_synthetic_trace_is_the_generators_output():
    load = load_trace(TRACES / "synthetic-1000.csv")
    assert load.format == "ours" and load.skipped == 0
    assert load.jobs == generate_trace(1000, 0)
    assert "generate_trace(1000, seed=0)" in (TRACES / "synthetic-1000.csv").read_text().splitlines()[0]


def test_shipped_default_trace_fits_the_default_topology():
    jobs = load_trace(TRACES / "default.csv").jobs
    assert 4 <= len(jobs) <= 5
    assert {j.model for j in jobs} <= {"gpt3-125m", "gpt3-350m", "gpt3-1.3b"}
    for j in jobs:
        assert 4 <= j.gpus <= 16 and j.arrival_s <= 60
        assert 20 <= j.iterations <= 50 and 32 <= j.global_batch <= 128 and 1024 <= j.seq_len <= 2048


# --- sizing arrivals to an offered load: trace generate --topology FILE --load L ---

TOPOLOGIES = Path(__file__).resolve().parents[2] / "topologies"


def paper8():
    from spiderflow.topology import load_topology
    from spiderflow.traces.planned import PlannedGpuTime
    topo = load_topology(TOPOLOGIES / "paper8.yaml")
    return topo.total_gpus, PlannedGpuTime(topo)


def test_gpu_seconds_by_hand():
    job = generate_trace(1, 0)[0]
    flops = 140.4e12  # an A100 at MFU 0.45: the reference GPU, so gpu_seconds = gpus x target run time
    assert gpu_seconds(job, flops) == pytest.approx(job.gpus * run_s(job), rel=1e-12)
    assert gpu_seconds(job, 2 * flops) == pytest.approx(gpu_seconds(job, flops) / 2)


@pytest.mark.parametrize("arrival", ["poisson", "bursty"])
@pytest.mark.parametrize("load", [0.5, 0.7, 0.9, 2.0])
def test_mean_gap_gives_the_asked_load(arrival, load):
    total, sizer = paper8()
    mean = mean_gap_for_load(300, 3, load, total_gpus=total, job_gpu_seconds=sizer, arrival=arrival, max_gpus=64)
    jobs = generate_trace(300, 3, arrival=arrival, mean_interarrival_s=mean, max_gpus=64)
    assert offered_load(jobs, total_gpus=total, job_gpu_seconds=sizer) == pytest.approx(load, rel=1e-6)
    # the jobs are the same as at any other mean gap: only the arrivals stretch
    other = generate_trace(300, 3, arrival=arrival, mean_interarrival_s=600, max_gpus=64)
    assert [(j.model, j.gpus, j.iterations) for j in jobs] == [(j.model, j.gpus, j.iterations) for j in other]


@pytest.mark.parametrize("load, jobs, message", [
    (0, 10, r"load must be a number in \(0, 2\]"), (2.5, 10, "load must be"), (float("nan"), 10, "load must be"),
    (True, 10, "load must be"), (0.5, 1, "load needs at least 2 jobs"),
    (1e-9, 10, "needs a mean gap of .* raise the load"),
])
def test_load_out_of_range(load, jobs, message):
    total, sizer = paper8()
    with pytest.raises(ConfigError, match=message):
        mean_gap_for_load(jobs, 0, load, total_gpus=total, job_gpu_seconds=sizer)


def test_cli_generate_for_a_load(tmp_path, capsys, cli):
    main = cli
    out = tmp_path / "t.csv"
    assert main(["trace", "generate", "--jobs", "100", "--seed", "2", "--topology", str(TOPOLOGIES / "paper8.yaml"),
                 "--load", "0.7", "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert "offered load 0.700 of paper8's 128 GPUs" in said
    jobs = load_trace(out).jobs
    total, sizer = paper8()
    assert offered_load(jobs, total_gpus=total, job_gpu_seconds=sizer) == pytest.approx(0.7, rel=1e-4)
    assert max(j.gpus for j in jobs) <= 128  # capped at the topology's GPUs (a power of two)
    assert "--load 0.7" in out.read_text().splitlines()[0]


@pytest.mark.parametrize("extra, message", [
    (["--load", "0.5"], "--load and --topology go together"),
    (["--topology", "topologies/paper8.yaml"], "--load and --topology go together"),
    (["--load", "0.5", "--topology", "topologies/paper8.yaml", "--mean-interarrival", "60"],
     "give --load or --mean-interarrival, not both"),
])
def test_cli_load_needs_a_topology_and_no_mean_gap(tmp_path, capsys, cli, extra, message):
    main = cli
    assert main(["trace", "generate", "--jobs", "5", *extra, "--out", str(tmp_path / "t.csv")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "t.csv").exists()


def test_trace_generate_json_describes_the_file_written(tmp_path, capsys):
    import json

    from spiderflow.cli import main

    path = tmp_path / "t.csv"
    assert main(["trace", "generate", "--jobs", "12", "--seed", "5", "--out", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    jobs = load_trace(str(path)).jobs
    assert out["out"] == str(path) and out["jobs"] == len(jobs) == 12 and out["seed"] == 5
    assert out["last_arrival_s"] == pytest.approx(jobs[-1].arrival_s) and out["gpus"] == sum(j.gpus for j in jobs)
    assert out["mean_interarrival_s"] == 600.0 and out["offered_load"] is None and out["topology"] is None
    assert main(["trace", "generate", "--jobs", "12", "--seed", "5", "--out", str(path), "--json",
                 "--topology", "paper8", "--load", "0.5"]) == 0
    loaded = json.loads(capsys.readouterr().out)
    assert loaded["load"] == 0.5 and loaded["offered_load"] == pytest.approx(0.5, rel=1e-3)
    assert loaded["max_gpus"] <= 128  # paper8's 128 GPUs


def test_planned_gpu_time_is_the_simulated_run_of_the_job_alone():
    """The sizing's GPU-seconds are what the simulator (exact pricing) charges the job when it runs alone:
    GPUs of SpinSearch's plan x iterations x its iteration time (a WAN job too)."""
    from spiderflow.simulate.engine import SimConfig, simulate

    total, sizer = paper8()
    jobs = generate_trace(60, 4, max_gpus=64)
    shapes = {}
    for j in jobs:  # one job per GPU count: one cluster (8, 16) and across the WAN (32 and 64 > any cluster)
        shapes.setdefault(j.gpus, j)
    assert {8, 64} <= set(shapes)
    for job in shapes.values():
        rec, = simulate(sizer.topology, [dataclasses.replace(job, arrival_s=0.0)], SimConfig(exact=True))
        used = sum(rec.placement.values()) * (rec.end_s - rec.start_s)
        assert sizer(job) == pytest.approx(used, rel=1e-6)
    assert not sizer.unplanned


def test_planned_gpu_time_falls_back_to_compute_for_a_job_no_plan_fits():
    total, sizer = paper8()
    job = dataclasses.replace(generate_trace(1, 0)[0], gpus=256)  # paper8 has 128 GPUs
    assert sizer(job) == gpu_seconds(job, sizer.flops_per_gpu)
    assert sizer.unplanned == {(job.model, 256, job.global_batch, job.seq_len)}
