"""The shared scheduler (spiderflow.scheduling): hosts per cluster, fixed plans, and the simulator's
replay of an emulator run (start-up allowance, overhead on the replay's clock, priced network)."""

import dataclasses

import pytest

from spiderflow.costmodel import TopologyView, estimate
from spiderflow.plan import Plan, Stage
from spiderflow.scheduling import END_SLACK, JobRecord, Scheduler, SchedulerConfig, _Moment, fixed_plan, ranks_needed
from spiderflow.simulate.engine import SimConfig, simulate
from spiderflow.topology import parse_topology
from spiderflow.workload import Job
from tests.simulate.test_sim_engine import job, two_sites


def _records(jobs):
    return [JobRecord(job=j, arrival_s=j.arrival_s) for j in jobs]


def test_a_job_waits_for_hosts_and_starts_when_they_return():
    """One host per cluster: a two-stage pipeline over a and b takes both hosts, so a small job
    waits for a host although GPUs are free, and starts once the pipeline is released."""
    topo = two_sites()
    pipe = _pipeline(topo, stages=("a", "b"))
    sched = Scheduler(topo, SchedulerConfig(planner="blind"), hosts_per_cluster={"a": 1, "b": 1})
    sched._strategy = fixed_plan(pipe)  # the first decision: the pipeline
    (r0,) = _records([pipe.job])
    assert sched.schedule([r0]) == [r0] and r0.hosts == {"a": 1, "b": 1} == ranks_needed(pipe)
    assert sched.free_hosts == {"a": 0, "b": 0} and sum(sched.free.values()) == 14
    sched._strategy = fixed_plan(_pipeline(topo, stages=("a",), job_id="small"))
    (r1,) = _records([_pipeline(topo, stages=("a",), job_id="small").job])
    assert sched.schedule([r1]) == [] and r1.status == "queued" and r1.overhead_s > 0  # planned, then waited
    sched.release(r0)
    assert sched.free_hosts == {"a": 1, "b": 1} and sched.free == {"a": 8, "b": 8}
    assert sched.schedule([r1]) == [r1] and r1.status == "running"


def test_more_ranks_than_hosts_is_rejected_with_the_fix():
    topo = two_sites()
    plan = _pipeline(topo)  # two stages in a, one in b
    sched = Scheduler(topo, SchedulerConfig(planner=fixed_plan(plan)), hosts_per_cluster={"a": 1, "b": 1})
    (rec,) = _records([plan.job])
    assert sched.schedule([rec]) == [rec]
    assert rec.status == "rejected" and "needs 2 ranks in a" in rec.reason and "--hosts-per-cluster" in rec.reason


def _pipeline(topo, stages=("a", "a", "b"), job_id="p"):
    """A one-replica pipeline, one GPU per stage, over ``stages`` (clusters)."""
    j = Job(job_id=job_id, arrival_s=0.0, model="gpt3-350m", gpus=len(stages), iterations=4, global_batch=8,
            seq_len=1024)
    bounds = [round(24 * i / len(stages)) for i in range(len(stages) + 1)]
    reps = (tuple(Stage(cluster=c, layer_start=bounds[i], layer_end=bounds[i + 1], tp=1) for i, c in enumerate(stages)),)
    return Plan(job=j, replicas=reps, dp=1, micro_batch_size=1, micro_batches=8)


def test_fixed_plan_is_a_planner_and_waits_for_its_gpus():
    topo = two_sites()
    plan = _pipeline(topo)
    cfg = SchedulerConfig(planner=fixed_plan(plan, "pipe"))
    assert cfg.planner_name == "pipe"
    sched = Scheduler(topo, cfg)
    (rec,) = _records([plan.job])
    sched.free["a"] = 1  # as if another job held 7 of a's GPUs: the plan needs two there
    sched.running.append(JobRecord(job=job(9, 7), arrival_s=0.0, status="running"))
    assert sched.schedule([rec]) == [] and rec.status == "queued"  # not rejected: the topology is not empty
    sched.running.clear()
    sched.free["a"] = 8
    assert sched.schedule([rec]) == [rec] and rec.placement == {"a": 2, "b": 1}


def test_fifo_head_blocks_and_backfill_passes_it():
    topo = two_sites()
    for backfill, started in ((False, ["j0"]), (True, ["j0", "j2"])):
        sched = Scheduler(topo, SchedulerConfig(planner="blind", backfill=backfill))
        recs = _records([job(0, 12), job(1, 16), job(2, 4)])
        assert [r.job.job_id for r in sched.schedule(recs)] == started


def test_startup_allowance_and_charged_overhead_move_the_end_exactly():
    topo = two_sites()
    jobs = [job(0, 16, iterations=5)]
    (plain,) = simulate(topo, jobs, SimConfig(planner="blind"))
    (late,) = simulate(topo, jobs, SimConfig(planner="blind", startup_s=2.5))
    assert late.start_s == plain.start_s and late.end_s == pytest.approx(plain.end_s + 2.5)
    (charged,) = simulate(topo, jobs, SimConfig(planner="blind", charge_overhead=True, overhead_scale=0.25))
    assert charged.start_s == pytest.approx(charged.overhead_s * 0.25)
    assert charged.end_s == pytest.approx(charged.start_s + plain.end_s - plain.start_s)


def test_priced_topology_prices_iterations_while_planning_stays_on_the_topology():
    """A simulation of an emulator replay prices the plan on the network as the emulator shapes it,
    not on the topology the planner saw: here the priced network's WAN link is 10x thinner."""
    topo = two_sites()
    thin = dataclasses.replace(topo, links=tuple(dataclasses.replace(l, bandwidth_gbps=0.1) for l in topo.links))
    jobs = [job(0, 16, iterations=3)]
    (base,) = simulate(topo, jobs, SimConfig(planner="blind"))
    (priced,) = simulate(topo, jobs, SimConfig(planner="blind", priced_topology=thin))
    assert priced.placement == base.placement == {"a": 8, "b": 8}
    assert priced.alone_iteration_s == pytest.approx(estimate(priced.plan, TopologyView(topology=thin)), rel=0.02)
    assert priced.alone_iteration_s > 1.5 * base.alone_iteration_s
    assert priced.jct_s == pytest.approx(3 * priced.alone_iteration_s)


def test_unknown_planner_name_is_refused():
    with pytest.raises(ValueError, match="unknown planner 'nope'"):
        SchedulerConfig(planner="nope")


def test_three_clusters_route_load_is_counted_per_flow():
    topo = parse_topology({"name": "line", "clusters": [
        {"name": n, "gpu": "a100-80gb", "nodes": 1, "gpus_per_node": 8} for n in "abc"],
        "links": [{"a": "a", "b": "b", "bandwidth_gbps": 1.0, "latency_ms": 10.0},
                  {"a": "b", "b": "c", "bandwidth_gbps": 1.0, "latency_ms": 10.0}]})
    sched = Scheduler(topo, SchedulerConfig(planner="blind"))
    (rec,) = _records([job(0, 12)])
    sched.schedule([rec])
    load = sched.link_load()
    assert load and all(v == sum(key in route for route in rec.routes) for key, v in load.items())
    sched.release(rec)
    assert sched.link_load() == {}


def test_charged_decisions_are_made_one_after_another():
    """One scheduler: two jobs arriving together are planned in turn, so the second starts after
    both decisions, not after its own alone."""
    topo = two_sites()
    first, second = simulate(topo, [job(0, 4, iterations=2), job(1, 4, iterations=2)],
                             SimConfig(planner="genetic", charge_overhead=True, search_budget=200))
    assert first.start_s == pytest.approx(first.overhead_s)
    assert second.start_s == pytest.approx(first.overhead_s + second.overhead_s)
    assert second.overhead_s > 0


def fast_and_slow():
    """a: 8 fast GPUs (h100), b: 8 slow ones (v100), one thin link: a job that must start now goes
    to b or spans the link; waiting for a's GPUs can finish it sooner."""
    return parse_topology({"name": "fs", "clusters": [
        {"name": "a", "gpu": "h100", "nodes": 1, "gpus_per_node": 8},
        {"name": "b", "gpu": "v100", "nodes": 1, "gpus_per_node": 8}],
        "links": [{"a": "a", "b": "b", "bandwidth_gbps": 0.1, "latency_ms": 30.0}]})


def fast_slow_slow():
    """fast_and_slow with a second slow cluster c behind b: a - b - c, thin links."""
    return parse_topology({"name": "fss", "clusters": [
        {"name": "a", "gpu": "h100", "nodes": 1, "gpus_per_node": 8},
        {"name": "b", "gpu": "v100", "nodes": 1, "gpus_per_node": 8},
        {"name": "c", "gpu": "v100", "nodes": 1, "gpus_per_node": 8}],
        "links": [{"a": "a", "b": "b", "bandwidth_gbps": 0.1, "latency_ms": 30.0},
                  {"a": "b", "b": "c", "bandwidth_gbps": 0.1, "latency_ms": 30.0}]})


def test_spinsearch_waits_for_fast_gpus_and_lets_others_pass():
    topo = fast_and_slow()
    short = job(0, 4, iterations=3)  # takes half of a briefly
    long = job(1, 8, arrival=0.5, iterations=400)
    small = job(2, 4, arrival=1.0, iterations=3)  # fits on b beside the waiting job's reservation
    wait = simulate(topo, [short, long, small], SimConfig(planner="spinsearch"))
    now = simulate(topo, [short, long, small], SimConfig(planner="spinsearch", wait=False))
    assert wait[0].placement == {"a": 4}
    assert now[1].start_s == pytest.approx(0.5) and now[1].placement != {"a": 8}
    assert wait[1].admission.startswith("started now on a:8")  # its last decision, once a freed up
    assert wait[1].start_s == pytest.approx(wait[0].end_s) and wait[1].placement == {"a": 8}
    assert wait[1].jct_s < now[1].jct_s  # waiting finished it sooner
    assert wait[2].start_s == pytest.approx(1.0) and wait[2].placement == {"b": 4}  # not blocked (FIFO)
    blind = simulate(topo, [short, long, small], SimConfig(planner="blind"))
    assert blind[1].start_s == pytest.approx(0.5) and blind[1].admission == ""  # baselines start now


def test_a_job_decided_after_another_started_in_the_same_pass_can_wait_for_it():
    """x and y (long) wait for first's end on the fast cluster a; in the pass at that end x takes
    a, and y, decided next, must see x's expected end (set as x starts, as the emulator sets it at
    launch) and wait for it rather than start at once on slow b. Before, a job started in a pass
    had no expected end until the pass was over: y started on b (the simulated twin of paper8-16's
    emulated replay did that to w4, 13.6 s against the emulator's 8.7 s)."""
    topo = fast_and_slow()
    first, x, y = job(0, 8, iterations=3), job(1, 8, arrival=0.1, iterations=3), job(2, 8, arrival=0.2, iterations=400)
    recs = simulate(topo, [first, x, y], SimConfig(planner="spinsearch"))
    assert [r.placement for r in recs] == [{"a": 8}, {"a": 8}, {"a": 8}], [r.admission for r in recs]
    assert recs[1].start_s == pytest.approx(recs[0].end_s) and recs[2].start_s == pytest.approx(recs[1].end_s)


def test_a_job_that_would_take_reserved_gpus_waits_too():
    topo = fast_and_slow()
    sched = Scheduler(topo, SchedulerConfig(planner="spinsearch"))
    short, long, greedy = _records([job(0, 4, iterations=3), job(1, 8, iterations=400), job(2, 4, iterations=400)])
    sched.schedule([short], now=0.0)
    assert short.placement == {"a": 4}
    short.expected_end_s = 1.0
    # long waits for a:8 at t = 1; greedy (4 GPUs, long) would sit on a's last 4 GPUs or on b:
    # on a it would delay long's reservation, so it is held back when SpinSearch picks a.
    changed = sched.schedule([long, greedy], now=0.1)
    assert long.status == "queued" and long.admission.startswith("waits for j0")
    if greedy.status == "running":
        assert "a" not in greedy.placement  # it took b's GPUs, clear of the reservation
    else:
        assert greedy.admission.startswith("waits: starting now would delay j1")
    assert all(r.status == "running" for r in changed)


def test_a_job_too_big_for_the_free_gpus_reserves_its_best_ones_instead_of_holding_the_queue():
    """big wants 12 GPUs, 8 are free (a:4 fast, b:4 slow) beside r1 (a:4, ends at 10) and r2 (b:4,
    ends at 20). Under FIFO it held the queue until 12 were free. With admission it reserves the GPUs
    of its plan with the whole topology at the first end that frees them all (r1's: a's 8 fast GPUs
    and 4 of b's), unplanned but for that plan; long, which would still hold a's GPUs at 10, is held
    back, and short, done long before, starts on a. Without admission the head still holds the queue."""
    topo = fast_and_slow()
    for wait in (True, False):
        sched = Scheduler(topo, SchedulerConfig(planner="spinsearch", wait=wait))
        r1, r2, big, long, short = _records([job(0, 4), job(1, 4), job(2, 12, iterations=400),
                                             job(3, 4, iterations=400), job(4, 4, iterations=1)])
        _running(sched, topo, [r1, r2], "ab", [10.0, 20.0])
        calls = _counting(sched)
        changed = sched.schedule([big, long, short], now=0.0)
        if not wait:
            assert changed == [] and calls == [] and big.reservation is None  # FIFO: big holds the queue
            continue
        assert big.status == "queued" and big.reservation.gpus == {"a": 8, "b": 4} and big.reservation.at_s == 10.0
        assert big.waits_for == ("j0",) and big.admission.startswith("waits: wants 12 GPUs, 8 free; reserves")
        assert calls[0] == {"a": 8, "b": 8}  # big: only its plan with the whole topology
        assert long.status == "queued" and long.admission.startswith("waits: starting now would delay j2")
        assert changed == [short] and short.placement == {"a": 4}


def test_a_waiting_job_keeps_the_end_it_waits_for_when_shorter_jobs_pass_it():
    """long waits for short's end on the fast cluster a; small jobs then start beside it on c and
    end sooner, filling the look-ahead's first ends. It must still see short's end (else it forgets
    what it waits for and starts now on slow b: what the emulator did with paper8-16's w2)."""
    topo = fast_slow_slow()
    sched = Scheduler(topo, SchedulerConfig(planner="spinsearch"))
    short, long, *small = _records([job(0, 4, iterations=3), job(1, 8, iterations=400)]
                                   + [job(2 + i, 2, iterations=3) for i in range(4)])
    sched.schedule([short], now=0.0)
    assert short.placement == {"a": 4}
    short.expected_end_s = 10.0
    sched.schedule([long], now=0.1)
    assert long.status == "queued" and long.admission.startswith("waits for j0") and long.waits_for == ("j0",)
    from spiderflow.placement import PlacementRequest, spinsearch
    for i, r in enumerate(small):  # short jobs start on c meanwhile (as ones passing it would), ending first
        req = PlacementRequest(job=r.job, topology=topo, free_gpus={"c": sched.free["c"]}, allowed=("c",))
        sched._commit(r, spinsearch.place(req), {})
        r.expected_end_s = 1.0 + i
    assert [r.status for r in small] == ["running"] * 4 and sched.free["c"] == 0
    sched.schedule([long], now=0.2)
    assert long.status == "queued" and long.admission.startswith("waits for j0"), long.admission


def test_a_waiting_job_is_not_planned_again_until_what_it_waits_for_happens():
    """long waits for short's end on a. Passes in between (arrivals) leave its decision and its
    reservation standing without planning it again; once short ends it decides afresh and starts on a.
    Re-planning every waiting job at every event made the simulator quadratic on deep queues."""
    topo = fast_and_slow()
    sched = Scheduler(topo, SchedulerConfig(planner="spinsearch"))
    short, long, greedy = _records([job(0, 4, iterations=3), job(1, 8, iterations=400), job(2, 4, iterations=400)])
    sched.schedule([short], now=0.0)
    short.expected_end_s = 1.0
    sched.schedule([long], now=0.1)
    assert long.status == "queued" and long.waits_for == ("j0",) and long.reservation.gpus == {"a": 8}
    spent = long.overhead_s
    sched.schedule([long, greedy], now=0.2)  # an arrival: long keeps waiting, unplanned
    assert long.overhead_s == spent and long.status == "queued" and long.reservation is not None
    assert greedy.status == "queued" or "a" not in greedy.placement  # the standing reservation still holds a
    if greedy.status == "running":
        sched.release(greedy)
    sched.release(short)  # what long waits for happened
    sched.schedule([long], now=1.0)
    assert long.overhead_s > spent and long.status == "running" and long.placement == {"a": 8}
    assert long.reservation is None


def _running(sched, topo, records, where, ends):
    """Start ``records`` on the named cluster each (SpinSearch restricted to it), ending at ``ends``."""
    from spiderflow.placement import PlacementRequest, spinsearch
    for r, c, end in zip(records, where, ends):
        req = PlacementRequest(job=r.job, topology=topo, free_gpus={c: sched.free[c]}, allowed=(c,))
        sched._commit(r, spinsearch.place(req), {})
        r.expected_end_s = end


def _counting(sched):
    """The free GPUs of every planner call the scheduler makes from now on (the real SpinSearch)."""
    calls, real = [], sched._strategy
    sched._strategy = lambda req: calls.append(dict(req.free_gpus)) or real(req)
    return calls


def test_a_job_as_fast_now_as_on_the_whole_topology_starts_without_looking_ahead():
    """a has 4 fast GPUs free beside two running jobs, b runs a third: a 4-GPU job's plan now (a:4) is
    its plan with every GPU free, so no end of a running job can finish it sooner. It is planned
    now and once on the whole topology, not at each of the three ends."""
    topo = fast_and_slow()
    sched = Scheduler(topo, SchedulerConfig(planner="spinsearch"))
    r1, r2, r3, new = _records([job(0, 2), job(1, 2), job(2, 4), job(3, 4, iterations=400)])
    _running(sched, topo, [r1, r2, r3], "aab", [1.0, 2.0, 3.0])
    calls = _counting(sched)
    sched.schedule([new], now=0.1)
    assert new.status == "running" and new.placement == {"a": 4}
    assert "with the whole topology to itself" in new.admission
    assert calls == [{"a": 4, "b": 4}, {"a": 8, "b": 8}]  # now, then alone; no look-ahead


def test_the_look_ahead_stops_at_the_first_end_that_gives_the_job_its_best_plan():
    """long (8 GPUs) waits for a's 8 fast GPUs at t = 1 (r1's end), where it gets its plan on the
    whole topology: the later ends (jobs on b at 2 and 3) cannot finish it sooner, so they are not planned."""
    topo = fast_and_slow()
    sched = Scheduler(topo, SchedulerConfig(planner="spinsearch"))
    r1, r2, r3, long = _records([job(0, 4), job(1, 2), job(2, 2), job(3, 8, iterations=400)])
    _running(sched, topo, [r1, r2, r3], "abb", [1.0, 2.0, 3.0])
    calls = _counting(sched)
    sched.schedule([long], now=0.1)
    assert long.status == "queued" and long.waits_for == ("j0",) and long.reservation.gpus == {"a": 8}
    assert calls == [{"a": 4, "b": 4}, {"a": 8, "b": 8}, {"a": 8, "b": 4}]  # now, alone, at r1's end only


def test_the_look_ahead_also_weighs_the_first_end_that_frees_the_jobs_best_gpus():
    """long's best plan is a's 8 fast GPUs, which r4 frees at t = 4; the next three ends (r1-r3 on c)
    free only slow GPUs, no better than b's 8 free now. Within those three ends it would start now on
    b; the end that frees its whole-topology plan's GPUs is weighed too, and it waits for a."""
    topo = fast_slow_slow()
    sched = Scheduler(topo, SchedulerConfig(planner="spinsearch"))
    r1, r2, r3, r4, long = _records([job(0, 2), job(1, 2), job(2, 2), job(3, 8), job(4, 8, iterations=400)])
    _running(sched, topo, [r1, r2, r3, r4], "ccca", [1.0, 2.0, 3.0, 4.0])
    calls = _counting(sched)
    sched.schedule([long], now=0.1)
    assert long.status == "queued" and long.reservation.gpus == {"a": 8} and long.reservation.at_s == 4.0
    assert long.waits_for == ("j0", "j1", "j2", "j3")
    assert {"a": 8, "b": 8, "c": 8} in calls  # planned at r4's end


def _waiting_past_weighed_ends():
    """long waits for a's fast GPUs at r4's end (t = 4), having weighed r1-r3's ends on c (1, 2, 3)
    as start times and passed them over; r5 holds 2 of b's GPUs until t = 10, after long's start."""
    topo = fast_slow_slow()
    sched = Scheduler(topo, SchedulerConfig(planner="spinsearch"))
    *run, long = _records([job(0, 2), job(1, 2), job(2, 2), job(3, 8), job(4, 2), job(5, 8, iterations=400)])
    _running(sched, topo, run, "cccab", [1.0, 2.0, 3.0, 4.0, 10.0])
    sched.schedule([long], now=0.1)
    res = long.reservation
    assert long.status == "queued" and res.at_s == 4.0 and long.waits_for == ("j0", "j1", "j2", "j3")
    assert {j: entry[0] for j, entry in res.passed.items()} == {"j0": 1.0, "j1": 2.0, "j2": 3.0}
    assert res.slack_s == pytest.approx(END_SLACK * 3.9)
    return sched, run, long


def _end(sched, rec, at):
    rec.end_s = at  # as the simulator tells it
    sched.release(rec)


def test_a_waiting_job_passes_the_ends_it_weighed_without_planning_again_while_they_come_as_expected():
    """r1 ends at 1, as long expected (within the slack): what long weighed there is what it gets,
    so it keeps its decision unplanned. r2 then ends at 1.2, 0.8 s before its expected 2 (more than
    END_SLACK of the 3.9 s wait): long is planned again. (Re-planning at ends weighed and met as
    weighed was a quarter of the CPU of 10,000 jobs of the 600 s-gap trace: simulator_speed.md.)"""
    sched, (r1, r2, *_), long = _waiting_past_weighed_ends()
    res = long.reservation
    calls = _counting(sched)
    sched.release(r1, ended_s=1.0 + res.slack_s / 2)  # as the emulator tells it (its end_s set after)
    sched.schedule([long], now=1.0 + res.slack_s / 2)
    assert calls == [] and long.reservation is res and long.status == "queued"
    _end(sched, r2, 1.2)
    sched.schedule([long], now=1.2)
    assert calls and long.reservation is not res  # decided afresh


def test_a_waiting_job_is_planned_again_at_an_end_it_weighed_when_more_is_free_than_it_weighed():
    """r1 ends at 1 as expected, but r5, which long does not wait for, has ended early (1.1 instead
    of 10): b has 2 more GPUs free than long weighed at r1's end, so it is planned again."""
    sched, (r1, *_, r5), long = _waiting_past_weighed_ends()
    res = long.reservation
    calls = _counting(sched)
    _end(sched, r1, 1.0)
    _end(sched, r5, 1.1)
    sched.schedule([long], now=1.1)
    assert calls and long.reservation is not res


def test_a_standing_decision_is_checked_again_once_more_is_free_than_it_weighed():
    """r1 ends at 1 as expected and long keeps its decision unplanned; then r5, which long does not
    wait for, ends early (1.1 instead of 10): the next pass compares what long weighed at r1's end
    with what is free now, not with what was free at 1 (those comparisons are kept only until the
    running jobs change), and long is planned again."""
    sched, (r1, *_, r5), long = _waiting_past_weighed_ends()
    res = long.reservation
    calls = _counting(sched)
    _end(sched, r1, 1.0)
    sched.schedule([long], now=1.0)
    assert calls == [] and long.reservation is res
    _end(sched, r5, 1.1)
    sched.schedule([long], now=1.1)
    assert calls and long.reservation is not res


def test_a_job_with_others_queued_behind_it_weighs_the_gpu_time_it_would_hold():
    """long (8 GPUs) can start now on slow b and finish at 126 s, or wait for r1's 4 GPUs on fast a
    at t = 120 and finish at 137 s, running 17 s instead of 126. Alone in the queue it starts now:
    that finishes it sooner. With two jobs queued behind it, the 110 s of 8 GPUs it would hold
    longer on b (half the topology) delay each of them by about 55 s: it waits for a."""
    topo = fast_and_slow()
    for behind in (0, 2):
        sched = Scheduler(topo, SchedulerConfig(planner="spinsearch"))
        r1, long, *others = _records([job(0, 4), job(1, 8, iterations=100)]
                                     + [job(2 + i, 8, iterations=100) for i in range(behind)])
        _running(sched, topo, [r1], "a", [120.0])
        sched.schedule([long, *others], now=0.0)
        if behind == 0:
            assert long.status == "running" and long.placement == {"b": 8}, long.admission
            assert long.admission == "started now on b:8: finishes at 126.404 s"  # a: no sooner, not weighed
        else:
            assert long.status == "queued" and long.reservation.gpus == {"a": 8}, long.admission
            assert long.reservation.at_s == 120.0 and long.waits_for == ("j0",)
            assert "finishes at 136.6" in long.admission and "vs 126.4" in long.admission
            assert "2 jobs queued" in long.admission


def _state(free: dict[str, int], load: dict | None = None) -> _Moment:
    return _Moment([], free, load or {})


def test_spinsearch_answers_are_reused_for_a_job_of_the_same_shape_in_the_same_state():
    """Admission asks about the same states again and again: a job of the same shape asked about the
    same free GPUs and load gets the plan SpinSearch gave the first (its id in a refusal), without a
    planner call, and the plan becomes its own when it starts; another state is planned afresh."""
    topo = fast_and_slow()
    sched = Scheduler(topo, SchedulerConfig(planner="spinsearch"))
    calls = _counting(sched)
    first, second, other = _records([job(0, 8), job(1, 8), job(2, 4)])
    free = {"a": 8, "b": 8}
    p1 = sched._place(first, _state(free))
    p2 = sched._place(second, _state(dict(free)))
    assert len(calls) == 1 and p2.segments == p1.segments and p2.plan is p1.plan
    per_iteration = estimate(p1.plan, TopologyView(topology=topo))
    assert sched._run_s(second, p2, _state(free)) == second.job.iterations * per_iteration
    sched._commit(second, p2, {})
    assert second.plan.job is second.job and second.plan == dataclasses.replace(p1.plan, job=second.job)
    assert estimate(second.plan, TopologyView(topology=topo)) == per_iteration  # whichever job carries it
    assert p1.plan.job is first.job  # the memo's plan is not changed
    sched._place(second, _state({"a": 4, "b": 8}))
    sched._place(other, _state(free))
    assert len(calls) == 3  # another state, another shape
    big = _records([job(3, 8, model="llama2-70b"), job(4, 8, model="llama2-70b")])
    for rec in big:  # 70B parameters do not fit on 8 GPUs: the refusal names the job asked about
        with pytest.raises(Exception, match=f"^{rec.job.job_id}: "):
            sched._place(rec, _state(free))
    assert len(calls) == 4
    blind = Scheduler(topo, SchedulerConfig(planner="blind"))  # not deterministic: never reused
    blind_calls = _counting(blind)
    for rec in (first, second):
        blind._place(rec, _state(free))
    assert len(blind_calls) == 2


def test_a_moment_is_counted_once_and_forgotten_when_running_jobs_or_free_gpus_change():
    """What is free and loaded at a moment is kept for the look-aheads and reservation checks that
    ask about it again, and counted afresh once a job starts or ends, or a driver changes the free
    GPUs itself (capacity events do)."""
    topo = two_sites()
    sched = Scheduler(topo, SchedulerConfig(planner="blind"))
    (rec,) = _records([job(0, 16)])
    sched._commit(rec, sched._place(rec, _state(dict(sched.free))), {})
    rec.expected_end_s = 100.0
    now = sched._moment(None)
    assert now is sched._moment(None)
    assert now.free == {"a": 0, "b": 0} and now.load == sched.link_load() and now.load  # its flows cross the link
    later = sched._moment(100.0)
    assert later.gone == [rec] and later.free == {"a": 8, "b": 8} and later.load == {}
    assert sched._moment(99.0).gone == [] and sched._moment(99.0).load == now.load
    req = sched._request(rec.job, later)
    assert req.topology_view() is later.view(topo, sched.cfg.calibration)
    assert later.key() == (tuple(req.free_gpus.items()), frozenset(req.link_load.items()))
    sched.release(rec)
    assert sched._moment(None).free == {"a": 8, "b": 8} and sched._moment(None).load == {}
    sched.free["b"] = 4  # GPUs withdrawn by the driver, outside the scheduler
    assert sched._moment(None).free == {"a": 8, "b": 4}
