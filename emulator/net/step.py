"""``emulator check --step``: change a WAN link's bandwidth under a running flow; how long until it shows.

One TCP flow (iperf3) crosses one WAN link (pinned as ``emulator check`` pins
it). From this process we read the receiving host's ``rx_bytes`` every
:data:`SAMPLE_S` (``/proc/PID/net/dev`` of a process in its namespace, so no
command runs per sample) on the machine-wide monotonic clock (over several servers, ``--servers``, the
flow runs towards this machine's end of the link, so that host is here;
the sender and the router that changes may be on the other server). After a
warm-up the link's bandwidth is multiplied by ``factor`` through
:class:`~emulator.net.live.LiveNetwork` (what ``emulator run --wan-events``
uses), and later set back. For each step we report:

- ``apply_ms``: from the moment the change was due to the moment it was in
  force (``tc`` returned);
- ``settle_s``: from then until the received rate, over windows of
  :data:`WINDOW_S`, came within :data:`SETTLE_REL` of the rate expected after
  the step (the rate measured before it x the step's ratio) and stayed there
  for the rest of that phase; None if it never did.

A step that fails while the host (hypervisor) stole 2 % or more of this
machine's CPU is made again, as ``emulator check`` re-measures a rate
(:func:`emulator.net.measure.another_try`): a stall of the whole machine
reads as a window that never settled. Each step says how much was stolen
(``host_steal_pct``).

A step down is in force at the next packet htb dequeues, and is seen as soon
as the bottleneck queue has drained; a step up waits for TCP's congestion
window to grow into the new bandwidth-delay product, so it takes round trips.
"""

from __future__ import annotations

import dataclasses
import statistics
import subprocess
import time
from dataclasses import dataclass

from emulator.net.hoststeal import StealMeter, noticeable
from emulator.net.live import LiveNetwork
from emulator.net.measure import IPERF_BASE_PORT, STOLEN_TRIES, Target, _wait_listening, pin_routes, targets, warmup_s
from spiderflow.errors import EmulatorError
from spiderflow.wan import WanEvent

SAMPLE_S = 0.02
WINDOW_S = 0.2
SETTLE_REL = 0.10
PHASE_S = 4.0  # wall seconds measured after each step (x the dilation)
APPLY_MS = 100.0  # issue 19: a change is in force on the wire within 100 ms of its event time


@dataclass(frozen=True, kw_only=True)
class Step:
    link: str  # "a-b"
    direction: str  # "a -> b"
    from_gbps: float
    to_gbps: float
    rate_before_mbps: float  # receiver's rate (L2 bytes) in the last second before the step
    rate_after_mbps: float  # the rate once it settled, or over the phase's second half (rate_after)
    apply_ms: float
    settle_s: float | None
    host_steal_pct: float = 0.0  # CPU the host stole from this machine during the step test

    @property
    def ok(self) -> bool:
        return self.apply_ms <= APPLY_MS and self.settle_s is not None

    def as_json(self) -> dict:
        return {**{k: (round(v, 4) if isinstance(v, float) else v) for k, v in vars(self).items()}, "ok": self.ok}


def _rx_bytes(pid: int, dev: str) -> int:
    with open(f"/proc/{pid}/net/dev") as fh:
        for line in fh:
            name, _, rest = line.partition(":")
            if name.strip() == dev:
                return int(rest.split()[0])
    raise EmulatorError(f"no interface {dev} in the namespace of process {pid}")


def settle_time(samples: list[tuple[float, int]], applied: float, end: float, expected_mbps: float) -> float | None:
    """Seconds from ``applied`` to the end of the first window from which every window up to
    ``end`` is within SETTLE_REL of ``expected_mbps``."""
    ok_from = _settled_from(samples, applied, end, expected_mbps)
    return None if ok_from is None else max(0.0, ok_from + WINDOW_S - applied)


def _settled_from(samples: list[tuple[float, int]], applied: float, end: float, expected_mbps: float) -> float | None:
    """The start of the first window from which every window up to ``end`` is within SETTLE_REL of
    ``expected_mbps`` (None: the last one is not)."""
    ok_from = None
    for t, rate in _sliding(samples, applied, end):
        if abs(rate - expected_mbps) <= SETTLE_REL * expected_mbps:
            if ok_from is None:
                ok_from = t
        else:
            ok_from = None
    return ok_from


def rate_after(samples: list[tuple[float, int]], applied: float, end: float, expected_mbps: float) -> float:
    """Median Mbit/s of the windows that start once the rate settled (:func:`settle_time`); where it
    settled only in the phase's last windows, so that none starts after the first settled one ends,
    of the settled windows; where it never settled, of the phase's second half (NaN: no window)."""
    ok_from = _settled_from(samples, applied, end, expected_mbps)
    start = applied + (end - applied) / 2 if ok_from is None else ok_from + WINDOW_S
    tail = [r for _t, r in _sliding(samples, start, end)]
    if not tail and ok_from is not None:  # a loaded machine: it settled within the phase's last window
        tail = [r for _t, r in _sliding(samples, ok_from, end)]
    return statistics.median(tail) if tail else float("nan")


def _sliding(samples: list[tuple[float, int]], start: float, end: float) -> list[tuple[float, float]]:
    """(window start, Mbit/s) for every window of WINDOW_S starting at a sample in [start, end - WINDOW_S]."""
    pts = [(t, b) for t, b in samples if start <= t <= end]
    out, j = [], 0
    for i, (t0, b0) in enumerate(pts):
        while j < len(pts) and pts[j][0] - t0 < WINDOW_S:
            j += 1
        if j == len(pts):
            break
        t1, b1 = pts[j]
        out.append((t0, 8 * (b1 - b0) / (t1 - t0) / 1e6))
    return out


def step_test(emu, *, link: tuple[str, str] | None = None, factor: float = 0.5,
              progress=lambda _m: None) -> list[Step]:
    """Step ``link`` (default: the topology's first) down by ``factor`` and back up under one flow;
    again, up to STOLEN_TRIES times, while a step fails and the host stole a noticeable share of the CPU."""
    tries = 0
    while True:
        meter = StealMeter()
        steps = _step_once(emu, link=link, factor=factor, progress=progress)
        stolen = meter.share()
        steps = [dataclasses.replace(st, host_steal_pct=100 * stolen) for st in steps]
        if not step_again(steps, tries):
            return steps
        tries += 1
        progress(f"step: the host stole {100 * stolen:.0f}% of this machine's CPU and a step failed: again")


def step_again(steps: list[Step], tries: int) -> bool:
    """Whether to make the steps again after ``tries`` repeats: a step failed while the host stole
    a noticeable share of the CPU (:func:`~emulator.net.hoststeal.noticeable`), fewer than STOLEN_TRIES times so far."""
    return (not all(st.ok for st in steps) and tries < STOLEN_TRIES
            and noticeable(min(st.host_steal_pct for st in steps)))


def _step_once(emu, *, link: tuple[str, str] | None, factor: float, progress) -> list[Step]:
    k = emu.config.dilation
    wan = [t for t in targets(emu) if t.kind == "wan"]
    if not wan:
        raise EmulatorError("--step needs a WAN link; this topology has none")
    if link is not None:
        wan = [t for t in wan if {t.a, t.b} == set(link)]
    wan = [t for t in wan if not emu.is_remote(t.dst)]  # the receiver's bytes are read from /proc here
    if not wan:
        raise EmulatorError("--step with --servers: the link needs an end on this machine (its receiver's "
                            "bytes are read here); name one with --step A-B")
    target: Target = wan[0]
    pin_routes(emu, [target])
    live = LiveNetwork(emu)
    base = emu.topology.link(target.a, target.b)
    warm = warmup_s(target, 2.0 * k)
    phase = PHASE_S * k
    total = warm + 2 * phase
    server = emu.popen(target.dst, ["iperf3", "-s", "-1", "-p", str(IPERF_BASE_PORT)], role="iperf3-server",
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_listening(server, IPERF_BASE_PORT, 10.0, f"{target.dst}: iperf3 server")
    dst_pid = emu.node(target.dst).pid
    dev = emu.plan.host(target.dst).intf
    progress(f"step: {target.a} -> {target.b}, {base.bandwidth_gbps:g} Gbit/s x {factor:g} after {warm:g} s, "
             f"back after {warm + phase:g} s ({total:g} s)")
    client = emu.popen(target.src, ["iperf3", "-c", target.dst_ip, "-p", str(IPERF_BASE_PORT), "-t", f"{total:g}"],
                       role="iperf3", stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    t0 = time.monotonic()
    samples: list[tuple[float, int]] = []
    plan = [(t0 + warm, base.bandwidth_gbps * factor), (t0 + warm + phase, base.bandwidth_gbps)]
    applied: list[tuple[float, float, float]] = []  # (due, in force, to_gbps)
    while client.poll() is None and time.monotonic() < t0 + total + 10:
        now = time.monotonic()
        samples.append((now, _rx_bytes(dst_pid, dev)))
        if plan and now >= plan[0][0]:
            due, gbps = plan.pop(0)
            at = live.apply([WanEvent(time_s=0.0, a=base.a, b=base.b, bandwidth_gbps=gbps, latency_ms=None,
                                      up=True)])
            applied.append((due, at, gbps))
        time.sleep(max(0.0, SAMPLE_S - (time.monotonic() - now)))
    client.wait(timeout=10)
    server.wait(timeout=10)
    if len(applied) != 2:
        raise EmulatorError(f"{target.src}: iperf3 ended before the steps were made "
                            f"(exit {client.returncode}): {client.stderr.read().decode(errors='replace')[-200:]}")
    steps = []
    previous = base.bandwidth_gbps
    # each phase ends at the next step, the last one a window before the flow's planned end (iperf3
    # stops then: its last windows would read the stop, not the link)
    ends = [applied[1][1], min(samples[-1][0], t0 + total - WINDOW_S)]
    for (due, at, gbps), end in zip(applied, ends):
        before = [r for _t, r in _sliding(samples, at - 1.0, at)]
        rate_before = statistics.median(before) if before else float("nan")
        expected = rate_before * gbps / previous
        settle = settle_time(samples, at, end, expected)
        steps.append(Step(link=f"{base.a}-{base.b}", direction=f"{target.a} -> {target.b}",
                          from_gbps=previous, to_gbps=gbps, rate_before_mbps=rate_before,
                          rate_after_mbps=rate_after(samples, at, end, expected),
                          apply_ms=(at - due) * 1e3, settle_s=None if settle is None else settle / k))
        previous = gbps
    return steps
