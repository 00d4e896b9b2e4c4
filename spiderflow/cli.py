"""``python -m spiderflow``: one entry point, one error handler.

Known errors (``SpiderFlowError``) print one line and exit with their code
(2); ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import sys

from spiderflow import __version__, shipped
from spiderflow.cliutil import (MAX_SEED, MAX_TIME_LIMIT_S, OneLineParser, dumps, input_file, int_in, run_main,
                                int_list, make_output_dir, name_list, output_dir, output_file, seed_arg,
                                time_limit_arg, write_output_file)
from spiderflow.costmodel import NO_CALIBRATION, load_calibration
from spiderflow.costmodel.calibration import check_calibration_applies
from spiderflow.errors import ConfigError, SpiderFlowError
from spiderflow.placement import DEFAULT_PLANNER, PLANNERS, PlacementRequest, run_planner
from spiderflow.topology import load_topology
from spiderflow.topology.generate import generate_topology, topology_to_yaml
from spiderflow.workload import MODELS, Job


# Sanity bounds of the options (a value past them is a typo, not a bigger experiment)
MAX_GPUS = 1_000_000
MAX_GLOBAL_BATCH = 1_000_000  # sequences per iteration
MAX_SEQ_LEN = 1_048_576  # tokens
MAX_GENERATED_CLUSTERS = 4096


def add_plan(sub) -> None:
    p = sub.add_parser("plan", help="place and plan one job, print the plan and its prediction")
    p.add_argument("--topology", default="default",
                   help="topology YAML, or a shipped name: " + ", ".join(shipped.names("topology"))
                        + " (default %(default)s)")
    p.add_argument("--model", required=True, choices=list(MODELS), help="model to train")
    p.add_argument("--gpus", required=True, type=int_in(1, MAX_GPUS), help=f"1..{MAX_GPUS:,}")
    p.add_argument("--global-batch", type=int_in(1, MAX_GLOBAL_BATCH), default=256,
                   help=f"sequences per iteration, 1..{MAX_GLOBAL_BATCH:,} (default %(default)s)")
    p.add_argument("--seq-len", type=int_in(1, MAX_SEQ_LEN), default=2048,
                   help=f"tokens, 1..{MAX_SEQ_LEN:,} (default %(default)s)")
    p.add_argument("--clusters", type=name_list(what="cluster"),
                   help="comma-separated clusters to use, in pipeline order")
    p.add_argument("--planner", default=DEFAULT_PLANNER, choices=list(PLANNERS),
                   help="placement strategy (default %(default)s)")
    p.add_argument("--calibration", type=input_file,
                   help="calibration JSON from `emulator calibrate` (default: none)")
    p.add_argument("--calibration-any-topology", action="store_true",
                   help="apply --calibration although it records another topology than --topology")
    p.add_argument("--seed", type=seed_arg, default=0, help=f"0..{MAX_SEED} (default %(default)s)")
    p.add_argument("--time-limit", type=time_limit_arg, default=60.0,
                   help=f"solver time limit, seconds, in (0, {MAX_TIME_LIMIT_S:g}] (default %(default)g)")
    p.add_argument("--json", action="store_true", help="print the plan as one JSON object")
    p.set_defaults(func=cmd_plan)


def cmd_plan(args) -> int:
    topo = load_topology(args.topology)
    cal = load_calibration(args.calibration) if args.calibration else NO_CALIBRATION
    check_calibration_applies(cal, topo, allow_other_topology=args.calibration_any_topology)
    allowed = None
    if args.clusters:
        allowed = tuple(args.clusters)
        for name in allowed:
            if name not in topo.names:
                raise ConfigError(f"--clusters: {name!r} is not a cluster of {args.topology}; "
                                  f"known: {', '.join(topo.names)}")
    job = Job(job_id=f"{args.model}/{args.gpus}gpu", arrival_s=0.0, model=args.model, gpus=args.gpus, iterations=1,
              global_batch=args.global_batch, seq_len=args.seq_len)
    req = PlacementRequest(job=job, topology=topo, free_gpus={c.name: c.total_gpus for c in topo.clusters},
                           calibration=cal, seed=args.seed, time_limit_s=args.time_limit, allowed=allowed)
    result = run_planner(args.planner, req)
    out = plan_json(result)
    if args.json:
        print(dumps(out))
    else:
        print(format_plan(out))
    return 0


def plan_json(result) -> dict:
    plan, pred = result.placement.plan, result.prediction
    return {
        "planner": result.planner,
        "status": result.placement.status,
        "overhead_s": result.overhead_s,
        "model": plan.job.model,
        "placement": plan.placement,
        "pipeline_order": [c for c, _ in result.placement.segments],
        "stages": plan.describe(),
        "replicas": len(plan.replicas),
        "micro_batches": plan.micro_batches,
        "micro_batch_size": plan.micro_batch_size,
        "global_batch": plan.global_batch,
        "recompute": plan.recompute,
        "zero1": plan.zero1,
        "predicted": pred.as_dict(),
        "memory_gb_per_gpu": pred.memory_gb_per_gpu,
    }


def format_plan(out: dict) -> str:
    """The plan as text, human units (``--json`` has the raw seconds and bytes). Layer ranges are
    half-open, ``[start, end)``, as in the JSON's ``layers``. The iteration's breakdown adds up: the
    busiest stage computes, waits on transfers, waits on other stages, then the exposed sync."""
    from spiderflow.simulate.metrics import decimals, duration_unit, human_duration, rounded_parts

    lines = [f"planner {out['planner']} ({out['status']}), decided in {human_duration(out['overhead_s'])}",
             "placement: " + ", ".join(f"{c}={g}" for c, g in out["placement"].items()),
             f"{out['replicas']} replica(s); micro-batch {out['micro_batch_size']} x {out['micro_batches']} "
             f"(global batch {out['global_batch']}); zero1={out['zero1']} recompute={out['recompute']}",
             f"{'rep':>3} {'stage':>5} {'cluster':<10} {'layers':<10} {'tp':>3} {'dp':>3} {'gpus':>5}"]
    for s in out["stages"]:
        layers = f"[{s['layers'][0]}, {s['layers'][1]})"
        lines.append(f"{s['replica']:>3} {s['stage']:>5} {s['cluster']:<10} {layers:<10} {s['tp']:>3} "
                     f"{s['dp']:>3} {s['gpus']:>5}")
    lines.append("(layers [start, end): half-open, end excluded)")
    p = out["predicted"]
    total = p["iteration_s"]
    unit, per = duration_unit(total)
    places = min(decimals(total / per), 3)
    names = ("compute", "exposed p2p", "bubble", "exposed dp sync")
    raw = [p["compute_s"], p["exposed_p2p_s"], p["compute_wait_s"], p["dp_sync_s"]]
    shown = rounded_parts(total / per, [x / per for x in raw], places)
    share = rounded_parts(100.0, [x / total * 100 if total > 0 else 0.0 for x in raw], 0)
    lines.append(f"predicted iteration {total / per:.{places}f} {unit} = "
                 + " + ".join(f"{name} {v:.{places}f} {unit} ({pct:.0f}%)"
                              for name, v, pct in zip(names, shown, share)))
    lines.append("  (the busiest stage's time: its compute, waiting on transfers, waiting on other stages, "
                 "then the sync)")
    lines.append(f"overlapped (not added above): p2p {human_duration(p['p2p_s'])} per iteration on the busiest "
                 f"boundary (one direction), dp sync {human_duration(p['dp_sync_total_s'])} on the longest stage")
    lines.append(f"memory: {out['memory_gb_per_gpu']:.1f} GB per GPU (largest stage)")
    return "\n".join(lines)


def add_topology(sub) -> None:
    p = sub.add_parser("topology", help="topology tools")
    tsub = p.add_subparsers(dest="topology_cmd", required=True)
    g = tsub.add_parser("generate", help="a reproducible geo-random sparse topology")
    g.add_argument("--clusters", type=int_in(2, MAX_GENERATED_CLUSTERS), required=True,
                   help=f"2..{MAX_GENERATED_CLUSTERS}")
    g.add_argument("--seed", type=seed_arg, default=0, help=f"0..{MAX_SEED} (default %(default)s)")
    g.add_argument("--out", type=output_file, required=True, help="YAML file to write")
    g.add_argument("--json", action="store_true", help="print what was written as one JSON object")
    g.set_defaults(func=cmd_topology_generate)
    c = tsub.add_parser("check", help="load and validate a topology file")
    c.add_argument("file", help="topology YAML, or a shipped name")
    c.add_argument("--json", action="store_true", help="print the topology's summary as one JSON object")
    c.set_defaults(func=cmd_topology_check)


def topology_summary(topo) -> dict:
    """What `topology check` and `topology generate` report of a topology (``--json``)."""
    from spiderflow.traces.cli import printable

    return {"name": topo.name, "source": printable(str(topo.source)), "routing": topo.routing,
            "clusters": len(topo.clusters), "links": len(topo.links), "total_gpus": topo.total_gpus,
            "by_cluster": {c.name: {"gpu": c.gpu, "gpus": c.total_gpus} for c in topo.clusters}}


def cmd_topology_generate(args) -> int:
    from spiderflow.traces.cli import printable

    topo = generate_topology(args.clusters, args.seed)
    write_output_file(args.out, topology_to_yaml(topo, seed=args.seed))
    if args.json:
        print(dumps({"out": printable(args.out), "seed": args.seed, **topology_summary(topo)}))
    else:
        print(f"wrote {args.out}: {len(topo.clusters)} clusters, {len(topo.links)} links, "
              f"{topo.total_gpus} GPUs (seed {args.seed})")
    return 0


def cmd_topology_check(args) -> int:
    from spiderflow.traces.cli import printable

    topo = load_topology(args.file)
    if args.json:
        print(dumps({"file": printable(args.file), "ok": True, **topology_summary(topo)}))
    else:
        print(f"{args.file}: ok ({len(topo.clusters)} clusters, {len(topo.links)} links, "
              f"{topo.total_gpus} GPUs, routing {topo.routing})")
    return 0


def add_bench(sub) -> None:
    p = sub.add_parser("bench", help="benchmarks")
    bsub = p.add_subparsers(dest="bench_cmd", required=True)
    b = bsub.add_parser("planner", help="scheduling overhead and plan quality of every planner")
    b.add_argument("--clusters", type=int_list(2, MAX_GENERATED_CLUSTERS), default=[8, 16, 32, 64, 128],
                   help=f"comma-separated topology sizes, each 2..{MAX_GENERATED_CLUSTERS}")
    b.add_argument("--jobs", type=int_in(1, 10_000), default=20, help="jobs per size, 1..10,000")
    b.add_argument("--seed", type=seed_arg, default=0, help=f"0..{MAX_SEED} (default %(default)s)")
    b.add_argument("--planners", type=name_list(PLANNERS, "planner"), default=list(PLANNERS),
                   help=f"comma-separated; default all: {','.join(PLANNERS)}")
    b.add_argument("--time-limit", type=time_limit_arg, default=10.0,
                   help=f"ILP time limit per decision, seconds, in (0, {MAX_TIME_LIMIT_S:g}] (default %(default)g)")
    b.add_argument("--out", type=output_dir, default="runs/bench-planner",
                   help="directory for planner.md and the CSVs (default %(default)s; the committed results "
                        "are in benchmarks/results)")
    b.add_argument("--json", action="store_true",
                   help="print the summary (one object per size and planner; overheads in ms, ratios to "
                        "SpinSearch; null where a planner planned nothing) instead of planner.md")
    b.set_defaults(func=cmd_bench_planner)


def cmd_bench_planner(args) -> int:
    from tqdm import tqdm

    from spiderflow import bench

    out = make_output_dir(args.out)  # before the benchmark's minutes, not after
    planners = list(args.planners)
    if "spinsearch" not in planners:
        planners.insert(0, "spinsearch")
    rows = []
    with tqdm(total=len(args.clusters) * args.jobs * len(planners), desc="planning", unit="job",
              disable=args.json) as bar:
        for n in args.clusters:
            rows += bench.run_size(n, args.jobs, args.seed, planners, time_limit_s=args.time_limit,
                                   progress=bar)
    summary = bench.summarise(rows)
    command = "python -m spiderflow bench planner " + " ".join(sys.argv[3:] if len(sys.argv) > 3 else [])
    md = bench.write_results(rows, summary, out, bench.header_line(command.strip()))
    if args.json:
        from spiderflow.traces.cli import printable

        print(dumps({"out": printable(str(md.parent)), "machine": bench.machine(), "seed": args.seed,
                     "jobs_per_size": args.jobs, "time_limit_s": args.time_limit, "summary": summary}))
    else:
        print(md.read_text())
        print(f"wrote {md} and CSVs beside it")
    return 0


def add_sim_commands(sub) -> None:
    from spiderflow.simulate import commands

    commands.add_simulate(sub)
    commands.add_compare(sub)
    commands.add_trace(sub)


def add_wan_commands(sub) -> None:
    from spiderflow.wan.cli import add_wan

    add_wan(sub)


COMMANDS = [add_plan, add_topology, add_bench, add_sim_commands, add_wan_commands]


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="python -m spiderflow", description=__doc__.splitlines()[0])
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    parser.add_argument("--version", action="version", version=f"spiderflow {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in COMMANDS:
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    return run_main(_main, argv)


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except SpiderFlowError as exc:
        if args.debug:
            raise
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
