"""Rank mapping and byte counts of `emulator run` (pure, no root), and its CLI without root."""

import pytest

from emulator import console as cli
from emulator.jobs.compute import ProxyShape, proxy_forward_flops
from emulator.jobs.launch import emulated_topology, emulated_view, predict_emulated, rank_specs, ranks_per_cluster
from emulator.net.layout import NetConfig
from emulator.jobs.replay import RunConfig
from spiderflow.costmodel import plan_work, predict
from spiderflow.costmodel.schedule import simulate_1f1b
from spiderflow.costmodel.stages import stage_compute_s, stage_params, sync_s
from spiderflow.costmodel.work import price
from spiderflow.plan import Plan, Stage
from spiderflow.workload import Job
from spiderflow.topology import parse_topology

from .conftest import free_port

TOPO = parse_topology({
    "name": "two",
    "clusters": [{"name": "east", "gpu": "a100-80gb", "nodes": 1, "gpus_per_node": 8},
                 {"name": "west", "gpu": "a100-80gb", "nodes": 1, "gpus_per_node": 8}],
    "links": [{"a": "east", "b": "west", "bandwidth_gbps": 1.0, "latency_ms": 10.0}],
}, source="<test>")
JOB = Job(job_id="j", arrival_s=0.0, model="gpt3-125m", gpus=16, iterations=10, global_batch=32, seq_len=1024)


def plan_two_replicas() -> Plan:
    """2 replicas (one per cluster) x 2 stages, dp 2 inside each stage."""
    reps = tuple((Stage(cluster=c, layer_start=0, layer_end=6), Stage(cluster=c, layer_start=6, layer_end=12))
                 for c in ("east", "west"))
    return Plan(job=JOB, replicas=reps, dp=2, micro_batch_size=1, micro_batches=8)


def plan_across() -> Plan:
    rep = (Stage(cluster="east", layer_start=0, layer_end=6, tp=2), Stage(cluster="west", layer_start=6, layer_end=12))
    return Plan(job=JOB, replicas=(rep,), dp=4, micro_batch_size=1, micro_batches=8)


def specs(plan, scale=10.0, dilation=1.0, **kw):
    view = emulated_view(TOPO, NetConfig(scale=scale, dilation=dilation))
    return view, rank_specs(plan_work(plan, view), master_addr="10.1.0.10", master_port=29500, scale=scale,
                            dilation=dilation, iterations=6, out_dir="/tmp/x", **kw)


def test_one_rank_per_replica_stage():
    plan = plan_two_replicas()
    view = emulated_view(TOPO, NetConfig())
    work = plan_work(plan, view)
    assert [(w.rank, w.replica, w.stage, w.cluster) for w in work.ranks] == [
        (0, 0, 0, "east"), (1, 0, 1, "east"), (2, 1, 0, "west"), (3, 1, 1, "west")]
    assert ranks_per_cluster(plan, view) == {"east": 2, "west": 2} == work.ranks_per_cluster()


def test_wan_boundary_carries_dp_groups_intra_boundary_one_group():
    group = JOB.spec.boundary_bytes(1, 1024)  # one dp group's boundary tensor
    _, across = specs(plan_across())
    assert across[0].activation_bytes == round(4 * group / 10) == across[1].prev_activation_bytes
    _, local = specs(plan_two_replicas())
    assert local[0].activation_bytes == round(group / 10) == local[1].prev_activation_bytes
    assert local[0].prev_rank is None and local[0].next_rank == 1 and local[1].next_rank is None


def test_sync_is_real_across_clusters_and_slept_inside():
    plan = plan_two_replicas()
    view, ss = specs(plan)
    assert ss[0].sync_groups == [[[0], [2]], [[1], [3]]]  # stage 0: east rank 0, west rank 2
    for s in ss:
        stage = plan.replicas[0][s.stage]
        assert s.grad_bytes == round(stage_params(plan, stage) * 2 / 10)
        assert s.sync_intra_s == pytest.approx(sync_s(plan, s.stage, view)[0])
        assert (s.forward_s, s.backward_s) == stage_compute_s(plan, stage, view.topology, view.calibration)
    _, across = specs(plan_across())
    assert across[0].sync_groups == [[], []]  # one replica: nothing crosses the WAN


@pytest.mark.parametrize("scale,dilation", [(1.0, 1.0), (10.0, 1.0), (10.0, 4.0), (25.0, 8.0)])
@pytest.mark.parametrize("make", [plan_two_replicas, plan_across])
def test_rank_specs_carry_the_cost_models_work_items_unchanged(make, scale, dilation):
    """The one contract: bytes / scale, times x dilation, layout and groups as the cost model has them."""
    plan = make()
    view, ss = specs(plan, scale, dilation, timeout_s=30.0)
    work = plan_work(plan, view)
    assert len(ss) == work.world_size == len(work.ranks)
    for w, s in zip(work.ranks, ss):
        assert (s.rank, s.replica, s.stage, s.world_size, s.depth) == (w.rank, w.replica, w.stage, work.world_size,
                                                                        work.depth)
        assert (s.prev_rank, s.next_rank) == (w.prev_rank, w.next_rank)
        assert (s.micro_batches, s.recompute) == (work.micro_batches, work.recompute)
        assert s.forward_s == pytest.approx(w.forward_s * dilation)
        assert s.backward_s == pytest.approx(w.backward_s * dilation)
        assert s.sync_intra_s == pytest.approx(w.sync_intra_s * dilation)
        assert s.timeout_s == pytest.approx(30.0 * dilation)
        assert s.grad_bytes == max(4, round(w.grad_bytes / scale))
        if w.next_rank is not None:
            assert s.activation_bytes == max(4, round(w.next_bytes / scale))
        if w.prev_rank is not None:
            assert s.prev_activation_bytes == max(4, round(w.prev_bytes / scale))
        assert s.sync_groups == [[list(g) for g in stage] for stage in work.sync_groups]


def test_predict_prices_exactly_the_work_items():
    """predict's timeline is the 1F1B schedule of the priced work items of its slowest replica."""
    plan = plan_across()
    view = emulated_view(TOPO, NetConfig())
    work = plan_work(plan, view)
    costs = price(list(work.ranks), view)
    assert predict(plan, view, check_memory=False).timeline == simulate_1f1b(costs, plan.micro_batches)
    w0 = work.ranks[0]
    chan = view.p2p("east", "west")
    assert costs[0].send_forward_s == pytest.approx(chan.alpha_s + w0.next_bytes / chan.bytes_per_s)
    assert costs[0].forward_s == w0.forward_s


def test_emulated_view_caps_intra_bandwidth_at_the_wire_cap():
    topo = emulated_topology(TOPO, NetConfig(scale=10.0, intra_cap_mbps=1000.0))
    assert all(c.intra_cluster_bandwidth_gbps == 10.0 for c in topo.clusters)  # 1000 Mbit/s x 10
    assert topo.links == TOPO.links
    plan = plan_two_replicas()
    assert predict_emulated(plan, emulated_view(TOPO, NetConfig(scale=10.0))) > \
        predict_emulated(plan, emulated_view(TOPO, NetConfig(scale=10.0, intra_cap_mbps=100000.0)))


def test_run_without_root_says_so_in_one_line(monkeypatch, capsys):
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    assert cli.main(["run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "sudo" in err[0]


def test_compute_real_is_accepted_and_still_needs_root(monkeypatch, capsys):
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    assert cli.main(["run", "--compute", "real"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "sudo" in err[0]


def test_real_compute_specs_carry_proxies_of_the_stages_forward_flops():
    rate = 1e11  # FLOP/s of one core, as the runner's probe would measure it
    plan = plan_across()  # stage 0: tp 2 (NVLink time in forward_s), stage 1: the head too
    view = emulated_view(TOPO, NetConfig(scale=10.0))
    real = rank_specs(plan_work(plan, view), master_addr="10.1.0.10", master_port=29500, scale=10.0,
                      iterations=6, out_dir="/tmp/x", compute="real", cpu_flops_per_s=rate)
    for s in real:
        stage = plan.replicas[0][s.stage]
        assert s.compute == "real" and s.proxy["layers"] == stage.layers == 6
        assert (s.proxy["micro_batch"], s.proxy["seq_len"]) == (1, 128)
        assert proxy_forward_flops(ProxyShape(**s.proxy)) == pytest.approx(s.forward_s * rate, rel=0.03)
    assert real[1].proxy["hidden"] > real[0].proxy["hidden"]  # the head's FLOPs are in the target
    _, emulated = specs(plan)
    assert all(s.compute == "emulated" and s.proxy is None for s in emulated)
    assert [(s.forward_s, s.activation_bytes) for s in emulated] == [(s.forward_s, s.activation_bytes) for s in real]


def test_real_compute_needs_a_cpu_rate_and_a_known_mode():
    work = plan_work(plan_across(), emulated_view(TOPO, NetConfig(scale=10.0)))
    kw = dict(master_addr="a", master_port=1, scale=10.0, iterations=6, out_dir="/tmp/x")
    with pytest.raises(ValueError, match="cpu_flops_per_s"):
        rank_specs(work, compute="real", **kw)
    with pytest.raises(ValueError, match="'gpu'"):
        rank_specs(work, compute="gpu", cpu_flops_per_s=1e9, **kw)
    with pytest.raises(ValueError, match="compute.*'gpu'"):
        RunConfig(compute="gpu")
    assert RunConfig(compute="real").compute == "real"


def test_specs_of_a_three_stage_plan_run_over_loopback(tmp_path):
    """Rank 1 receives one group's bytes from rank 0 (same cluster) and sends dp x that to rank 2 (WAN):
    sizes must agree pairwise, every receive posted ahead, the slept intra sync logged in S."""
    import dataclasses
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    rep = (Stage(cluster="east", layer_start=0, layer_end=4), Stage(cluster="east", layer_start=4, layer_end=8),
           Stage(cluster="west", layer_start=8, layer_end=12))
    plan = Plan(job=Job(**{**JOB.__dict__, "job_id": "t"}), replicas=(rep,), dp=2, micro_batch_size=1,
                micro_batches=4)
    port = free_port()
    view = emulated_view(TOPO, NetConfig(scale=100.0))
    ss = rank_specs(plan_work(plan, view), master_addr="127.0.0.1", master_port=port, scale=100.0,
                    iterations=3, out_dir=str(tmp_path), timeout_s=60)
    assert abs(ss[1].prev_activation_bytes * 2 - ss[1].activation_bytes) <= 1
    assert ss[1].activation_bytes == ss[2].prev_activation_bytes
    assert ss[0].activation_bytes == ss[1].prev_activation_bytes
    assert all(spec.sync_intra_s > 0 for spec in ss)
    # 0.2-0.5 ms here, less than a wake-up's lateness on a busy machine: slept 20 ms instead, to see it in S
    ss = [dataclasses.replace(spec, sync_intra_s=0.02) for spec in ss]
    paths = []
    for spec in ss:
        paths.append(tmp_path / f"r{spec.rank}.json")
        spec.dump(paths[-1])
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    repo = Path(__file__).resolve().parents[2]
    procs = [subprocess.Popen([sys.executable, "-m", "emulator.jobs.worker", str(p)], cwd=repo, env=env) for p in paths]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0]
    for spec in ss:
        lines = [json.loads(l) for l in (tmp_path / f"t-r{spec.rank}.jsonl").read_text().splitlines()]
        assert lines[0]["event"] == "start" and "mono" in lines[0] and lines[-1]["event"] == "done"
        ops = [l for l in lines if l["event"] == "op"]
        syncs = [(before, op) for before, op in zip(ops, ops[1:]) if op["kind"] == "S"]
        # the intra sync is slept on the GPU stream's clock, from the end of the iteration's last compute op
        # (the rank's own work between them, posting the next iteration's receives, runs meanwhile)
        assert len(syncs) == 3 and all(op["end"] - before["end"] >= spec.sync_intra_s * 0.9 for before, op in syncs)


def test_the_runner_probes_the_cpu_once_in_real_mode_only(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from emulator.jobs import replay as runner_mod

    calls = []
    monkeypatch.setattr(runner_mod, "cpu_flops_per_s", lambda: calls.append(1) or 1.5e11)
    emu = SimpleNamespace(hosts={})  # no hosts: nothing is launched, warm_tcp off
    real = runner_mod.Runner(TOPO, [], RunConfig(compute="real", warm_tcp=False), emu, out_dir=tmp_path / "a")
    assert real.cpu_flops_per_s == 1.5e11 and calls == [1]
    emulated = runner_mod.Runner(TOPO, [], RunConfig(warm_tcp=False), emu, out_dir=tmp_path / "b")
    assert emulated.cpu_flops_per_s is None and calls == [1]
