"""SpinSearch's lead on real traffic over other arrival orders of one trace: `emulator compare` per seed (root).

    sudo .venv/bin/python benchmarks/emulated_orders.py [--topology topologies/paper8.yaml]
        [--trace traces/paper8-16.csv] [--seeds 1,2,3] [--planners spinsearch,ilp,genetic,blind]
        [--iterations 8] [--hosts-per-cluster 10] [--search-budget 1000]
        [--out benchmarks/results/emulated-orders-paper8] [--render]

The README's emulated headline is one trace in one order. Seed s keeps that trace's jobs and its
arrival times and deals the jobs out to those times in the order ``random.Random(s).shuffle`` gives
(seed 0: the order as written), so a seed changes which job arrives first and which ones find the
clusters busy, not the work offered. Each seed is one ``emulator compare`` (about five minutes for
paper8-16's four planners on 2 cores) into ``OUT/seed-S/`` (its trace.csv beside compare's files).
``OUT/orders.md`` gives per seed every other planner's avg JCT over SpinSearch's and SpinSearch's
throughput over the planner's, measured (simulated), SpinSearch's avg JCT over the replay's floor,
then per planner the geometric mean and the smallest of each ratio over the seeds, and how far each of
three predictions of a job's iteration time was from what it measured, by where the job ran
(:func:`error_rows`). ``--render`` writes it again from the seeds' directories, running nothing.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from emulator.net.layout import MAX_HOSTS  # noqa: E402
from emulator.run import MAX_ITERATIONS  # noqa: E402
from spiderflow.bench import machine  # noqa: E402
from spiderflow.cliutil import OneLineParser, int_in, int_list, make_output_dir, name_list, one_line_errors, \
    output_dir  # noqa: E402
from spiderflow.errors import ConfigError  # noqa: E402
from spiderflow.placement import PLANNERS  # noqa: E402
from spiderflow.simulate.metrics import fmt_value, ratio_of  # noqa: E402
from spiderflow.traces import load_trace  # noqa: E402
from spiderflow.traces.ours import write_trace  # noqa: E402
from spiderflow.workload import Job  # noqa: E402

REFERENCE = "spinsearch"


def reordered(jobs: list[Job], seed: int) -> list[Job]:
    """``jobs`` (sorted by arrival) dealt out to the same arrival times in ``random.Random(seed)``'s
    shuffled order; seed 0 leaves them as they are."""
    times = [j.arrival_s for j in jobs]
    order = list(jobs)
    if seed:
        random.Random(seed).shuffle(order)
    return [replace(j, arrival_s=t) for j, t in zip(order, times)]


def planner_list(text: str) -> list[str]:
    """argparse type for ``--planners``: :func:`~spiderflow.cliutil.name_list` of known planners, SpinSearch
    among them and at least one other."""
    names = name_list(PLANNERS, "planner")(text)
    if REFERENCE not in names or len(names) < 2:
        raise argparse.ArgumentTypeError(f"must name {REFERENCE} and at least one other planner (got {text!r})")
    return names


def ratios(summary: dict, planner: str, kind: str) -> tuple[float | None, float | None]:
    """(planner's avg JCT / SpinSearch's, SpinSearch's throughput / planner's) of one compare's ``kind``
    (measured or simulated) results, as ``emulator compare``'s table has them (None: no figure)."""
    mine, ref = summary["planners"][planner][kind], summary["planners"][REFERENCE][kind]
    return (ratio_of(mine["avg_jct_s"], ref["avg_jct_s"]),
            ratio_of(ref["throughput_tokens_per_s"], mine["throughput_tokens_per_s"]))


def geomean(values: list[float | None]) -> float | None:
    """Of the values there are (None: a seed without the ratio); 0 where one of them is."""
    there = [v for v in values if v is not None]
    if not there:
        return None
    if 0 in there:  # SpinSearch completed nothing in a seed: its throughput ratio is 0
        return 0.0
    return statistics.geometric_mean(there)


def smallest(values: list[float | None]) -> float | None:
    return min((v for v in values if v is not None), default=None)


def x(value: float | None) -> str:
    return fmt_value(value, ".2f", suffix="x")


def table(runs: dict[int, dict], planners: list[str]) -> list[str]:
    """orders.md's tables: per seed, then per planner over the seeds."""
    others = [p for p in planners if p != REFERENCE]
    lines = ["| seed | first three arrivals | completed | SpinSearch avg JCT (s) | / floor | "
             + " | ".join(f"{p}: JCT / SpinSearch's | SpinSearch's throughput / {p}'s" for p in others) + " |",
             "|---|---|---|---:|---:|" + "---:|---:|" * len(others)]
    for seed, run in runs.items():
        s, floors = run["summary"], run["summary"].get("floors")
        ref = s["planners"][REFERENCE]["measured"]
        done = ", ".join(f"{p} {s['planners'][p]['measured']['completed']}/{s['planners'][p]['measured']['jobs']}"
                         for p in planners)
        over = x(ratio_of(ref["avg_jct_s"], floors["jct_floor_s"]) if floors else None)
        cells = []
        for p in others:
            (jm, tm), (js, ts) = ratios(s, p, "measured"), ratios(s, p, "simulated")
            cells += [f"{x(jm)} ({x(js)})", f"{x(tm)} ({x(ts)})"]
        avg = fmt_value(ref["avg_jct_s"], ".2f")
        lines.append(f"| {seed} | {', '.join(run['first'])} | {done} | {avg} | {over} | "
                     + " | ".join(cells) + " |")
    lines += ["", "| planner | JCT / SpinSearch's: geometric mean | smallest | SpinSearch's throughput / "
              "planner's: geometric mean | smallest |", "|---|---:|---:|---:|---:|"]
    for p in others:
        cells = []
        for i in (0, 1):
            m = [ratios(r["summary"], p, "measured")[i] for r in runs.values()]
            sim = [ratios(r["summary"], p, "simulated")[i] for r in runs.values()]
            cells += [f"{x(geomean(m))} ({x(geomean(sim))})", f"{x(smallest(m))} ({x(smallest(sim))})"]
        lines.append(f"| {p} | " + " | ".join(cells) + " |")
    return lines


# where a job ran, for the prediction errors (error_rows)
WHERE = ("one cluster", "over the WAN, its links its own", "over the WAN, links shared with another job")
# the predictions of a job's iteration time compared with what it measured (error_rows)
PREDICTIONS = ("at launch (the planner's)", "simulated replay", "`shared`")


def where_ran(job: dict) -> str:
    """Which of :data:`WHERE` a job of a replay's result.json ran: over the WAN with links shared when
    its `shared` prediction (every overlapping job's load) is above its prediction alone."""
    if len(job["placement"]) == 1:
        return WHERE[0]
    crossed = job["predicted_shared_iteration_s"] > job["predicted_alone_iteration_s"] * (1 + 1e-9)
    return WHERE[2] if crossed else WHERE[1]


def job_errors(where: Path, planner: str) -> list[tuple[str, dict[str, float]]]:
    """Each completed job of one planner's replay in ``where`` (a seed's directory): where it ran (a
    :data:`WHERE`) and each prediction's error against its measured iteration time, in % (a prediction
    left out where it does not apply: the simulated replay's where the simulation placed the job
    elsewhere, and any for a job placed again, whose first plan its later intervals did not run)."""
    result, jobs = where / planner / "result.json", where / f"jobs-{planner}.csv"
    try:
        ran = json.loads(result.read_text())["jobs"]
        with jobs.open(newline="") as f:
            sim = {r["job_id"]: r for r in csv.DictReader(f)}
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(f"{where}: cannot read {planner}'s jobs ({exc}); --render needs each seed's "
                          f"{planner}/result.json and jobs-{planner}.csv as emulator compare writes them") from None
    out = []
    for j in ran:
        measured, shared = j["measured_iteration_s"], j["predicted_shared_iteration_s"]
        if measured is None or shared is None:  # did not complete, or was placed again
            continue
        kind = where_ran(j)
        errors = {PREDICTIONS[0]: j["error_pct"], PREDICTIONS[2]: 100.0 * (shared - measured) / measured}
        row = sim.get(j["job_id"], {})
        if row.get("simulated_iteration_s") and row["simulated_placement"] == row["placement"]:
            errors[PREDICTIONS[1]] = 100.0 * (float(row["simulated_iteration_s"]) - measured) / measured
        out.append((kind, errors))
    return out


def error_rows(out: Path, seeds: list[int], planners: list[str]) -> list[str]:
    """orders.md's table of prediction errors, over every seed and planner: per place a job ran
    (:data:`WHERE`) and prediction (:data:`PREDICTIONS`), the jobs, the median error, the median
    error's size and the range."""
    errors: dict[str, list[dict[str, float]]] = {w: [] for w in WHERE}
    for seed in seeds:
        for planner in planners:
            for kind, e in job_errors(out / f"seed-{seed}", planner):
                errors[kind].append(e)
    lines = ["| where the job ran | prediction | jobs | median error | median of its size | range |",
             "|---|---|---:|---:|---:|---|"]
    for kind in WHERE:
        for what in PREDICTIONS:
            values = [e[what] for e in errors[kind] if what in e]
            if not values:
                lines.append(f"| {kind} | {what} | 0 | n/a | n/a | n/a |")
                continue
            lines.append(f"| {kind} | {what} | {len(values)} | {statistics.median(values):+.1f}% | "
                         f"{statistics.median(map(abs, values)):.1f}% | {min(values):+.1f}% to {max(values):+.1f}% |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="benchmarks/emulated_orders.py", description=__doc__.splitlines()[0])
    parser.add_argument("--topology", default="topologies/paper8.yaml")
    parser.add_argument("--trace", default="traces/paper8-16.csv")
    parser.add_argument("--seeds", type=int_list(0, 2 ** 32 - 1), default="1,2,3")
    parser.add_argument("--planners", type=planner_list, default="spinsearch,ilp,genetic,blind")
    parser.add_argument("--iterations", type=int_in(3, MAX_ITERATIONS), default=8)
    parser.add_argument("--hosts-per-cluster", type=int_in(1, MAX_HOSTS), default=10)
    parser.add_argument("--search-budget", type=int_in(1, 1_000_000), default=1000)
    parser.add_argument("--out", type=output_dir, default="benchmarks/results/emulated-orders-paper8")
    parser.add_argument("--render", action="store_true",
                        help="only write OUT/orders.md again from the seeds' directories under OUT (no root)")
    args = parser.parse_args(argv)
    if args.render:
        return one_line_errors(lambda: rerender(args))
    if os.geteuid() != 0:
        print("error: run as root (it builds emulated networks)", file=sys.stderr)
        return 2
    return one_line_errors(lambda: run(args))


def run(args) -> None:
    jobs = load_trace(args.trace).jobs
    if len(jobs) < 2:
        raise ConfigError(f"{args.trace}: {len(jobs)} job(s); reordering needs at least 2")
    out = make_output_dir(args.out)
    runs: dict[int, dict] = {}
    for seed in args.seeds:
        where = out / f"seed-{seed}"
        where.mkdir(exist_ok=True)
        order = reordered(jobs, seed)
        write_trace(order, where / "trace.csv", comment=f"{args.trace} in the order of seed {seed} "
                                                         "(benchmarks/emulated_orders.py)")
        argv = [sys.executable, "-m", "emulator", "compare", "--topology", args.topology,
                "--trace", str(where / "trace.csv"), "--planners", ",".join(args.planners),
                "--iterations", str(args.iterations), "--hosts-per-cluster", str(args.hosts_per_cluster),
                "--search-budget", str(args.search_budget), "--out", str(where)]
        print(f"[orders] seed {seed}: {' '.join(argv[1:])}", file=sys.stderr, flush=True)
        done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True)
        if done.returncode != 0 or not (where / "summary.json").exists():
            raise ConfigError(f"seed {seed}: emulator compare exited {done.returncode}: "
                              f"{done.stderr.strip().splitlines()[-1:] or ['(nothing on stderr)']}")
        summary = json.loads((where / "summary.json").read_text())
        runs[seed] = {"summary": summary, "first": [j.job_id for j in order[:3]]}
        print(f"[orders] seed {seed}: " + ", ".join(f"{p} {x(ratios(summary, p, 'measured')[0])}"
                                                    for p in args.planners if p != REFERENCE)
              + f" avg JCT over SpinSearch's ({summary['wall_s']:.0f} s)", file=sys.stderr, flush=True)
    render(args, out, runs)


def rerender(args) -> None:
    """orders.md again from ``OUT/seed-S/`` (summary.json and trace.csv) of every seed in ``--seeds``."""
    out, runs = Path(args.out), {}
    for seed in args.seeds:
        where = out / f"seed-{seed}"
        try:
            summary = json.loads((where / "summary.json").read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{where / 'summary.json'}: cannot read a compare's summary ({exc}); run the "
                              "seed first, without --render") from None
        runs[seed] = {"summary": summary, "first": [j.job_id for j in load_trace(where / "trace.csv").jobs[:3]]}
    render(args, out, runs)


def render(args, out: Path, runs: dict[int, dict]) -> None:
    """Write ``out/orders.md`` from the seeds' runs (each: compare's summary and its first arrivals)."""
    cmd = (f"sudo .venv/bin/python benchmarks/emulated_orders.py --topology {args.topology} --trace {args.trace} "
           f"--seeds {','.join(map(str, runs))} --planners {','.join(args.planners)} "
           f"--iterations {args.iterations} --hosts-per-cluster {args.hosts_per_cluster} "
           f"--search-budget {args.search_budget} --out {args.out}")
    first = next(iter(runs.values()))["summary"]
    lines = [f"# SpinSearch on real traffic over {len(runs)} arrival orders of {Path(args.trace).name}", "",
             f"`{cmd}`", "",
             f"Machine: {machine()}; written {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; the "
             f"compare runs took {sum(r['summary']['wall_s'] for r in runs.values()):.0f} s. Each seed: "
             f"{first['what']}.", "",
             "Seed s deals the trace's jobs out to its arrival times in `random.Random(s).shuffle`'s order "
             "(benchmarks/emulated_orders.py). Ratios over 1.00x mean SpinSearch did better; measured on the "
             "emulated network, the simulator's prediction of the same replay in brackets. Floor: "
             "`emulator compare`'s (each job on SpinSearch's plan for it alone, queued only behind a job no "
             "other can run beside). Each seed's files: `seed-S/` (headline.md, jobs-*.csv, summary.json).", ""]
    lines += table(runs, args.planners)
    lines += ["", "## How far each prediction of a job's iteration time was from what it measured", "",
              "Every completed job of every seed and planner, by where it ran: in one cluster; over the WAN on "
              "links no other job's traffic crossed while it ran; over the WAN on links another job's did for "
              "some of its run (its `shared` prediction above its prediction alone). Error: (predicted - "
              "measured) / measured. At launch: the cost model under the link load when it started, as the "
              "planner saw it (`emulator run`'s error column). Simulated replay: the simulator's prediction of the "
              "same replay (WAN links re-shared max-min as jobs come and go), its figure the median of the "
              "iterations the measured one takes, where it placed the job as the replay did. `shared`: the cost "
              "model under the load of every job that overlapped it, for its whole run. Jobs placed again are "
              "left out.", ""]
    lines += error_rows(out, list(runs), args.planners)
    (out / "orders.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
