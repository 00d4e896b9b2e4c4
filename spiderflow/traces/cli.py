"""The ``trace`` subcommands: ``trace generate`` (synthetic, optionally sized to a load) and
``trace import`` (a public trace mapped to our CSV, each mapping rule reported on stderr)."""

from __future__ import annotations

import sys

from spiderflow.cliutil import MAX_SEED, dumps, float_in, int_in, output_file, power_of_two_in, seed_arg
from spiderflow.errors import ConfigError
from spiderflow.traces.generate import (ARRIVALS, MAX_LOAD, MAX_MEAN_INTERARRIVAL_S, generate_trace,
                                        mean_gap_for_load, offered_load)
from spiderflow.traces.load import load_trace
from spiderflow.traces.mapping import (FRACTIONAL_MODES, MAX_GPU_SCALE, SMALL_MODES, UNFINISHED_MODES)
from spiderflow.traces.ours import write_trace
from spiderflow.traces.sniff import FORMATS

MAX_GENERATED_JOBS = 1_000_000
MAX_TRACE_GPUS = 1 << 20
DEFAULT_MEAN_INTERARRIVAL_S = 600.0


def add_trace(sub) -> None:
    p = sub.add_parser("trace", help="trace tools")
    tsub = p.add_subparsers(dest="trace_cmd", required=True)
    g = tsub.add_parser("generate", help="a reproducible synthetic LLM-training trace")
    g.add_argument("--jobs", type=int_in(1, MAX_GENERATED_JOBS), required=True, help=f"1..{MAX_GENERATED_JOBS:,}")
    g.add_argument("--seed", type=seed_arg, default=0, help=f"0..{MAX_SEED} (default %(default)s)")
    g.add_argument("--arrival", choices=ARRIVALS, default="poisson")
    g.add_argument("--mean-interarrival", type=float_in(0.0, MAX_MEAN_INTERARRIVAL_S, "seconds"),
                   help=f"seconds, in (0, {MAX_MEAN_INTERARRIVAL_S:g}] (default {DEFAULT_MEAN_INTERARRIVAL_S:g}; "
                        "not with --load)")
    g.add_argument("--max-gpus", type=power_of_two_in(8, MAX_TRACE_GPUS), default=512,
                   help=f"a power of two in 8..{MAX_TRACE_GPUS:,} (default %(default)s; with --topology at most "
                        "its GPUs, rounded down to a power of two)")
    g.add_argument("--topology", help="topology whose GPUs --load refers to (needs --load)")
    g.add_argument("--load", type=float_in(0.0, MAX_LOAD),
                   help=f"offered load in (0, {MAX_LOAD:g}] of --topology's GPUs: the mean gap between "
                        "arrivals is chosen so that sum(GPUs x run time) / (GPUs x span of arrivals) = LOAD")
    g.add_argument("--out", type=output_file, required=True, help="CSV file to write")
    g.add_argument("--json", action="store_true",
                   help="print what was written as one JSON object (seconds; offered_load null without --load)")
    g.set_defaults(func=cmd_trace_generate)

    i = tsub.add_parser("import", help="map a public GPU-cluster trace to our CSV, reporting each rule")
    i.add_argument("trace", help="the public trace file (or folder, for alibaba-v2020)")
    i.add_argument("--format", choices=FORMATS, help="trace format (default: told from the header)")
    i.add_argument("--skip-bad-rows", action="store_true")
    i.add_argument("--gpu-scale", type=float_in(0.0, MAX_GPU_SCALE),
                   help=f"multiply traced GPUs, in (0, {MAX_GPU_SCALE:g}] (default 8; 1 for acme)")
    i.add_argument("--min-gpus", type=power_of_two_in(1, MAX_TRACE_GPUS), help="a power of two (default 8)")
    i.add_argument("--max-gpus", type=power_of_two_in(1, MAX_TRACE_GPUS), help="a power of two (default 512)")
    i.add_argument("--fractional", choices=FRACTIONAL_MODES, help="GPU shares (default aggregate)")
    i.add_argument("--unfinished", choices=UNFINISHED_MODES, help="jobs that did not finish (default censor)")
    i.add_argument("--small", choices=SMALL_MODES, help="jobs below --min-gpus (default raise)")
    i.add_argument("--out", type=output_file, required=True, help="CSV file to write")
    i.set_defaults(func=cmd_trace_import)


def printable(path: str) -> str:
    """``path`` as text any terminal takes: a byte that was not UTF-8 (a lone surrogate) becomes U+FFFD."""
    return str(path).encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _planned_gpu_time(path: str):
    """The topology at ``path`` and its :class:`~spiderflow.traces.planned.PlannedGpuTime`."""
    from spiderflow.topology import load_topology
    from spiderflow.traces.planned import PlannedGpuTime

    topo = load_topology(path)
    return topo, PlannedGpuTime(topo)


def cmd_trace_generate(args) -> int:
    if (args.load is None) != (args.topology is None):
        raise ConfigError("trace generate: --load and --topology go together (the load is of that topology's GPUs)")
    if args.load is not None and args.mean_interarrival is not None:
        raise ConfigError("trace generate: give --load or --mean-interarrival, not both (--load sets the mean gap)")
    max_gpus, mean, note = args.max_gpus, args.mean_interarrival or DEFAULT_MEAN_INTERARRIVAL_S, ""
    if args.load is not None:
        topo, sizer = _planned_gpu_time(args.topology)
        name, total = topo.name, topo.total_gpus
        if total < 8:
            raise ConfigError(f"{args.topology}: has {total} GPUs; trace generate makes jobs of 8 GPUs or more")
        max_gpus = min(max_gpus, 1 << (total.bit_length() - 1))
        mean = mean_gap_for_load(args.jobs, args.seed, args.load, total_gpus=total, job_gpu_seconds=sizer,
                                 arrival=args.arrival, max_gpus=max_gpus)
    jobs = generate_trace(args.jobs, args.seed, arrival=args.arrival, mean_interarrival_s=mean, max_gpus=max_gpus)
    command = (f"python -m spiderflow trace generate --jobs {args.jobs} --seed {args.seed} --arrival {args.arrival} "
               + (f"--topology {printable(args.topology)} --load {args.load:g}" if args.load is not None
                  else f"--mean-interarrival {mean:g}") + f" --max-gpus {max_gpus}")
    if args.load is not None:
        achieved = offered_load(jobs, total_gpus=total, job_gpu_seconds=sizer)
        unplanned = (f", {len(sizer.unplanned)} job shape(s) no plan fits counted at compute only"
                     if sizer.unplanned else "")
        note = (f"; offered load {achieved:.3f} of {name}'s {total} GPUs (GPU-seconds as SpinSearch plans each "
                f"job on the empty topology{unplanned}; mean gap {mean:.1f} s)")
        command += f"\nmean gap {mean:.6g} s: offered load {achieved:.4f} (docs/traces.md, 'Offered load')"
    write_trace(jobs, args.out, comment=command)
    if args.json:
        print(dumps({"out": printable(args.out), "jobs": len(jobs), "seed": args.seed, "arrival": args.arrival,
                     "mean_interarrival_s": mean, "max_gpus": max_gpus, "last_arrival_s": jobs[-1].arrival_s,
                     "gpus": sum(j.gpus for j in jobs),
                     "topology": printable(args.topology) if args.topology is not None else None,
                     "load": args.load, "offered_load": achieved if args.load is not None else None}))
    else:
        print(f"wrote {printable(args.out)}: {len(jobs)} jobs over {jobs[-1].arrival_s / 3600:.1f} h{note}")
    return 0


def cmd_trace_import(args) -> int:
    names = ("gpu_scale", "min_gpus", "max_gpus", "fractional", "unfinished", "small")
    options = {n: getattr(args, n) for n in names if getattr(args, n) is not None}
    trace = load_trace(args.trace, format=args.format, skip_bad_rows=args.skip_bad_rows, **options)
    for line in trace.report:
        print(f"{printable(trace.source)}: {line}", file=sys.stderr)
    if trace.skipped:
        print(f"{printable(trace.source)}: skipped {trace.skipped} bad rows", file=sys.stderr)
    given = " ".join(f"--{n.replace('_', '-')} {v}" for n, v in options.items())
    command = f"python -m spiderflow trace import {printable(args.trace)} --format {trace.format}"
    write_trace(trace.jobs, args.out, comment=command + (f" {given}" if given else "") + "\n" + "\n".join(trace.report))
    print(f"wrote {printable(args.out)}: {len(trace.jobs)} jobs over {trace.jobs[-1].arrival_s / 3600:.1f} h")
    return 0
