"""Simulator: hand-checkable WAN sharing, queueing, rejection, and a committed golden run."""

import csv
from pathlib import Path

import pytest

from spiderflow.costmodel import TopologyView, estimate
from spiderflow.simulate.engine import SimConfig, SimRecord, simulate
from spiderflow.simulate.metrics import job_rows, summarise
from spiderflow.topology import parse_topology
from spiderflow.workload import Job

DATA = Path(__file__).parent / "data"


def two_sites(gpus_a=8, gpus_b=8, bw=1.0):
    """Two 1-node clusters of 8 GPUs joined by one link: a job of 16 GPUs must span it."""
    return parse_topology({"name": "two", "clusters": [
        {"name": "a", "gpu": "a100-80gb", "nodes": 1, "gpus_per_node": gpus_a},
        {"name": "b", "gpu": "a100-80gb", "nodes": 1, "gpus_per_node": gpus_b}],
        "links": [{"a": "a", "b": "b", "bandwidth_gbps": bw, "latency_ms": 10.0}]})


def job(i, gpus, arrival=0.0, iterations=10, model="gpt3-1.3b"):
    return Job(job_id=f"j{i}", arrival_s=arrival, model=model, gpus=gpus, iterations=iterations,
               global_batch=64, seq_len=1024)


def test_job_alone_gets_the_whole_link():
    topo = two_sites()
    (rec,) = simulate(topo, [job(0, 16)], SimConfig(planner="blind"))
    assert set(rec.placement) == {"a", "b"}
    alone = estimate(rec.plan, TopologyView(topology=topo))
    assert rec.iteration_s == pytest.approx(alone)
    assert rec.jct_s == pytest.approx(10 * alone)


def line_topology():
    """Line a(8) - b(4) - c(8), 1 Gbit/s links."""
    return parse_topology({"name": "line", "clusters": [
        {"name": "a", "gpu": "a100-80gb", "nodes": 1, "gpus_per_node": 8},
        {"name": "b", "gpu": "a100-80gb", "nodes": 1, "gpus_per_node": 4},
        {"name": "c", "gpu": "a100-80gb", "nodes": 1, "gpus_per_node": 8}],
        "links": [{"a": "a", "b": "b", "bandwidth_gbps": 1.0, "latency_ms": 10.0},
                  {"a": "b", "b": "c", "bandwidth_gbps": 1.0, "latency_ms": 10.0}]})


def test_two_jobs_on_one_link_get_half_each():
    """Line a(8) - b(4) - c(8). Blind puts j0 (12 GPUs) on a:8 + c:4 (route a-b-c) and j1 (8 GPUs)
    on b:4 + c:4 (route b-c). Link b-c carries both flows: 0.5 Gbit/s each; j0's a-b hop is then
    not its bottleneck, so it is also held to 0.5."""
    topo = line_topology()
    r0, r1 = simulate(topo, [job(0, 12, iterations=1000), job(1, 8, iterations=1000)], SimConfig(planner="blind"))
    assert r0.placement == {"a": 8, "c": 4} and r1.placement == {"b": 4, "c": 4}
    shared = {0: estimate(r0.plan, TopologyView(topology=topo, link_gbps={("a", "b"): 0.5, ("b", "c"): 0.5})),
              1: estimate(r1.plan, TopologyView(topology=topo, link_gbps={("b", "c"): 0.5}))}
    assert shared[0] > estimate(r0.plan, TopologyView(topology=topo))
    first = 0 if r0.end_s < r1.end_s else 1
    assert (r0, r1)[first].jct_s == pytest.approx(1000 * shared[first])


def test_iteration_times_follow_the_pace_as_the_link_is_shared_then_alone():
    """test_two_jobs_on_one_link_get_half_each's jobs, j1 with 4 iterations: j0 runs its first ones
    at the shared pace, the rest alone. Its iteration times say so one by one, as the emulator
    measures them; the whole-run mean would blur the two."""
    topo = line_topology()
    r0, r1 = simulate(topo, [job(0, 12, iterations=20), job(1, 8, iterations=4)],
                      SimConfig(planner="blind", record_paces=True))
    shared = estimate(r0.plan, TopologyView(topology=topo, link_gbps={("a", "b"): 0.5, ("b", "c"): 0.5}))
    alone = estimate(r0.plan, TopologyView(topology=topo))
    times = r0.iteration_times()
    assert len(times) == 20 and sum(times) == pytest.approx(r0.end_s - r0.start_s)
    n = sum(1 for t in times if t == pytest.approx(shared))  # whole iterations before j1 ended
    assert 1 <= n < 10 and r1.end_s < r0.start_s + (n + 1) * shared
    assert times[:n] == pytest.approx([shared] * n) and times[n + 1:] == pytest.approx([alone] * (19 - n))
    assert alone < times[n] < shared  # the iteration j1's end fell in
    assert r1.iteration_times() == pytest.approx([r1.iteration_s] * 4)
    (plain, _) = simulate(topo, [job(0, 12, iterations=20), job(1, 8, iterations=4)], SimConfig(planner="blind"))
    assert plain.paces == [] and plain.iteration_times() == [] and plain.end_s == r0.end_s


def test_iteration_times_stop_at_the_first_change():
    """Only iterations that ended before the first change count (a stop, say, at 12.5 s)."""
    rec = SimRecord(job=job(0, 8, iterations=4), arrival_s=0.0)
    rec.paces, rec.end_s = [(10.0, 1.0), (12.5, 2.0)], 15.5  # 2.5 iterations at 1 s, 1.5 at 2 s
    assert rec.iteration_times() == pytest.approx([1.0, 1.0, 1.5, 2.0])
    rec.paces = [(10.0, 1.0), (20.0, 1.0)]  # stopped at 12.5, started again at 20
    rec.first_changed_s, rec.end_s = 12.5, 21.5
    assert rec.iteration_times() == pytest.approx([1.0, 1.0])


def test_fifo_queues_and_backfill_jumps():
    topo = two_sites()
    jobs = [job(0, 12, iterations=5), job(1, 16, arrival=1.0, iterations=5), job(2, 4, arrival=2.0, iterations=5)]
    fifo = simulate(topo, jobs, SimConfig(planner="blind"))
    assert fifo[2].start_s >= fifo[1].start_s  # j2 waits behind j1
    back = simulate(topo, jobs, SimConfig(planner="blind", backfill=True))
    assert back[2].start_s == pytest.approx(2.0)  # j2 fits in the 4 free GPUs at once


def test_impossible_jobs_are_rejected_with_reason():
    topo = two_sites()
    recs = simulate(topo, [job(0, 64), job(1, 8, model="gpt3-175b"), job(2, 8)], SimConfig(planner="spinsearch"))
    assert [r.status for r in recs] == ["rejected", "rejected", "done"]
    assert "wants 64 GPUs" in recs[0].reason
    assert "does not fit in GPU memory" in recs[1].reason
    summary = summarise(recs, topo.total_gpus)
    assert (summary["completed"], summary["rejected"]) == (1, 2)


def _golden_rows(recs):
    keep = ("job_id", "status", "start_s", "end_s", "placement")
    return [{k: (f"{v:.6g}" if isinstance(v, float) else str(v if v is not None else ""))
             for k, v in row.items() if k in keep} for row in job_rows(recs)]


def test_golden_small_trace(request):
    """paper8 + the first 40 jobs of traces/synthetic-1000.csv, SpinSearch, seed 0 (overhead not charged)."""
    from spiderflow.topology import load_topology
    from spiderflow.traces import load_trace
    root = Path(__file__).resolve().parents[2]
    topo = load_topology(root / "topologies" / "paper8.yaml")
    jobs = load_trace(root / "traces" / "synthetic-1000.csv").jobs[:40]
    rows = _golden_rows(simulate(topo, jobs, SimConfig(planner="spinsearch", seed=0)))
    golden = DATA / "golden_paper8_40.csv"
    if request.config.getoption("--update-golden", default=False):  # pragma: no cover
        with open(golden, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    with open(golden, newline="") as fh:
        assert list(csv.DictReader(fh)) == rows


def test_a_replay_makes_full_collections_rare_and_restores_the_thresholds(monkeypatch):
    """The replay runs with at most one full garbage collection per FULL_COLLECTION_EVERY
    middle-generation ones (the heap it grows made the defaults walk it dozens of times), and
    gives the caller its own thresholds back, also when a replay fails."""
    import gc

    from spiderflow.simulate import engine

    seen = []
    schedule = engine.Simulation._schedule

    def spy(self, now):
        seen.append(gc.get_threshold())
        return schedule(self, now)

    def fail(self, now):
        raise RuntimeError("planner broke")

    old = gc.get_threshold()
    try:
        gc.set_threshold(500, 7, 3)
        monkeypatch.setattr(engine.Simulation, "_schedule", spy)
        simulate(two_sites(), [job(0, 8)], SimConfig(planner="blind"))
        assert seen and set(seen) == {(500, 7, engine.FULL_COLLECTION_EVERY)}
        assert gc.get_threshold() == (500, 7, 3)
        monkeypatch.setattr(engine.Simulation, "_schedule", fail)
        with pytest.raises(RuntimeError, match="planner broke"):
            simulate(two_sites(), [job(0, 8)], SimConfig(planner="blind"))
        assert gc.get_threshold() == (500, 7, 3)
    finally:
        gc.set_threshold(*old)
