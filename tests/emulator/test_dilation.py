"""Time dilation (pure, no root): auto's choice, the CLI value, real-equivalent check results, measured / K."""

import argparse
import json

import pytest

from emulator.net.check import real_equivalent
from emulator.jobs.dilation import (CANDIDATES, ERROR_BUDGET, choose_dilation, critical_ops, distortion, host_ops,
                                    parse_dilation)
from emulator.jobs.launch import emulated_view
from emulator.net.measure import Result, Target
from emulator.net.layout import NetConfig
from emulator.jobs.replay import JobRun, Rank, RunConfig, Runner
from emulator.jobs.worker import RankSpec
from spiderflow.costmodel import plan_work
from spiderflow.plan import Plan, Stage
from spiderflow.workload import Job

from .conftest import two_cluster_topology

TOPO = two_cluster_topology(bandwidth_gbps=1.0, latency_ms=10.0)


def work(micro_batches=8, stages=("east", "west"), replicas=1):
    job = Job(job_id="j", arrival_s=0.0, model="gpt3-125m", gpus=2 * len(stages) * replicas, iterations=6,
              global_batch=2 * micro_batches * replicas, seq_len=1024)
    n = len(stages)
    rep = tuple(Stage(cluster=c, layer_start=12 * i // n, layer_end=12 * (i + 1) // n) for i, c in enumerate(stages))
    reps = (rep,) if replicas == 1 else (rep, tuple(Stage(cluster="west" if s.cluster == "east" else "east",
                                                           layer_start=s.layer_start, layer_end=s.layer_end)
                                                     for s in rep))
    plan = Plan(job=job, replicas=reps, dp=2, micro_batch_size=1, micro_batches=micro_batches)
    return plan_work(plan, emulated_view(TOPO, NetConfig()))


def test_parse_dilation_takes_auto_or_a_number_in_range():
    assert parse_dilation("auto") == "auto" and parse_dilation("4") == 4.0 and parse_dilation("1.5") == 1.5
    for bad in ("0.5", "x", "nan", "100", "-2"):
        with pytest.raises(argparse.ArgumentTypeError, match="auto"):
            parse_dilation(bad)


def test_critical_ops_count_1f1b_transfers_and_the_sync_ring():
    assert host_ops(work(8, ("east",))) == 2 * 8  # one stage: F and B per micro-batch
    assert critical_ops(work(8, ("east",))) == 1  # ... back to back on the GPU stream's clock: one end
    assert critical_ops(work(8, ("east",), replicas=2)) == 1 + 2  # then a 2-rank ring: 2(p - 1) steps
    assert critical_ops(work(8)) == host_ops(work(8)) == 2 * 2 * (8 + 1)  # 2 stages: m + S - 1 each way, each
    # ending in a send a neighbour waits for, and a transfer after each
    assert critical_ops(work(8, replicas=2)) == 2 * 2 * 9 + 2  # + a 2-rank ring


def test_one_stage_jobs_load_the_cores_with_every_op_but_are_distorted_by_one():
    one = work(8, ("east",))
    it = 16 * 1e-4 / ERROR_BUDGET  # 3% at K = 1 if each op's cost added up, as before the GPU stream's clock
    assert choose_dilation([("j", one, it)], overhead_s=1e-4, cores=1000).dilation == 1
    assert "0.2% at K=1" in choose_dilation([("j", one, it)], overhead_s=1e-4, cores=1000).reason
    # 62 such jobs on 2 cores: each op's cost still loads the cores, rho = 62 x 3% / 2 = 93%: K = 1 not taken
    many = [(f"j{i}", one, it) for i in range(62)]
    assert choose_dilation(many, overhead_s=1e-4, cores=2).dilation == 2


def test_auto_takes_the_smallest_k_within_budget_for_the_tightest_job():
    w = work(8)
    ops = critical_ops(w)
    overhead = 1e-4
    for target_k in CANDIDATES:
        # an iteration time that needs exactly target_k (contention negligible: 1000 cores)
        iteration = ops * overhead / (ERROR_BUDGET * target_k) * 1.01
        choice = choose_dilation([("a", w, 100.0), ("tight", w, iteration)], overhead_s=overhead, cores=1000)
        assert choice.dilation == target_k, choice.reason
        assert "tight" in choice.reason and f"K={target_k}" in choice.reason
    assert distortion(ops, 1.0, overhead, 1.0, 4) == pytest.approx(ops * overhead / 4)
    assert 8 not in CANDIDATES  # WAN pipelines ran 8-10% slow at K = 8 (docs/emulator-run.md)


def test_auto_counts_contention_stops_at_its_largest_k_and_says_so():
    w = work(8)
    ops = critical_ops(w)
    it = ops * 1e-4 / ERROR_BUDGET * 1.1  # 2.7% at K = 1 without contention
    assert choose_dilation([("j", w, it)], overhead_s=1e-4, cores=1000).dilation == 1
    # ten such jobs at once on 2 cores: rho = 10 x 2.7% / 2 = 14%, 2.7% x 1/(1 - 0.14) > 3% at K = 1
    many = [(f"j{i}", w, it) for i in range(10)]
    assert choose_dilation(many, overhead_s=1e-4, cores=2).dilation == 2
    # one at a time (calibration's plans): no queueing between them
    assert choose_dilation(many, overhead_s=1e-4, cores=2, one_at_a_time=True).dilation == 1
    capped = choose_dilation([("j", w, 1e-4)], overhead_s=1e-4, cores=2)
    assert capped.dilation == CANDIDATES[-1] and "not met" in capped.reason
    assert choose_dilation([], overhead_s=1e-4).dilation == 1


def test_check_reports_wire_measurements_in_real_equivalent_units():
    t = Target(a="east", b="west", src="east-h0", dst="west-h0", src_ip="1", dst_ip="2", kind="wan",
               configured_mbps=25.0, configured_delay_ms=40.0, mechanism="htb+nfqueue")  # at K = 4
    r = real_equivalent(Result(target=t, measured_mbps=24.5, measured_delay_ms=40.8), 4)
    assert (r.target.configured_mbps, r.measured_mbps) == (100.0, 98.0)
    assert (r.target.configured_delay_ms, r.measured_delay_ms) == (10.0, pytest.approx(10.2))


def _runner_with_a_measured_job(tmp_path):
    """A Runner at K = 4 and a two-rank job whose rank lines are 0.8 s apart (0.2 s iterations)."""
    from types import SimpleNamespace

    k = 4.0
    cfg = RunConfig(warm_tcp=False, iterations=4, warmup=1, net=NetConfig(dilation=k))
    runner = Runner(TOPO, [], cfg, SimpleNamespace(hosts={}), out_dir=tmp_path)
    job = Job(job_id="j", arrival_s=0.0, model="gpt3-125m", gpus=2, iterations=4, global_batch=2, seq_len=1024)
    run = JobRun(job=job, arrival_s=0.0, start_s=1.0)  # launched 1 s real-equivalent = 4 s wall after t0
    runner.t0 = 1000.0
    for rank in (0, 1):
        spec = RankSpec(job_id="j", rank=rank, world_size=2, master_addr="x", master_port=1, stage=rank, depth=2,
                        micro_batches=1, iterations=4, forward_s=0.1, backward_s=0.2, activation_bytes=4,
                        grad_bytes=4, prev_rank=None, next_rank=None)
        run.ranks.append(Rank(spec=spec, host=None, proc=None))
        start = 1000.0 + 4.0 + 0.5 + rank * 0.1  # first op 0.5 s wall after launch
        lines = [{"event": "start", "mono": start}] + [
            {"event": "iteration", "it": it, "end": 1.0 + 0.8 * it - rank * 0.1} for it in range(4)]
        (tmp_path / "ranks" / f"j-r{rank}.jsonl").write_text("".join(json.dumps(l) + "\n" for l in lines))
    return runner, run


def test_runner_reports_iterations_and_startup_in_real_equivalent_and_wall_time(tmp_path):
    """Rank lines 0.8 s apart at K = 4 are 0.2 s iterations; the start-up stays in wall seconds."""
    runner, run = _runner_with_a_measured_job(tmp_path)
    runner._measure(run)
    assert run.iteration_s == pytest.approx([0.2] * 3)  # intervals ending at iterations 1..3
    assert run.startup_wall_s == pytest.approx(0.5)


def test_runner_says_what_the_host_stole_while_a_job_was_measured(tmp_path):
    """Its measured iterations ran from 1005.5 to 1007.9 s (this machine's clock); samples at 1005.0
    and 1008.5 s around them saw 0.35 s stolen of 2 CPUs x 3.5 s: 5%."""
    from emulator.net.hoststeal import USER_HZ, StealLog

    runner, run = _runner_with_a_measured_job(tmp_path)
    stat = tmp_path / "stat"
    now = iter([1005.0, 1008.5, 1010.0])  # two samples of the loop, one when measuring
    runner.steal = StealLog(path=str(stat), cpus=2, clock=lambda: next(now))
    for stolen in (0, int(0.35 * USER_HZ)):
        stat.write_text(f"cpu  1 0 1 1 0 0 0 {stolen} 0 0\n")
        runner.steal.sample()
    runner._measure(run)
    assert run.host_steal_pct == pytest.approx(5.0)
    assert run.as_json()["host_steal_pct"] == 5.0


def test_a_calibration_is_applied_only_at_the_dilation_it_was_fitted_at(tmp_path):
    from spiderflow.errors import EmulatorError
    from emulator.run import check_calibration_dilation
    from spiderflow.costmodel import load_calibration
    from spiderflow.errors import ConfigError

    path = tmp_path / "calibration-two.json"
    path.write_text(json.dumps({"paths": {"east->west": {"alpha_s": 0.01, "beta_gbps": 0.9}}, "scale": 10,
                                "dilation": 2}))
    cal = load_calibration(path)
    assert cal.dilation == 2.0
    check_calibration_dilation(cal, 2.0)
    with pytest.raises(EmulatorError, match=r"calibration-two.json: fitted at dilation 2, this run uses 4; "
                                            r"pass --dilation 2"):
        check_calibration_dilation(cal, 4.0)
    path.write_text(json.dumps({"paths": {}}))  # older files: no dilation recorded, accepted at any K
    check_calibration_dilation(load_calibration(path), 4.0)
    path.write_text(json.dumps({"dilation": -1}))
    with pytest.raises(ConfigError, match="dilation must be a positive number"):
        load_calibration(path)


def test_auto_takes_the_dilation_a_calibration_was_fitted_at_and_says_what_it_would_have_taken(tmp_path):
    from emulator.jobs.dilation import Choice
    from emulator.run import calibrated_choice, check_calibration_dilation
    from spiderflow.costmodel import NO_CALIBRATION, load_calibration

    sized = Choice(dilation=2.0, reason="s7's distortion 2.1% at K = 2")
    assert calibrated_choice(NO_CALIBRATION, sized) is sized
    path = tmp_path / "calibration-one.json"
    path.write_text(json.dumps({"paths": {}, "scale": 10, "dilation": 1}))
    cal = load_calibration(path)
    choice = calibrated_choice(cal, sized)
    assert choice.dilation == 1.0
    assert choice.reason == (f"{path} was fitted at dilation 1 (auto would take 2: s7's distortion 2.1% at K = 2; "
                             "calibrate with --dilation 2 for that)")
    check_calibration_dilation(cal, choice.dilation)  # what resolve_network checks next: it passes
    path.write_text(json.dumps({"paths": {}, "dilation": 2}))
    assert calibrated_choice(load_calibration(path), sized) is sized
    path.write_text(json.dumps({"paths": {}}))  # no dilation recorded: auto's own choice
    assert calibrated_choice(load_calibration(path), sized) is sized
