"""``python -m spiderflow``: one entry point, one error handler.

Known errors (``SpiderFlowError``) print one line and exit with their code
(2); ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from spiderflow.costmodel import NO_CALIBRATION, load_calibration
from spiderflow.errors import ConfigError, SpiderFlowError
from spiderflow.placement import DEFAULT_PLANNER, PLANNERS, PlacementRequest, run_planner
from spiderflow.topology import load_topology
from spiderflow.topology.generate import generate_topology, topology_to_yaml
from spiderflow.workload import MODELS, Job


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer (got {text!r})") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer (got {text!r})")
    return value


def add_plan(sub) -> None:
    p = sub.add_parser("plan", help="place and plan one job, print the plan and its prediction")
    p.add_argument("--topology", default="topologies/default.yaml")
    p.add_argument("--model", required=True, choices=list(MODELS))
    p.add_argument("--gpus", required=True, type=_positive_int)
    p.add_argument("--global-batch", type=_positive_int, default=256)
    p.add_argument("--seq-len", type=_positive_int, default=2048)
    p.add_argument("--clusters", help="comma-separated clusters to use, in pipeline order")
    p.add_argument("--planner", default=DEFAULT_PLANNER, choices=list(PLANNERS))
    p.add_argument("--calibration", help="calibration JSON from `emulator calibrate`")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--time-limit", type=float, default=60.0, help="solver time limit, seconds")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_plan)


def cmd_plan(args) -> int:
    topo = load_topology(args.topology)
    cal = load_calibration(args.calibration) if args.calibration else NO_CALIBRATION
    allowed = None
    if args.clusters:
        allowed = tuple(c.strip() for c in args.clusters.split(",") if c.strip())
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
        print(json.dumps(out, indent=2))
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
    lines = [f"planner {out['planner']} ({out['status']}), decided in {out['overhead_s'] * 1e3:.1f} ms",
             "placement: " + ", ".join(f"{c}={g}" for c, g in out["placement"].items()),
             f"{out['replicas']} replica(s); micro-batch {out['micro_batch_size']} x {out['micro_batches']} "
             f"(global batch {out['global_batch']}); zero1={out['zero1']} recompute={out['recompute']}",
             f"{'rep':>3} {'stage':>5} {'cluster':<10} {'layers':>9} {'tp':>3} {'dp':>3} {'gpus':>5}"]
    for s in out["stages"]:
        lines.append(f"{s['replica']:>3} {s['stage']:>5} {s['cluster']:<10} "
                     f"{s['layers'][0]:>4}-{s['layers'][1]:<4} {s['tp']:>3} {s['dp']:>3} {s['gpus']:>5}")
    p = out["predicted"]
    lines.append(f"predicted iteration {p['iteration_s']:.3f} s: compute {p['compute_s']:.3f} s, "
                 f"p2p {p['p2p_s']:.3f} s, exposed dp sync {p['dp_sync_s']:.3f} s, bubble {p['bubble_s']:.3f} s")
    lines.append(f"memory: {out['memory_gb_per_gpu']:.1f} GB per GPU (largest stage)")
    return "\n".join(lines)


def add_topology(sub) -> None:
    p = sub.add_parser("topology", help="topology tools")
    tsub = p.add_subparsers(dest="topology_cmd", required=True)
    g = tsub.add_parser("generate", help="a reproducible geo-random sparse topology")
    g.add_argument("--clusters", type=_positive_int, required=True)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--out", required=True)
    g.set_defaults(func=cmd_topology_generate)
    c = tsub.add_parser("check", help="load and validate a topology file")
    c.add_argument("file")
    c.set_defaults(func=cmd_topology_check)


def cmd_topology_generate(args) -> int:
    if args.clusters < 2:
        raise ConfigError(f"--clusters must be >= 2 (got {args.clusters})")
    topo = generate_topology(args.clusters, args.seed)
    Path(args.out).write_text(topology_to_yaml(topo))
    print(f"wrote {args.out}: {len(topo.clusters)} clusters, {len(topo.links)} links, "
          f"{topo.total_gpus} GPUs")
    return 0


def cmd_topology_check(args) -> int:
    topo = load_topology(args.file)
    print(f"{args.file}: ok ({len(topo.clusters)} clusters, {len(topo.links)} links, "
          f"{topo.total_gpus} GPUs, routing {topo.routing})")
    return 0


def _int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated integers (got {text!r})") from None
    if not values or min(values) < 2:
        raise argparse.ArgumentTypeError(f"must be integers >= 2 (got {text!r})")
    return values


def add_bench(sub) -> None:
    p = sub.add_parser("bench", help="benchmarks")
    bsub = p.add_subparsers(dest="bench_cmd", required=True)
    b = bsub.add_parser("planner", help="scheduling overhead and plan quality of every planner")
    b.add_argument("--clusters", type=_int_list, default=[8, 16, 32, 64, 128])
    b.add_argument("--jobs", type=_positive_int, default=20)
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--planners", default=None, help=f"comma-separated; default all: {','.join(PLANNERS)}")
    b.add_argument("--time-limit", type=float, default=10.0, help="ILP time limit per decision, seconds")
    b.add_argument("--out", default="benchmarks/results")
    b.set_defaults(func=cmd_bench_planner)


def cmd_bench_planner(args) -> int:
    from tqdm import tqdm

    from spiderflow import bench

    planners = [p.strip() for p in (args.planners or ",".join(PLANNERS)).split(",") if p.strip()]
    for name in planners:
        if name not in PLANNERS:
            raise ConfigError(f"--planners: unknown planner {name!r}; known: {', '.join(PLANNERS)}")
    if "spinsearch" not in planners:
        planners.insert(0, "spinsearch")
    rows = []
    with tqdm(total=len(args.clusters) * args.jobs * len(planners), desc="planning", unit="job") as bar:
        for n in args.clusters:
            rows += bench.run_size(n, args.jobs, args.seed, planners, time_limit_s=args.time_limit,
                                   progress=bar)
    summary = bench.summarise(rows)
    command = "python -m spiderflow bench planner " + " ".join(sys.argv[3:] if len(sys.argv) > 3 else [])
    md = bench.write_results(rows, summary, Path(args.out), bench.header_line(command.strip()))
    print(md.read_text())
    print(f"wrote {md} and CSVs beside it")
    return 0


def add_sim_commands(sub) -> None:
    from spiderflow.simulate import commands

    commands.add_simulate(sub)
    commands.add_compare(sub)
    commands.add_trace(sub)


COMMANDS = [add_plan, add_topology, add_bench, add_sim_commands]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m spiderflow", description=__doc__.splitlines()[0])
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in COMMANDS:
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
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
