"""Max-min fair rates of flows sharing links (progressive filling / water-filling).

Every flow crosses a set of links; a link's capacity is shared by the flows on
it. The max-min fair allocation is the one where no flow can get more without
taking from a flow that has no more than it (Bertsekas & Gallager, "Data
Networks", 2nd ed., sec. 6.5.2). Progressive filling finds it: raise every
flow's rate together; a flow stops when it reaches its demand or when a link it
crosses fills up (that link is its *bottleneck*); the others keep rising.

This implementation raises a common "water level" and keeps a heap of the next
level at which something stops: each link's fill level (remaining capacity /
flows still rising on it) and each flow's demand. Popping the lowest level
freezes that link's rising flows (or that one flow); each frozen flow updates
the links on its path and re-pushes their fill levels (stale heap entries are
skipped). Levels only rise, so every flow freezes once.

Complexity: O((P + F + L) log(P + F + L)) time and O(P + F + L) memory for F
flows, L links and P = the summed path lengths (each flow-link incidence
updates one link and pushes one heap entry). The naive round-based filling is
O(F x P).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Hashable, Mapping, Sequence
from typing import TypeVar

K = TypeVar("K", bound=Hashable)  # link key
F = TypeVar("F", bound=Hashable)  # flow key


def _check(capacity: Mapping, flows: Mapping, demand: Mapping | None) -> None:
    for link, cap in capacity.items():
        if isinstance(cap, bool) or not isinstance(cap, (int, float)) or math.isnan(cap) or cap < 0 \
                or math.isinf(cap):
            raise ValueError(f"capacity[{link!r}] must be a finite number >= 0 (got {cap!r})")
    for flow, path in flows.items():
        if isinstance(path, (str, bytes)):
            raise ValueError(f"flows[{flow!r}] must be a sequence of link keys, not a string (got {path!r})")
        for link in path:
            if link not in capacity:
                raise ValueError(f"flows[{flow!r}] crosses link {link!r}, which has no capacity")
    for flow, want in (demand or {}).items():
        if flow not in flows:
            raise ValueError(f"demand[{flow!r}] names no flow")
        if isinstance(want, bool) or not isinstance(want, (int, float)) or math.isnan(want) or want < 0:
            raise ValueError(f"demand[{flow!r}] must be a number >= 0 or math.inf (got {want!r})")


def max_min_fair_share(capacity: Mapping[K, float], flows: Mapping[F, Sequence[K]],
                       demand: Mapping[F, float] | None = None) -> dict[F, float]:
    """Each flow's max-min fair rate, in the units of ``capacity``.

    ``flows`` maps a flow to the links it crosses (a link listed twice counts
    once); ``demand`` caps a flow's rate (missing or ``math.inf``: unlimited).
    A flow that crosses no link gets its demand, which must then be finite.
    Rates are returned for every flow, in ``flows`` order. Raises ValueError
    on a negative, NaN or infinite capacity, a negative or NaN demand, or a
    path naming an unknown link.
    """
    _check(capacity, flows, demand)
    demand = demand or {}
    paths: dict[F, tuple[K, ...]] = {f: tuple(dict.fromkeys(p)) for f, p in flows.items()}
    on_link: dict[K, list[F]] = {}
    for f, path in paths.items():
        for link in path:
            on_link.setdefault(link, []).append(f)
        if not path and not math.isfinite(demand.get(f, math.inf)):
            raise ValueError(f"flows[{f!r}] crosses no link and has no finite demand; its rate would be "
                             "unbounded: give it a link or a demand")

    rate: dict[F, float] = {}
    remaining: dict[K, float] = {link: float(capacity[link]) for link in on_link}
    rising: dict[K, int] = {link: len(fs) for link, fs in on_link.items()}
    version: dict[K, int] = dict.fromkeys(on_link, 0)
    order = itertools.count()  # tie-break: deterministic, never compares keys
    heap: list[tuple[float, int, int, object, int]] = []  # (level, kind 0=demand 1=link, seq, key, version)
    for f in paths:
        want = demand.get(f, math.inf)
        if math.isfinite(want):
            heap.append((float(want), 0, next(order), f, 0))
    for link in on_link:
        heap.append((remaining[link] / rising[link], 1, next(order), link, 0))
    heapq.heapify(heap)

    level = 0.0

    def freeze(f: F, at: float) -> None:
        rate[f] = at
        for link in paths[f]:
            remaining[link] -= at
            rising[link] -= 1
            version[link] += 1
            if rising[link] > 0:
                # Mathematically >= at; max() guards against rounding pulling it below.
                fill = max(remaining[link] / rising[link], at)
                heapq.heappush(heap, (fill, 1, next(order), link, version[link]))

    while heap and len(rate) < len(paths):
        at, kind, _, key, ver = heapq.heappop(heap)
        level = max(level, at)
        if kind == 0:
            if key not in rate:
                freeze(key, level)  # type: ignore[arg-type]
        elif ver == version[key] and rising[key] > 0:  # type: ignore[index]
            for f in on_link[key]:  # type: ignore[index]
                if f not in rate:
                    freeze(f, level)
    return {f: rate[f] for f in paths}
