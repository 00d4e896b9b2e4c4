"""What a replay does when the WAN or the GPU pool changes under its running jobs (issue 19).

The simulator's semantics (:mod:`spiderflow.simulate.changes`, docs/wan-events.md), on
real ranks:

- **WAN event** (put in force on the wire by :mod:`emulator.jobs.wanplay`): the
  scheduler plans on the changed network from then on. A running job whose
  traffic has another route keeps running: the routers already send it round
  the down link (``rerouted``). A job whose route has no way round a down link
  is **stopped** (its ranks ended, its progress kept) and re-queued.
- **Capacity event** (``--capacity-events``; its times, the notice included, are
  compressed like arrivals): at the
  notice the cluster's free GPUs leave the pool, at ``time_s`` the rest is
  taken from the jobs running there (latest started first), which are
  stopped and re-queued; at ``return_s`` the GPUs come back.
- A stopped job is placed again by the same scheduler; its new ranks run the
  iterations it had left and start after the **restart cost**
  (:func:`spiderflow.simulate.changes.resume_cost_s`, real-equivalent seconds,
  x K on the wall: the whole restart cost for a job stopped while its ranks
  iterate, nothing on its first start-up), holding their GPUs and hosts
  meanwhile, as the simulator charges it.

- **Voluntary re-planning** (SpinSearch only, ``RunConfig.replan``): once a
  change is in force and the queued jobs have had their scheduling pass, a
  running job is planned again on its GPUs plus the free ones, its ranks
  fitting its hosts plus the free ones (``Scheduler.replan``), when a WAN
  change made its predicted iteration time more than
  :data:`~spiderflow.simulate.changes.REPLAN_THRESHOLD` times its prediction
  when it was (re)placed, or when a down link is back up or withdrawn GPUs
  came back and it was (re)placed while the network was impaired (a link down
  or GPUs withdrawn); a job whose ranks wait out a restart cost is planned
  again too. It **moves** when the time that saves on the iterations it has
  left (counted from its ranks' lines) exceeds what the move delays them by
  (``move_delay_s``: the restart cost as for a stop, ``resume_cost_s``, and the
  new placement's start-up, less what it had still to wait where it is): its
  ranks, if started, are ended, and its new ranks start on the
  new placement after that cost, as a stopped job's do. The simulator does the
  same, hosts counted (the simulated replay of ``emulator compare``).
"""

from __future__ import annotations

from collections.abc import Sequence

from emulator.jobs.startup import startup_s
from spiderflow.scheduling import crosses
from spiderflow.plan import placement_text
from spiderflow.simulate.changes import REPLAN_THRESHOLD, REPLANNING, CapacityPool, move_delay_s, resume_cost_s
from spiderflow.simulate.flows import plan_routes
from spiderflow.wan import CapacityEvent

NOTICE, WITHDRAW, RETURN = "notice", "withdraw", "return"


class ReplayChanges:
    """Applies WAN changes (already on the wire) and capacity events to a :class:`Runner`'s jobs."""

    def __init__(self, runner, capacity_events: Sequence[CapacityEvent] = ()) -> None:
        self.runner = runner
        self.pool = CapacityPool()
        self.down: frozenset = frozenset()
        self.lifted: list[str] = []  # links back up and GPUs back since the last re-planning, as logged
        self.wan_changed = False  # a WAN change came in force since the last re-planning
        steps = []
        for ev in capacity_events:
            steps.append((ev.notice_at_s, NOTICE, ev))
            steps.append((ev.time_s, WITHDRAW, ev))
            if ev.return_s is not None:
                steps.append((ev.return_s, RETURN, ev))
        # (replay-clock time, kind, event): trace times compressed like arrivals
        self.steps = sorted(((t / runner.cfg.time_scale, kind, ev) for t, kind, ev in steps),
                            key=lambda s: s[0])

    def network_changed(self, applied) -> None:
        """The routing topology and down links of a batch that is now in force on the wire."""
        r = self.runner
        went_down = applied.down - self.down
        self.lifted += [f"{'-'.join(key)} is back up" for key in sorted(self.down - applied.down)]
        self.down = applied.down
        r.topo = applied.topology
        r.sched.set_network(applied.topology, applied.down)
        self._impaired()
        r._dirty = True
        for j in list(r.sched.running):
            routes = plan_routes(j.plan, applied.topology)
            dead = crosses(routes, applied.down)
            if dead is not None:
                r.stop(j, self._resume_s(j), why=f"its route crosses {'-'.join(dead)}, which is down, "
                                                 "with no way round")
                continue
            if went_down and any(key in went_down for route in j.routes for key in route):
                j.rerouted += 1
            j.routes = routes
            j.changed_t = applied.in_force_t
            if j.first_changed_t is None:
                j.first_changed_t = applied.in_force_t
            j.predicted_after_s = r.predict_now(j)
        self.wan_changed = True

    def replan(self) -> None:
        """After the scheduling pass that follows a change: SpinSearch's voluntary re-planning of the
        jobs a WAN change slowed, and once an impairment lifted, of those placed under it (module
        docstring), as the simulator's ``Changes.replan`` does after its pass."""
        r = self.runner
        wan, self.wan_changed = self.wan_changed, False
        lifted, self.lifted = self.lifted, []
        if not (wan or lifted) or not r.cfg.replan or r.sched.cfg.planner_name not in REPLANNING:
            return
        # a job paying its restart cost (ranks waiting) is planned again too, as one starting up is
        for j in [j for j in r.sched.running if j.placed_s is not None]:
            if wan and j.predicted_after_s is not None and j.predicted_after_s > REPLAN_THRESHOLD * j.placed_s:
                self._move_if_it_pays(j, j.predicted_after_s, (
                    f"the change made it {j.predicted_after_s / j.placed_s:.2f}x slower "
                    f"({j.predicted_after_s:.3f} s/iteration)"))
            elif lifted and j.placed_impaired:
                now_s = r.predict_now(j)
                self._move_if_it_pays(j, now_s, f"placed while the network was impaired ({now_s:.3f} s/iteration "
                                                f"there), and {', '.join(lifted)}")

    def _move_if_it_pays(self, j, now_s: float, why: str) -> None:
        """Plan running ``j`` again; move it when the time the new plan saves over the iterations it has
        left (at ``now_s`` an iteration where it is) exceeds what the move delays its next iteration by
        (:func:`~spiderflow.simulate.changes.move_delay_s`): the restart cost as for a stop, the new
        placement's start-up, less what it had still to wait where it is."""
        r = self.runner
        found = r.sched.replan(j)
        if found is None or found[0].plan.placement == j.placement:
            return
        placement = found[0]
        new_s = r.predict_on(placement.plan, j)
        left = r.iterations_left(j)  # its ranks' lines, read once for what follows
        iterated = self._iterated(j, left)
        cost, until = self._resume_s(j, iterated=iterated), self._until_iteration_s(j, iterated)
        startup = startup_s(placement.plan, r.topo, r.k)
        delay = move_delay_s(cost, startup, until)
        saved = left * (now_s - new_s)
        if saved <= delay:
            return  # the move would not pay for itself
        than = ((f"the {delay:.1f} s it delays its next iteration by" if delay > 0 else
                 "what the move costs it: its next iteration comes no later") +
                f" ({cost:.1f} s of checkpoint and {startup:.1f} s of start-up there"
                + (f", less the {until:.1f} s it had still to wait here)" if until else ")"))
        r.move(j, placement, cost, why=(
            f"{why}; on {placement_text(placement.segments)} {new_s:.3f} s/iteration saves {saved:.1f} s "
            f"over its {left} iterations left, more than {than}"))

    def _iterated(self, j, left: int | None = None) -> bool:
        """Whether running ``j``'s ranks of this attempt finished an iteration (by their lines here;
        ``left``: its ``iterations_left``, where the caller has read them already)."""
        if j.pending is not None:
            return False
        r = self.runner
        return (r.iterations_left(j) if left is None else left) < r.cfg.iterations - j.done_before

    def _resume_s(self, j, notice_s: float = 0.0, *, iterated: bool | None = None) -> float:
        """:func:`~spiderflow.simulate.changes.resume_cost_s` of running ``j`` stopped or moved now."""
        iterated = self._iterated(j) if iterated is None else iterated
        restart_left = max(0.0, j.launch_at - self.runner.now()) if j.pending is not None else 0.0
        return resume_cost_s(j.job, iterated=iterated, trained=iterated or j.done_before > 0,
                             restart_left_s=restart_left, notice_s=notice_s)

    def _until_iteration_s(self, j, iterated: bool) -> float:
        """Real-equivalent seconds running ``j`` had still to wait for its next iteration where it is: the
        rest of a restart cost its ranks wait out, then their predicted start-up (``startup_s``), or of
        that start-up once they launched; 0 once they iterate (``iterated``: :meth:`_iterated`)."""
        r = self.runner
        if iterated or (j.pending is None and j.launched_t is None):
            return 0.0
        startup = startup_s(j.plan, r.topo, r.k)
        if j.pending is not None:
            return max(0.0, j.launch_at - r.now()) + startup
        return max(0.0, j.launched_t + startup - r.now())

    def due(self, now: float) -> None:
        """Apply the capacity steps due by ``now`` (the replay's clock)."""
        r = self.runner
        while self.steps and self.steps[0][0] <= now:
            _t, kind, ev = self.steps.pop(0)
            free = r.sched.free
            if kind == NOTICE:
                self.pool.announce(ev, free, r.sched.topo.cluster(ev.cluster).total_gpus)
                r.log(f"capacity: {ev.cluster} loses {ev.gpus} GPU(s) in {ev.notice_s:g} s (notice)")
            elif kind == WITHDRAW:
                self.pool.settle(free)
                for j in reversed(list(r.sched.running)):
                    if not self.pool.owed.get(ev.cluster, 0):
                        break
                    if j.placement.get(ev.cluster, 0):
                        r.stop(j, self._resume_s(j, notice_s=ev.notice_s / r.cfg.time_scale),
                               why=f"{ev.cluster}'s GPUs were withdrawn")
                        self.pool.settle(free)
                r.log(f"capacity: {ev.cluster}: {self.pool.withdrawn.get(ev.cluster, 0)} GPU(s) withdrawn")
            else:
                self.pool.give_back(ev, free)
                self.lifted.append(f"{ev.cluster}'s GPUs are back")
                r.log(f"capacity: {ev.cluster}'s GPUs are back")
            self._impaired()
            r._dirty = True

    def released(self) -> None:
        """A job ended: GPUs announced as withdrawn take what it freed first."""
        self.pool.settle(self.runner.sched.free)

    def _impaired(self) -> None:
        self.runner.sched.impaired = bool(self.down) or self.pool.impaired
