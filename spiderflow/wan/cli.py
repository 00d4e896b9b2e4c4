"""The ``wan`` subcommands: ``wan generate`` (a diurnal pattern and outages), ``wan spot`` (spot
withdrawals of GPUs) and ``wan check`` (load a WAN or capacity events file against a topology); and
the ``--wan-events``, ``--capacity-events`` and ``--no-replan`` options that ``simulate`` and
``compare`` share (``emulator run`` and ``compare`` share ``--no-replan``)."""

from __future__ import annotations

import argparse
import shlex

from spiderflow import shipped
from spiderflow.cliutil import (MAX_SEED, dumps, float_in, input_file, int_in, output_file, seed_arg,
                                write_output_file)
from spiderflow.errors import ConfigError
from spiderflow.topology import load_topology
from spiderflow.traces.cli import printable
from spiderflow.wan.capacity import format_capacity_events, load_capacity_events
from spiderflow.wan.events import format_wan_events, load_wan_events, resolve_link
from spiderflow.wan.generate import WanPattern, generate_wan_events
from spiderflow.wan.spot import SpotPattern, generate_spot_events

MAX_HOURS = 24 * 366.0
MAX_OUTAGES = 10_000
MAX_WITHDRAWALS = 10_000


def add_change_arguments(p: argparse.ArgumentParser) -> None:
    """A changing network for a replay (docs/wan-events.md)."""
    p.add_argument("--wan-events", type=input_file, metavar="FILE",
                   help="WAN events CSV (time_s,link,bandwidth_gbps,latency_ms,up; `wan generate` makes one): "
                        "link bandwidth over time and outages (default: a static WAN)")
    p.add_argument("--capacity-events", type=input_file, metavar="FILE",
                   help="capacity events CSV (time_s,cluster,gpus,notice_s,return_s): spot GPUs withdrawn "
                        "after a notice and returned")
    add_replan_argument(p)


def add_replan_argument(p: argparse.ArgumentParser) -> None:
    """``--no-replan``: SpinSearch's voluntary re-planning off (docs/wan-events.md)."""
    p.add_argument("--no-replan", dest="replan", action="store_false",
                   help="SpinSearch keeps a running job's plan unless a change forces it off (default: it "
                        "re-plans a job a WAN change made 1.5x slower, and one placed while a link was down or GPUs "
                        "withdrawn once they are back, when the move pays for its restart)")


def load_changes(args, topo) -> dict:
    """The SimConfig fields of the change options (empty when none was given)."""
    out: dict = {}
    if args.wan_events:
        out["wan_events"] = load_wan_events(args.wan_events, topo)
    if args.capacity_events:
        out["capacity_events"] = load_capacity_events(args.capacity_events, topo)
    if out or not args.replan:
        out["replan"] = args.replan
    return out


def add_wan(sub) -> None:
    p = sub.add_parser("wan", help="a WAN that changes under running jobs: events files")
    wsub = p.add_subparsers(dest="wan_cmd", required=True)
    d = WanPattern()
    g = _generator(wsub, "generate", "a reproducible WAN events file: diurnal bandwidth and random outages")
    g.add_argument("--hours", type=float_in(0.0, MAX_HOURS, "hours"), default=d.hours,
                   help="horizon from 0 s on the trace's clock (default %(default)g)")
    g.add_argument("--step-s", type=float_in(0.0, 86_400.0, "seconds", lo_open=True), default=d.step_s,
                   help="seconds between bandwidth rows (default %(default)g)")
    g.add_argument("--diurnal-amplitude", type=float_in(0.0, 0.95, lo_open=False), default=d.diurnal_amplitude,
                   help="share of a link's bandwidth taken at its local busy hour, in [0, 0.95] (default %(default)g)")
    g.add_argument("--start-hour-utc", type=float_in(0.0, 23.99, lo_open=False), default=d.start_hour_utc,
                   help="UTC hour at 0 s (default %(default)g)")
    g.add_argument("--outages", type=int_in(0, MAX_OUTAGES), default=d.outages,
                   help=f"random link outages, 0..{MAX_OUTAGES:,} (default %(default)s)")
    g.add_argument("--outage-s", type=float_in(0.0, 30 * 86_400.0, "seconds"), default=d.outage_s,
                   help="seconds each outage lasts (default %(default)g)")
    g.add_argument("--outage-link", metavar="A-B", help="the link every outage hits (default: drawn)")
    g.set_defaults(func=cmd_wan_generate)
    sp = SpotPattern()
    s = _generator(wsub, "spot", "a reproducible capacity events file: spot withdrawals of clusters' GPUs")
    s.add_argument("--hours", type=float_in(0.0, MAX_HOURS, "hours"), default=sp.hours,
                   help="horizon on the trace's clock in which withdrawals start (default %(default)g)")
    s.add_argument("--withdrawals", type=int_in(1, MAX_WITHDRAWALS), default=sp.withdrawals,
                   help=f"withdrawals drawn (a cluster's overlapping ones merge), 1..{MAX_WITHDRAWALS:,} "
                        "(default %(default)s)")
    s.add_argument("--notice-s", type=float_in(0.0, 86_400.0, "seconds", lo_open=False), default=sp.notice_s,
                   help="seconds of notice before each (default %(default)g, EC2's spot interruption notice)")
    s.add_argument("--min-hours", type=float_in(0.0, MAX_HOURS, "hours"), default=sp.min_hours,
                   help="shortest withdrawal (default %(default)g)")
    s.add_argument("--max-hours", type=float_in(0.0, MAX_HOURS, "hours"), default=sp.max_hours,
                   help="longest withdrawal (default %(default)g)")
    s.add_argument("--share", type=float_in(0.0, 1.0), default=sp.share,
                   help="share of the cluster's GPUs each takes, rounded up, in (0, 1] (default %(default)g)")
    s.set_defaults(func=cmd_wan_spot)
    c = wsub.add_parser("check", help="load and validate a WAN or capacity events file against a topology")
    c.add_argument("file", help="events CSV")
    c.add_argument("--topology", default="default", help="topology YAML, or a shipped name (default %(default)s)")
    c.add_argument("--capacity", action="store_true", help="the file holds capacity events")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=cmd_wan_check)


def _generator(wsub, name: str, what: str) -> argparse.ArgumentParser:
    """A generator's subcommand with the options ``generate`` and ``spot`` share."""
    p = wsub.add_parser(name, help=what)
    p.add_argument("--topology", default="default",
                   help="topology YAML, or a shipped name: " + ", ".join(shipped.names("topology"))
                        + " (default %(default)s)")
    p.add_argument("--seed", type=seed_arg, default=0, help=f"0..{MAX_SEED} (default %(default)s)")
    p.add_argument("--out", type=output_file, required=True, help="CSV file to write")
    p.add_argument("--json", action="store_true", help="print what was written as one JSON object")
    return p


def cmd_wan_generate(args) -> int:
    topo = load_topology(args.topology)
    link = None
    if args.outage_link is not None:
        link = resolve_link(args.outage_link, topo)
        if isinstance(link, str):
            raise ConfigError(f"--outage-link {link}")
    try:
        pattern = WanPattern(hours=args.hours, step_s=args.step_s, diurnal_amplitude=args.diurnal_amplitude,
                             outages=args.outages, outage_s=args.outage_s, outage_link=link,
                             start_hour_utc=args.start_hour_utc)
        events = generate_wan_events(topo, args.seed, pattern)
    except ValueError as exc:
        raise ConfigError(f"wan generate: {exc}") from None
    command = (f"python -m spiderflow wan generate --topology {shlex.quote(printable(args.topology))} "
               f"--seed {args.seed} --hours {pattern.hours:g} --step-s {pattern.step_s:g} "
               f"--diurnal-amplitude {pattern.diurnal_amplitude:g} --start-hour-utc {pattern.start_hour_utc:g} "
               f"--outages {pattern.outages} --outage-s {pattern.outage_s:g}"
               + (f" --outage-link {link[0]}-{link[1]}" if link else "")
               + f" --out {shlex.quote(printable(args.out))}")
    comment = (f"{command.strip()}\n{topo.name}: {len(topo.links)} links; diurnal amplitude "
               f"{pattern.diurnal_amplitude:g}, {pattern.outages} outage(s) of {pattern.outage_s:g} s; seed {args.seed}"
               "\nformat: docs/wan-events.md")
    write_output_file(args.out, format_wan_events(events, comment=comment))
    downs = sum(1 for ev in events if not ev.up)
    if args.json:
        print(dumps({"out": printable(args.out), "topology": topo.name, "seed": args.seed, "rows": len(events),
                     "links": len(topo.links), "hours": pattern.hours, "step_s": pattern.step_s,
                     "diurnal_amplitude": pattern.diurnal_amplitude, "outages": pattern.outages,
                     "outage_s": pattern.outage_s, "down_rows": downs}))
    else:
        print(f"wrote {printable(args.out)}: {len(events)} rows over {pattern.hours:g} h on {len(topo.links)} links "
              f"of {topo.name} ({pattern.outages} outage(s); seed {args.seed})")
    return 0


def cmd_wan_spot(args) -> int:
    topo = load_topology(args.topology)
    if args.min_hours > args.max_hours:
        raise ConfigError(f"wan spot: --min-hours {args.min_hours:g} is more than --max-hours {args.max_hours:g}; "
                          "raise --max-hours or lower --min-hours")
    try:
        pattern = SpotPattern(hours=args.hours, withdrawals=args.withdrawals, notice_s=args.notice_s,
                              min_hours=args.min_hours, max_hours=args.max_hours, share=args.share)
    except ValueError:
        raise ConfigError(f"wan spot: --notice-s {args.notice_s:g} must be shorter than --hours {args.hours:g} "
                          "(withdrawals start after their notice); lengthen --hours") from None
    events = generate_spot_events(topo, args.seed, pattern)
    command = (f"python -m spiderflow wan spot --topology {shlex.quote(printable(args.topology))} "
               f"--seed {args.seed} --hours {pattern.hours:g} --withdrawals {pattern.withdrawals} "
               f"--notice-s {pattern.notice_s:g} --min-hours {pattern.min_hours:g} --max-hours {pattern.max_hours:g} "
               f"--share {pattern.share:g} --out {shlex.quote(printable(args.out))}")
    comment = (f"{command}\n{topo.name}: {len(events)} withdrawal(s) of {len(topo.clusters)} clusters "
               f"({pattern.withdrawals} drawn; a cluster's overlapping ones merged); seed {args.seed}"
               "\nformat: docs/wan-events.md")
    write_output_file(args.out, format_capacity_events(events, comment=comment))
    if args.json:
        print(dumps({"out": printable(args.out), "topology": topo.name, "seed": args.seed, "rows": len(events),
                     "drawn": pattern.withdrawals, "hours": pattern.hours, "notice_s": pattern.notice_s,
                     "min_hours": pattern.min_hours, "max_hours": pattern.max_hours, "share": pattern.share,
                     "gpu_hours": round(sum(ev.gpus * (ev.return_s - ev.time_s) for ev in events) / 3600, 3)}))
    else:
        print(f"wrote {printable(args.out)}: {len(events)} withdrawal(s) over {pattern.hours:g} h on {topo.name} "
              f"({pattern.withdrawals} drawn; seed {args.seed})")
    return 0


def cmd_wan_check(args) -> int:
    topo = load_topology(args.topology)
    events = (load_capacity_events if args.capacity else load_wan_events)(args.file, topo)
    kind = "capacity" if args.capacity else "WAN"
    if args.json:
        print(dumps({"file": printable(args.file), "ok": True, "kind": kind, "events": len(events),
                     "first_s": events[0].time_s, "last_s": events[-1].time_s}))
    else:
        print(f"{printable(args.file)}: ok ({len(events)} {kind} events from {events[0].time_s:g} s "
              f"to {events[-1].time_s:g} s, on {topo.name})")
    return 0
