"""A bulk flow's queue at a shared WAN link, against the cost model's shared prediction (root).

    sudo .venv/bin/python benchmarks/queue_delay.py [--queue-bdp 1,0.1] [--repeats 2]
        [--trace benchmarks/results/emulated-orders-paper8/seed-3/trace.csv] [--planner genetic]
        [--out benchmarks/results/queue-delay]

In the six emulated arrival orders (benchmarks/emulated_orders.py) `genetic`'s w4, a pipeline from
ohio to virginia, measured up to 27% above its `shared` prediction, the cost model under the load of
every job that overlapped it, which should bound it from above. w2's route from oregon to ireland
crosses ohio-virginia, whose router buffer holds one bandwidth-delay product of the longest route
across it (275 ms round trip). The cost model prices a shared link's bandwidth only; a bulk flow
can keep that buffer full ahead of a pipeline's transfers. This replays one of those orders with
`emulator run` at each ``--queue-bdp`` in turn, ``--repeats`` times (alternating, so a slow spell of
the machine hits both alike), and writes ``OUT/queue_delay.md``: per WAN job whose links another
job's traffic crossed, its measured iteration time and its error against `shared` at each buffer
size, the median over the repeats. Each run's files are in ``OUT/q-Q-R/``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from emulated_orders import WHERE, where_ran  # noqa: E402
from emulator.net.check import MAX_QUEUE_BDP  # noqa: E402
from spiderflow.bench import machine  # noqa: E402
from spiderflow.cliutil import OneLineParser, float_in, int_in, make_output_dir, one_line_errors, \
    output_dir  # noqa: E402
from spiderflow.errors import ConfigError  # noqa: E402
from spiderflow.placement import PLANNERS  # noqa: E402

SETTINGS = ("--topology", "topologies/paper8.yaml", "--search-budget", "1000", "--iterations", "8",
            "--hosts-per-cluster", "10", "--dilation", "4")


def bdp_list(text: str) -> list[float]:
    """argparse type for ``--queue-bdp``: buffer sizes, comma-separated, each in (0, MAX_QUEUE_BDP], none twice."""
    one = float_in(0.0, MAX_QUEUE_BDP)  # as the emulator's --queue-bdp takes each
    try:
        values = [one(v) for v in text.split(",")]
    except argparse.ArgumentTypeError:
        values = []
    if not values or len(set(values)) < len(values):
        raise argparse.ArgumentTypeError(f"must be buffer sizes in bandwidth-delay products, comma-separated, each "
                                         f"in (0, {MAX_QUEUE_BDP:g}], none twice (got {text!r})")
    return values


def shared_jobs(result: dict) -> dict[str, tuple[str, float, float]]:
    """The WAN jobs of one run whose `shared` prediction is above their prediction alone (another job's
    traffic crossed their links): id -> (placement, measured, `shared`) in s an iteration."""
    out = {}
    for j in result["jobs"]:
        m, shared = j["measured_iteration_s"], j["predicted_shared_iteration_s"]
        if m is not None and shared is not None and where_ran(j) == WHERE[2]:
            out[j["job_id"]] = (" ".join(f"{c}:{g}" for c, g in j["placement"].items()), m, shared)
    return out


def table(runs: dict[float, list[dict]]) -> list[str]:
    """Per job (in any run's shared set) and buffer size: its placements, the median measured and the
    median error against `shared` over the repeats where it was placed as in the first."""
    shared = {q: [shared_jobs(r) for r in rs] for q, rs in runs.items()}  # each run's, once
    jobs = sorted({j for per_run in shared.values() for js in per_run for j in js})
    lines = ["| job | placement | " + " | ".join(f"{q:g} BDP: measured (s) | error vs `shared`" for q in shared) + " |",
             "|---|---|" + "---:|---:|" * len(shared)]
    for job in jobs:
        where = next(js[job][0] for per_run in shared.values() for js in per_run if job in js)
        cells = []
        for q, per_run in shared.items():
            mine = [js[job] for js in per_run if job in js and js[job][0] == where]
            if not mine:
                cells += ["n/a", "n/a"]
                continue
            cells += [f"{statistics.median(m for _, m, _ in mine):.3f} ({len(mine)})",
                      f"{statistics.median(100 * (sh - m) / m for _, m, sh in mine):+.1f}%"]
        lines.append(f"| {job} | {where} | " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(prog="benchmarks/queue_delay.py", description=__doc__.splitlines()[0])
    ap.add_argument("--queue-bdp", type=bdp_list, default="1,0.1")
    ap.add_argument("--repeats", type=int_in(1, 100), default=2)
    ap.add_argument("--trace", default="benchmarks/results/emulated-orders-paper8/seed-3/trace.csv")
    ap.add_argument("--planner", choices=list(PLANNERS), default="genetic")
    ap.add_argument("--out", type=output_dir, default="benchmarks/results/queue-delay")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("error: run as root (it builds emulated networks)", file=sys.stderr)
        return 2
    return one_line_errors(lambda: run(args))


def run(args) -> None:
    out = make_output_dir(args.out)
    runs: dict[float, list[dict]] = {q: [] for q in args.queue_bdp}
    t0 = time.monotonic()
    for r in range(args.repeats):
        for q in args.queue_bdp:
            where = out / f"q-{q:g}-{r}"
            argv = [sys.executable, "-m", "emulator", "run", *SETTINGS, "--trace", args.trace,
                    "--planner", args.planner, "--queue-bdp", f"{q:g}", "--out", str(where), "--json"]
            print(f"[queue-delay] {' '.join(argv[1:])}", file=sys.stderr, flush=True)
            done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True)
            if done.returncode != 0:
                raise ConfigError(f"--queue-bdp {q:g}: emulator run exited {done.returncode}: "
                                  f"{done.stderr.strip().splitlines()[-1:] or ['(nothing on stderr)']}")
            runs[q].append(json.loads(done.stdout))
    cmd = (f"sudo .venv/bin/python benchmarks/queue_delay.py --queue-bdp {','.join(f'{q:g}' for q in args.queue_bdp)} "
           f"--repeats {args.repeats} --trace {args.trace} --planner {args.planner} --out {args.out}")
    lines = ["# A bulk flow's queue at a shared WAN link", "", f"`{cmd}`", "",
             f"Machine: {machine()}; written {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
             f"{time.monotonic() - t0:.0f} s. Each run: `emulator run {' '.join(SETTINGS)} --trace {args.trace} "
             f"--planner {args.planner} --queue-bdp Q`, the buffer sizes in turn, {args.repeats} times.", "",
             "Per WAN job whose links another job's traffic crossed while it ran (its `shared` prediction above its "
             "prediction alone): its measured iteration time (the median over the repeats that placed it so, their "
             "count in brackets) and `shared`'s error against it, (shared - measured) / measured, the median. A "
             "negative error is a job slower than the cost model's fair share of every link it crossed allows.", ""]
    lines += table(runs)
    (out / "queue_delay.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
