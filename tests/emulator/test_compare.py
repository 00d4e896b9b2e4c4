"""`emulator compare`'s simulated replay (no root): the simulator replays what the emulator replays."""

import dataclasses

import pytest

from emulator.compare import headline, ranking, replay_jobs, simulated_iteration_s, simulated_replay
from emulator.jobs.launch import emulated_view, predict_emulated
from emulator.jobs.replay import RunConfig
from emulator.jobs.startup import FIXED_WALL_S, startup_s
from emulator.net.layout import NetConfig
from spiderflow.placement import PlacementRequest, run_planner
from spiderflow.shipped import find
from spiderflow.topology import load_topology
from spiderflow.traces import load_trace

TOPO = load_topology(find("default", "topology"))
JOBS = load_trace(find("default", "trace")).jobs
FREE = {c.name: c.total_gpus for c in TOPO.clusters}


def _cfg(**kw):
    net = NetConfig(hosts_per_cluster=kw.pop("hosts", 4), dilation=kw.pop("dilation", 2.0))
    return RunConfig(planner="spinsearch", iterations=6, time_scale=10.0, net=net, **kw)


def test_the_simulation_replays_the_emulators_arrivals_iterations_and_network():
    cfg = _cfg()
    jobs = replay_jobs(JOBS, cfg.iterations)
    recs = simulated_replay(TOPO, jobs, cfg, startup=0.0)
    assert [r.arrival_s for r in recs] == [j.arrival_s / 10.0 for j in JOBS]
    assert all(r.job.iterations == 6 for r in recs) and all(r.completed for r in recs)
    first = recs[0]  # alone on the network while it runs its 6 iterations (the next arrives later)
    alone = predict_emulated(first.plan, emulated_view(TOPO, cfg.net))
    assert first.alone_iteration_s == pytest.approx(alone)  # priced as the emulator predicts it
    assert first.end_s - first.start_s == pytest.approx(6 * alone)
    assert first.start_s == pytest.approx(first.arrival_s + first.overhead_s / cfg.net.dilation)


def test_the_startup_model_moves_each_end_by_its_plans_startup():
    cfg = _cfg()
    jobs = replay_jobs(JOBS, cfg.iterations)
    plain = simulated_replay(TOPO, jobs[:1], cfg, startup=0.0)[0]
    modelled = simulated_replay(TOPO, jobs[:1], cfg)[0]
    extra = startup_s(modelled.plan, TOPO, cfg.net.dilation)
    assert extra >= FIXED_WALL_S / cfg.net.dilation
    assert modelled.end_s - modelled.start_s == pytest.approx(plain.end_s - plain.start_s + extra)


def test_startup_grows_with_ranks_and_round_trips():
    """A one-cluster plan pays the fixed cost only; a plan across the WAN pays round trips too,
    more the farther apart its clusters."""
    local = run_planner("spinsearch", PlacementRequest(job=JOBS[0], topology=TOPO, free_gpus=FREE)).placement.plan
    assert len(local.placement) == 1
    assert startup_s(local, TOPO, 4.0) == pytest.approx(FIXED_WALL_S / 4.0)
    big = dataclasses.replace(JOBS[0], gpus=24)  # no cluster has 24 GPUs
    wide = run_planner("spinsearch", PlacementRequest(job=big, topology=TOPO, free_gpus=FREE)).placement.plan
    assert len(wide.placement) > 1
    rtt = max(2 * TOPO.path(a, b).latency_ms / 1000 for a in wide.placement for b in wide.placement)
    assert startup_s(wide, TOPO, 4.0) > 10 * rtt  # tens of round trips: rendezvous and slow start


def test_hosts_per_cluster_bind_the_simulation_as_they_bind_the_emulator():
    cfg = _cfg(hosts=1)
    recs = simulated_replay(TOPO, replay_jobs(JOBS, 6), cfg, startup=0.0)
    rejected = [r for r in recs if r.status == "rejected"]
    assert all("--hosts-per-cluster" in r.reason for r in rejected)
    assert all(max(r.hosts.values()) <= 1 for r in recs if r.completed)


def test_headline_ratios_point_one_way_and_ranking_is_by_avg_jct():
    def side(jct, thr):
        return {"completed": 2, "jobs": 2, "avg_jct_s": jct, "p95_jct_s": jct, "throughput_tokens_per_s": thr,
                "gpu_utilization": 0.5, "avg_overhead_s": 0.01}
    results = {"spinsearch": {"measured": side(10.0, 100.0), "simulated": side(9.0, 110.0), "error_pct": {
                   "avg_jct_s": -10.0, "throughput_tokens_per_s": 10.0}},
               "blind": {"measured": side(20.0, 50.0), "simulated": side(18.0, 55.0), "error_pct": {
                   "avg_jct_s": -10.0, "throughput_tokens_per_s": 10.0}}}
    row = next(l for l in headline(results).splitlines() if l.startswith("| blind"))
    assert "| 2.00x | 2.00x | 2.00x | 2.00x |" in row  # JCT and throughput: > 1, SpinSearch better
    assert ranking(results, "measured") == ranking(results, "simulated") == ["spinsearch", "blind"]


def test_events_are_compressed_like_arrivals_in_the_simulated_replay():
    from emulator.compare import compressed_events
    from spiderflow.wan import CapacityEvent, WanEvent

    wan = (WanEvent(time_s=100.0, a="oregon", b="virginia", bandwidth_gbps=0.1, latency_ms=None, up=True),)
    cap = (CapacityEvent(time_s=200.0, cluster="tokyo", gpus=8, notice_s=50.0, return_s=400.0),)
    w, c = compressed_events(wan, cap, 10.0)
    assert w[0].time_s == 10.0 and (c[0].time_s, c[0].notice_s, c[0].return_s) == (20.0, 5.0, 40.0)
    cfg = _cfg(replan=False)  # the job stays on the thinned link (SpinSearch would move it)
    job = dataclasses.replace(JOBS[0], job_id="wide", gpus=24, arrival_s=0.0)  # 24 > any cluster: a WAN job
    plain, = simulated_replay(TOPO, [job], cfg, startup=0.0)
    links = {tuple(sorted(k)) for route in plain.routes for k in route}
    first = sorted(links)[0]
    thin = (WanEvent(time_s=0.5 * 10.0 * plain.end_s, a=first[0], b=first[1], bandwidth_gbps=0.05,
                     latency_ms=None, up=True),)  # mid-run on the replay's clock
    slowed, = simulated_replay(TOPO, [job], cfg, startup=0.0, wan_events=thin)
    assert slowed.end_s - slowed.start_s > 1.2 * (plain.end_s - plain.start_s)  # the event reached the simulation
    # its figure is the iterations before the change, as the emulator measures a job a change reached
    assert slowed.first_changed_s == pytest.approx(thin[0].time_s / 10.0)
    assert len(slowed.iteration_times()) < job.iterations
    assert simulated_iteration_s(slowed, cfg.warmup) == pytest.approx(simulated_iteration_s(plain, cfg.warmup))
    late, = simulated_replay(TOPO, [job], cfg, startup=0.0, wan_events=(dataclasses.replace(
        thin[0], time_s=10.0 * plain.end_s * 1.01),))
    # due after the job ended: no effect (its run, that is: its start moves by the planner's charged wall time)
    assert late.end_s - late.start_s == pytest.approx(plain.end_s - plain.start_s)


def test_replays_the_host_stole_from_are_named():
    from emulator.compare import stolen_note
    from emulator.run import format_table

    assert stolen_note({"spinsearch": {"host_steal_pct": 0.4}, "ilp": {"host_steal_pct": 1.9}}) == ""
    note = stolen_note({"spinsearch": {"host_steal_pct": 0.4}, "ilp": {"host_steal_pct": 7.6}})
    assert "(ilp 8%; /proc/stat steal)" in note and "spinsearch" not in note
    quiet = format_table([], NetConfig(), "nfqueue", "out")
    busy = format_table([], NetConfig(), "nfqueue", "out", host_steal_pct=5.2)
    assert "stole" not in quiet and "stole 5% of this machine's CPU during the run" in busy
    assert busy.splitlines()[-1] == "output: out"


def test_the_run_table_names_the_jobs_measured_while_the_host_stole():
    from emulator.jobs.replay import JobRun
    from emulator.run import format_table
    from spiderflow.workload import Job

    def run(job_id, stolen):
        job = Job(job_id=job_id, arrival_s=0.0, model="gpt3-125m", gpus=2, iterations=4, global_batch=2,
                  seq_len=1024)
        return JobRun(job=job, arrival_s=0.0, status="ok", host_steal_pct=stolen)

    text = format_table([run("a", 7.4), run("b", 0.3), run("c", None)], NetConfig(), "nfqueue", "out")
    assert "measured while the host stole a noticeable share of the CPU: a 7%\n" in text


def test_the_run_table_shows_a_moved_job_where_its_measured_iterations_ran():
    """A job placed again (stopped or moved by a change): its row is its first placement and ranks, which
    its prediction and measured iterations describe; the line after the change names the new one."""
    from emulator.jobs.replay import JobRun
    from emulator.run import format_table
    from spiderflow.workload import Job

    job = Job(job_id="wan", arrival_s=0.0, model="gpt3-125m", gpus=16, iterations=20, global_batch=32,
              seq_len=1024)
    moved = JobRun(job=job, arrival_s=0.0, status="ok", segments=(("north", 16),), placement={"north": 16},
                   first_segments=(("east", 8), ("west", 8)), first_ranks=2, attempt=1, predicted_s=0.547,
                   iteration_s=[0.55, 0.552], changed_t=5.11, predicted_after_s=0.0257,
                   iteration_after_s=[0.026, 0.026])
    lines = format_table([moved], NetConfig(), "nfqueue", "out").splitlines()
    row = next(line for line in lines if line.startswith("wan "))
    assert row.split()[1:5] == ["east:8", "west:8", "2", "0.547"]
    assert "  wan            at 5.11 s on north:16: predicted 0.026 measured 0.026 over 2 iteration(s), " \
           "error -1.2%" in lines
    assert moved.as_json()["after_change"]["placement"] == {"north": 16}


def _floors(jobs, cfg, startup):
    from emulator.compare import compressed_jobs, startup_of
    from emulator.floors import replay_floors

    return replay_floors(TOPO, compressed_jobs(jobs, cfg.time_scale), cfg, startup_of(startup, TOPO, cfg.net))


def test_a_job_alone_ends_at_its_floor_but_for_the_planners_charged_time():
    """The floor prices SpinSearch's plan alone as the simulated replay does: the emulated network (not the
    topology's figures), the exact schedule and the start-up model, on the replay's clock."""
    from spiderflow.simulate.floors import trace_floors
    from spiderflow.traces.planned import PlannedGpuTime

    cfg = _cfg(hosts=8)
    job = dataclasses.replace(JOBS[0], job_id="wide", gpus=24, arrival_s=30.0)  # across the WAN
    floors = _floors(replay_jobs([job], cfg.iterations), cfg, "model")
    rec, = simulated_replay(TOPO, replay_jobs([job], cfg.iterations), cfg)
    assert rec.completed and floors["jobs"] == 1 and floors["exclusive_jobs"] == 0
    assert floors["jct_floor_s"] == pytest.approx(rec.jct_s - rec.overhead_s / cfg.net.dilation, rel=1e-9)
    assert floors["makespan_floor_s"] == pytest.approx(floors["jct_floor_s"], rel=1e-12)
    assert startup_s(rec.plan, TOPO, cfg.net.dilation) > 0.05 * floors["jct_floor_s"]
    # --startup in seconds: every job's floor moves by exactly that
    assert _floors(replay_jobs([job], cfg.iterations), cfg, 2.5)["jct_floor_s"] == pytest.approx(
        _floors(replay_jobs([job], cfg.iterations), cfg, 0.0)["jct_floor_s"] + 2.5, rel=1e-12)
    # the topology's own figures, with no start-up, would be another floor: the test tells them apart
    plain = trace_floors(replay_jobs([job], cfg.iterations), PlannedGpuTime(TOPO))
    assert abs(plain["jct_floor_s"] - floors["jct_floor_s"]) > 0.05 * floors["jct_floor_s"]


def test_no_planner_beats_the_floors_in_the_simulated_replay():
    cfg = _cfg(hosts=8)
    jobs = replay_jobs(JOBS, cfg.iterations)
    floors = _floors(jobs, cfg, "model")
    assert floors["jobs"] == len(JOBS)
    from spiderflow.simulate.metrics import summarise

    for planner in ("spinsearch", "blind"):
        s = summarise(simulated_replay(TOPO, jobs, dataclasses.replace(cfg, planner=planner)), TOPO.total_gpus)
        assert s["completed"] == len(JOBS)
        assert s["avg_jct_s"] >= floors["jct_floor_s"], planner
        assert s["throughput_tokens_per_s"] <= floors["throughput_ceiling_tokens_per_s"], planner


def test_the_floor_columns_are_each_sides_ratio_and_the_note_says_what_they_price():
    from emulator.compare import floors_about

    def side(jct, thr):
        return {"completed": 1, "jobs": 1, "avg_jct_s": jct, "p95_jct_s": jct, "throughput_tokens_per_s": thr,
                "gpu_utilization": 0.5, "avg_overhead_s": 0.01}
    results = {"spinsearch": {"measured": side(12.0, 50.0), "simulated": side(15.0, 40.0),
                              "error_pct": {"avg_jct_s": 25.0, "throughput_tokens_per_s": -20.0}}}
    floors = {"jct_floor_s": 10.0, "jct_no_foresight_s": 10.0, "throughput_ceiling_tokens_per_s": 100.0,
              "jobs": 1}
    lines = headline(results, floors=floors).splitlines()
    assert lines[0].endswith("| avg JCT / floor: measured | simulated | ceiling / throughput: measured | simulated |")
    assert lines[2].endswith("| 1.20x | 1.50x | 2.00x | 2.50x |")
    assert len(lines[1].split("|")) == len(lines[0].split("|")) == len(lines[2].split("|"))
    assert "|" not in headline(results).splitlines()[0].split("simulated |")[-1]  # no floors: no columns
    about = floors_about(floors, 1)
    assert "the emulated network, the exact schedule, the ranks' start-up allowance" in about
    assert "(emulator/floors.py)" in about and "may fall under the floor" in about
    assert "WAN and capacity events" not in about
    assert "events only slow links" in floors_about(floors, 1, events=True)
    assert floors_about(floors, 1, "a-b at 3 s has 9 Gbit/s, over the topology's 1").startswith(
        "No floors: a WAN event makes a link faster than the topology's figures")
    assert floors_about(None, 1) == "No floors: no job has a plan on the empty topology."
