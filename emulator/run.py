"""``sudo python -m emulator run``: replay a trace with real torch.distributed ranks on the emulated WAN.

Builds the network (:class:`~emulator.net.emulation.Emulation`), replays the trace
with :class:`~emulator.jobs.replay.Runner`, tears the network down, and compares
every job's measured iteration time with the cost model's prediction on the
emulated network (see docs/emulator-run.md). Progress goes to stderr; the
per-job table (or ``--json``) to stdout. Results are written to ``--out``:
``config.json`` first, the ranks' JSON lines as they happen (``ranks/``),
``jobs.csv`` and ``summary.md`` at the end, also after Ctrl-C or an error.

``--servers localhost,HOST...`` splits the clusters over several machines
(:class:`~emulator.net.multihost.ClusterEmulation`, docs/multihost.md): ranks
start from a rank pool on their host's server (:mod:`emulator.jobs.remotepool`; with
``--cold-start`` a cold one, whose ranks exec a new interpreter there); their JSON lines are
copied to ``--out`` here as they grow, the rest and their logs when their job ends.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import datetime as dt
import json
import statistics
import sys
import time
from collections.abc import Collection
from dataclasses import asdict
from pathlib import Path

from emulator import handback
from emulator.net.capability import require_root
from emulator.net.check import add_network_arguments, network_config, resolve_topology
from emulator.net.servers import ServerSet, add_server_arguments, assign_clusters, load_topology_with_servers, \
    server_set
from emulator.jobs.compute import COMPUTE_MODES
from emulator.jobs.dilation import Choice, choose_dilation, measure_op_overhead_s
from spiderflow.errors import EmulatorError
from emulator.jobs.launch import emulated_view, predict_emulated
from emulator.net.hoststeal import StealMeter, noticeable, stolen_sentence
from emulator.net.layout import NetConfig
from emulator.jobs.pool import RankPool
from emulator.jobs.replay import JobRun, RunConfig, Runner
from emulator.net.state import StateStore
from spiderflow.cliutil import (add_scheduler_arguments, dumps, float_in, input_file, int_in,
                                output_dir)
from spiderflow.costmodel import NO_CALIBRATION, Calibration, load_calibration, plan_work
from spiderflow.costmodel.calibration import check_calibration_applies
from spiderflow.errors import InfeasiblePlan
from spiderflow.placement import DEFAULT_PLANNER, PLANNERS, PlacementRequest, run_planner
from spiderflow.plan import placement_text
from spiderflow.provenance import provenance
from spiderflow.topology import Topology
from spiderflow.traces import load_trace
from spiderflow.wan import load_capacity_events, load_wan_events
from spiderflow.wan.cli import add_replan_argument
from spiderflow.workload import Job

HELP = "replay a trace: real torch.distributed ranks run the planned jobs on the emulated WAN"
DEFAULT_TOPOLOGY = "topologies/default.yaml"
DEFAULT_TRACE = "traces/default.csv"
DEFAULT_HOSTS = 4
SIZING_TIME_LIMIT_S = 2.0  # solver limit when --dilation auto plans each job alone to size K
# Sanity bounds of the options (a value past them is a typo, not a longer experiment)
MAX_ITERATIONS = 100_000
MAX_TIME_SCALE = 1e6
MAX_JOB_TIMEOUT_S = 7 * 86_400.0
CSV_FIELDS = ("job_id", "status", "placement", "plan", "ranks", "predicted_iteration_s", "startup_wall_s",
              "predicted_alone_iteration_s", "predicted_shared_iteration_s", "measured_iteration_s", "measured_min_s", "measured_max_s",
              "measured_iterations", "error_pct", "jct_s", "queue_s", "reason", "admission", "host_steal_pct")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = RunConfig()
    parser.add_argument("--topology", default=DEFAULT_TOPOLOGY, help="topology YAML (default %(default)s)")
    parser.add_argument("--trace", default=DEFAULT_TRACE, help="job trace (default %(default)s)")
    parser.add_argument("--planner", choices=sorted(PLANNERS), default=DEFAULT_PLANNER,
                        help="placement strategy (default %(default)s)")
    parser.add_argument("--iterations", type=int_in(2, MAX_ITERATIONS), default=d.iterations, metavar="K",
                        help=f"iterations each job runs, 2..{MAX_ITERATIONS:,} (default %(default)s)")
    parser.add_argument("--warmup", type=int_in(0, MAX_ITERATIONS - 2), default=d.warmup,
                        help="first iterations left out of the measurement, 0..iterations-2 (default %(default)s)")
    parser.add_argument("--time-scale", type=float_in(0.0, MAX_TIME_SCALE), default=d.time_scale,
                        help=f"divide the trace's arrival times by this, in (0, {MAX_TIME_SCALE:g}] "
                             "(default %(default)g)")
    parser.add_argument("--compute", choices=COMPUTE_MODES, default=d.compute,
                        help="emulated: sleep the cost model's GPU time (default); real: run CPU proxies of the "
                             "stages, sized to that time at this CPU's matmul rate (small runs only)")
    parser.add_argument("--job-timeout", type=float_in(0.0, MAX_JOB_TIMEOUT_S, "seconds"), default=d.job_timeout_s,
                        metavar="S",
                        help="fail a job still running S seconds after launch (real-equivalent: S x K wall "
                             f"seconds under dilation K; in (0, {MAX_JOB_TIMEOUT_S:g}]; default %(default)g)")
    parser.add_argument("--slow-start-after-idle", action="store_true",
                        help="keep the kernel's TCP slow start after idle (default: off in the emulated hosts, "
                             "so a pipeline transfer costs alpha + n / beta as the cost model assumes)")
    parser.add_argument("--cold-start", action="store_true",
                        help="start every rank as a new Python interpreter that imports torch, exec'd from a "
                             "cold pool on its server (default: fork it from a warm rank pool that imported torch "
                             "once, emulator/jobs/pool.py)")
    parser.add_argument("--calibration", type=input_file, default=None, metavar="FILE",
                        help="calibration JSON from `emulator calibrate`: the planner and the predictions use it")
    parser.add_argument("--calibration-any-topology", action="store_true",
                        help="apply --calibration although it records another topology than --topology")
    parser.add_argument("--wan-events", type=input_file, default=None, metavar="FILE",
                        help="WAN events CSV (docs/wan-events.md): links' bandwidth, latency and outages over "
                             "the trace's time, put in force on the live network at their times (compressed by "
                             "--time-scale and dilated like arrivals)")
    parser.add_argument("--capacity-events", type=input_file, default=None, metavar="FILE",
                        help="capacity events CSV (docs/wan-events.md): GPUs of a cluster withdrawn with a notice "
                             "and returned, on the trace's time; jobs on withdrawn GPUs are stopped and placed again")
    add_replan_argument(parser)
    add_scheduler_arguments(parser)
    parser.add_argument("--out", type=output_dir, default=None, help="output directory (default runs/<timestamp>)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    add_network_arguments(parser)
    add_server_arguments(parser)
    parser.set_defaults(hosts_per_cluster=DEFAULT_HOSTS)


def auto_dilation(topo: Topology, jobs: list[Job], net: NetConfig, *, planner: str,
                  calibration: Calibration) -> Choice:
    """``--dilation auto`` for a trace: every job planned alone on the whole topology (what it will
    run at best), sized by :func:`emulator.jobs.dilation.choose_dilation`."""
    view = emulated_view(topo, net, calibration=calibration)
    sized = []
    for job in jobs:
        try:
            res = run_planner(planner, PlacementRequest(job=job, topology=topo, calibration=calibration,
                                                        free_gpus={c.name: c.total_gpus for c in topo.clusters},
                                                        time_limit_s=SIZING_TIME_LIMIT_S))
        except InfeasiblePlan:
            continue
        plan = res.placement.plan
        work = plan_work(plan, view)
        sized.append((job.job_id, work, predict_emulated(plan, view)))
    return choose_dilation(sized, overhead_s=measure_op_overhead_s())


def check_calibration_dilation(calibration: Calibration, dilation: float) -> None:
    """A calibration fitted under one dilation carries that K's per-op costs: apply it at the same K."""
    if calibration.dilation is not None and calibration.dilation != dilation:
        raise EmulatorError(f"{calibration.source}: fitted at dilation {calibration.dilation:g}, this run uses "
                            f"{dilation:g}; pass --dilation {calibration.dilation:g} or calibrate again "
                            f"with --dilation {dilation:g}")


def calibrated_choice(calibration: Calibration, sized: Choice) -> Choice:
    """``auto`` with a calibration fitted at a recorded K: that K, whose per-op costs its fits carry
    (:func:`check_calibration_dilation`), saying what ``auto`` would have taken (``sized``)."""
    if calibration.dilation is None or calibration.dilation == sized.dilation:
        return sized
    return Choice(dilation=calibration.dilation,
                  reason=f"{calibration.source} was fitted at dilation {calibration.dilation:g} (auto would take "
                         f"{sized.dilation:g}: {sized.reason}; calibrate with --dilation {sized.dilation:g} for that)")


def resolve_network(args: argparse.Namespace, topo: Topology, jobs: list[Job], *, planner: str,
                    calibration: Calibration) -> tuple[NetConfig, Choice]:
    """The network options with ``--dilation`` resolved (``auto``: sized on ``planner``'s plans of
    every job alone, or the K a calibration was fitted at), checked against the calibration's dilation."""
    if args.dilation == "auto":
        choice = calibrated_choice(calibration, auto_dilation(topo, jobs, network_config(args, 1.0),
                                                              planner=planner, calibration=calibration))
    else:
        choice = Choice(dilation=args.dilation, reason="--dilation")
    net = network_config(args, choice.dilation)
    check_calibration_dilation(calibration, net.dilation)
    return net, choice


def check_warmup(args: argparse.Namespace) -> None:
    """--warmup against --iterations (each option's own range is checked by its type), before any work."""
    if args.warmup > args.iterations - 2:
        raise EmulatorError(f"--warmup must be in 0..iterations-2 = 0..{args.iterations - 2} (got {args.warmup}); "
                            "an iteration time needs two measured iteration ends: lower --warmup or raise "
                            "--iterations")


def servers_of(args: argparse.Namespace) -> ServerSet | None:
    """``--servers`` (None: this machine alone)."""
    servers = server_set(args)
    if servers is not None and len(servers.names) < 2:
        servers = None  # this machine alone
    return servers


def topology_split(path: str, servers: ServerSet | None) -> tuple[Topology, dict[str, str] | None]:
    """The topology of ``path`` (its ``server:`` keys taken out) and which server each cluster runs on
    (None: this machine alone); ``calibrate`` calls it once per ``--topology``."""
    topo, pins = load_topology_with_servers(resolve_topology(path))
    assignment = None if servers is None else assign_clusters(topo.names, servers.names, pins=pins,
                                                              source=topo.source)
    return topo, assignment


def servers_and_topology(args: argparse.Namespace) -> tuple[ServerSet | None, Topology, dict[str, str] | None]:
    """``--servers`` (None: this machine alone), the topology, and which server each cluster runs on;
    bad input fails here, before root (``run`` and ``compare``)."""
    servers = servers_of(args)
    topo, assignment = topology_split(args.topology, servers)
    return servers, topo, assignment


def check_split(topo: Topology, servers: ServerSet | None, assignment: dict[str, str] | None) -> None:
    """Is the split of ``topo`` over ``servers`` one the emulation can build (before root)?"""
    if assignment is not None:
        from emulator.net.multihost import check_assignment  # Mininet's cluster mode only when asked

        check_assignment(topo, assignment, servers.first)


def rank_start(cold: bool) -> str:
    """How ranks start (``config.json``'s ``rank_start``)."""
    return "cold (exec from each server's pool)" if cold else "warm pool"


def rank_pools(emu, servers: ServerSet | None, config: dict, log, *, cold: bool = False):
    """The rank pool(s) of ``emu``, as a context manager: one here, or one per server (``config`` gets
    the clock offsets). Warm, or with ``cold`` (``--cold-start``) cold: each rank execs a new
    interpreter on its own server, which imports torch itself (emulator/jobs/pool.py)."""
    if servers is None:
        return RankPool(emu, log=log, cold=cold)
    from emulator.jobs.remotepool import ServerPools

    config["clock_offsets"] = {s: o.as_json() for s, o in servers.offsets.items()}
    return ServerPools(emu, log=log, cold=cold)


def main(args: argparse.Namespace) -> int:
    check_warmup(args)
    servers, topo, assignment = servers_and_topology(args)  # bad inputs fail here, before root
    trace_path = resolve_topology(args.trace)
    jobs = load_trace(trace_path).jobs
    wan_events = load_wan_events(resolve_topology(args.wan_events), topo) if args.wan_events else ()
    capacity_events = (load_capacity_events(resolve_topology(args.capacity_events), topo)
                       if args.capacity_events else ())
    calibration = load_calibration(args.calibration) if args.calibration else NO_CALIBRATION
    check_calibration_applies(calibration, topo, allow_other_topology=args.calibration_any_topology)
    net, choice = resolve_network(args, topo, jobs, planner=args.planner, calibration=calibration)
    try:
        cfg = RunConfig(planner=args.planner, backfill=args.backfill, seed=args.seed, time_limit_s=args.time_limit,
                        search_budget=args.search_budget, wait=args.wait, replan=args.replan,
                        iterations=args.iterations,
                        warmup=args.warmup,
                        time_scale=args.time_scale, job_timeout_s=args.job_timeout, net=net,
                        warm_tcp=not args.slow_start_after_idle, compute=args.compute,
                        calibration=calibration)
    except ValueError as exc:
        raise EmulatorError(f"run: {exc}") from None
    check_split(topo, servers, assignment)
    require_root()
    StateStore().refuse_if_busy()  # a second run: one line, nothing written
    out = handback.make_output_dir(args.out or f"runs/{dt.datetime.now().strftime('%Y%m%d-%H%M%S')}")
    progress = lambda msg: print(f"[run] {msg}", file=sys.stderr, flush=True)  # noqa: E731
    config = {**provenance(), "topology": topo.source, "trace": trace_path, "jobs": len(jobs), "planner": cfg.planner,
              "backfill": cfg.backfill, "seed": cfg.seed, "time_limit_s": cfg.time_limit_s,
              "search_budget": cfg.search_budget, "wait": cfg.wait, "replan": cfg.replan,
              "iterations": cfg.iterations, "warmup": cfg.warmup, "time_scale": cfg.time_scale,
              "compute": cfg.compute, "calibration": args.calibration, "warm_tcp": cfg.warm_tcp,
              "job_timeout_s": cfg.job_timeout_s, "rank_timeout_s": cfg.rank_timeout_s,
              "rank_start": rank_start(args.cold_start),
              "scale": net.scale, "dilation": net.dilation, "dilation_reason": choice.reason,
              "net": asdict(net), "wan_events": args.wan_events,
              "capacity_events": args.capacity_events}
    if servers is not None:
        config.update(servers=list(servers.names), tunnel=servers.tunnel, assignment=assignment)
    (out / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    progress(f"{len(jobs)} jobs from {trace_path} on {topo.source}; planner {cfg.planner}; "
             f"{cfg.iterations} iterations ({cfg.warmup} warm-up); arrivals / {cfg.time_scale:g}; output {out}")
    progress(f"scale {net.scale:g}, dilation {net.dilation:g}: {choice.reason}")

    t0, meter = time.monotonic(), StealMeter()
    runner = None
    mechanism = None
    stolen = 0.0  # percent of the CPU the host stole during the run (set when it ends)
    try:
        with emulation(topo, net, servers, assignment, progress) as emu, contextlib.ExitStack() as stack:
            mechanism = emu.mechanism
            pool = stack.enter_context(rank_pools(emu, servers, config, progress, cold=args.cold_start))
            runner = Runner(topo, jobs, cfg, emu, out_dir=out, log=progress, pool=pool, wan_events=wan_events,
                            capacity_events=capacity_events)
            if runner.cpu_flops_per_s is not None:  # probed by the Runner: config.json gets it too
                config["cpu_flops_per_s"] = runner.cpu_flops_per_s
            (out / "config.json").write_text(json.dumps(config, indent=1) + "\n")  # and the clock offsets
            runner.run()  # marks what was still running if it raises
    finally:
        if runner is not None:
            wall, stolen = time.monotonic() - t0, 100 * meter.share()
            with unwritable_raises(out):  # a full disk: the network is down already, the results are lost
                write_results(out, runner.jobs, net, mechanism, wall, runner.peak_ranks, applied_events(runner),
                              host_steal_pct=stolen)
            progress(f"results in {out} ({wall:.0f} s in all, at most {runner.peak_ranks} ranks at once)")
    result = as_json(runner.jobs, net, out, runner.peak_ranks, applied_events(runner), host_steal_pct=stolen)
    if args.json:
        print(dumps(result, indent=1))
    else:
        print(format_table(runner.jobs, net, mechanism, out, host_steal_pct=stolen))
    return 0 if all(j.status == "ok" for j in runner.jobs) else 1


def emulation(topo: Topology, net: NetConfig, servers: ServerSet | None, assignment: dict[str, str] | None, log):
    """The emulated network: on this machine, or split over ``servers`` (Mininet only once we use it)."""
    if servers is None:
        from emulator.net.emulation import Emulation

        return Emulation(topo, net, log=log)
    from emulator.net.multihost import ClusterEmulation

    return ClusterEmulation(topo, net, servers=servers, assignment=assignment, log=log)


def applied_events(runner) -> list[dict] | None:
    """``result.json``'s ``wan_events`` (None: the run had neither --wan-events nor --capacity-events)."""
    if runner.changes is None:
        return None
    return [] if runner.player is None else [a.as_json() for a in runner.player.applied]


def after_change_errors(jobs: list[JobRun]) -> list[float]:
    """|error| after the last change (WAN event or re-placement) of every ok job that measured intervals after one."""
    out = []
    for j in jobs:
        after = j.as_json().get("after_change")
        if j.status == "ok" and after and after["error_pct"] is not None:
            out.append(abs(after["error_pct"]))
    return out


def as_json(jobs: list[JobRun], net: NetConfig, out: Path, peak_ranks: int | None = None,
            wan_events: list[dict] | None = None, host_steal_pct: float | None = None) -> dict:
    errs = [abs(j.error_pct) for j in jobs if j.error_pct is not None and j.status == "ok"]
    res = {"jobs": [j.as_json() for j in jobs], "scale": net.scale, "dilation": net.dilation, "out": str(out),
           "median_abs_error_pct": statistics.median(errs) if errs else None, "peak_ranks": peak_ranks,
           "host_steal_pct": None if host_steal_pct is None else round(host_steal_pct, 2)}
    if wan_events is not None:
        after = after_change_errors(jobs)
        res["wan_events"] = wan_events
        res["after_change_median_abs_error_pct"] = statistics.median(after) if after else None
        res["after_change_jobs"] = len(after)
        res["replanned"] = sum(1 for j in jobs if j.replanned)  # the simulator's summary keys
        res["rerouted"] = sum(1 for j in jobs if j.rerouted)
        res["lost_s"] = sum(j.lost_s for j in jobs)
    return res


def _fmt(x, spec=".3f") -> str:
    return "" if x is None else format(x, spec)


def unwritable(out: Path, exc: OSError) -> EmulatorError:
    """The one line for results that cannot be written to ``out`` (a full disk, most often)."""
    return EmulatorError(f"{out}: cannot write the run's results there ({exc.strerror or exc}); free space there, "
                         "or pass --out DIR on another file system, and run again")


@contextlib.contextmanager
def unwritable_raises(out: Path, *, only: Collection[int] | None = None):
    """Writes of results to ``out`` inside: an OSError becomes :func:`unwritable`'s line. ``only``: just
    those errnos (a block that does more than write, e.g. :data:`~spiderflow.cliutil.NO_SPACE`)."""
    try:
        yield
    except OSError as exc:
        if only is not None and exc.errno not in only:
            raise
        raise unwritable(out, exc) from None


def write_results(out: Path, jobs: list[JobRun], net: NetConfig, mechanism: str | None, wall_s: float,
                  peak_ranks: int, wan_events: list[dict] | None = None, *, host_steal_pct: float = 0.0) -> None:
    with open(out / "jobs.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=CSV_FIELDS)
        w.writeheader()
        for j in jobs:
            d = j.as_json()
            spread = d["measured_spread_s"] or [None, None]
            w.writerow({**{k: d.get(k) for k in CSV_FIELDS if k in d},
                        "placement": placement_text(d["placement"].items()),
                        "measured_min_s": spread[0], "measured_max_s": spread[1], "reason": d.get("reason", "")})
    res = as_json(jobs, net, out, peak_ranks, wan_events, host_steal_pct)
    (out / "summary.md").write_text(
        f"# emulator run\n\n{format_table(jobs, net, mechanism, out, host_steal_pct=host_steal_pct)}\n\n"
        f"wall time {wall_s:.0f} s; at most {peak_ranks} ranks at once\n")
    (out / "result.json").write_text(dumps(res, indent=1) + "\n")
    with open(out / "ranks.jsonl", "w") as fh:  # every rank's lines in one file
        for path in sorted((out / "ranks").glob("*.jsonl")):
            fh.write(path.read_text())


def format_table(jobs: list[JobRun], net: NetConfig, mechanism: str | None, out: Path, *,
                 host_steal_pct: float = 0.0) -> str:
    k = net.dilation
    lines = [f"scale {net.scale:g} (bytes and bandwidths / {net.scale:g}; intra-cluster capped at "
             f"{net.intra_cap_mbps * net.scale / 1000:g} Gbit/s real-equivalent), dilation {k:g} "
             f"(rates / {k:g}, delays and compute x {k:g}, measured / {k:g}), delay by {mechanism or '?'}"
             + net.buffers_note()
             + "; times in real-equivalent s, start-up in wall s",
             "",
             f"{'job':<14} {'placement':<26} {'ranks':>5} {'predicted':>9} {'measured':>9} {'spread':>15} "
             f"{'error':>7} {'shared':>7} {'error':>7} {'jct':>6} {'start-up':>8}  status"]
    for j in jobs:
        d = j.as_json()
        place = placement_text(j.first_segments or d["placement"].items())  # where its measured iterations ran
        spread = "-".join(_fmt(x) for x in d["measured_spread_s"]) if d["measured_spread_s"] else ""
        err = f"{j.error_pct:+.1f}%" if j.error_pct is not None else ""
        m, shared = j.measured_s, j.predicted_shared_s
        err_shared = f"{100 * (shared - m) / m:+.1f}%" if m and shared is not None else ""
        status = j.status + (f": {j.reason}" if j.status != "ok" else "")
        lines.append(f"{j.job.job_id:<14} {place:<26} {j.first_ranks or len(j.ranks):>5} {_fmt(j.predicted_s):>9} "
                     f"{_fmt(j.measured_s):>9} {spread:>15} {err:>7} {_fmt(shared):>7} {err_shared:>7} "
                     f"{_fmt(j.jct_s, '.1f'):>6} {_fmt(j.startup_wall_s, '.2f'):>8}  {status}")
    errs = [abs(j.error_pct) for j in jobs if j.error_pct is not None and j.status == "ok"]
    changed = [(j, j.as_json()["after_change"]) for j in jobs if j.changed_t is not None]
    if changed:
        lines += ["", "after the last change a job saw (a WAN event in force, or its new placement after a stop "
                      "or a move):"]
        for j, a in changed:
            err = f"{a['error_pct']:+.1f}%" if a["error_pct"] is not None else "n/a"
            where = f" on {placement_text(a['placement'].items())}" if j.attempt else ""
            lines.append(f"  {j.job.job_id:<14} at {a['t']:.2f} s{where}: predicted {_fmt(a['predicted_iteration_s'])} "
                         f"measured {_fmt(a['measured_iteration_s'])} over {a['measured_iterations']} "
                         f"iteration(s), error {err}")
    lines += ["", f"median |error| {statistics.median(errs):.1f}% over {len(errs)} job(s)" if errs
              else "no job measured",
              "predicted: the cost model with the link load at the job's launch (what the planner saw); "
              "shared: with the load of every job that overlapped it", f"output: {out}"]
    if noticeable(host_steal_pct):
        lines.insert(-1, stolen_sentence(f"{host_steal_pct:.0f}%", "during the run")
                     + ", so measured times run long by up to about that much")
    hit = [f"{j.job.job_id} {j.host_steal_pct:.0f}%" for j in jobs
           if j.host_steal_pct is not None and noticeable(j.host_steal_pct)]
    if hit:
        lines.insert(-1, f"measured while the host stole a noticeable share of the CPU: {', '.join(hit)}")
    return "\n".join(lines)
