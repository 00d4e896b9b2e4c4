"""What the simulator does when the WAN or the GPU pool changes under running jobs (issue 19).

Semantics in full: docs/wan-events.md. In short:

- **WAN event**: the link's figures change (:class:`NetworkState` builds the topology with every
  link's current figures; a down link stays in the graph as a *dead* link, ``DEAD_BANDWIDTH_GBPS``
  and ``DEAD_LATENCY_MS``, so routing avoids it wherever another route exists and every planner
  still sees a connected graph; the scheduler refuses any plan whose routes cross it). Running jobs
  are re-routed on the new routes and re-priced from their progress; a job whose route has no way
  around a dead link is stopped and re-queued (a forced re-plan).
- **Capacity event**: at the notice the cluster's free GPUs leave the pool (up to the number
  announced); at ``time_s`` the rest is taken from the jobs running there (the latest started
  first), which are stopped and re-queued; at ``return_s`` the GPUs come back.
- A stopped job keeps its progress (it checkpoints when stopped) and pays
  :func:`restart_cost_s` before its first iteration on its new placement; one stopped before its first
  iteration since its latest start pays less (:func:`resume_cost_s`: nothing on its first start-up).
- **Voluntary re-planning** (SpinSearch only, ``SimConfig.replan``): after a WAN event, a running
  job whose iteration time is more than ``replan_threshold`` times the one it had when it was
  (re)placed is planned again on its GPUs plus the free ones; so is, once a down link is back up or
  withdrawn GPUs come back (and the queued jobs have had their pass), a running job that was
  (re)placed while the network was impaired (a link down or GPUs withdrawn). Either moves when the
  time that saves on its remaining iterations exceeds what the move delays its next iteration by
  (:func:`move_delay_s`: the restart cost as for a stop, :func:`resume_cost_s`, and the new
  placement's start-up, less what it had still to wait where it is). A job still starting up or
  paying a restart cost is planned again too (the emulator's rule: its ranks are launching or
  waiting); the latter keeps the checkpoint it is saving.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from spiderflow.costmodel import TopologyView
from spiderflow.scheduling import crosses
from spiderflow.simulate.flows import plan_routes
from spiderflow.topology import Topology
from spiderflow.wan import CapacityEvent, WanEvent
from spiderflow.workload import OPTIMIZER_BYTES_PER_PARAM, WEIGHT_BYTES_PER_PARAM, Job

# A checkpoint holds the bf16 weights and the fp32 master weights, momentum and variance: 2 + 12
# bytes per parameter (Rajbhandari et al., SC'20, ZeRO, sec. 3.1); gradients are not saved.
CHECKPOINT_BYTES_PER_PARAM = WEIGHT_BYTES_PER_PARAM + OPTIMIZER_BYTES_PER_PARAM
# Assumptions, not measurements (SimConfig fields, so a study can vary them): a job writes its
# checkpoint to its region's object store at 20 Gbit/s (2.5 GB/s, the order of what one client
# sustains with parallel multipart uploads) and its new placement reads it back across regions at
# 10 Gbit/s (many parallel TCP streams over the provider backbone, faster than one training flow).
CHECKPOINT_SAVE_GBPS = 20.0
CHECKPOINT_LOAD_GBPS = 10.0
# SpinSearch re-plans a running job whose iteration time grew past this multiple of the one it had
# when placed: far enough that the diurnal swing of a link (30% by default in `wan generate`) alone
# does not trigger it, close enough that an outage's detour or a halved link does.
REPLAN_THRESHOLD = 1.5
REPLANNING = ("spinsearch",)  # planners that may move a running job by choice; the baselines do not
# A dead link: below the topology loader's minimum bandwidth (1e-6 Gbit/s) and longer than any route
# of live links (at most 4,096 links of at most 60,000 ms each: 2.5e8 ms), so both routing rules
# avoid it whenever another route exists.
DEAD_BANDWIDTH_GBPS = 1e-9
DEAD_LATENCY_MS = 1e9

GBPS = 1e9 / 8  # bytes/s per Gbit/s
WAN, NOTICE, WITHDRAW, RETURN = "wan", "notice", "withdraw", "return"  # the change events' kinds

if TYPE_CHECKING:
    from spiderflow.simulate.engine import Simulation, SimRecord


def checkpoint_bytes(job: Job) -> float:
    return float(job.spec.params * CHECKPOINT_BYTES_PER_PARAM)


def restart_cost_s(job: Job, *, notice_s: float = 0.0, save_gbps: float = CHECKPOINT_SAVE_GBPS,
                   load_gbps: float = CHECKPOINT_LOAD_GBPS) -> float:
    """Seconds a stopped job needs before its first iteration on a new placement: saving its
    checkpoint, less the part a notice period hides (the job checkpoints as the notice arrives and
    trains on meanwhile), plus reading it back."""
    nbytes = checkpoint_bytes(job)
    save_s = nbytes / (save_gbps * GBPS)
    return max(0.0, save_s - notice_s) + nbytes / (load_gbps * GBPS)


def resume_cost_s(job: Job, *, iterated: bool, trained: bool, restart_left_s: float = 0.0, notice_s: float = 0.0,
                  save_gbps: float = CHECKPOINT_SAVE_GBPS, load_gbps: float = CHECKPOINT_LOAD_GBPS) -> float:
    """Seconds of checkpointing a job that a change stops, or SpinSearch moves, needs before its first
    iteration on the new placement (its start-up aside: :func:`move_delay_s` counts that).

    - One that has ``iterated`` since its latest start pays the whole :func:`restart_cost_s` (a notice
      hides part of the save).
    - One that has not, and has never ``trained`` (its first start-up), pays nothing: it has no state to
      save or read back, and starts afresh on the new placement as it first did.
    - One that has not, but trained before (placed again after a change, and paying its restart cost,
      ``restart_left_s`` of it left, or starting up after it) has trained nothing since its checkpoint:
      it pays what is left of the save (a restart cost is the save, then the load) and a whole load at
      the new placement."""
    if iterated:
        return restart_cost_s(job, notice_s=notice_s, save_gbps=save_gbps, load_gbps=load_gbps)
    if not trained:
        return 0.0
    load_s = checkpoint_bytes(job) / (load_gbps * GBPS)
    return max(0.0, restart_left_s - load_s) + load_s


def move_delay_s(cost_s: float, startup_s: float, until_iteration_s: float) -> float:
    """What a move delays a job's next iteration by: the checkpointing it needs (:func:`resume_cost_s`)
    and the new placement's start-up, less what it had still to wait where it is before its next
    iteration (the rest of a restart cost and of a start-up; 0 for a job iterating)."""
    return cost_s + startup_s - until_iteration_s


class NetworkState:
    """Every link's current figures, and the topology they make (the planned one and the priced one)."""

    def __init__(self, topology: Topology, priced: Topology) -> None:
        self.base, self.base_priced = topology, priced
        self.links = {l.key: (l.bandwidth_gbps, l.latency_ms, True) for l in topology.links}

    def apply(self, ev: WanEvent) -> None:
        bw, lat, _ = self.links[ev.key]
        self.links[ev.key] = (bw if ev.bandwidth_gbps is None else ev.bandwidth_gbps,
                              lat if ev.latency_ms is None else ev.latency_ms, ev.up)

    @property
    def down(self) -> frozenset:
        return frozenset(key for key, (_, _, up) in self.links.items() if not up)

    def figures(self, key: tuple[str, str]) -> tuple[float, float]:
        """(bandwidth_gbps, latency_ms) the link has now (dead figures when down)."""
        bw, lat, up = self.links[key]
        return (bw, lat) if up else (DEAD_BANDWIDTH_GBPS, DEAD_LATENCY_MS)

    def _build(self, topo: Topology) -> Topology:
        links = []
        for link in topo.links:
            bw, lat = self.figures(link.key) if link.key in self.links else (link.bandwidth_gbps, link.latency_ms)
            links.append(replace(link, bandwidth_gbps=bw, latency_ms=lat))
        return replace(topo, links=tuple(links))  # a fresh route cache (Topology._routes is init=False)

    def topologies(self) -> tuple[Topology, Topology]:
        planned = self._build(self.base)
        return planned, (planned if self.base_priced is self.base else self._build(self.base_priced))


class CapacityPool:
    """GPUs withdrawn per cluster, and GPUs owed: announced but still in use until ``time_s``."""

    def __init__(self) -> None:
        self.withdrawn: dict[str, int] = {}
        self.owed: dict[str, int] = {}
        self.taken: dict[int, int] = {}  # id(event) -> GPUs it withdrew (what its return gives back)

    @property
    def impaired(self) -> bool:
        return any(self.withdrawn.values()) or any(self.owed.values())

    def announce(self, ev: CapacityEvent, free: dict[str, int], total: int) -> None:
        """The notice: up to ``ev.gpus`` GPUs (at most what the cluster still has) will go; its
        free ones leave the pool now."""
        c = ev.cluster
        amount = min(ev.gpus, total - self.withdrawn.get(c, 0) - self.owed.get(c, 0))
        self.taken[id(ev)] = amount
        self.owed[c] = self.owed.get(c, 0) + amount
        self.settle(free)

    def settle(self, free: dict[str, int]) -> None:
        """Free GPUs go to what is owed first (a job ending during a notice gives its GPUs up)."""
        for c, owed in self.owed.items():
            take = min(owed, free[c])
            if take:
                free[c] -= take
                self.owed[c] -= take
                self.withdrawn[c] = self.withdrawn.get(c, 0) + take

    def give_back(self, ev: CapacityEvent, free: dict[str, int]) -> None:
        amount = self.taken.pop(id(ev), 0)
        c = ev.cluster
        back = min(amount, self.withdrawn.get(c, 0))
        self.withdrawn[c] = self.withdrawn.get(c, 0) - back
        free[c] += back


class Changes:
    """Applies a simulation's WAN and capacity events (module docstring) through its scheduler."""

    def __init__(self, sim: "Simulation") -> None:
        self.sim = sim
        self.net = NetworkState(sim.sched.topo, sim.priced)
        self.pool = CapacityPool()
        self.lifted = False  # a link came back up or GPUs came back since the last re-planning

    def push_all(self, events, priority: int) -> None:
        cfg = self.sim.cfg
        for ev in cfg.wan_events:
            events.push(ev.time_s, (WAN, ev), priority=priority)
        for ev in cfg.capacity_events:
            events.push(ev.notice_at_s, (NOTICE, ev), priority=priority)
            events.push(ev.time_s, (WITHDRAW, ev), priority=priority)
            if ev.return_s is not None:
                events.push(ev.return_s, (RETURN, ev), priority=priority)

    def resume_s(self, rec: SimRecord, now: float, notice_s: float = 0.0) -> float:
        """:func:`resume_cost_s` of running ``rec`` stopped or moved at ``now``."""
        cfg = self.sim.cfg
        iterated = now > rec.iterating_s
        return resume_cost_s(rec.job, iterated=iterated, trained=iterated or rec.remaining < rec.job.iterations,
                             restart_left_s=max(0.0, rec.restart_until_s - now), notice_s=notice_s,
                             save_gbps=cfg.checkpoint_save_gbps, load_gbps=cfg.checkpoint_load_gbps)

    def apply(self, kind: str, ev, now: float) -> bool:
        """Apply one change at ``now``; True when running jobs' flows or iteration times moved."""
        sched = self.sim.sched
        changed = False
        if kind == WAN:
            changed = self._wan(ev, now)
        elif kind == NOTICE:
            self.pool.announce(ev, sched.free, sched.topo.cluster(ev.cluster).total_gpus)
        elif kind == WITHDRAW:
            changed = self._withdraw(ev, now)
        else:
            self.pool.give_back(ev, sched.free)
            self.lifted = True
        sched.impaired = bool(self.net.down) or self.pool.impaired
        return changed

    def _wan(self, ev: WanEvent, now: float) -> bool:
        sim, down_before = self.sim, self.net.down
        self.net.apply(ev)
        topo, priced = self.net.topologies()
        down = self.net.down
        sim.priced = priced
        sim.capacity = {l.key: l.bandwidth_gbps for l in priced.links}
        sim.sched.set_network(topo, down)
        went_down = ev.key in down and ev.key not in down_before
        self.lifted |= ev.key in down_before and ev.key not in down
        changed = False
        for rec in list(sim.running):
            sim.changed(rec, now)  # as the emulator marks every job running when a WAN change is in force
            routes = plan_routes(rec.plan, topo)
            if crosses(routes, down) is not None:  # no way around a dead link: stop, re-plan
                sim.stop(rec, now, self.resume_s(rec, now))
                changed = True
                continue
            used = any(ev.key in route for route in rec.routes)
            if routes == rec.routes and not used:
                continue  # neither its routes nor its links' figures moved
            rec.rerouted += went_down and used
            rec.routes = routes
            view = TopologyView(topology=priced, calibration=sim.cfg.calibration)
            rec.pricer = sim._repricer(rec.plan, view)
            rec.alone_iteration_s = sim._price(rec, view)
            rec.shares, rec.shared_estimates = (), {}  # re-estimated by the reshare that follows
            sim.flows_changed = changed = True
        return changed

    def _withdraw(self, ev: CapacityEvent, now: float) -> bool:
        """The GPUs go: what the notice could not take from the free pool is taken from the jobs
        running in the cluster, the latest started first."""
        sim, c = self.sim, ev.cluster
        self.pool.settle(sim.sched.free)
        changed = False
        for rec in reversed(list(sim.running)):
            if not self.pool.owed.get(c, 0):
                break
            if rec.placement.get(c, 0):
                sim.stop(rec, now, self.resume_s(rec, now, ev.notice_s))
                self.pool.settle(sim.sched.free)
                changed = True
        return changed

    def replan(self, kind: str, now: float) -> bool:
        """SpinSearch's voluntary re-planning after a change (module docstring): the jobs a WAN event
        slowed past the threshold, and once an impairment lifted, those placed under it; True if a
        job moved."""
        sim = self.sim
        cfg, sched = sim.cfg, sim.sched
        lifted, self.lifted = self.lifted, False
        if (kind != WAN and not lifted) or not cfg.replan or sched.cfg.planner_name not in REPLANNING:
            return False
        moved = False
        for rec in list(sim.running):
            if rec.iteration_s is None or rec.placed_iteration_s is None:
                continue  # not priced yet
            slowed = kind == WAN and rec.iteration_s > cfg.replan_threshold * rec.placed_iteration_s
            if not (slowed or (lifted and rec.placed_impaired)):
                continue
            found = sched.replan(rec)
            if found is None or found[0].plan.placement == rec.placement:
                continue
            placement, iteration_s = found
            cost = self.resume_s(rec, now)
            delay = move_delay_s(cost, sim.startup_of(placement.plan), max(0.0, rec.iterating_s - now))
            if rec.remaining * (rec.iteration_s - iteration_s) <= delay:
                continue  # the move would not pay for itself
            sched.move(rec, placement)
            sim.moved(rec, now, cost)
            moved = True
        return moved
