"""How far the cost model's price of a shared WAN link is from the emulated runs, and how far a
load weighted by each flow's duty cycle would be.

The cost model gives a new flow ``capacity / (load + 1)`` of a link, where ``load`` counts every
other job's flows on it as sending all the time; pipelines send in bursts. This reads the emulated
runs of ``benchmarks/emulated_orders.py`` (each order's ``<planner>/result.json``: every job's plan,
its start and end, its measured iteration time) and, for every job whose WAN links another job used
during some of its run, prices its plan over its run with the load of the jobs running at each
moment (weighted by the time each lasted), with that load

- left out (``alone``: what the planner predicts on an idle network),
- counted (``counted``: the cost model's load, at each moment instead of the whole run),
- weighted by duty (``duty``: each other job's flows count by the fraction of its iteration its
  busiest WAN boundary moves bytes one way, plus its inter-cluster sync; latency takes no bandwidth),

beside the run's own ``shared`` figure (every job that overlapped it, counted, for the whole run).
Nothing is run on the network: the measured figures are the committed ones.

    .venv/bin/python benchmarks/shared_link_model.py [--orders DIR] [--out FILE]

Writes benchmarks/results/shared_link_model.md: per load, the median, median size and range of
(predicted - measured) / measured over those jobs, and the jobs alone on their links for a check.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import statistics
import sys
from collections import Counter
from pathlib import Path

from emulator.jobs.launch import describe_plan, emulated_view
from emulator.net.layout import NetConfig
from spiderflow.bench import machine
from spiderflow.cliutil import OneLineParser, input_dir, one_line_errors, output_file, write_output_file
from spiderflow.costmodel import Prediction, predict
from spiderflow.errors import ConfigError
from spiderflow.plan import Plan, Stage
from spiderflow.simulate.flows import plan_routes
from spiderflow.topology import load_topology
from spiderflow.traces import load_trace

REPO = Path(__file__).resolve().parents[1]
ORDERS = REPO / "benchmarks" / "results" / "emulated-orders-paper8"
OUT = REPO / "benchmarks" / "results" / "shared_link_model.md"
LOADS = ("alone", "counted", "duty")
_STAGE = re.compile(r"(\S+?)\[(\d+):(\d+) tp(\d+)\]")
_TAIL = re.compile(r"(\d+) replica\(s\), dp (\d+), mbs (\d+) x (\d+)\)")


def parse_plan(job, text: str) -> Plan:
    """The plan :func:`emulator.jobs.launch.describe_plan` wrote as ``text`` (recompute and ZeRO-1
    are not in it: :func:`priced_jobs` checks each against its recorded prediction)."""
    body, _, tail = text.rpartition(" (")
    found = _TAIL.fullmatch(tail)
    if not body or found is None:
        raise ConfigError(f"{job.job_id}: plan {text!r} is not describe_plan's text")
    n, dp, mbs, m = map(int, found.groups())
    reps = [tuple(Stage(cluster=c, layer_start=int(a), layer_end=int(b), tp=int(t))
                  for c, a, b, t in _STAGE.findall(r)) for r in body.split(" | ")]
    reps = (reps * n)[:n] if len(reps) == 1 else reps  # describe_plan writes identical replicas once
    plan = Plan(job=job, replicas=tuple(reps), dp=dp, micro_batch_size=mbs, micro_batches=m)
    if describe_plan(plan) != text:
        raise ConfigError(f"{job.job_id}: plan {text!r} did not read back as written")
    return plan


def duty(plan: Plan, pred: Prediction) -> float:
    """Fraction of an iteration alone (``pred``, the plan priced alone) that the plan's busiest WAN
    boundary moves bytes one way (its messages' latency left out), plus its inter-cluster sync, at most 1."""
    m = plan.micro_batches
    busy = max((m * max(c.send_forward_s - c.send_forward_latency_s, c.send_backward_s - c.send_backward_latency_s)
                for c in pred.costs), default=0.0)
    sync = max((c.sync_wan_s for c in pred.costs), default=0.0)
    return min(1.0, (busy + sync) / pred.iteration_s)


def priced_jobs(cfg: dict, trace: dict, planner: Path, topo) -> dict[str, dict]:
    """Each completed job of one replay (``cfg``: its order's config.json; ``trace``: its jobs by id):
    its plan, routes, iteration time alone, duty and run (real-equivalent seconds)."""
    net = NetConfig(**cfg["net"])
    view = emulated_view(topo, net)
    jobs = {}
    for j in json.loads((planner / "result.json").read_text())["jobs"]:
        if j["status"] != "ok":
            continue
        job = trace[j["job_id"]]
        plan = parse_plan(job, j["plan"])
        pred = predict(plan, view, check_memory=False)
        alone = pred.iteration_s
        if abs(alone - j["predicted_alone_iteration_s"]) > 1e-6 * alone:
            raise ConfigError(f"{planner / 'result.json'}: {job.job_id}'s plan prices at {alone:.6g} s alone, "
                              f"recorded {j['predicted_alone_iteration_s']:.6g} s; another cost model or flags")
        arrival = job.arrival_s / cfg["time_scale"]
        jobs[job.job_id] = {"row": j, "plan": plan, "routes": plan_routes(plan, topo), "net": net, "alone": alone,
                            "duty": duty(plan, pred), "start": arrival + j["queue_s"], "end": arrival + j["jct_s"]}
    return jobs


def over_run(job: dict, others: list[dict], topo) -> dict[str, float]:
    """``job``'s iteration time under each load, weighted by how long each set of others ran beside it."""
    start, end = job["start"], job["end"]
    cuts = sorted({start, end, *(min(max(o[k], start), end) for o in others for k in ("start", "end"))})
    got = {"alone": job["alone"], "counted": 0.0, "duty": 0.0}  # alone: the same at every moment
    for a, z in zip(cuts, cuts[1:]):
        mid = (a + z) / 2
        counted, weighted = Counter(), Counter()
        for o in others:
            if o["start"] <= mid < o["end"]:
                for route in o["routes"]:
                    for key in route:
                        counted[key] += 1
                        weighted[key] += o["duty"]
        for name, load in (("counted", counted), ("duty", weighted)):
            view = emulated_view(topo, job["net"], link_load=dict(load))
            got[name] += (z - a) / (end - start) * predict(job["plan"], view, check_memory=False).iteration_s
    return got


def orders_in(path: Path) -> list[Path]:
    """The replays' directories: ``path`` itself if it holds one order (its config.json), else its
    ``seed-*`` ones, as emulated_orders.py writes them."""
    if not path.is_dir():
        raise ConfigError(f"{path}: no such directory; give one emulated_orders.py wrote (--orders)")
    found = [path] if (path / "config.json").exists() else sorted(
        p for p in path.glob("seed-*") if (p / "config.json").exists())
    if not found:
        raise ConfigError(f"{path}: no order's config.json in it or in a seed-* directory; give a directory "
                          "emulated_orders.py or emulator compare wrote (--orders)")
    return found


def rows_of(orders: Path) -> list[dict]:
    rows = []
    for order in orders_in(orders):
        cfg = json.loads((order / "config.json").read_text())
        topo = load_topology(REPO / cfg["topology"])
        trace = {j.job_id: j for j in load_trace(REPO / cfg["trace"]).jobs}
        for planner in sorted(p for p in order.iterdir() if (p / "result.json").exists()):
            jobs = priced_jobs(cfg, trace, planner, topo)
            for name, job in jobs.items():
                if not job["routes"]:
                    continue
                others = [o for n, o in jobs.items() if n != name and o["routes"]
                          and o["start"] < job["end"] and o["end"] > job["start"]]
                got = over_run(job, others, topo)
                m = job["row"]["measured_iteration_s"]
                err = {k: 100 * (v - m) / m for k, v in got.items()}
                err["shared"] = 100 * (job["row"]["predicted_shared_iteration_s"] - m) / m
                rows.append({"order": order.name, "planner": planner.name, "job": name, "duty": job["duty"],
                             "measured": m, "placement": job["row"]["placement"], "err": err,
                             "shared_link": abs(got["counted"] - got["alone"]) > 1e-9 * got["alone"]})
    return rows


def shown(path: str) -> str:
    """``path`` as the command would be typed in the repository."""
    full = Path(path).resolve()
    return str(full.relative_to(REPO)) if full.is_relative_to(REPO) else path


def summary(rows: list[dict], load: str) -> str:
    e = [r["err"][load] for r in rows]
    return (f"| {load} | {statistics.median(e):+.1f}% | {statistics.median(map(abs, e)):.1f}% | "
            f"{min(e):+.1f}% .. {max(e):+.1f}% |")


def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(prog="benchmarks/shared_link_model.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--orders", type=input_dir, default=str(ORDERS),
                    help="a directory emulated_orders.py wrote (seed-*/<planner>/result.json), or one order's")
    ap.add_argument("--out", type=output_file, default=str(OUT))
    args = ap.parse_args(argv)
    return one_line_errors(lambda: run(args))


def run(args: argparse.Namespace) -> None:
    rows = rows_of(Path(args.orders))
    shared = [r for r in rows if r["shared_link"]]
    if not shared:
        raise ConfigError(f"{args.orders}: no job shared a WAN link with another; nothing to compare")
    head = "| load | median error | median size | range |\n|---|---:|---:|---|\n"
    loads = (*LOADS, "shared")
    alone = [r for r in rows if not r["shared_link"]]
    text = (f"# The price of a shared WAN link against the emulated runs\n\n{dt.date.today()}, {machine()}.\n\n"
            f"Command: `.venv/bin/python benchmarks/shared_link_model.py --orders {shown(args.orders)}`\n\n"
            "error = (predicted - measured) / measured of a job's iteration time (the module docstring says "
            "what each load is).\n\n"
            f"## {len(shared)} jobs whose WAN links another job used during some of their run\n\n"
            + head + "\n".join(summary(shared, k) for k in loads))
    if alone:
        text += (f"\n\n## {len(alone)} jobs on WAN links of their own (a check: every load prices them alike)\n\n"
                 + head + "\n".join(summary(alone, k) for k in loads))
    text += ("\n\n## The jobs that shared\n\n| order | planner | job | placement | duty | measured (s) | "
             + " | ".join(loads) + " |\n|---|---|---|---|---:|---:|" + "---:|" * len(loads) + "\n"
             + "\n".join(f"| {r['order']} | {r['planner']} | {r['job']} | "
                         f"{' '.join(f'{c}:{g}' for c, g in r['placement'].items())} | {r['duty']:.2f} | "
                         f"{r['measured']:.3f} | " + " | ".join(f"{r['err'][k]:+.1f}%" for k in loads) + " |"
                         for r in shared) + "\n")
    write_output_file(args.out, text)
    print(text)


if __name__ == "__main__":
    sys.exit(main())
