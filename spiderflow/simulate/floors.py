"""Lower bounds on a trace's completion times that no non-preemptive schedule can beat.

Each job is (arrival, run time, GPUs), its run time the fastest any planner is
granted for it (benchmarks/headline.py: SpinSearch's plan for it alone on the
empty topology). Without a queue every job ends at its arrival plus its run
time. Some jobs cannot share the topology with any other job of the trace
(``exclusive``: its GPUs and any other job's exceed the topology's), e.g. a
128-GPU pretraining run on paper8's 128 GPUs: every job that arrives while it
runs waits for its end, or it waits for theirs. :func:`schedule_floors` keeps
exactly that constraint and drops every other (non-exclusive jobs never delay
one another): exclusive jobs run one at a time, each from its arrival or
later, and every other job runs, as early as it can from its arrival, where no
exclusive job is running. The minimum over every order and start time of the
exclusive jobs, of the sum of completions and, apart, of the last completion,
bounds any real schedule's from below (an offline minimum: it may start an
exclusive job later for jobs that have not arrived yet, which no online
scheduler knows of). ``foresight=False`` gives the same minimum over fewer
schedules, those that never do that: a reference rather than a floor
(:func:`schedule_floors`).

At a minimum each exclusive job starts at its earliest start (its arrival or
the previous exclusive job's end) or at the end of a job that fits in the gap
before it: moved any earlier, that job no longer fits; anywhere between two
such times, starting it earlier only lowers every completion. So only those
start times are tried: (n + 1)^k per order of k exclusive jobs among n, each
pricing the n jobs. At most :data:`MAX_EXCLUSIVE` are kept (the longest), fewer
where k! (n + 1)^k n passes :data:`WORK` (a long trace); the others count as
non-exclusive, which drops constraints and keeps the bound valid (with none
kept, every job ends at its arrival plus its run time).

:func:`trace_floors` gives a trace's floors on a topology, every job's run time
SpinSearch's plan for it alone on the empty topology, as a
:class:`spiderflow.traces.planned.PlannedGpuTime` (the sizing of ``trace
generate --load``) has it, or as a subclass prices that plan (``emulator
compare``'s: on the emulated network, with the ranks' start-up).
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from spiderflow.simulate.metrics import human_count, human_duration, ratio_of
from spiderflow.topology import Topology
from spiderflow.traces.planned import PlannedGpuTime
from spiderflow.wan import WanEvent
from spiderflow.workload import Job

MAX_EXCLUSIVE = 3  # exclusive jobs ordered and placed exactly (k! (n + 1)^k start times at most)
WORK = 20_000_000  # ... fewer where k! (n + 1)^k n passes this (measured: n = 40 and k = 3 0.12 s of CPU,
#                    200 and 2 0.6 s, 4,000 and 1 0.7 s; 5,000 jobs keep none)


@dataclass(frozen=True)
class ScheduleFloors:
    completion_sum_s: float  # the sum of the jobs' completion times (JCT floor: minus the arrivals, over n)
    last_end_s: float  # the last completion (makespan floor: minus the first arrival)
    exclusive: int  # the exclusive jobs ordered exactly


def exclusive_jobs(gpus: Sequence[int], total_gpus: int) -> list[int]:
    """Indices of the jobs that cannot run beside any other job: their GPUs plus any other's exceed the
    topology's (with one job, none: it has nobody to exclude)."""
    if len(gpus) < 2:
        return []
    order = sorted(range(len(gpus)), key=lambda i: gpus[i])
    smallest, second = gpus[order[0]], gpus[order[1]]
    return [i for i, g in enumerate(gpus) if g + (second if i == order[0] else smallest) > total_gpus]


def schedule_floors(jobs: Sequence[tuple[float, float, int]], total_gpus: int,
                    foresight: bool = True) -> ScheduleFloors:
    """Floors under the sum of completions and the last completion of ``jobs`` (arrival s, run s, GPUs)
    on ``total_gpus`` GPUs (module docstring). Without ``foresight``, the same minimum over the schedules that
    never hold an exclusive job back for a job that has not arrived yet: it starts at its earliest start or
    when jobs that had arrived by then end, and it waits for no exclusive job that arrives after it could
    start. That is a reference, not a floor for schedulers without foresight: in a real replay contention
    delays the jobs such a job waits for, and jobs that arrive meanwhile may end before it starts, which
    these times would not let them. It says how far a replay is from what is reachable without foresight."""
    if not jobs:
        raise ValueError("schedule_floors: no jobs")
    excl = exclusive_jobs([g for _, _, g in jobs], total_gpus)
    k, n = min(MAX_EXCLUSIVE, len(excl)), len(jobs)
    while k and math.factorial(k) * (n + 1) ** k * n > WORK:
        k -= 1
    excl = sorted(excl, key=lambda i: -jobs[i][1])[:k]
    keep = set(excl)
    others = [(a, r) for i, (a, r, _) in enumerate(jobs) if i not in keep]
    best = [math.inf, math.inf]  # sum of completions, last completion

    def place(order: tuple[int, ...], m: int, prev_end: float, left: list[tuple[float, float]],
              total: float, last: float) -> None:
        if m == len(order):
            ends = [max(a, prev_end) + r for a, r in left]
            best[0] = min(best[0], total + sum(ends))
            best[1] = min(best[1], max([last, *ends]))
            return
        arrival, run = jobs[order[m]][:2]
        if not foresight and arrival > prev_end and any(jobs[w][0] < arrival for w in order[m + 1:]):
            return  # an exclusive job that had arrived would wait for this one to arrive
        ends = {j: max(a, prev_end) + r for j, (a, r) in enumerate(left)}  # each one's earliest, in the gap before it
        lo = max(arrival, prev_end)
        for start in {lo, *(e for j, e in ends.items() if e > lo and (foresight or left[j][0] <= lo))}:
            fit = [e for e in ends.values() if e <= start]
            rest = [job for j, job in enumerate(left) if ends[j] > start]
            place(order, m + 1, start + run, rest, total + sum(fit) + start + run, max([last, start + run, *fit]))

    for order in itertools.permutations(excl):
        place(order, 0, -math.inf, others, 0.0, -math.inf)
    return ScheduleFloors(completion_sum_s=best[0], last_end_s=best[1], exclusive=len(excl))


def trace_floors(jobs: Sequence[Job], sizer: PlannedGpuTime) -> dict | None:
    """The floors of replaying ``jobs`` on ``sizer``'s topology for a planner whose plans are no faster than
    SpinSearch's for each job alone on the empty topology (``sizer``'s plans, its calibration fitting the
    links as the simulator's): each job runs that long (``sizer.run_s``, a start-up only where the sizer
    prices one), with no other job's load and no overhead, queued only behind a job that no other can run
    beside (:func:`schedule_floors`). A job no plan fits is left out (every scheduler rejects it); None when
    no job fits. Keys, in the simulator summary's units (the first arrival is the trace's):

    - ``jct_floor_s``: the least avg JCT; ``jct_no_foresight_s``: that without foresight (a reference);
      ``jct_floor_alone_s``: the mean run alone (no queue at all);
    - ``makespan_floor_s``: the least span from the first arrival to the last end, and
      ``throughput_ceiling_tokens_per_s`` every job's tokens over it;
    - ``jobs``: the jobs counted; ``exclusive_jobs``: those ordered exactly."""
    counted = [(j, r) for j in jobs if (r := sizer.run_s(j)) is not None]
    if not counted:
        return None
    triples = [(j.arrival_s, r, j.gpus) for j, r in counted]
    total_gpus = sizer.topology.total_gpus
    bound = schedule_floors(triples, total_gpus)
    no_foresight = schedule_floors(triples, total_gpus, foresight=False) if bound.exclusive else None
    n, arrived = len(counted), sum(j.arrival_s for j, _ in counted)
    alone = statistics.fmean(r for _, r in counted)
    span = bound.last_end_s - min(j.arrival_s for j in jobs)
    tokens = sum(j.iterations * j.tokens_per_iteration for j, _ in counted)
    return {"jct_floor_s": (bound.completion_sum_s - arrived) / n if bound.exclusive else alone,
            "jct_no_foresight_s": (no_foresight.completion_sum_s - arrived) / n if no_foresight else alone,
            "jct_floor_alone_s": alone, "makespan_floor_s": span,
            "throughput_ceiling_tokens_per_s": tokens / span if span > 0 else None,
            "jobs": n, "exclusive_jobs": bound.exclusive}


def floor_ratios(summary: dict, floors: dict) -> tuple[float | None, float | None]:
    """A replay's avg JCT over the JCT floor and the throughput ceiling over its throughput (1.00: there;
    None where the summary has no figure): the floor columns of both compare commands' tables."""
    return (ratio_of(summary["avg_jct_s"], floors["jct_floor_s"]),
            ratio_of(floors["throughput_ceiling_tokens_per_s"], summary["throughput_tokens_per_s"]))


def faster_link(topology: Topology, wan_events: Sequence[WanEvent]) -> str:
    """The first WAN event that gives a link more bandwidth or less latency than ``topology`` has, said in a
    few words; "" when none does. Then every link stays at most as fast as the topology has it (an outage
    only takes it away), capacity events only take GPUs away for a while, and a stop only adds its restart
    cost: no job runs faster than its plan alone on the empty topology, and :func:`trace_floors` hold."""
    links = {link.key: link for link in topology.links}
    for e in wan_events:
        link = links[e.key]
        if e.bandwidth_gbps is not None and e.bandwidth_gbps > link.bandwidth_gbps:
            return (f"{e.a}-{e.b} at {e.time_s:g} s has {e.bandwidth_gbps:g} Gbit/s, over the topology's "
                    f"{link.bandwidth_gbps:g}")
        if e.latency_ms is not None and e.latency_ms < link.latency_ms:
            return f"{e.a}-{e.b} at {e.time_s:g} s has {e.latency_ms:g} ms, under the topology's {link.latency_ms:g}"
    return ""


def floors_text(floors: dict | None, jobs: int, faster: str = "", *, events: bool = False, priced: str = "",
                source: str = "spiderflow/simulate/floors.py") -> str:
    """What the floor columns compare with, in one paragraph (or why there are none: ``faster``, from
    :func:`faster_link`); ``events``: the run had WAN or capacity events; ``priced`` says how SpinSearch's plan
    for a job alone is priced where the topology's figures are not all (``emulator compare``'s floors),
    ``source`` where the floors are made."""
    if faster:
        return (f"No floors: a WAN event makes a link faster than the topology's figures, which the floors plan on "
                f"({faster}).")
    if floors is None:
        return "No floors: no job has a plan on the empty topology."
    no_foresight = ("" if floors["jct_no_foresight_s"] == floors["jct_floor_s"] else
                    f" ({human_duration(floors['jct_no_foresight_s'])} without holding a job back for jobs yet to "
                    "arrive, a reference rather than a floor)")
    ceiling = floors["throughput_ceiling_tokens_per_s"]
    return (f"Floors ({floors['jobs']} of {jobs} jobs, those a plan fits): avg JCT >= "
            f"{human_duration(floors['jct_floor_s'])}{no_foresight}, throughput <= "
            f"{'n/a' if ceiling is None else human_count(ceiling, 'tokens/s')}, for any planner whose plan for "
            f"a job is no faster than SpinSearch's for it alone on the empty topology{priced}: every job runs that "
            "long, with no other job's load and no overhead, queued only behind a job no other can run beside "
            f"({source})." + (" This run's WAN and capacity events only slow links and take GPUs away for a "
                              "while, so the floors hold under them." if events else ""))
