"""How a running plan's traffic becomes flows on WAN links (for max-min fair sharing).

A plan puts traffic on the WAN in two ways:

- **pipeline**: each stage boundary whose two stages sit in different
  clusters sends activations forward and gradients backward along the route
  between them (one flow per distinct route; forward and backward share it);
- **gradient sync**: each stage whose replicas span clusters all-reduces over
  a ring of those clusters: one flow per ring hop's route.

Every flow is elastic (TCP-like, no demand cap): concurrent jobs split each
link max-min fairly (:mod:`spiderflow.simulate.fairshare`). A job's usable
bandwidth on a link is what the *other* jobs' flows leave of it (capacity
minus their max-min rates): alone, a job has every link whole, and its own
transfers take turns on it as the cost model's schedule already has them.
Its iteration time is recomputed from those per-link bandwidths with the cost
model. Links inside clusters are not shared between jobs (each job has its own
GPUs' NICs).
"""

from __future__ import annotations

from spiderflow.plan import Plan
from spiderflow.topology import Topology

LinkKey = tuple[str, str]


def plan_routes(plan: Plan, topology: Topology) -> list[tuple[LinkKey, ...]]:
    """Distinct WAN routes (as tuples of link keys) the plan's traffic uses."""
    pairs: set[tuple[str, str]] = set()
    for rep in plan.replicas:
        for a, b in zip(rep, rep[1:]):
            if a.cluster != b.cluster:
                pairs.add((a.cluster, b.cluster))
    for i in range(plan.depth):
        ring = list(dict.fromkeys(rep[i].cluster for rep in plan.replicas))
        if len(ring) > 1:
            for a, b in zip(ring, ring[1:] + ring[:1]):
                pairs.add((a, b))
    routes = []
    seen: set[tuple[LinkKey, ...]] = set()
    for a, b in sorted(pairs):
        key = tuple(sorted(l.key for l in topology.path(a, b).links))
        if key and key not in seen:
            seen.add(key)
            routes.append(key)
    return routes
