"""A WAN and a GPU pool that change under running jobs (docs/wan-events.md): finish times checked by
hand from the cost model's predictions, restart costs, re-routing, re-planning and its ablation."""

import dataclasses

import pytest

from spiderflow.costmodel import TopologyView, estimate
from spiderflow.scheduling import Scheduler, SchedulerConfig, records
from spiderflow.simulate.changes import checkpoint_bytes, restart_cost_s
from spiderflow.simulate.engine import SimConfig, simulate
from spiderflow.simulate.metrics import job_rows, summarise
from spiderflow.topology import parse_topology
from spiderflow.wan import CapacityEvent, WanEvent
from spiderflow.workload import Job


def topology(gpus, links, kinds=None):
    """One node of ``gpus[name]`` GPUs per cluster, A100-80GB unless ``kinds`` names another."""
    kinds = kinds or {}
    return parse_topology({"name": "t", "clusters": [
        {"name": n, "gpu": kinds.get(n, "a100-80gb"), "nodes": 1, "gpus_per_node": g} for n, g in gpus.items()],
        "links": [{"a": a, "b": b, "bandwidth_gbps": bw, "latency_ms": 10.0} for a, b, bw in links]})


def two_sites(bw=1.0):
    return topology({"a": 8, "b": 8}, [("a", "b", bw)])


def job(i, gpus, iterations=100, arrival=0.0):
    return Job(job_id=f"j{i}", arrival_s=arrival, model="gpt3-1.3b", gpus=gpus, iterations=iterations,
               global_batch=64, seq_len=1024)


def wan(t, a, b, bw=None, up=True):
    return WanEvent(time_s=t, a=a, b=b, bandwidth_gbps=bw, latency_ms=None, up=up)


def alone(rec, topo):
    return estimate(rec.plan, TopologyView(topology=topo))


def test_bandwidth_halves_mid_run():
    """100 iterations at t1 s each; at 50 t1 the link halves: the other 50 take t2 s each."""
    topo = two_sites()
    (base,) = simulate(topo, [job(0, 16)], SimConfig(planner="blind"))
    t1 = alone(base, topo)
    assert base.placement == {"a": 8, "b": 8} and base.end_s == pytest.approx(100 * t1)
    (rec,) = simulate(topo, [job(0, 16)], SimConfig(planner="blind", wan_events=(wan(50 * t1, "a", "b", 0.5),)))
    t2 = alone(rec, two_sites(0.5))
    assert t2 > 1.2 * t1
    assert rec.end_s == pytest.approx(50 * t1 + 50 * t2)
    assert (rec.replanned, rec.rerouted, rec.lost_s) == (0, 0, 0.0)


def test_restating_the_topology_changes_nothing():
    topo = two_sites()
    jobs = [job(0, 16), job(1, 8, arrival=5.0)]
    plain = simulate(topo, jobs, SimConfig(planner="spinsearch"))
    same = simulate(topo, jobs, SimConfig(planner="spinsearch", wan_events=(wan(10.0, "b", "a", 1.0),)))
    assert [(r.start_s, r.end_s, r.placement) for r in plain] == [(r.start_s, r.end_s, r.placement) for r in same]


def test_outage_with_another_route_reroutes():
    """Triangle a-b, a-c, c-b: a-b down at T sends the job's traffic round through c (20 ms, same
    bandwidth) until a-b is up again at U; no restart."""
    topo = topology({"a": 8, "b": 8, "c": 1}, [("a", "b", 1.0), ("a", "c", 1.0), ("c", "b", 1.0)])
    detour = topology({"a": 8, "b": 8, "c": 1}, [("a", "c", 1.0), ("c", "b", 1.0)])
    (base,) = simulate(topo, [job(0, 16)], SimConfig(planner="blind"))
    t1 = alone(base, topo)
    T, U = 30 * t1, 60 * t1
    (rec,) = simulate(topo, [job(0, 16)], SimConfig(planner="blind", wan_events=(
        wan(T, "a", "b", up=False), wan(U, "a", "b", up=True))))
    t2 = alone(rec, detour)
    assert t2 > t1
    assert rec.end_s == pytest.approx(U + (100 - 30 - (U - T) / t2) * t1)
    assert (rec.rerouted, rec.replanned, rec.lost_s) == (1, 0, 0.0)


def test_outage_without_route_stops_the_job_until_it_can_be_placed_again():
    """two_sites: the job spans the only link; down at T, up at U. It stops at T (progress kept),
    waits (no plan may cross a dead link, and it is not rejected), restarts at U paying the restart
    cost, and finishes its other 50 iterations."""
    topo = two_sites()
    (base,) = simulate(topo, [job(0, 16)], SimConfig(planner="blind"))
    t1 = alone(base, topo)
    T, U = 50 * t1, 200 * t1
    cfg = SimConfig(planner="blind", wan_events=(wan(T, "a", "b", up=False), wan(U, "a", "b", up=True)))
    (rec,) = simulate(topo, [job(0, 16)], cfg)
    cost = restart_cost_s(rec.job)
    # 1.3e9 parameters x 14 bytes: saved at 20 Gbit/s, read back at 10 Gbit/s
    assert cost == pytest.approx(rec.job.spec.params * 14 * 8 / 20e9 + rec.job.spec.params * 14 * 8 / 10e9)
    assert rec.end_s == pytest.approx(U + cost + 50 * t1)
    assert (rec.replanned, rec.lost_s, rec.start_s) == (1, pytest.approx(U + cost - T), 0.0)
    summary = summarise([rec], topo.total_gpus, changes=True)
    assert (summary["replanned"], summary["lost_s"]) == (1, pytest.approx(U + cost - T))
    assert job_rows([rec], changes=True)[0]["replanned"] == 1


def test_a_job_stopped_again_while_it_pays_its_restart_cost_loses_the_time_to_its_one_resume():
    """As above, and the link goes down again at U + 5 s, within the restart cost (5 s into its 7.3 s
    save), and is up at V: the job keeps the checkpoint it was saving, so it resumes at V + the rest of
    its first restart cost (what was left of the save, then a whole load), and lost_s is that less T
    (the first restart's resume never came)."""
    topo = two_sites()
    (base,) = simulate(topo, [job(0, 16)], SimConfig(planner="blind"))
    t1 = alone(base, topo)
    T, U = 50 * t1, 200 * t1
    V = U + 40.0
    events = tuple(wan(t, "a", "b", up=up) for t, up in ((T, False), (U, True), (U + 5.0, False), (V, True)))
    (rec,) = simulate(topo, [job(0, 16)], SimConfig(planner="blind", wan_events=events))
    rest = restart_cost_s(rec.job) - 5.0
    assert checkpoint_bytes(rec.job) / 2.5e9 > 5.0  # still saving when stopped again
    assert rec.end_s == pytest.approx(V + rest + 50 * t1)
    assert (rec.replanned, rec.lost_s) == (2, pytest.approx(V + rest - T))


def test_a_job_stopped_during_its_first_start_up_pays_no_restart_cost():
    """As test_outage_without_route_stops..., with 30 s of start-up and the link down at 10 s, before
    the job's first iteration: it has nothing to save or read back, so when the link is up at U it
    starts afresh (start-up again, every iteration), as if it arrived then."""
    topo = two_sites()
    startup, U = 30.0, 100.0
    cfg = SimConfig(planner="blind", startup_s=startup,
                    wan_events=(wan(10.0, "a", "b", up=False), wan(U, "a", "b", up=True)))
    (rec,) = simulate(topo, [job(0, 16)], cfg)
    assert rec.end_s == pytest.approx(U + startup + 100 * alone(rec, topo))
    assert (rec.replanned, rec.lost_s, rec.start_s) == (1, pytest.approx(U + startup - 10.0), 0.0)


def test_a_job_stopped_during_start_up_after_a_restart_pays_only_the_load():
    """Stopped at T while iterating, placed again at U (the restart cost, then 30 s of start-up), and
    stopped again during that start-up: its checkpoint is saved and holds all it did, so at V it pays
    only the load of it at its new placement, then its start-up."""
    topo = two_sites()
    startup = 30.0
    (base,) = simulate(topo, [job(0, 16)], SimConfig(planner="blind", startup_s=startup))
    t1 = alone(base, topo)
    T, U = startup + 50 * t1, startup + 200 * t1
    cost = restart_cost_s(base.job)
    W = U + cost + 10.0  # 10 s into the start-up after the restart cost
    V = W + 40.0
    events = tuple(wan(t, "a", "b", up=up) for t, up in ((T, False), (U, True), (W, False), (V, True)))
    (rec,) = simulate(topo, [job(0, 16)], SimConfig(planner="blind", startup_s=startup, wan_events=events))
    load_s = checkpoint_bytes(rec.job) / 1.25e9  # 10 Gbit/s
    assert rec.end_s == pytest.approx(V + load_s + startup + 50 * t1)
    assert rec.replanned == 2


def test_capacity_withdrawal_moves_the_job_after_its_notice():
    """The job runs on a:8; a's 8 GPUs are announced at T - N and gone at T: the job checkpoints
    during the notice (N hides that much of the save), is re-planned on b at T and pays the rest."""
    topo = two_sites()
    (base,) = simulate(topo, [job(0, 8)], SimConfig(planner="blind"))
    t = alone(base, topo)
    T, N = 40 * t, 2.0
    ev = CapacityEvent(time_s=T, cluster="a", gpus=8, notice_s=N, return_s=None)
    (rec,) = simulate(topo, [job(0, 8)], SimConfig(planner="blind", capacity_events=(ev,)))
    cost = restart_cost_s(rec.job, notice_s=N)
    assert cost == pytest.approx(restart_cost_s(rec.job) - N)
    assert base.placement == {"a": 8} and rec.placement == {"b": 8}
    assert rec.end_s == pytest.approx(T + cost + 60 * t)
    assert rec.lost_s == pytest.approx(cost) and rec.replanned == 1


def test_announced_gpus_leave_the_pool_at_the_notice():
    """a has 16 GPUs, j0 runs on 8 of them; all 16 are announced at T - N. The 8 free ones leave the
    pool at once, so j1 (arriving during the notice) gets b; at T j0 is stopped and waits for b."""
    topo = topology({"a": 16, "b": 8}, [("a", "b", 1.0)])
    (base,) = simulate(topo, [job(0, 8)], SimConfig(planner="blind"))
    t = alone(base, topo)
    T, N = 40 * t, 10.0
    ev = CapacityEvent(time_s=T, cluster="a", gpus=16, notice_s=N, return_s=None)
    j0, j1 = simulate(topo, [job(0, 8), job(1, 8, iterations=5, arrival=T - 1.0)],
                      SimConfig(planner="blind", capacity_events=(ev,)))
    assert base.placement == {"a": 8} and j1.placement == {"b": 8}
    assert j1.start_s == pytest.approx(T - 1.0)
    cost = restart_cost_s(j0.job, notice_s=N)
    assert j0.placement == {"b": 8} and j0.end_s == pytest.approx(j1.end_s + cost + 60 * t)
    assert j0.lost_s == pytest.approx(j1.end_s + cost - T)


def test_capacity_returns():
    topo = two_sites()
    ev = CapacityEvent(time_s=0.0, cluster="a", gpus=8, notice_s=0.0, return_s=100.0)
    (rec,) = simulate(topo, [job(0, 16, iterations=5, arrival=1.0)], SimConfig(planner="blind", capacity_events=(ev,)))
    assert rec.status == "done" and rec.start_s == pytest.approx(100.0) and rec.replanned == 0


def test_spinsearch_replans_a_slowed_job_and_no_replan_does_not():
    """c (16 GPUs) runs j0 until it ends; j1 (16 GPUs) started meanwhile across a-b. At T the a-b link
    falls to 1% of its bandwidth: SpinSearch moves j1 to the now free c (paying the restart cost) as
    its iteration time grew past 1.5x; with replan off it crawls on; blind keeps its plan."""
    topo = topology({"a": 8, "b": 8, "c": 16}, [("a", "b", 1.0), ("b", "c", 1.0)])
    jobs = [job(0, 16, iterations=20), job(1, 16, iterations=400, arrival=1.0)]
    (_, first) = simulate(topo, jobs, SimConfig(planner="spinsearch", wait=False))
    assert first.placement == {"a": 8, "b": 8}
    t_ab = alone(first, topo)
    T = 1.0 + 100 * t_ab
    events = (wan(T, "a", "b", 0.01),)
    on = simulate(topo, jobs, SimConfig(planner="spinsearch", wait=False, wan_events=events))[1]
    off = simulate(topo, jobs, SimConfig(planner="spinsearch", wait=False, wan_events=events, replan=False))[1]
    assert on.placement == {"c": 16} and on.replanned == 1
    cost = restart_cost_s(on.job)
    assert on.end_s == pytest.approx(T + cost + 300 * alone(on, topo))
    assert on.lost_s == pytest.approx(cost)
    assert off.placement == {"a": 8, "b": 8} and off.replanned == 0
    slow = alone(off, topology({"a": 8, "b": 8, "c": 16}, [("a", "b", 0.01), ("b", "c", 1.0)]))
    assert off.end_s == pytest.approx(T + 300 * slow)
    assert on.end_s < off.end_s
    blind = simulate(topo, jobs, SimConfig(planner="blind", wan_events=events))[1]
    assert blind.replanned == 0


def test_replanning_counts_hosts_as_an_emulated_replay_does():
    """The same move with hosts per cluster counted, as in the simulation of an emulator replay: j1
    moves to c and holds the host its new plan's rank needs there."""
    topo = topology({"a": 8, "b": 8, "c": 16}, [("a", "b", 1.0), ("b", "c", 1.0)])
    jobs = [job(0, 16, iterations=20), job(1, 16, iterations=400, arrival=1.0)]
    hosts = {"a": 1, "b": 1, "c": 1}
    (_, first) = simulate(topo, jobs, SimConfig(planner="spinsearch", wait=False, hosts_per_cluster=hosts))
    assert first.placement == {"a": 8, "b": 8} and first.hosts == {"a": 1, "b": 1}
    events = (wan(1.0 + 100 * alone(first, topo), "a", "b", 0.01),)
    on = simulate(topo, jobs, SimConfig(planner="spinsearch", wait=False, wan_events=events,
                                        hosts_per_cluster=hosts))[1]
    assert on.placement == {"c": 16} and on.replanned == 1 and on.hosts == {"c": 1}
    off = simulate(topo, jobs, SimConfig(planner="spinsearch", wait=False, wan_events=events,
                                         hosts_per_cluster=hosts, replan=False))[1]
    assert off.placement == {"a": 8, "b": 8} and off.replanned == 0 and on.end_s < off.end_s


def test_replan_refuses_a_plan_whose_ranks_the_free_hosts_cannot_take():
    """Scheduler.replan with hosts counted: the better plan on c needs a rank there; with c's only
    host taken (as another job's rank would hold it) there is no move, with it free there is one,
    and the move hands the job's hosts over."""
    sched = Scheduler(topology({"a": 8, "b": 8, "c": 16}, [("a", "b", 1.0), ("b", "c", 1.0)]),
                      SchedulerConfig(planner="spinsearch", wait=False), hosts_per_cluster={"a": 1, "b": 1, "c": 1})
    first, second = records([job(0, 16), job(1, 16)])
    sched.schedule([first, second])
    assert first.placement == {"c": 16} and second.placement == {"a": 8, "b": 8}
    topo = topology({"a": 8, "b": 8, "c": 16}, [("a", "b", 0.01), ("b", "c", 1.0)])
    sched.set_network(topo)  # the a-b link fell to 1% (a WAN event)
    sched.release(first)
    sched.free_hosts["c"] = 0
    assert sched.replan(second) is None
    sched.free_hosts["c"] = 1
    placement, iteration_s = sched.replan(second)
    assert placement.plan.placement == {"c": 16} and iteration_s < estimate(second.plan, TopologyView(topology=topo))
    sched.move(second, placement)
    assert second.hosts == {"c": 1} and sched.free_hosts == {"a": 1, "b": 1, "c": 0}
    assert sched.free == {"a": 8, "b": 8, "c": 0}


def test_spinsearch_moves_a_job_placed_while_gpus_were_withdrawn_once_they_return():
    """c's 16 GPUs are withdrawn from 0 s to R: j1 (16 GPUs, arriving at 1 s) starts across a-b. When
    c's GPUs come back, SpinSearch plans again the job it placed while the pool was short and moves it
    to c (paying the restart cost); with replan off it stays on a-b; blind keeps its plan."""
    topo = topology({"a": 8, "b": 8, "c": 16}, [("a", "b", 1.0), ("b", "c", 1.0)])
    jobs = [job(1, 16, iterations=400, arrival=1.0)]
    (first,) = simulate(topo, jobs, SimConfig(planner="spinsearch", wait=False))
    assert first.placement == {"c": 16}  # where it goes with the whole pool
    R = 1.0 + 100 * alone(first, topo)
    cfg = SimConfig(planner="spinsearch", wait=False,
                    capacity_events=(CapacityEvent(time_s=0.0, cluster="c", gpus=16, notice_s=0.0, return_s=R),))
    (on,) = simulate(topo, jobs, cfg)
    (off,) = simulate(topo, jobs, dataclasses.replace(cfg, replan=False))
    assert off.placement == {"a": 8, "b": 8} and off.replanned == 0 and off.placed_impaired
    assert off.end_s == pytest.approx(1.0 + 400 * alone(off, topo))
    left = 400 - (R - 1.0) / alone(off, topo)
    cost = restart_cost_s(on.job)
    assert on.placement == {"c": 16} and on.replanned == 1 and not on.placed_impaired
    assert on.end_s == pytest.approx(R + cost + left * alone(on, topo)) and on.end_s < off.end_s
    assert on.lost_s == pytest.approx(cost)
    (blind,) = simulate(topo, jobs, dataclasses.replace(cfg, planner="blind"))
    assert blind.replanned == 0


def test_a_job_still_starting_up_when_the_gpus_return_is_planned_again_as_the_emulator_does():
    """As above, with 10 s of start-up before a job's first iteration and c back at 5 s: j1 is still
    starting up on a-b. The emulator plans such a job again (its ranks are launching); so does the
    simulator, which skipped it until it iterated (the return was then spent). It moves to c with
    nothing done: no checkpoint to save or read back, only its start-up again."""
    topo = topology({"a": 8, "b": 8, "c": 16}, [("a", "b", 1.0), ("b", "c", 1.0)])
    jobs = [job(1, 16, iterations=400, arrival=1.0)]
    R, startup = 5.0, 10.0
    cfg = SimConfig(planner="spinsearch", wait=False, startup_s=startup,
                    capacity_events=(CapacityEvent(time_s=0.0, cluster="c", gpus=16, notice_s=0.0, return_s=R),))
    (on,) = simulate(topo, jobs, cfg)
    (off,) = simulate(topo, jobs, dataclasses.replace(cfg, replan=False))
    assert off.placement == {"a": 8, "b": 8} and off.replanned == 0
    assert on.placement == {"c": 16} and on.replanned == 1
    assert on.end_s == pytest.approx(R + startup + 400 * alone(on, topo)) and on.end_s < off.end_s


@pytest.mark.parametrize("back_after", [5.0, 10.0])
def test_a_job_paying_its_restart_cost_when_the_gpus_return_is_planned_again(back_after):
    """j1 (16 GPUs) runs on c; c's GPUs are withdrawn at T and come back ``back_after`` later, while
    j1, placed again across a-b, still pays its restart cost (7.3 s of checkpoint save, then 14.6 s of
    load). SpinSearch plans it again then (before 72d7627 it was skipped until it iterated, by when the
    return was spent) and moves it back to c. It keeps the checkpoint it is saving: moved within the
    save (5 s) the move costs it nothing; within the load (10 s) it costs the 2.7 s of load done."""
    topo = topology({"a": 8, "b": 8, "c": 16}, [("a", "b", 1.0), ("b", "c", 1.0)])
    jobs = [job(1, 16, iterations=400, arrival=1.0)]
    T = 10.0
    ev = CapacityEvent(time_s=T, cluster="c", gpus=16, notice_s=0.0, return_s=T + back_after)
    cfg = SimConfig(planner="spinsearch", wait=False, capacity_events=(ev,))
    (on,) = simulate(topo, jobs, cfg)
    (off,) = simulate(topo, jobs, dataclasses.replace(cfg, replan=False))
    assert off.placement == {"a": 8, "b": 8} and off.replanned == 1 and off.placed_impaired
    left = 400 - (T - 1.0) / alone(on, topo)
    save_s, load_s = checkpoint_bytes(on.job) / 2.5e9, checkpoint_bytes(on.job) / 1.25e9  # 20 and 10 Gbit/s
    cost = restart_cost_s(on.job)
    assert cost == pytest.approx(save_s + load_s) and save_s == pytest.approx(7.3, abs=0.05)
    resumed = T + max(cost, back_after + cost - save_s)  # when its iterations resume on c
    assert on.placement == {"c": 16} and on.replanned == 2 and not on.placed_impaired
    assert on.end_s == pytest.approx(resumed + left * alone(on, topo)) and on.end_s < off.end_s
    assert on.lost_s == pytest.approx(resumed - T)  # from the stop to the resume, counted once


def test_a_job_a_wan_change_slows_while_it_pays_its_restart_cost_is_planned_again():
    """j0 holds d (24 GPUs), j1 runs on c. c's GPUs are withdrawn at T, 3 s before j0 ends: j1 is placed
    again across a-b and pays its restart cost; at T + 5 s, within it, a-b falls to 0.01 Gbit/s.
    SpinSearch plans j1 again (before 72d7627 it was skipped, and the change was never looked at
    again: it crawled over a-b for 11 hours) and moves it to the d that j0 left, still within the
    checkpoint's save: its iterations resume when they would have, only faster."""
    topo = topology({"a": 8, "b": 8, "c": 16, "d": 24}, [("a", "b", 1.0), ("b", "c", 1.0), ("c", "d", 1.0)])
    jobs = [job(0, 24, iterations=300), job(1, 16, iterations=400, arrival=1.0)]
    j0, j1 = simulate(topo, jobs, SimConfig(planner="spinsearch", wait=False))
    assert j0.placement == {"d": 24} and j1.placement == {"c": 16}
    T = j0.end_s - 3.0
    cfg = SimConfig(planner="spinsearch", wait=False, wan_events=(wan(T + 5.0, "a", "b", bw=0.01),),
                    capacity_events=(CapacityEvent(time_s=T, cluster="c", gpus=16, notice_s=0.0, return_s=None),))
    _, on = simulate(topo, jobs, cfg)
    _, off = simulate(topo, jobs, dataclasses.replace(cfg, replan=False))
    assert off.placement == {"a": 8, "b": 8} and off.replanned == 1
    cost = restart_cost_s(on.job)
    left = 400 - (T - 1.0) / alone(j1, topo)
    assert on.placement == {"d": 16} and on.replanned == 2 and on.lost_s == pytest.approx(cost)
    assert on.end_s == pytest.approx(T + cost + left * alone(on, topo)) and on.end_s < off.end_s / 100


def test_the_gpus_a_move_frees_go_to_the_queue_at_once():
    """c (16 RTX 4090s) is withdrawn until R: j1 (gpt3-1.3b) starts on a-b (A100s); j2 (llama2-70b,
    which does not fit c's memory) arrives and waits. At R j2 still cannot use c, j1 moves there, and
    j2 starts at once on the a-b GPUs j1 left (as the emulator's next pass does), not when j1 ends."""
    topo = topology({"a": 8, "b": 8, "c": 16}, [("a", "b", 1.0), ("b", "c", 1.0)], kinds={"c": "rtx4090"})
    big = Job(job_id="j2", arrival_s=2.0, model="llama2-70b", gpus=16, iterations=10, global_batch=16, seq_len=1024)
    jobs = [job(1, 16, iterations=400, arrival=1.0), big]
    R = 60.0
    ev = CapacityEvent(time_s=0.0, cluster="c", gpus=16, notice_s=0.0, return_s=R)
    j1, j2 = simulate(topo, jobs, SimConfig(planner="spinsearch", wait=False, capacity_events=(ev,)))
    assert j1.placement == {"c": 16} and j1.replanned == 1
    assert j2.placement == {"a": 8, "b": 8} and j2.start_s == pytest.approx(R)


def test_a_lifted_impairment_leaves_a_job_placed_before_it_where_it_is():
    """j1 starts across a-b while j0 holds c (the pool whole); d's GPUs are withdrawn after j0 ended
    and come back at R. Only jobs placed while the pool was short are planned again then: j1 stays,
    although the free c would be faster (were every running job planned again, j1 would move there)."""
    topo = topology({"a": 8, "b": 8, "c": 16, "d": 8}, [("a", "b", 1.0), ("b", "c", 1.0), ("c", "d", 1.0)])
    jobs = [job(0, 16, iterations=20), job(1, 16, iterations=400, arrival=1.0)]
    j0, j1 = simulate(topo, jobs, SimConfig(planner="spinsearch", wait=False))
    assert j0.placement == {"c": 16} and j1.placement == {"a": 8, "b": 8} and not j1.placed_impaired
    T = j0.end_s + 1.0
    ev = CapacityEvent(time_s=T, cluster="d", gpus=8, notice_s=0.0, return_s=T + 1.0)
    _, kept = simulate(topo, jobs, SimConfig(planner="spinsearch", wait=False, capacity_events=(ev,)))
    assert kept.placement == {"a": 8, "b": 8} and kept.replanned == 0 and kept.end_s == pytest.approx(j1.end_s)


def test_a_link_back_up_moves_the_job_placed_round_it():
    """a-b is down from 0 s to U, the other links thin: j1 (16 GPUs, at 1 s) is placed over a thin link
    and, once a-b is back up, planned again and moved onto a-b."""
    topo = topology({"a": 8, "b": 8, "c": 8}, [("a", "b", 1.0), ("a", "c", 0.01), ("b", "c", 0.01)])
    jobs = [job(1, 16, iterations=400, arrival=1.0)]
    U = 30.0
    events = (wan(0.0, "a", "b", up=False), wan(U, "a", "b", up=True))
    (on,) = simulate(topo, jobs, SimConfig(planner="spinsearch", wait=False, wan_events=events))
    (off,) = simulate(topo, jobs, SimConfig(planner="spinsearch", wait=False, wan_events=events, replan=False))
    assert off.replanned == 0 and off.placement != {"a": 8, "b": 8}
    assert on.replanned == 1 and on.placement == {"a": 8, "b": 8} and on.end_s < off.end_s


@pytest.mark.parametrize("moves", [True, False])
def test_a_move_counts_the_start_up_it_costs_a_job_that_iterates(moves):
    """As test_spinsearch_moves_a_job_placed_while_gpus_were_withdrawn_once_they_return, with a start-up
    of S s before a job's first iteration. At R, 100 iterations in, j1 would save 300 x (t_ab - t_c) on
    c; moving costs it the restart cost and S (it iterates where it is, so it would wait for nothing).
    It moves only when the saving beats both (before, the start-up was left out of the rule)."""
    topo = topology({"a": 8, "b": 8, "c": 16}, [("a", "b", 1.0), ("b", "c", 1.0)])
    on_c, on_ab = (simulate(topo, [job(1, 16, iterations=400, arrival=1.0)],
                            SimConfig(planner="spinsearch", wait=False, capacity_events=events))[0]
                   for events in ((), (CapacityEvent(time_s=0.0, cluster="c", gpus=16, notice_s=0.0, return_s=None),)))
    assert on_c.placement == {"c": 16} and on_ab.placement == {"a": 8, "b": 8}
    t_c, t_ab = alone(on_c, topo), alone(on_ab, topo)
    saved, cost = 300 * (t_ab - t_c), restart_cost_s(on_c.job)
    assert saved > cost + 10.0
    S = (saved - cost) / 2 if moves else saved - cost + 10.0
    R = 1.0 + S + 100 * t_ab
    cfg = SimConfig(planner="spinsearch", wait=False, startup_s=S,
                    capacity_events=(CapacityEvent(time_s=0.0, cluster="c", gpus=16, notice_s=0.0, return_s=R),))
    (rec,) = simulate(topo, [job(1, 16, iterations=400, arrival=1.0)], cfg)
    if moves:
        assert rec.placement == {"c": 16} and rec.end_s == pytest.approx(R + cost + S + 300 * t_c)
    else:
        assert rec.placement == {"a": 8, "b": 8} and rec.end_s == pytest.approx(1.0 + S + 400 * t_ab)
