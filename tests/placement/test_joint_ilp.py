"""``joint-ilp``: one MILP over placement and parallel degrees; its plan must stand on the cost model.

Fixtures stay in this file (another suite shares ``tests/placement``).
"""

import time

import pytest

from spiderflow.costmodel import fits_memory, predict
from spiderflow.errors import InfeasiblePlan
from spiderflow.placement.base import STATUS_OPTIMAL, STATUS_TIME_LIMIT, PlacementRequest
from spiderflow.placement.ilp import place_ilp
from spiderflow.placement.joint_ilp import place_joint_ilp
from spiderflow.topology import parse_topology
from spiderflow.topology.generate import generate_topology
from spiderflow.workload import Job


def job(model, gpus, batch=256, seq=2048):
    return Job(job_id=f"{model}/{gpus}", arrival_s=0, model=model, gpus=gpus, iterations=1,
               global_batch=batch, seq_len=seq)


def request(t, j, *, time_limit_s=20.0):
    return PlacementRequest(job=j, topology=t, free_gpus={c.name: c.total_gpus for c in t.clusters},
                            time_limit_s=time_limit_s, threads=1, seed=0)


# x: consumer cards on a fast nearby link; z: one H100 node far away.
TRI = parse_topology({
    "name": "tri",
    "clusters": [{"name": "x", "gpu": "rtx4090", "nodes": 2, "gpus_per_node": 8},
                 {"name": "y", "gpu": "a100-80gb", "nodes": 1, "gpus_per_node": 8},
                 {"name": "z", "gpu": "h100", "nodes": 1, "gpus_per_node": 8}],
    "links": [{"a": "x", "b": "y", "bandwidth_gbps": 5.9, "latency_ms": 6.0},
              {"a": "y", "b": "z", "bandwidth_gbps": 3.0, "latency_ms": 74.0},
              {"a": "x", "b": "z", "bandwidth_gbps": 7.7, "latency_ms": 17.0}],
})


def test_joint_ilp_plan_is_optimal_valid_and_no_worse_than_ilp_with_tpa():
    """Its own Plan: all GPUs used, fits memory, and ``detail`` quotes ``predict`` on it.

    On this case (measured) the joint MILP's plan predicts 1.046 s against 1.072 s for the
    brute-force-optimal placement planned by TPA: TPA splits layers by compute, the joint MILP
    piles them on the fast side of a thin boundary. We only assert "no worse than ilp + 2%".
    A 0.4 s solve (the same triangle with gpt3-2.7b takes 11 s: even 3 clusters can be slow for
    this formulation); the 60 s limit is only a guard for loaded machines.
    """
    req = request(TRI, job("gpt3-1.3b", 16, batch=64), time_limit_s=60.0)
    placement = place_joint_ilp(req)
    view = req.matrix_view()
    plan = placement.plan
    assert placement.status == STATUS_OPTIMAL
    assert plan.gpus == 16 and sum(g for _, g in placement.segments) == 16
    assert {c for c, _ in placement.segments} == set(plan.placement)
    assert fits_memory(plan, view)
    predicted = predict(plan, view).iteration_s
    assert placement.detail["predicted_s"] == pytest.approx(predicted)
    assert placement.detail["solver"] in ("HiGHS", "CBC") and placement.detail["variables"] > 0
    assert predicted <= 1.02 * predict(place_ilp(req).plan, view).iteration_s


def test_joint_ilp_model_too_large_names_memory():
    with pytest.raises(InfeasiblePlan, match="short of memory"):
        place_joint_ilp(request(TRI, job("gpt3-175b", 24)))


def test_joint_ilp_stops_at_its_time_limit_with_a_plan():
    req = request(generate_topology(8, seed=0), job("gpt3-6.7b", 64), time_limit_s=0.5)
    t0 = time.process_time()  # CPU time: robust to other load on the test machine
    placement = place_joint_ilp(req)
    assert time.process_time() - t0 < 8.0  # ~1 s unloaded
    assert placement.status == STATUS_TIME_LIMIT
    assert placement.plan.gpus == 64
    assert fits_memory(placement.plan, req.matrix_view())
