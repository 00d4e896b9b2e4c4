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
host from the rank pool of the host's server, waits, brings remote ranks' files back
(:mod:`~emulator.calibrate.benchranks`), and :func:`combine` turns their JSON lines into the records of
``microbench.jsonl`` (docs/calibration.md), each with the cost model's
uncalibrated figures for that path or group beside the measurement.
"""

from __future__ import annotations

import os
import statistics
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from emulator.calibrate.benchranks import BenchHost, run_ranks
from emulator.jobs.worker import rank_env
from emulator.net.state import MARKER_ENV
from spiderflow.errors import EmulatorError
from spiderflow.costmodel import TopologyView
from spiderflow.costmodel.network import GBPS
from spiderflow.topology import Topology

SIZES_BYTES = tuple(4096 * 16 ** k for k in range(5))  # 4 KB, 64 KB, 1 MB, 16 MB, 256 MB
MAX_BYTES = 256 * 2 ** 20
CROSS_MAX_BYTES = 16 * 2 ** 20
LARGE_BYTES = 64 * 2 ** 20  # from this size on: fewer samples (each takes seconds over the WAN)
STALL_S = 600.0  # no line from any rank for this long: a hung rank (one sample takes at most ~10 s)
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


def run_microbench(emu, topology: Topology, tests: list[dict], view: TopologyView, *, out_dir: Path, pools=None,
                   stall_s: float = STALL_S, log: Callable[[str], None] = lambda _m: None) -> list[dict]:
    """Run ``tests`` on two hosts of every cluster of ``emu``; return the combined records.

    Each rank starts from ``pools.for_host(host)``: the warm rank pool of its host's server (one
    :class:`~emulator.jobs.pool.RankPool` on one machine; ``ServerPools`` with ``--servers``, whose
    remote ranks' files come back here: :mod:`~emulator.calibrate.benchranks`). No deadline for the
    whole run (it grows with the square of the cluster count: paper8's 70 tests take about 20
    minutes): it fails when no rank has written a line for ``stall_s``, which is also each rank's
    torch.distributed timeout; both x the emulation's dilation, and times are divided by it
    (real-equivalent). Logs which test is running every ``PROGRESS_EVERY_S``. Without ``pools``
    (one machine), a rank pool is started for the run and closed after it."""
    if pools is None:
        from emulator.jobs.pool import RankPool

        with RankPool(emu, log=log) as pool:
            return run_microbench(emu, topology, tests, view, out_dir=out_dir, pools=pool, stall_s=stall_s, log=log)
    k = emu.config.dilation
    stall_s *= k
    hosts = []
    for c in topology.names:
        hs = emu.hosts[c]
        if len(hs) < HOSTS_NEEDED:
            raise EmulatorError(f"calibrate needs {HOSTS_NEEDED} hosts per cluster ({c} has {len(hs)})")
        hosts += [BenchHost(name=h.name, ip=h.ip, intf=h.intf, ns_pid=emu.node(h.name).pid) for h in hs[:HOSTS_NEEDED]]
    repo = Path(__file__).resolve().parents[2]

    def env_of(host: BenchHost) -> dict[str, str]:
        return {**os.environ, **rank_env(host.intf, host.name, "gloo"), MARKER_ENV: emu.run_id,
                "PYTHONPATH": str(repo) + os.pathsep + os.environ.get("PYTHONPATH", "")}

    spec = {"master_addr": hosts[0].ip, "master_port": BENCH_PORT, "scale": emu.scale, "timeout_s": stall_s,
            "tests": tests}
    by_id = {t["id"]: t for t in tests}
    lines = run_ranks(hosts, spec, pool_of=pools.for_host, work=Path(out_dir) / "bench", env_of=env_of,
                      stall_s=stall_s, describe=lambda tid: f"{by_id[tid]['op']} {by_id[tid]['name']}",
                      poll=emu.check_daemons, log=log)
    return combine(tests, lines, topology=topology.source, view=view, dilation=k)
