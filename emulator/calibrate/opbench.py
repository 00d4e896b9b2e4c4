"""nccl-tests-style microbenchmarks over the emulated network, with real torch.distributed collectives.

Which tests (:func:`bench_tests`, pure): with two hosts per cluster (ranks
``2i`` and ``2i + 1`` in cluster ``i``),

- ``p2p`` over every WAN path: one direction per pair of clusters (the
  shaping is symmetric; a path entry of the calibration file serves both
  directions), host 0 to host 0, multi-hop paths included;
- ``p2p`` inside every cluster (host 0 to host 1);
- ``all_reduce`` over every pair of clusters (host 0 of each; scope
  ``pair``), to the full size: a two-member ring is data parallelism over two
  clusters, the commonest cross-cluster sync, and it loads both directions of
  the path at once, which one-way p2p does not (measured on default,
  virginia+london at 256 MB: one-way p2p 0.6% over ``alpha + n / beta``, the
  ring 4.8% over its model). Its fit becomes the calibration's ``rings``
  entry for that pair;
- ``all_reduce``, ``all_gather`` and ``reduce_scatter`` inside the first
  cluster (2 ranks) and across all clusters (host 0 of each, one flat ring
  as gloo builds it).

Sizes are real-equivalent bytes, 4 KB to 256 MB by factors of 16 (the wire
carries them divided by the scale). Collectives across all clusters stop at
``CROSS_MAX_BYTES`` (16 MB): a 256 MB ring over the thinnest default link
takes over ten seconds a sample, and at 16 MB the bandwidth term is already
about half of the time.

:func:`run_microbench` starts one :mod:`~emulator.calibrate.opbench_worker` per
host, waits, and :func:`combine` turns their JSON lines into the records of
``microbench.jsonl`` (docs/calibration.md), each with the cost model's
uncalibrated figures for that path or group beside the measurement.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from emulator.jobs.ranklog import read_lines
from spiderflow.errors import EmulatorError
from emulator.jobs.worker import rank_env
from spiderflow.costmodel import TopologyView
from spiderflow.costmodel.network import GBPS
from spiderflow.topology import Topology

SIZES_BYTES = tuple(4096 * 16 ** k for k in range(5))  # 4 KB, 64 KB, 1 MB, 16 MB, 256 MB
MAX_BYTES = 256 * 2 ** 20
CROSS_MAX_BYTES = 16 * 2 ** 20
LARGE_BYTES = 64 * 2 ** 20  # from this size on: fewer samples (each takes seconds over the WAN)
STALL_S = 600.0  # no line from any rank for this long: a hung rank (one sample takes at most ~10 s)
PROGRESS_EVERY_S = 60.0
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")
BENCH_PORT = 29400
HOSTS_NEEDED = 2


def _sizes(limit: int) -> list[int]:
    return [s for s in SIZES_BYTES if s <= limit]


def bench_tests(topology: Topology, *, samples: int = 3, warmup: int = 1, samples_large: int = 2,
                max_bytes: int = MAX_BYTES, cross_max_bytes: int = CROSS_MAX_BYTES) -> list[dict]:
    """The ordered test list every rank runs (see the module docstring)."""
    names = list(topology.names)
    h0 = {c: 2 * i for i, c in enumerate(names)}
    common = {"samples": samples, "warmup": warmup, "samples_large": samples_large, "large_bytes": LARGE_BYTES}
    tests: list[dict] = []

    def add(op: str, scope: str, name: str, clusters: list[str], ranks: list[int], limit: int) -> None:
        tests.append({"id": len(tests), "op": op, "scope": scope, "name": name, "clusters": clusters,
                      "ranks": ranks, "sizes": _sizes(limit), **common})

    pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1:]]
    for a, b in pairs:
        add("p2p", "wan", f"{a}->{b}", [a, b], [h0[a], h0[b]], max_bytes)
    for a, b in pairs:
        add("all_reduce", "pair", f"{a}+{b}", [a, b], [h0[a], h0[b]], max_bytes)
    for c in names:
        add("p2p", "intra", c, [c], [h0[c], h0[c] + 1], max_bytes)
    first = names[0]
    for op in COLLECTIVES:
        add(op, "intra", first, [first], [h0[first], h0[first] + 1], max_bytes)
    if len(names) > 1:
        for op in COLLECTIVES:
            add(op, "cross", "+".join(names), names, [h0[c] for c in names], cross_max_bytes)
    return tests


def configured(test: dict, view: TopologyView) -> tuple[float, float]:
    """(alpha_s, beta_gbps) the uncalibrated cost model uses for this test's path or group."""
    clusters = test["clusters"]
    if test["scope"] == "wan":
        chan = view.p2p(*clusters)
    elif test["scope"] == "intra":
        chan = view.intra(clusters[0], spans_nodes=True)
    else:
        chan = view.ring(clusters)
    return chan.alpha_s, chan.bytes_per_s / GBPS


def combine(tests: list[dict], lines: list[dict], *, topology: str, view: TopologyView,
            dilation: float = 1.0) -> list[dict]:
    """Rank lines -> one ``microbench.jsonl`` record per (test, size): median over the measured samples,
    in real-equivalent seconds (wall / ``dilation``)."""
    stamps: dict[tuple[int, int, int], list[dict]] = defaultdict(list)
    for line in lines:
        if "test" in line and not line.get("warmup"):
            stamps[(line["test"], line["bytes"], line["rep"])].append(line)
    records = []
    for test in tests:
        alpha, beta = configured(test, view)
        for size in test["sizes"]:
            samples, count = [], None
            for (tid, nbytes, _rep), group in sorted(stamps.items()):
                if tid != test["id"] or nbytes != size:
                    continue
                starts = [g["t_start"] for g in group if "t_start" in g]
                ends = [g["t_end"] for g in group if "t_end" in g]
                if len(ends) == (1 if test["op"] == "p2p" else len(test["ranks"])) and starts:
                    samples.append((max(ends) - max(starts)) / dilation)
                    count = group[0]["count"]
            if not samples:
                continue
            records.append({"topology": topology, "op": test["op"], "scope": test["scope"], "name": test["name"],
                            "clusters": test["clusters"], "ranks": len(test["ranks"]), "bytes": size,
                            "count": count, "type": "float", "time_s": statistics.median(samples),
                            "samples_s": samples, "configured_alpha_s": alpha, "configured_beta_gbps": beta})
    return records


def _progress(work: Path, ranks: int) -> tuple[int, int | None]:
    """(bytes the ranks have written, highest test id any rank has stamped) from their JSON-line files."""
    written, last = 0, None
    for rank in range(ranks):
        path = work / f"r{rank}.jsonl"
        if not path.exists():
            continue
        written += path.stat().st_size
        for line in read_lines(path)[-1:]:  # a line still being written is skipped
            tid = line.get("test")
            if tid is not None:
                last = tid if last is None else max(last, tid)
    return written, last


def run_microbench(emu, topology: Topology, tests: list[dict], view: TopologyView, *, out_dir: Path,
                   stall_s: float = STALL_S, log: Callable[[str], None] = lambda _m: None) -> list[dict]:
    """Run ``tests`` on two hosts of every cluster of ``emu``; return the combined records.

    No deadline for the whole run (it grows with the square of the cluster count: paper8's 70 tests
    take about 20 minutes): it fails when no rank has written a line for ``stall_s``, which is also
    each rank's torch.distributed timeout; both x the emulation's dilation, and times are divided by it
    (real-equivalent). Logs which test is running every ``PROGRESS_EVERY_S``."""
    k = emu.config.dilation
    stall_s *= k
    work = Path(out_dir) / "bench"
    work.mkdir(parents=True, exist_ok=True)
    hosts = []
    for c in topology.names:
        hs = emu.hosts[c]
        if len(hs) < HOSTS_NEEDED:
            raise EmulatorError(f"calibrate needs {HOSTS_NEEDED} hosts per cluster ({c} has {len(hs)})")
        hosts.extend(hs[:HOSTS_NEEDED])
    repo = Path(__file__).resolve().parents[2]
    procs = []
    for rank, host in enumerate(hosts):
        spec = {"rank": rank, "world_size": len(hosts), "master_addr": hosts[0].ip, "master_port": BENCH_PORT,
                "scale": emu.scale, "timeout_s": stall_s, "out": str(work / f"r{rank}.jsonl"), "tests": tests}
        path = work / f"r{rank}.json"
        path.write_text(json.dumps(spec))
        env = {**os.environ, **rank_env(host.intf, host.name, "gloo"),
               "PYTHONPATH": str(repo) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        with open(work / f"r{rank}.log", "wb") as logfile:
            procs.append(emu.popen(host.name, [sys.executable, "-m", "emulator.calibrate.opbench_worker", str(path)],
                                   env=env, role=f"bench/r{rank}", stdout=logfile, stderr=subprocess.STDOUT,
                                   cwd=str(repo)))
    log(f"microbenchmarks: {len(tests)} tests on {len(hosts)} ranks")
    by_id = {t["id"]: t for t in tests}
    t0 = time.monotonic()
    seen, moved, logged, shown = 0, t0, t0, None
    while any(p.poll() is None for p in procs):
        now = time.monotonic()
        written, last = _progress(work, len(hosts))
        if written != seen:
            seen, moved = written, now
        elif now - moved > stall_s:
            raise EmulatorError(f"microbenchmarks made no progress for {stall_s:g} s "
                                f"(last test started: {by_id[last]['name'] if last is not None else 'none'}); "
                                f"logs in {work}")
        if last is not None and last != shown and now - logged >= PROGRESS_EVERY_S:
            log(f"microbenchmarks: test {last + 1}/{len(tests)} ({by_id[last]['op']} {by_id[last]['name']}), "
                f"{now - t0:.0f} s")
            shown, logged = last, now
        emu.check_daemons()
        time.sleep(1.0)
    lines = [line for rank in range(len(hosts)) for line in read_lines(work / f"r{rank}.jsonl")]
    bad = [(r, p.returncode) for r, p in enumerate(procs) if p.returncode != 0]
    if bad:
        reasons = [l.get("reason") for l in lines if l.get("event") == "failed"]
        raise EmulatorError(f"microbenchmark rank {bad[0][0]} exited with {bad[0][1]}"
                            + (f": {reasons[0]}" if reasons else f"; see {work}/r{bad[0][0]}.log"))
    return combine(tests, lines, topology=topology.source, view=view, dilation=k)
