"""Userspace delay stage: hold NFQUEUE'd packets for a link's one-way delay.

Used where the kernel lacks ``sch_netem``. The emulator starts one daemon per
gateway router, inside the router's network namespace; iptables sends each
WAN egress interface's forwarded packets to its own queue
(``FORWARD -o w-<peer> -j NFQUEUE --queue-num N``) and the daemon accepts each
packet ``latency_ms`` (plus jitter) after it arrived, so the delay sits on the
router and not on the sending host (whose TCP small-queue limit would stall).

Per queue the daemon keeps a FIFO of ``(due_time, packet_id)`` and never
releases a packet before its predecessor (``due = max(due, previous due)``),
so the link stays in order, as a real path does. Jitter is a delay offset
that wanders as an Ornstein-Uhlenbeck process (standard deviation
``jitter_ms``, correlation time ``JITTER_TAU_S``), as queueing on a real path
does: independent draws per packet would, once kept in order, turn into a
running maximum and inflate the mean delay, which this keeps at
``latency_ms``. Loss drops the packet on arrival. One loop serves all queues:
it releases whatever is due (one batch verdict per queue), then reads at most
``READ_BATCH`` packets before checking the clock again, so a burst on one
queue cannot starve releases on another.

Run: ``python -m emulator.net.delayd --queue NUM:DELAY_MS[:JITTER_MS[:LOSS_PCT]] ...``.
It prints ``ready`` on stdout once every queue is bound, exits 0 on SIGTERM or
SIGINT and, with ``--stats FILE``, writes its counters there as JSON on exit
and on SIGUSR1 (lateness = release time minus due time).

A packet's delay runs from its arrival: the kernel stamps every packet it
receives while any socket asks for receive timestamps (the daemon keeps one
open), the stamp comes with the queued packet, and a packet that waited in
the kernel's queue because the loop was busy or not run is held that much
less (``stamped``, ``max_read_wait_ms``); without a stamp, from when it was
read.

Lateness has two causes, counted apart. The stage's own: its loop was busy
(reading a burst, releasing another queue). The host's: the loop was ready
to run and was not run -- its ``select`` returned later than its timeout, or
it was off the CPU between two steps though it never blocked there (a
hypervisor stealing the virtual CPU, a kernel that does not preempt). The
loop measures those stalls (each round's wall time less its own CPU time and
less its sleep in ``select`` up to the timeout it asked for) and charges
each late packet the stall time after its due time, up to its lateness; the
rest is the stage's own (``p99_own_late_ms``). ``stage_stalls`` counts the
stalls of 0.1 ms or more: on a busy virtual machine they, not the stage,
make packets late.

Live changes (issue 19, a WAN that changes under running jobs): with
``--control FILE``, SIGHUP makes it read FILE -- a sequence number on the
first line, then one ``NUM:DELAY_MS[:JITTER_MS[:LOSS_PCT]]`` per changed
queue -- and apply it to packets arriving from then on (queued ones keep
their due times, and order is kept: a shorter delay waits behind them), then
write ``SEQ MONOTONIC_S`` to ``FILE.ack`` (the moment it took effect, on the
machine-wide monotonic clock).
"""

from __future__ import annotations

import argparse
import bisect
import gc
import json
import math
import os
import random
import select
import signal
import sys
import time
from collections import deque
from dataclasses import dataclass, field

from emulator.net.nfq import NF_ACCEPT, NF_DROP, QueueSocket, keep_rx_stamps_on

READ_BATCH = 64
IDLE_WAKE_S = 0.25
JITTER_TAU_S = 0.05  # correlation time of the jitter process
LATE_BUCKETS_MS = (0.5, 1.0, 2.0, 5.0)  # stats count packets released later than these
LATE_BUCKETS_S = tuple(b / 1e3 for b in LATE_BUCKETS_MS)
HIST_BIN_MS = 0.05  # lateness histogram: 0.05 ms bins up to 50 ms (the last bin takes the rest)
HIST_BINS = 1000
HIST_PER_S = 1e3 / HIST_BIN_MS
STALL_MIN_S = 1e-4  # a stall shorter than this is not recorded (a wake-up's own latency)
STALL_LOG_MAX = 4096  # recorded stalls kept before those no pending packet can need are dropped
STAMP_AGE_MAX_S = 1.0  # a kernel arrival stamp older than this (or in the future by more than
STAMP_SKEW_S = 1e-3  # this) is taken for a step of the wall clock: the packet counts from its read


@dataclass(kw_only=True)
class QueueSpec:
    num: int
    delay_ms: float
    jitter_ms: float = 0.0
    loss_pct: float = 0.0

    @classmethod
    def parse(cls, text: str) -> "QueueSpec":
        parts = text.split(":")
        if not 2 <= len(parts) <= 4:
            raise ValueError(f"--queue must be NUM:DELAY_MS[:JITTER_MS[:LOSS_PCT]] (got {text!r})")
        nums = [float(p) for p in parts[1:]] + [0.0] * (4 - len(parts))
        spec = cls(num=int(parts[0]), delay_ms=nums[0], jitter_ms=nums[1], loss_pct=nums[2])
        if spec.delay_ms < 0 or spec.jitter_ms < 0 or not 0 <= spec.loss_pct < 100:
            raise ValueError(f"--queue values out of range (got {text!r})")
        return spec

    def arg(self) -> str:
        return f"{self.num}:{self.delay_ms:g}:{self.jitter_ms:g}:{self.loss_pct:g}"


@dataclass
class _Queue:
    spec: QueueSpec
    pending: deque = field(default_factory=deque)
    last_due: float = 0.0
    packets: int = 0
    dropped: int = 0
    max_pending: int = 0
    late_sum_s: float = 0.0
    late_max_s: float = 0.0
    late_over: list = field(default_factory=lambda: [0] * len(LATE_BUCKETS_MS))
    late_hist: list = field(default_factory=lambda: [0] * (HIST_BINS + 1))
    own_max_s: float = 0.0
    own_hist: list = field(default_factory=lambda: [0] * (HIST_BINS + 1))  # lateness less the host's share
    host_delayed: int = 0  # packets released late partly because the host stalled the loop
    stamped: int = 0  # packets held from the kernel's arrival stamp (not from when they were read)
    wait_max_s: float = 0.0  # the longest such a packet waited in the kernel's queue before it was read

    jitter_x: float = 0.0
    jitter_t: float | None = None

    def jitter_offset(self, now: float, sigma_s: float, rng: random.Random) -> float:
        """Exact OU update from the last packet's time to ``now``."""
        if self.jitter_t is None:
            self.jitter_x = rng.gauss(0.0, sigma_s)
        else:
            rho = math.exp(-max(0.0, now - self.jitter_t) / JITTER_TAU_S)
            self.jitter_x = rho * self.jitter_x + sigma_s * math.sqrt(1 - rho * rho) * rng.gauss(0.0, 1.0)
        self.jitter_t = now
        return self.jitter_x

    def stats(self) -> dict:
        released = self.packets - self.dropped - len(self.pending)
        return {"queue": self.spec.num, "delay_ms": self.spec.delay_ms, "packets": self.packets,
                "dropped": self.dropped, "max_pending": self.max_pending,
                "mean_late_ms": 1e3 * self.late_sum_s / released if released else 0.0,
                "max_late_ms": 1e3 * self.late_max_s,
                "late_over_ms": dict(zip((f"{b:g}" for b in LATE_BUCKETS_MS), self.late_over)),
                **{f"p{q:g}_late_ms": quantile_ms(self.late_hist, q / 100) for q in (50, 99, 99.9)},
                "max_own_late_ms": 1e3 * self.own_max_s, "host_delayed": self.host_delayed,
                "stamped": self.stamped, "max_read_wait_ms": 1e3 * self.wait_max_s,
                **{f"p{q:g}_own_late_ms": quantile_ms(self.own_hist, q / 100) for q in (50, 99, 99.9)}}


def quantile_ms(hist: list[int], q: float) -> float:
    """Upper edge of the lateness histogram's bin holding quantile ``q`` of its packets."""
    total = sum(hist)
    if not total:
        return 0.0
    seen = 0
    for i, count in enumerate(hist):
        seen += count
        if seen >= q * total:
            return (i + 1) * HIST_BIN_MS
    return HIST_BINS * HIST_BIN_MS


@dataclass
class StallLog:
    """The times the loop was ready to run and was not run (the module doc), in order.

    Each stall is kept as ``[end - length, end]``, ``end`` the moment the loop
    noticed it: where in the step it fell is unknown, and every step after it
    in that wake-up was pushed back by its whole length anyway.
    """

    ends: list = field(default_factory=list)
    lengths: list = field(default_factory=list)
    upto: list = field(default_factory=list)  # stalled seconds up to and including each
    count: int = 0
    total_s: float = 0.0
    max_s: float = 0.0

    def note(self, end: float, length: float) -> None:
        if length < STALL_MIN_S:
            return
        self.count += 1
        self.total_s += length
        self.max_s = max(self.max_s, length)
        self.ends.append(end)
        self.lengths.append(length)
        self.upto.append(self.total_s)

    def since(self, t: float) -> float:
        """Stalled seconds after ``t`` (the host's share of a packet due at ``t`` and released now)."""
        ends = self.ends
        if not ends or ends[-1] <= t:
            return 0.0
        i = bisect.bisect_right(ends, t)
        length = self.lengths[i]
        return self.total_s - self.upto[i] + length - max(0.0, t - (ends[i] - length))

    def forget_before(self, t: float) -> None:
        """Drop the stalls that ended by ``t`` (no packet due at or after ``t`` needs them)."""
        i = bisect.bisect_right(self.ends, t)
        del self.ends[:i], self.lengths[:i], self.upto[:i]

    def stats(self) -> dict:
        return {"count": self.count, "total_ms": 1e3 * self.total_s, "max_ms": 1e3 * self.max_s}


class DelayStage:
    """The event loop; ``sock`` is anything with QueueSocket's receive/verdict/fileno."""

    def __init__(self, specs: list[QueueSpec], sock, *, seed: int | None = None) -> None:
        self.queues = {s.num: _Queue(s) for s in specs}
        self.sock = sock
        self.rng = random.Random(seed)
        self.stalls = StallLog()
        self.stopping = False

    def update(self, specs: list[QueueSpec]) -> None:
        """New delay, jitter and loss for these queues (numbers this stage does not hold: refused)."""
        unknown = [s.num for s in specs if s.num not in self.queues]
        if unknown:
            raise ValueError(f"no queue {unknown[0]} in this delay stage (has {sorted(self.queues)})")
        for spec in specs:
            self.queues[spec.num].spec = spec

    def on_packets(self, packets: list[tuple[int, int, float]], now: float, real_now: float | None = None) -> None:
        """Hold ``(queue, id, arrival)`` packets read at ``now`` (CLOCK_MONOTONIC). A packet's delay
        runs from its arrival where the kernel stamped it (CLOCK_REALTIME, read against ``real_now``:
        a packet that waited in the kernel's queue while the loop was busy or stalled is not held
        that much longer), else from ``now``."""
        for qnum, pid, stamp in packets:
            q = self.queues.get(qnum)
            if q is None:  # not ours: never hold it
                self.sock.verdict(qnum, pid, NF_ACCEPT, batch=False)
                continue
            spec = q.spec
            q.packets += 1
            if spec.loss_pct and self.rng.random() * 100.0 < spec.loss_pct:
                q.dropped += 1
                self.sock.verdict(qnum, pid, NF_DROP, batch=False)
                continue
            arrived = now
            if stamp and real_now is not None:
                waited = real_now - stamp
                if -STAMP_SKEW_S <= waited <= STAMP_AGE_MAX_S:  # else a clock step: not a wait
                    waited = max(0.0, waited)
                    arrived -= waited
                    q.stamped += 1
                    if waited > q.wait_max_s:
                        q.wait_max_s = waited
            delay_s = spec.delay_ms / 1e3
            if spec.jitter_ms:
                delay_s = max(0.0, delay_s + q.jitter_offset(arrived, spec.jitter_ms / 1e3, self.rng))
            due = max(arrived + delay_s, q.last_due)
            q.last_due = due
            q.pending.append((due, pid))
            if len(q.pending) > q.max_pending:
                q.max_pending = len(q.pending)

    def release_due(self, now: float) -> float:
        """Accept every due packet; return the next due time (inf when idle)."""
        next_due = float("inf")
        stalls = self.stalls
        last_stall = stalls.ends[-1] if stalls.ends else -math.inf
        for q in self.queues.values():
            pending = q.pending
            last = None
            while pending and pending[0][0] <= now:
                due, last = pending.popleft()
                late = now - due
                q.late_sum_s += late
                if late > q.late_max_s:
                    q.late_max_s = late
                q.late_hist[min(int(late * HIST_PER_S), HIST_BINS)] += 1
                if late > LATE_BUCKETS_S[0]:
                    for i, bound in enumerate(LATE_BUCKETS_S):
                        if late > bound:
                            q.late_over[i] += 1
                if last_stall > due:  # the host stalled the loop after this packet was due
                    q.host_delayed += 1
                    late = max(0.0, late - stalls.since(due))
                if late > q.own_max_s:
                    q.own_max_s = late
                q.own_hist[min(int(late * HIST_PER_S), HIST_BINS)] += 1
            if last is not None:
                self.sock.verdict(q.spec.num, last, NF_ACCEPT, batch=True)
            if pending and pending[0][0] < next_due:
                next_due = pending[0][0]
        if len(stalls.ends) > STALL_LOG_MAX:
            stalls.forget_before(min(next_due, now))
        return next_due

    def run(self) -> None:
        clock, cpu = time.monotonic, time.thread_time
        fd = self.sock.fileno()
        note = self.stalls.note
        last, last_cpu, slept = clock(), cpu(), 0.0
        while not self.stopping:
            now, now_cpu = clock(), cpu()
            # since the last round: wall time not spent on the CPU, nor asleep in select as asked
            # (its overshoot past the timeout counts): the host did not run the loop
            note(now, (now - last) - (now_cpu - last_cpu) - slept)
            last, last_cpu = now, now_cpu
            next_due = self.release_due(now)
            before = clock()
            timeout = min(max(0.0, next_due - before), IDLE_WAKE_S)
            try:
                readable, _, _ = select.select([fd], [], [], timeout)
            except InterruptedError:
                readable = ()
            slept = min(clock() - before, timeout)
            if readable:
                packets = self.sock.receive(READ_BATCH)
                self.on_packets(packets, clock(), time.time())

    def stats(self) -> list[dict]:
        stage = self.stalls.stats()
        return [{**q.stats(), "stage_stalls": stage} for q in self.queues.values()]


def _write_stats(path: str | None, stage: DelayStage) -> None:
    if not path:
        return
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        json.dump({"pid": os.getpid(), "queues": stage.stats()}, fh)
    os.replace(tmp, path)


def read_control(path: str) -> tuple[str, list[QueueSpec]]:
    """(sequence number, specs) from a control file (see the module doc)."""
    with open(path) as fh:
        lines = [line.strip() for line in fh if line.strip()]
    if not lines:
        raise ValueError(f"{path}: empty control file")
    return lines[0], [QueueSpec.parse(line) for line in lines[1:]]


def write_control(path: str, seq: int, specs: list[QueueSpec]) -> None:
    """The control file for ``seq`` (atomically: the daemon never reads half of it)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        fh.write("\n".join([str(seq), *(s.arg() for s in specs)]) + "\n")
    os.replace(tmp, path)


def _apply_control(path: str, stage: DelayStage) -> None:
    try:
        seq, specs = read_control(path)
        stage.update(specs)
        answer = f"{seq} {time.monotonic():.6f}"
    except (OSError, ValueError) as exc:
        answer = f"error {exc}"
        print(f"delayd: control: {exc}", file=sys.stderr, flush=True)
    tmp = f"{path}.ack.tmp"
    with open(tmp, "w") as fh:
        fh.write(answer + "\n")
    os.replace(tmp, f"{path}.ack")


def _prioritise() -> None:
    """A late release is a delay error: run ahead of the traffic generators.

    SCHED_FIFO (the kernel's RT throttling still leaves 5% to everything else;
    the loop blocks in select whenever nothing is due), else nice -10. The
    loop allocates no cycles, so the cyclic GC only adds pauses: off.
    """
    gc.disable()
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
    except (OSError, AttributeError):
        try:
            os.setpriority(os.PRIO_PROCESS, 0, -10)
        except OSError:
            pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m emulator.net.delayd", description=__doc__.split("\n")[0])
    parser.add_argument("--queue", action="append", required=True, type=QueueSpec.parse,
                        help="NUM:DELAY_MS[:JITTER_MS[:LOSS_PCT]], once per queue")
    parser.add_argument("--maxlen", type=int, default=65536, help="packets a queue may hold")
    parser.add_argument("--no-gso", action="store_true", help="have the kernel segment GSO packets")
    parser.add_argument("--stats", help="write counters here (JSON) on exit and on SIGUSR1")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--control", help="on SIGHUP read new queue specs from here (see the module doc)")
    args = parser.parse_args(argv)

    stamps = keep_rx_stamps_on()  # open till exit: queued packets carry their arrival time
    sock = QueueSocket()
    for spec in args.queue:
        sock.bind_queue(spec.num, maxlen=args.maxlen, gso=not args.no_gso)
    stage = DelayStage(args.queue, sock, seed=args.seed)

    def stop(_signum, _frame):
        stage.stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGUSR1, lambda *_: _write_stats(args.stats, stage))
    if args.control:
        signal.signal(signal.SIGHUP, lambda *_: _apply_control(args.control, stage))
    _prioritise()
    print("ready", flush=True)
    try:
        stage.run()
    finally:
        _write_stats(args.stats, stage)
        sock.close()
        if stamps is not None:
            stamps.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
