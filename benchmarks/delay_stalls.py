"""The host's stalls against the emulated links (needs root); writes benchmarks/results/delay_stalls.md.

On a shared virtual machine the hypervisor now and then does not run a
virtual CPU for tens of milliseconds. The delay stage then releases packets
late through no fault of its own, and a link measured meanwhile reads low.
This runs the measurement of ``tests/emulator/test_net_root.py``'s
two-cluster network (60 Mbit/s, 20 ms one way on the wire; 2 hosts per
cluster, intra-cluster capped at 300 Mbit/s: ``measure_all`` as the test
calls it) ``--runs`` times in each of two modes, alternating:

- quiet: nothing else of ours runs;
- stolen: one SCHED_FIFO task per CPU at priority 50 (above the delay
  stage's 10) busy ``--busy-ms`` about every ``--period-ms`` ms (uniform
  0.5-1.5x the gap), a stand-in for the hypervisor stealing the CPU: the
  delay stage is ready and is not run (kernel timers and softirqs still run,
  so the shapers do not stop as they would under real steal).

Per run and delay queue: lateness p99 over every packet and the stage's own
p99 (less the host's share: ``emulator/net/delayd.py``), the stalls it
measured, the lowest measured/configured rate after ``measure_all``'s
re-measurements, and the CPU share /proc/stat says the host really stole.

Run: ``sudo .venv/bin/python benchmarks/delay_stalls.py [--runs 4]``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from emulator.net.capability import require_root  # noqa: E402
from spiderflow.cliutil import OneLineParser, float_in, int_in, output_file, write_output_file  # noqa: E402
from emulator.net.emulation import Emulation  # noqa: E402
from emulator.net.hoststeal import StealMeter  # noqa: E402
from emulator.net.layout import NetConfig  # noqa: E402
from emulator.net.measure import measure_all  # noqa: E402
from emulator.net.tolerance import DELAY_ABS_MS  # noqa: E402
from spiderflow.bench import machine  # noqa: E402
from spiderflow.topology import parse_topology  # noqa: E402

TOPOLOGY = {"name": "two",
            "clusters": [{"name": "east", "gpu": "a100-80gb", "nodes": 1, "gpus_per_node": 8},
                         {"name": "west", "gpu": "a100-80gb", "nodes": 1, "gpus_per_node": 8}],
            "links": [{"a": "east", "b": "west", "bandwidth_gbps": 0.6, "latency_ms": 20}]}


def steal_cpu(cpu: int, busy_s: float, period_s: float) -> None:
    """The stand-in: run above the delay stage on ``cpu``, busy ``busy_s`` about every ``period_s``."""
    os.sched_setaffinity(0, {cpu})
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(50))
    rng = random.Random(cpu)
    while True:
        time.sleep(rng.uniform(0.5, 1.5) * (period_s - busy_s))
        until = time.monotonic() + busy_s
        while time.monotonic() < until:
            pass


def one_run(stolen: bool, busy_ms: float, period_ms: float) -> dict:
    stealers = []
    if stolen:
        stealers = [subprocess.Popen([sys.executable, __file__, "--steal-cpu", str(cpu), "--busy-ms", str(busy_ms),
                                      "--period-ms", str(period_ms)]) for cpu in sorted(os.sched_getaffinity(0))]
    meter = StealMeter()
    try:
        with Emulation(parse_topology(TOPOLOGY), NetConfig(hosts_per_cluster=2, intra_cap_mbps=300)) as emu:
            results = measure_all(emu, wan_seconds=3, wan_omit_s=1, intra_seconds=3, intra_omit_s=1)
            stats = emu.delay_stats()
            mechanism = emu.mechanism
    finally:
        for proc in stealers:
            proc.kill()
            proc.wait()
    queues = [q for per_router in stats.values() for q in per_router]
    return {"mode": "stolen" if stolen else "quiet", "mechanism": mechanism,
            "host_steal_pct": 100 * meter.share(),
            "rate_min": min(r.measured_mbps / r.target.configured_mbps for r in results),
            "remeasured": sum(r.remeasured for r in results),
            "p99": max(q["p99_late_ms"] for q in queues), "own_p99": max(q["p99_own_late_ms"] for q in queues),
            "max": max(q["max_late_ms"] for q in queues), "own_max": max(q["max_own_late_ms"] for q in queues),
            "stalls": max(q["stage_stalls"]["count"] for q in queues),
            "stall_max": max(q["stage_stalls"]["max_ms"] for q in queues),
            "stalled_ms": max(q["stage_stalls"]["total_ms"] for q in queues),
            "read_wait": max(q["max_read_wait_ms"] for q in queues)}


def report(rows: list[dict], args: argparse.Namespace) -> str:
    lines = ["# The host's stalls against the emulated links", "",
             f"Measured {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC on {machine()} by "
             f"`benchmarks/delay_stalls.py --runs {args.runs} --busy-ms {args.busy_ms:g} --period-ms "
             f"{args.period_ms:g}` (the module doc says what it does).", "",
             "Per run, the worse of the two delay queues (one per gateway). `p99` / `own p99`: lateness "
             "of every released packet / less the host's share; stalls: those of 0.1 ms or more the "
             "stage measured (count, longest, total); read wait: the longest a packet waited in the "
             "kernel's queue before the stage read it (its delay runs from its arrival stamp, so that "
             "wait is not added to it); rate: the lowest measured / configured rate of the "
             "six flows after re-measurement; steal: what /proc/stat says the real hypervisor took "
             f"meanwhile. The test's bound is {DELAY_ABS_MS:g} ms.", "",
             "| run | mode | p99 ms | own p99 ms | max / own max ms | stalls (count, max ms, total ms) "
             "| read wait max ms | lowest rate | re-measured | real steal |",
             "|---:|---|---:|---:|---|---|---:|---:|---:|---:|"]
    for i, r in enumerate(rows):
        lines.append(f"| {i + 1} | {r['mode']} | {r['p99']:.2f} | {r['own_p99']:.2f} | {r['max']:.1f} / "
                     f"{r['own_max']:.1f} | {r['stalls']}, {r['stall_max']:.1f}, {r['stalled_ms']:.0f} | "
                     f"{r['read_wait']:.1f} | {r['rate_min']:.3f} | {r['remeasured']} | {r['host_steal_pct']:.1f}% |")
    lines.append("")
    for mode in ("quiet", "stolen"):
        sel = [r for r in rows if r["mode"] == mode]
        if sel:
            lines.append(f"- {mode}: p99 over {DELAY_ABS_MS:g} ms in {sum(r['p99'] >= DELAY_ABS_MS for r in sel)} "
                         f"of {len(sel)} runs, own p99 in {sum(r['own_p99'] >= DELAY_ABS_MS for r in sel)}; "
                         f"median p99 {statistics.median(r['p99'] for r in sel):.2f} ms, own "
                         f"{statistics.median(r['own_p99'] for r in sel):.2f} ms.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="benchmarks/delay_stalls.py", description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int_in(1, 100), default=4, help="runs per mode")
    parser.add_argument("--busy-ms", type=float_in(0.0, 10_000.0, "ms"), default=25.0)
    parser.add_argument("--period-ms", type=float_in(0.0, 10_000.0, "ms"), default=200.0)
    parser.add_argument("--steal-cpu", type=int, help=argparse.SUPPRESS)  # the stand-in's own process
    parser.add_argument("--out", type=output_file, default=str(REPO / "benchmarks" / "results" / "delay_stalls.md"))
    args = parser.parse_args(argv)
    if args.busy_ms >= args.period_ms:
        parser.error(f"--busy-ms ({args.busy_ms:g}) must be less than --period-ms ({args.period_ms:g})")
    if args.steal_cpu is not None:
        steal_cpu(args.steal_cpu, args.busy_ms / 1e3, args.period_ms / 1e3)
        return 0
    require_root()
    rows = []
    for i in range(args.runs):
        for stolen in (False, True):
            rows.append(one_run(stolen, args.busy_ms, args.period_ms))
            r = rows[-1]
            print(f"run {i + 1} {r['mode']}: p99 {r['p99']:.2f} ms, own {r['own_p99']:.2f} ms, "
                  f"stalls {r['stalls']} (max {r['stall_max']:.1f} ms), lowest rate {r['rate_min']:.3f}, "
                  f"steal {r['host_steal_pct']:.1f}%", file=sys.stderr)
    text = report(rows, args)
    write_output_file(args.out, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
