"""Tiny hand-checkable topologies and the brute-force optimum under the cost model."""

import itertools

from spiderflow.costmodel import predict
from spiderflow.errors import InfeasiblePlan
from spiderflow.parallel.tpa import plan_placement
from spiderflow.placement.base import PlacementRequest
from spiderflow.placement.milp_common import gpu_menu, max_positions
from spiderflow.topology import parse_topology
from spiderflow.workload import Job


def topo(clusters, links, name="t"):
    """clusters: {name: (gpu, nodes)}; links: [(a, b, gbps, ms)]."""
    return parse_topology({
        "name": name,
        "clusters": [{"name": n, "gpu": g, "nodes": k, "gpus_per_node": 8} for n, (g, k) in clusters.items()],
        "links": [{"a": a, "b": b, "bandwidth_gbps": bw, "latency_ms": ms} for a, b, bw, ms in links],
    })


def job(model, gpus, batch=256, seq=2048):
    return Job(job_id=f"{model}/{gpus}", arrival_s=0, model=model, gpus=gpus, iterations=1,
               global_batch=batch, seq_len=seq)


def request(t, j, *, free=None, time_limit_s=20.0, load=None):
    return PlacementRequest(job=j, topology=t, free_gpus=free or {c.name: c.total_gpus for c in t.clusters},
                            link_load=load or {}, time_limit_s=time_limit_s, threads=1, seed=0)


def brute_force(req, view):
    """Every ordered placement in the MILP's search space, planned by TPA, scored by ``predict``.

    The space is the one :func:`gpu_menu` defines (each cluster at most once, a GPU count from its
    menu, at most ``max_positions`` segments, exactly ``job.gpus`` GPUs), in every order.
    """
    menu = gpu_menu(req)
    best = None
    for k in range(1, max_positions(req, menu) + 1):
        for chain in itertools.permutations(menu, k):
            for counts in itertools.product(*(menu[c] for c in chain)):
                if sum(counts) != req.job.gpus:
                    continue
                segments = tuple(zip(chain, counts))
                try:
                    t = predict(plan_placement(req.job, segments, view), view).iteration_s
                except InfeasiblePlan:
                    continue
                if best is None or t < best[0]:
                    best = (t, segments)
    return best


LINE = topo({"a": ("a100-80gb", 2), "b": ("v100", 1), "c": ("h100", 1)},
            [("a", "b", 2.0, 20.0), ("b", "c", 5.0, 10.0)], "line")
RING4 = topo({"a": ("a100-40gb", 1), "b": ("h100", 1), "c": ("l40s", 1), "d": ("v100", 2)},
             [("a", "b", 1.0, 30.0), ("b", "c", 6.0, 15.0), ("c", "d", 3.0, 40.0), ("d", "a", 8.0, 5.0),
              ("a", "c", 0.5, 60.0)], "ring4")
TRI = topo({"x": ("rtx4090", 2), "y": ("a100-80gb", 1), "z": ("h100", 1)},
           [("x", "y", 5.9, 6.0), ("y", "z", 3.0, 74.0), ("x", "z", 7.7, 17.0)], "tri")

CASES = [
    (LINE, job("gpt3-1.3b", 24)),  # needs two or three clusters
    (RING4, job("gpt3-2.7b", 16, batch=128)),  # multi-hop a <-> c choices
    (TRI, job("gpt3-6.7b", 24, batch=64)),  # a model that does not fit on consumer cards alone
]


