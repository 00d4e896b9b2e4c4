"""``sudo python -m emulator calibrate``: microbenchmarks, alpha-beta fits, plans before/after, report.

For each ``--topology`` (default ``topologies/default.yaml``; repeat the
option for more): build the network with two hosts per cluster (more if a
plan needs them), run the microbenchmarks (:mod:`~emulator.calibrate.opbench`),
fit them and write ``calibration-<topology name>.json`` (the file
``--calibration`` of ``spiderflow plan/simulate/compare`` and ``emulator run``
reads), then run the plan set (:mod:`~emulator.calibrate.plans`) with the
uncalibrated and calibrated predictions beside the measurement; tear the
network down. Finally write ``report.md`` (:mod:`~emulator.calibrate.report`).
Everything is written as it is measured; the run-directory format is in
docs/calibration.md.

``--servers localhost,HOST...`` (with ``--tunnel``, ``--ssh-config``, ``--ssh-key``) splits each
topology's network over several machines as ``emulator run`` does (the same helpers of
:mod:`emulator.run`: each ``--topology`` gets its own split, ``server:`` pins included, checked
before root): the microbenchmark ranks and the plans' ranks start from the rank pool of their
host's server and their files come back here (docs/multihost.md).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

from emulator import handback
from emulator.net.capability import require_root
from emulator.net.check import add_network_arguments, network_config, resolve_topology
from emulator.jobs.dilation import Choice, choose_dilation, measure_op_overhead_s
from spiderflow.errors import EmulatorError
from emulator.net.hoststeal import StealMeter
from emulator.net.layout import NetConfig
from emulator.net.servers import ServerSet, add_server_arguments
from emulator.run import (MAX_ITERATIONS, check_split, check_warmup, emulation, rank_pools, servers_of, topology_split,
                          unwritable_raises)
from emulator.jobs.replay import RunConfig
from spiderflow.cliutil import NO_SPACE, dumps, int_in, output_dir
from spiderflow.costmodel import load_calibration, plan_work
from spiderflow.provenance import provenance
from spiderflow.topology.load import TOPOLOGY_NAME

HELP = "measure the emulated network (nccl-tests style), fit alpha-beta, check the cost model before/after"
DEFAULT_TOPOLOGY = "topologies/default.yaml"
MAX_SAMPLES = 100  # sanity bound: 100 repetitions of every size is already hours


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--topology", action="append", default=None,
                        help=f"topology YAML; repeat for several (default {DEFAULT_TOPOLOGY})")
    parser.add_argument("--iterations", type=int_in(2, MAX_ITERATIONS), default=5, metavar="K",
                        help=f"iterations each plan runs, 2..{MAX_ITERATIONS:,} (default %(default)s)")
    parser.add_argument("--warmup", type=int_in(0, MAX_ITERATIONS - 2), default=1,
                        help="first iterations of each plan left out of the measurement, 0..iterations-2 "
                             "(default %(default)s)")
    parser.add_argument("--samples", type=int_in(1, MAX_SAMPLES), default=3,
                        help=f"measured repetitions per microbenchmark size, 1..{MAX_SAMPLES} (2 from 64 MB on; "
                             "default %(default)s)")
    parser.add_argument("--no-plans", action="store_true", help="microbenchmarks and fits only")
    parser.add_argument("--out", type=output_dir, default=None,
                        help="output directory (default runs/calibrate-<timestamp>)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    add_network_arguments(parser)
    add_server_arguments(parser)


def file_stem(name: str) -> str:
    """``name`` as a file-name part: the topology loader already restricts it to
    ``TOPOLOGY_NAME``; a Topology built in code is checked again here so that
    ``calibration-<name>.json`` cannot land outside the output directory."""
    if not isinstance(name, str) or not TOPOLOGY_NAME.match(name):
        raise EmulatorError(f"topology name {name!r} cannot be part of a file name; give the topology a "
                            "name of 1-64 characters of [A-Za-z0-9._-] starting with a letter or digit")
    return name


def _append(path: Path, rows: list[dict]) -> None:
    with open(path, "a") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")


def calibrate_topology(topo, net: NetConfig, run_cfg: RunConfig, *, samples: int, with_plans: bool, out: Path,
                       log, servers: ServerSet | None = None, assignment: dict[str, str] | None = None,
                       record: dict | None = None) -> tuple[Path, str]:
    """One topology: microbenchmarks, fit, calibration file, plans. Returns the calibration file and
    the delay mechanism the network used. With ``servers``, the network is split by ``assignment``
    and every rank starts on its host's server (``record`` gets the measured clock offsets)."""
    from emulator.calibrate.opbench import HOSTS_NEEDED, bench_tests, run_microbench
    from emulator.calibrate.fit import calibration_json, fit_records
    from emulator.calibrate.plans import hosts_needed, plan_cases, run_case
    from emulator.jobs.launch import emulated_view
    from emulator.jobs.replay import warm_tcp

    cases = plan_cases(topo, topo.name) if with_plans else []
    hosts = max([net.hosts_per_cluster, HOSTS_NEEDED] + ([hosts_needed(cases, emulated_view(topo, net))]
                                                          if cases else []))
    net = NetConfig(**{**asdict(net), "hosts_per_cluster": hosts})
    stem = file_stem(topo.name)
    cal_path = out / f"calibration-{stem}.json"
    with emulation(topo, net, servers, assignment, log) as emu, \
            rank_pools(emu, servers, {} if record is None else record, log) as pool:
        mechanism = emu.mechanism
        warm_tcp(emu)
        t0 = time.monotonic()
        records = run_microbench(emu, topo, bench_tests(topo, samples=samples), emulated_view(topo, net),
                                 out_dir=out / f"bench-{stem}", pools=pool, log=log)
        _append(out / "microbench.jsonl", records)
        log(f"{topo.name}: microbenchmarks done in {time.monotonic() - t0:.0f} s")
        fits = fit_records(records, source=f"{out}/microbench.jsonl")
        cal_path.write_text(json.dumps(calibration_json(fits, scale=net.scale, dilation=net.dilation,
                                                        fitted_from=f"{out}/microbench.jsonl", topology=topo),
                                       indent=1) + "\n")
        calibration = load_calibration(cal_path)
        cfg = RunConfig(**{**run_cfg.__dict__, "net": net})
        (out / "timelines").mkdir(exist_ok=True)
        for case in cases:
            record, timeline = run_case(emu, topo, case, cfg, calibration, out_dir=out / "plans", log=log,
                                        pool=pool)
            _append(out / "plans.jsonl", [record])
            if timeline is not None:
                (out / "timelines" / f"{case.plan_id}.json").write_text(json.dumps(timeline) + "\n")
    return cal_path, mechanism


def auto_dilation(topos, net: NetConfig, *, with_plans: bool) -> Choice:
    """``--dilation auto``: sized by the plan set (each plan runs alone: its own ranks at most)."""
    from emulator.calibrate.plans import plan_cases
    from emulator.jobs.launch import emulated_view, predict_emulated

    if not with_plans:
        return Choice(dilation=1.0, reason="--no-plans: microbenchmarks time one collective at a time")
    sized = []
    for topo in topos:
        view = emulated_view(topo, net)
        for case in plan_cases(topo, topo.name):
            plan = case.plan(2)
            sized.append((case.plan_id, plan_work(plan, view), predict_emulated(plan, view)))
    return choose_dilation(sized, overhead_s=measure_op_overhead_s(), one_at_a_time=True)


def calibrate_topologies(splits, net: NetConfig, run_cfg: RunConfig, args: argparse.Namespace,
                         servers: ServerSet | None, config: dict, out: Path, log) -> tuple[list[Path], object]:
    """Calibrate every topology of ``splits`` in turn and write the report, also after a failure
    (``config.json`` rewritten as each ends): (the calibration files, the run directory read back)."""
    from emulator.calibrate.rundir import load_run

    (out / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    t0, meter = time.monotonic(), StealMeter()
    cal_paths, failure = [], None
    try:
        for topo, assignment in splits:
            record: dict = {}  # rank_pools puts the clock offsets measured at this topology's build here
            try:
                path, config["mechanism"] = calibrate_topology(
                    topo, net, run_cfg, samples=args.samples, with_plans=not args.no_plans, out=out, log=log,
                    servers=servers, assignment=assignment, record=record)
                cal_paths.append(path)
            finally:
                if "clock_offsets" in record:
                    config["clock_offsets"][topo.source] = record["clock_offsets"]
                config["host_steal_pct"] = round(100 * meter.share(), 2)  # so far: the report reads it
                (out / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    except BaseException as exc:
        failure = exc
        raise
    finally:
        run = report_on(out, failure, log, t0)
    return cal_paths, load_run(out) if run is None else run


def report_on(out: Path, failure: BaseException | None, log, t0: float):
    """Read the run directory back and write its report: the run directory, read and checked once for
    the report, its MAPE line and --json (None: no microbenchmark was written). After a ``failure``
    the report is still written where it can be, and the failure stays what the run ends with: on a
    full disk none is tried (a line may be cut short there), and one that cannot be written is logged."""
    from emulator.calibrate.report import write_report
    from emulator.calibrate.rundir import load_run

    full = isinstance(failure, OSError) and failure.errno in NO_SPACE
    if not (out / "microbench.jsonl").exists() or full:
        return None
    try:
        run = load_run(out)
        report = write_report(run)
    except (EmulatorError, OSError) as exc:
        if failure is None:
            raise
        log(f"no report: {exc}")
        return None
    log(f"report: {report} ({time.monotonic() - t0:.0f} s in all)")
    return run


def main(args: argparse.Namespace) -> int:
    check_warmup(args)
    servers = servers_of(args)
    paths = [resolve_topology(p) for p in (args.topology or [DEFAULT_TOPOLOGY])]
    splits = [topology_split(p, servers) for p in paths]  # bad inputs fail here, before root
    topos = [t for t, _ in splits]
    names = [file_stem(t.name) for t in topos]
    if len(set(names)) != len(names):
        raise EmulatorError(f"--topology: two files have the same name field ({', '.join(names)}); "
                            "calibration files are named after it")
    net = network_config(args, 1.0)
    if args.dilation == "auto":
        choice = auto_dilation(topos, net, with_plans=not args.no_plans)
    else:
        choice = Choice(dilation=args.dilation, reason="--dilation")
    net = network_config(args, choice.dilation)
    try:
        run_cfg = RunConfig(iterations=args.iterations, warmup=args.warmup, time_scale=1.0, net=net)
    except ValueError as exc:
        raise EmulatorError(f"calibrate: {exc}") from None
    for topo, assignment in splits:
        check_split(topo, servers, assignment)
    require_root()
    out = handback.make_output_dir(args.out or f"runs/calibrate-{dt.datetime.now().strftime('%Y%m%d-%H%M%S')}")
    for name in ("microbench.jsonl", "plans.jsonl"):
        (out / name).unlink(missing_ok=True)
    log = lambda msg: print(f"[calibrate] {msg}", file=sys.stderr, flush=True)  # noqa: E731
    log(f"scale {net.scale:g}, dilation {net.dilation:g}: {choice.reason}")
    config = {**provenance(), "topologies": [t.source for t in topos], "scale": net.scale, "dilation": net.dilation,
              "dilation_reason": choice.reason, "net": asdict(net), "compute": "emulated",
              "iterations": run_cfg.iterations, "warmup": run_cfg.warmup, "samples": args.samples,
              "plans": not args.no_plans}
    if servers is not None:  # per topology: each gets its own split network and its own clock measurement
        config.update(servers=list(servers.names), tunnel=servers.tunnel,
                      assignment={t.source: a for t, a in splits}, clock_offsets={})
    with unwritable_raises(out, only=NO_SPACE):  # a full disk: one line naming --out, after the teardown
        cal_paths, run = calibrate_topologies(splits, net, run_cfg, args, servers, config, out, log)
    from emulator.calibrate.report import mape_summary

    summary = mape_summary(run)
    if args.json:
        plans = run.plans
        print(dumps({"summary": summary, "calibration": [str(p) for p in cal_paths],
                     "report": str(out / "report.md"), "plans": plans, "out": str(out)}, indent=1))
    else:
        print(summary)
        print("calibration: " + ", ".join(str(p) for p in cal_paths))
        print(f"report: {out / 'report.md'}")
    return 0

