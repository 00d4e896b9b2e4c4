"""``sudo python -m emulator compare``: the planners' headline measured on real traffic.

Builds one emulated network and replays the same trace on it once per
planner, each replay alone (:class:`~emulator.jobs.replay.Runner`, the
shared :class:`~spiderflow.scheduling.Scheduler`), then tears the network
down once. Beside every replay, the simulator predicts that same replay
(:func:`simulated_replay`): the same compressed arrivals, the same
iterations per job (``--iterations``), the same hosts per cluster, the
network as the emulator shapes it, the scheduling overhead charged on the
replay's clock (wall / dilation) and each job's start-up
(``--startup``: by default the model of :mod:`emulator.jobs.startup`,
the ranks' start-up, their rendezvous over the WAN and TCP's slow start on
fresh connections, which the cost model does not price), iterations priced by the cost model's exact schedule as the
emulator's own predictions are. Measured and simulated JCTs are thus
comparable job by job.

Output (``--out``, default ``runs/compare-<timestamp>``): ``config.json``
first; per planner a directory with ``emulator run``'s files (``jobs.csv``,
``result.json``, ``ranks/``); ``jobs-<planner>.csv`` (per job: placement,
predicted vs measured iteration time, the simulated replay's (the median of the
same intervals as the measured one: :func:`simulated_iteration_s`), measured vs
simulated JCT);
``summary.json``; ``headline.md``; ``jct_cdf.png``/``.pdf`` (measured solid,
simulated dashed). Ctrl-C tears the network down and writes what was
measured. Times are real-equivalent seconds (wall / dilation); overheads are
the planners' wall seconds.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import datetime as dt
import json
import statistics
import sys
import textwrap
import time
from pathlib import Path

from emulator import handback
from emulator.floors import replay_floors
from emulator.jobs.launch import emulated_topology
from emulator.jobs.replay import BASE_PORT, JobRun, RunConfig, Runner
from emulator.jobs.startup import startup_s as job_startup_s
from emulator.net.capability import require_root
from emulator.net.check import add_network_arguments, resolve_topology
from emulator.net.hoststeal import StealMeter, noticeable
from emulator.net.state import StateStore
from emulator.run import (DEFAULT_HOSTS, MAX_ITERATIONS, MAX_JOB_TIMEOUT_S, MAX_TIME_SCALE, applied_events,
                          check_split, check_warmup, emulation, rank_pools, resolve_network, servers_and_topology,
                          unwritable_raises, write_results)
from emulator.net.servers import add_server_arguments
from spiderflow.cliutil import (add_scheduler_arguments, dumps, float_in, input_file, int_in,
                                name_list, output_dir)
from spiderflow.costmodel import NO_CALIBRATION, load_calibration
from spiderflow.costmodel.calibration import check_calibration_applies
from spiderflow.errors import EmulatorError
from spiderflow.placement import PLANNERS
from spiderflow.plan import placement_text
from spiderflow.provenance import provenance
from spiderflow.simulate.engine import SimConfig, SimRecord, simulate
from spiderflow.simulate.floors import faster_link, floor_ratios, floors_text
from spiderflow.simulate.metrics import fmt_value, ratio_of, summarise
from spiderflow.topology import Topology
from spiderflow.traces import load_trace
from spiderflow.wan import load_capacity_events, load_wan_events
from spiderflow.wan.cli import add_replan_argument
from spiderflow.workload import Job

HELP = "replay a trace once per planner on one emulated network: measured vs simulated JCT and throughput"
DEFAULT_PLANNERS = ("spinsearch", "ilp", "ilp-topo", "genetic", "blind")
REFERENCE = "spinsearch"
MAX_STARTUP_S = 3600.0
SUMMARY_FIELDS = ("avg_jct_s", "p50_jct_s", "p95_jct_s", "throughput_tokens_per_s", "makespan_s",
                  "gpu_utilization", "avg_overhead_s")
JOB_FIELDS = ("job_id", "status", "placement", "simulated_placement", "ranks", "predicted_iteration_s",
              "measured_iteration_s", "iteration_error_pct", "simulated_iteration_s", "measured_jct_s",
              "simulated_jct_s", "jct_error_pct", "measured_queue_s", "simulated_queue_s", "startup_wall_s",
              "overhead_s", "overhead_cpu_s", "admission", "reason", "host_steal_pct")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = RunConfig()
    parser.add_argument("--topology", default="topologies/default.yaml", help="topology YAML (default %(default)s)")
    parser.add_argument("--trace", default="traces/default.csv", help="job trace (default %(default)s)")
    parser.add_argument("--planners", type=name_list(PLANNERS, "planner"), default=list(DEFAULT_PLANNERS),
                        help=f"comma-separated, each once, from {', '.join(PLANNERS)} "
                             f"(default {','.join(DEFAULT_PLANNERS)}); ratios are to {REFERENCE} when it is listed")
    parser.add_argument("--iterations", type=int_in(2, MAX_ITERATIONS), default=d.iterations, metavar="K",
                        help=f"iterations each job runs, in both the replay and its simulation, 2..{MAX_ITERATIONS:,} "
                             "(default %(default)s)")
    parser.add_argument("--warmup", type=int_in(0, MAX_ITERATIONS - 2), default=d.warmup,
                        help="first iterations left out of the measured iteration time, 0..iterations-2 "
                             "(default %(default)s); the JCT counts them all")
    parser.add_argument("--time-scale", type=float_in(0.0, MAX_TIME_SCALE), default=d.time_scale,
                        help="divide the trace's arrival times by this, in both (default %(default)g)")
    parser.add_argument("--startup", type=startup_arg, default="model", metavar="model|S",
                        help="what the simulation adds before each job's first iteration for its ranks' start-up: "
                             "model (emulator/jobs/startup.py: rendezvous and slow start over the job's WAN round "
                             "trips) or S real-equivalent seconds for every job (default %(default)s)")
    parser.add_argument("--job-timeout", type=float_in(0.0, MAX_JOB_TIMEOUT_S, "seconds"), default=d.job_timeout_s,
                        metavar="S", help="fail a job still running S real-equivalent seconds after launch "
                                          "(default %(default)g)")
    parser.add_argument("--calibration", type=input_file, default=None, metavar="FILE",
                        help="calibration JSON from `emulator calibrate`: planners, predictions and the "
                             "simulation use it")
    parser.add_argument("--calibration-any-topology", action="store_true",
                        help="apply --calibration although it records another topology than --topology")
    parser.add_argument("--wan-events", type=input_file, default=None, metavar="FILE",
                        help="WAN events CSV (docs/wan-events.md), in force on the live network at their "
                             "compressed times in each replay and in its simulation")
    parser.add_argument("--capacity-events", type=input_file, default=None, metavar="FILE",
                        help="capacity events CSV (docs/wan-events.md), compressed like arrivals, in both")
    add_replan_argument(parser)
    add_scheduler_arguments(parser)
    parser.add_argument("--out", type=output_dir, default=None,
                        help="output directory (default runs/compare-<timestamp>)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    add_network_arguments(parser)
    add_server_arguments(parser)
    parser.set_defaults(hosts_per_cluster=DEFAULT_HOSTS)


def startup_arg(text: str) -> str | float:
    return "model" if text == "model" else float_in(0.0, MAX_STARTUP_S, "seconds or 'model'", lo_open=False)(text)


def replay_jobs(jobs: list[Job], iterations: int) -> list[Job]:
    """The trace's jobs as both replays run them: ``iterations`` each (arrivals stay trace time)."""
    return [dataclasses.replace(j, iterations=iterations) for j in jobs]


def compressed_jobs(jobs: list[Job], time_scale: float) -> list[Job]:
    """The jobs on the replay's clock: every arrival / ``time_scale``."""
    return [dataclasses.replace(j, arrival_s=j.arrival_s / time_scale) for j in jobs]


def compressed_events(wan_events, capacity_events, time_scale: float) -> tuple[tuple, tuple]:
    """Event times on the replay's clock: every trace time (a notice too) / ``time_scale``."""
    wan = tuple(dataclasses.replace(e, time_s=e.time_s / time_scale) for e in wan_events)
    cap = tuple(dataclasses.replace(e, time_s=e.time_s / time_scale, notice_s=e.notice_s / time_scale,
                                    return_s=None if e.return_s is None else e.return_s / time_scale)
                for e in capacity_events)
    return wan, cap


def simulated_replay(topo: Topology, jobs: list[Job], cfg: RunConfig, *, startup: str | float = "model",
                     wan_events=(), capacity_events=()) -> list[SimRecord]:
    """The simulator's prediction of ``emulator run`` replaying ``jobs`` under ``cfg`` (module docstring)."""
    net = cfg.net
    startup_s = startup_of(startup, topo, net)
    compressed = compressed_jobs(jobs, cfg.time_scale)
    wan, cap = compressed_events(wan_events, capacity_events, cfg.time_scale)
    sim = SimConfig(planner=cfg.planner, backfill=cfg.backfill, seed=cfg.seed, time_limit_s=cfg.time_limit_s,
                    wait=cfg.wait, replan=cfg.replan,
                    search_budget=cfg.search_budget, calibration=cfg.calibration, charge_overhead=True,
                    overhead_scale=1.0 / net.dilation, startup_s=startup_s,
                    hosts_per_cluster={c.name: net.hosts_per_cluster for c in topo.clusters},
                    priced_topology=emulated_topology(topo, net), exact=True, record_paces=True,
                    wan_events=wan, capacity_events=cap)
    return simulate(topo, compressed, sim)


def startup_of(startup: str | float, topo: Topology, net) -> object:
    """``--startup`` as the simulation applies it: a function of the plan, or seconds."""
    return (lambda plan: job_startup_s(plan, topo, net.dilation)) if startup == "model" else startup


def _pct(predicted: float | None, measured: float | None) -> float | None:
    ok = predicted is not None and measured is not None and measured > 0
    return 100.0 * (predicted - measured) / measured if ok else None


def simulated_iteration_s(rec: SimRecord | None, warmup: int) -> float | None:
    """The simulated replay's figure for a job's iteration time, sharing included: the median of the
    same intervals its measured figure takes (from the warm-up on, up to the first change that reached
    it; :meth:`SimRecord.iteration_times`). None where there are none."""
    times = rec.iteration_times()[max(1, warmup):] if rec is not None else []
    return statistics.median(times) if times else None


def job_rows(measured: list[JobRun], simulated: list[SimRecord], warmup: int) -> list[dict]:
    sim = {r.job.job_id: r for r in simulated}
    rows = []
    for j in measured:
        s = sim.get(j.job.job_id)
        sim_iter = simulated_iteration_s(s, warmup)
        rows.append({
            "job_id": j.job.job_id, "status": j.status, "placement": dict(j.segments),
            "simulated_placement": dict(s.segments) if s else {}, "ranks": len(j.ranks),
            "predicted_iteration_s": j.predicted_s, "measured_iteration_s": j.measured_s,
            "iteration_error_pct": j.error_pct,
            "simulated_iteration_s": sim_iter,
            "measured_jct_s": j.jct_s if j.completed else None, "simulated_jct_s": s.jct_s if s else None,
            "jct_error_pct": _pct(s.jct_s if s else None, j.jct_s if j.completed else None),
            "measured_queue_s": j.queue_s, "simulated_queue_s": s.queue_s if s else None,
            "startup_wall_s": j.startup_wall_s, "overhead_s": j.overhead_s,
            "overhead_cpu_s": j.overhead_cpu_s, "admission": j.admission,
            "reason": j.reason if j.status != "ok" else "", "host_steal_pct": j.host_steal_pct})
    return rows


def planner_result(measured: list[JobRun], simulated: list[SimRecord], total_gpus: int, warmup: int) -> dict:
    m, s = summarise(measured, total_gpus), summarise(simulated, total_gpus)
    error = {k: _pct(s[k], m[k]) for k in SUMMARY_FIELDS if k != "avg_overhead_s"}
    return {"measured": m, "simulated": s, "error_pct": error, "jobs": job_rows(measured, simulated, warmup)}


def headline(results: dict[str, dict], reference: str = REFERENCE, floors: dict | None = None) -> str:
    """One row per planner: measured, simulated and their error; ratios to ``reference`` where
    every ratio > 1 means the reference is better (lower JCT, higher throughput, lower overhead);
    with ``floors`` (:mod:`emulator.floors`), each side's avg JCT over the floor and the throughput
    ceiling over its throughput (1.00x: there)."""
    ref = results.get(reference)
    lines = [f"| planner | completed | avg JCT measured (s) | simulated (s) | error | p95 JCT measured (s) "
             f"| throughput measured (tokens/s) | simulated | error | GPU utilisation | avg overhead (ms) "
             f"| JCT / {reference}'s: measured | simulated | {reference}'s throughput / planner's: measured "
             f"| simulated |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    if floors:
        lines = [lines[0] + " avg JCT / floor: measured | simulated | ceiling / throughput: measured | simulated |",
                 lines[1] + "---:|---:|---:|---:|"]
    for name, r in results.items():
        m, s, e = r["measured"], r["simulated"], r["error_pct"]
        rm, rs = (ref["measured"], ref["simulated"]) if ref else ({}, {})
        lines.append(
            f"| {name} | {m['completed']}/{m['jobs']} | {fmt_value(m['avg_jct_s'], '.2f')} | {fmt_value(s['avg_jct_s'], '.2f')} | "
            f"{fmt_value(e['avg_jct_s'], '+.1f', suffix='%')} | {fmt_value(m['p95_jct_s'], '.2f')} | "
            f"{fmt_value(m['throughput_tokens_per_s'], '.4g')} | {fmt_value(s['throughput_tokens_per_s'], '.4g')} | "
            f"{fmt_value(e['throughput_tokens_per_s'], '+.1f', suffix='%')} | {fmt_value(m['gpu_utilization'], '.1f', 100, '%')} | "
            f"{fmt_value(m['avg_overhead_s'], '.1f', 1e3)} | "
            f"{fmt_value(ratio_of(m['avg_jct_s'], rm.get('avg_jct_s')), '.2f', suffix='x')} | "
            f"{fmt_value(ratio_of(s['avg_jct_s'], rs.get('avg_jct_s')), '.2f', suffix='x')} | "
            f"{fmt_value(ratio_of(rm.get('throughput_tokens_per_s'), m['throughput_tokens_per_s']), '.2f', suffix='x')} | "
            f"{fmt_value(ratio_of(rs.get('throughput_tokens_per_s'), s['throughput_tokens_per_s']), '.2f', suffix='x')} |")
        if floors:
            lines[-1] += floor_cells(m, s, floors)
    return "\n".join(lines)


def floor_cells(measured: dict, simulated: dict, floors: dict) -> str:
    """avg JCT / floor and throughput ceiling / throughput, measured and simulated: four table cells."""
    (jct_m, thr_m), (jct_s, thr_s) = floor_ratios(measured, floors), floor_ratios(simulated, floors)
    return "".join(f" {fmt_value(r, '.2f', suffix='x')} |" for r in (jct_m, jct_s, thr_m, thr_s))


def ranking(results: dict[str, dict], side: str) -> list[str]:
    """Planners by avg JCT, best first (those with no completed job last)."""
    key = lambda n: (results[n][side]["avg_jct_s"] is None, results[n][side]["avg_jct_s"] or 0.0)  # noqa: E731
    return sorted(results, key=key)


def write_outputs(out: Path, results: dict[str, dict], meta: dict, floors_about: str = "") -> str:
    for name, r in results.items():
        with open(out / f"jobs-{name}.csv", "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=JOB_FIELDS)
            w.writeheader()
            for row in r["jobs"]:
                w.writerow({**{k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()},
                            "placement": placement_text(row["placement"].items()),
                            "simulated_placement": placement_text(row["simulated_placement"].items())})
    doc = {"planners": results, **meta}
    (out / "summary.json").write_text(dumps(doc, indent=1) + "\n")
    table = headline(results, floors=meta.get("floors"))
    text = (f"# emulator compare\n\n{meta['what']}\n\n{table}\n\n"
            f"Ranked by avg JCT, best first: measured {', '.join(ranking(results, 'measured'))}; "
            f"simulated {', '.join(ranking(results, 'simulated'))}.\n\n"
            "JCT and throughput in real-equivalent seconds (wall / dilation); error = (simulated - measured) / "
            "measured; every ratio > 1 means the reference planner is better.\n"
            + (f"\n{floors_about}\n" if floors_about else "") + stolen_note(results))
    (out / "headline.md").write_text(text)
    jct_cdf(results, out / "jct_cdf", f"JCT, measured vs simulated: {meta['what']}")
    return text


def floors_about(floors: dict | None, jobs: int, faster: str = "", events: bool = False) -> str:
    """The paragraph under the table on its floor columns (:mod:`emulator.floors`), or why there are none
    (``faster``: :func:`~spiderflow.simulate.floors.faster_link`)."""
    text = floors_text(floors, jobs, faster, events=events, source="emulator/floors.py",
                       priced=(", priced as the simulated replay prices it alone (the emulated network, the exact "
                               "schedule, the ranks' start-up allowance)"))
    if floors is None:
        return text
    return text + (" Measured times rest on the emulation, not on the cost model: they may fall under the floor by "
                   "as much as the cost model errs (the error columns).")


def stolen_note(results: dict[str, dict]) -> str:
    """A paragraph naming the replays during which the host stole a noticeable share of the CPU."""
    stolen = {name: r["host_steal_pct"] for name, r in results.items() if noticeable(r.get("host_steal_pct", 0.0))}
    if not stolen:
        return ""
    each = ", ".join(f"{name} {pct:.0f}%" for name, pct in stolen.items())
    return (f"\nThe host (hypervisor) stole this machine's CPU during replays ({each}; /proc/stat steal): every "
            "emulated process stops meanwhile, so those replays' measured times run long by up to about that "
            "much, and measured ratios between planners lean against them; run again when the host is quieter.\n")


def jct_cdf(results: dict[str, dict], stem: Path, title: str) -> None:
    """Measured (solid) and simulated (dashed) JCT CDFs per planner, one colour per planner; PNG and PDF."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (name, r) in enumerate(results.items()):
        for side, style in (("measured", "-"), ("simulated", "--")):
            xs = [row[f"{side}_jct_s"] for row in r["jobs"] if row[f"{side}_jct_s"] is not None]
            if xs:
                ax.ecdf(xs, linestyle=style, color=colours[i % len(colours)], label=f"{name} {side}")
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (real-equivalent s, log scale)")
    ax.set_ylabel("fraction of jobs")
    ax.set_title(textwrap.fill(title, 90), fontsize=8)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="lower right", ncols=2)
    fig.tight_layout()
    for ext in ("png", "pdf"):
        fig.savefig(stem.with_suffix(f".{ext}"), dpi=120)
    plt.close(fig)


def main(args: argparse.Namespace) -> int:
    check_warmup(args)
    servers, topo, assignment = servers_and_topology(args)  # bad inputs fail here, before root
    trace_path = resolve_topology(args.trace)
    jobs = replay_jobs(load_trace(trace_path).jobs, args.iterations)
    wan_events = load_wan_events(resolve_topology(args.wan_events), topo) if args.wan_events else ()
    capacity_events = (load_capacity_events(resolve_topology(args.capacity_events), topo)
                       if args.capacity_events else ())
    calibration = load_calibration(args.calibration) if args.calibration else NO_CALIBRATION
    check_calibration_applies(calibration, topo, allow_other_topology=args.calibration_any_topology)
    planners = list(args.planners)
    # --dilation auto: sized by the reference planner's plans of every job alone
    net, choice = resolve_network(args, topo, jobs, planner=REFERENCE if REFERENCE in planners else planners[0],
                                  calibration=calibration)
    try:
        base = RunConfig(backfill=args.backfill, seed=args.seed, time_limit_s=args.time_limit, wait=args.wait,
                         replan=args.replan,
                         search_budget=args.search_budget, iterations=args.iterations, warmup=args.warmup,
                         time_scale=args.time_scale, job_timeout_s=args.job_timeout, net=net,
                         calibration=calibration)
    except ValueError as exc:
        raise EmulatorError(f"compare: {exc}") from None
    check_split(topo, servers, assignment)
    require_root()
    StateStore().refuse_if_busy()
    out = handback.make_output_dir(args.out or f"runs/compare-{dt.datetime.now().strftime('%Y%m%d-%H%M%S')}")
    progress = lambda msg: print(f"[compare] {msg}", file=sys.stderr, flush=True)  # noqa: E731
    what = (f"{len(jobs)} jobs of {Path(trace_path).name} on {topo.name}, {args.iterations} iterations each, "
            f"arrivals / {args.time_scale:g}, {net.hosts_per_cluster} hosts per cluster, scale {net.scale:g}, "
            f"dilation {net.dilation:g}"
            + net.buffers_note()
            + f", {'backfill' if args.backfill else 'FIFO'}, ILP limit {args.time_limit:g} s, "
            f"genetic {args.search_budget or 4900} trials")
    config = {**provenance(), "topology": topo.source, "trace": trace_path, "jobs": len(jobs), "planners": planners,
              "iterations": args.iterations, "warmup": args.warmup, "time_scale": args.time_scale,
              "backfill": args.backfill, "wait": args.wait, "replan": args.replan, "seed": args.seed,
              "time_limit_s": args.time_limit,
              "search_budget": args.search_budget, "calibration": args.calibration,
              "startup": args.startup, "scale": net.scale, "dilation": net.dilation,
              "dilation_reason": choice.reason, "net": dataclasses.asdict(net),
              "wan_events": args.wan_events, "capacity_events": args.capacity_events}
    if servers is not None:
        config.update(servers=list(servers.names), tunnel=servers.tunnel, assignment=assignment)
    (out / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    progress(f"{what}; planners {', '.join(planners)}; output {out}")
    progress(f"dilation {net.dilation:g}: {choice.reason}")
    faster = faster_link(topo, wan_events)  # a link faster than the floors plan on: none
    floors = None if faster else replay_floors(topo, compressed_jobs(jobs, base.time_scale), base,
                                               startup_of(args.startup, topo, net))
    about = floors_about(floors, len(jobs), faster, events=bool(wan_events or capacity_events))
    meta = {"what": what, "dilation": net.dilation, "scale": net.scale, "out": str(out), "floors": floors}
    results: dict[str, dict] = {}
    t0 = time.monotonic()
    try:
        with emulation(topo, net, servers, assignment, progress) as emu, contextlib.ExitStack() as stack:
            pool = stack.enter_context(rank_pools(emu, servers, config, progress))
            (out / "config.json").write_text(json.dumps(config, indent=1) + "\n")  # with the clock offsets
            port = BASE_PORT
            for name in planners:
                cfg = dataclasses.replace(base, planner=name)
                progress(f"{name}: replaying (simulating the same replay first)")
                simulated = simulated_replay(topo, jobs, cfg, startup=args.startup, wan_events=wan_events,
                                             capacity_events=capacity_events)
                runner = Runner(topo, jobs, cfg, emu, out_dir=out / name, pool=pool, first_port=port,
                                log=lambda m, name=name: progress(f"{name}: {m}"), wan_events=wan_events,
                                capacity_events=capacity_events)
                started, meter = time.monotonic(), StealMeter()
                try:
                    runner.run()  # marks what was still running if it raises
                finally:
                    stolen = 100 * meter.share()
                    with unwritable_raises(out):  # a full disk: the network comes down next, the results are lost
                        write_results(out / name, runner.jobs, net, emu.mechanism, time.monotonic() - started,
                                      runner.peak_ranks, applied_events(runner), host_steal_pct=stolen)
                    results[name] = {**planner_result(runner.jobs, simulated, topo.total_gpus, cfg.warmup),
                                     "host_steal_pct": round(stolen, 2)}
                port = runner.next_port
                r = results[name]
                progress(f"{name}: avg JCT measured {fmt_value(r['measured']['avg_jct_s'], '.2f')} s, simulated "
                         f"{fmt_value(r['simulated']['avg_jct_s'], '.2f')} s ({fmt_value(r['error_pct']['avg_jct_s'], '+.1f')}%); "
                         f"{time.monotonic() - started:.0f} s wall")
    finally:
        if results:
            meta["wall_s"] = round(time.monotonic() - t0, 1)
            with unwritable_raises(out):
                write_outputs(out, results, meta, about)
            progress(f"results in {out} ({meta['wall_s']:.0f} s in all)")
    if args.json:
        print(dumps({"planners": results, **meta}, indent=1))
    else:
        print((out / "headline.md").read_text())
    return 0 if all(j["status"] == "ok" for r in results.values() for j in r["jobs"]) else 1
