"""A job's start-up on the emulated network: what it costs before its iterations run at their pace.

The cost model prices steady-state iterations. A replayed job also pays, once:

- a fixed cost in wall seconds (forking the ranks from the pool, their
  ``init_process_group``, exiting and being seen to exit): about
  :data:`FIXED_WALL_S`, measured on this machine for one-cluster jobs
  (0.02-0.04 s real-equivalent at dilation 4);
- the rendezvous over the WAN: the c10d store on rank 0 and gloo's full
  mesh, whose set-up waits on round trips to rank 0 and between every pair
  of ranks, sequentially per rank: :data:`RENDEZVOUS_RTTS` +
  :data:`RENDEZVOUS_RTTS_PER_RANK` x ranks round trips of the job's widest
  round trip (real-equivalent: the wire's delays are dilated with the rest);
- the first transfers on fresh TCP connections, which start in slow start:
  :data:`RAMP_RTTS` round trips of each WAN hop between the plan's stages.

Fitted on ``emulator compare`` runs of ``traces/paper8-16.csv`` on paper8 at
dilation 4 (six WAN jobs of 2 to 10 ranks, round trips of 8 to 131 ms:
start-up plus the first iteration's excess were 15 to 60 round trips; the
model is within about 25% of each), see docs/emulator-run.md. The
simulator's replay of an emulator run (:mod:`emulator.compare`) adds it to
each job; the cost model itself does not.
"""

from __future__ import annotations

from spiderflow.plan import Plan
from spiderflow.topology import Topology

FIXED_WALL_S = 0.1
RENDEZVOUS_RTTS = 2.0
RENDEZVOUS_RTTS_PER_RANK = 4.0
RAMP_RTTS = 10.0


def rtt_s(topology: Topology, a: str, b: str) -> float:
    """Round trip between two clusters along the topology's route, seconds (0 within a cluster)."""
    return 0.0 if a == b else 2.0 * topology.path(a, b).latency_ms / 1000.0


def wan_hops(plan: Plan) -> set[tuple[str, str]]:
    """Cluster pairs that exchange data: pipeline boundaries, and a stage's replicas in other clusters."""
    hops = set()
    for rep in plan.replicas:
        for s, t in zip(rep, rep[1:]):
            if s.cluster != t.cluster:
                hops.add(tuple(sorted((s.cluster, t.cluster))))
    for i in range(len(plan.replicas[0])):
        clusters = sorted({rep[i].cluster for rep in plan.replicas})
        hops.update((a, b) for a, b in zip(clusters, clusters[1:]))
    return hops


def startup_s(plan: Plan, topology: Topology, dilation: float) -> float:
    """Real-equivalent seconds from a job's launch to its iterations' steady pace (module docstring)."""
    clusters = sorted(plan.placement)
    widest = max((rtt_s(topology, a, b) for a in clusters for b in clusters), default=0.0)
    ranks = sum(len(rep) for rep in plan.replicas)
    ramp = sum(rtt_s(topology, a, b) for a, b in wan_hops(plan))
    return FIXED_WALL_S / dilation + (RENDEZVOUS_RTTS + RENDEZVOUS_RTTS_PER_RANK * ranks) * widest * (widest > 0) \
        + RAMP_RTTS * ramp
