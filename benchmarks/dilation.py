"""Accuracy and wall time of `emulator run` against the time dilation K, in one sitting (root, ~15-25 min).

    sudo .venv/bin/python benchmarks/dilation.py [--topology topologies/paper8.yaml]
        [--trace traces/paper8-16.csv] [--hosts-per-cluster 10] [--iterations 8] [--dilations auto,1,2,4,8] [--repeat 1]
        [--out benchmarks/results/dilation.md]

Runs the same trace once per K (``auto`` is resolved by the run itself and
reported with the K it chose), and writes per K: the jobs' median, 90th
percentile and largest absolute error of the measured iteration time
against the cost model's prediction at launch, how many jobs were ok, the
most ranks running at once (``peak_ranks``), the median and largest job
start-up (specs handed over to the job's first op, wall seconds) and the
wall time of the whole run. Each run's own directory (``result.json``,
``jobs.csv``, rank logs) stays under ``runs/dilation-<K>``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from emulator.jobs.dilation import parse_dilation  # noqa: E402
from emulator.net.layout import MAX_HOSTS  # noqa: E402
from emulator.run import MAX_ITERATIONS  # noqa: E402
from spiderflow.cliutil import OneLineParser, int_in, output_file, write_output_file  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))]


def run_once(args, k: str, out: Path) -> dict:
    argv = [sys.executable, "-m", "emulator", "run", "--topology", args.topology, "--trace", args.trace,
            "--hosts-per-cluster", str(args.hosts_per_cluster), "--iterations", str(args.iterations),
            "--dilation", k, "--out", str(out), "--json"]
    t0 = time.monotonic()
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if not (out / "result.json").exists():
        raise SystemExit(f"K={k}: no result.json (exit {done.returncode}): {done.stderr.strip()[-400:]}")
    result = json.loads((out / "result.json").read_text())
    config = json.loads((out / "config.json").read_text())
    jobs = result["jobs"]
    errs = [abs(j["error_pct"]) for j in jobs if j["status"] == "ok" and j["error_pct"] is not None]
    starts = [j["startup_wall_s"] for j in jobs if j.get("startup_wall_s") is not None]
    return {"requested": k, "dilation": result["dilation"], "reason": config.get("dilation_reason", ""),
            "ok": sum(j["status"] == "ok" for j in jobs), "jobs": len(jobs), "peak_ranks": result["peak_ranks"],
            "median": statistics.median(errs) if errs else None, "p90": percentile(errs, 90) if errs else None,
            "max": max(errs) if errs else None, "startup_median": statistics.median(starts) if starts else None,
            "startup_max": max(starts) if starts else None, "wall_s": wall, "out": str(out),
            "per_job": {j["job_id"]: j["error_pct"] for j in jobs}}


def fmt(x, spec=".1f") -> str:
    return "-" if x is None else format(x, spec)


def dilation_list(text: str) -> list[str]:
    """argparse type for ``--dilations``: 'auto' or numbers in 1..64, comma-separated (kept as written:
    each is passed to `emulator run --dilation`)."""
    items = [x.strip() for x in text.split(",")]
    try:
        for x in items:
            parse_dilation(x)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"must be 'auto' or numbers in 1..64, comma-separated "
                                         f"(got {text!r})") from None
    return items


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="benchmarks/dilation.py", description=__doc__.splitlines()[0])
    parser.add_argument("--topology", default="topologies/paper8.yaml")
    parser.add_argument("--trace", default="traces/paper8-16.csv")
    parser.add_argument("--hosts-per-cluster", type=int_in(1, MAX_HOSTS), default=10)
    parser.add_argument("--iterations", type=int_in(3, MAX_ITERATIONS), default=8,
                        help="iterations per job (2 of them warm-up)")
    parser.add_argument("--dilations", type=dilation_list, default="auto,1,2,4,8")
    parser.add_argument("--repeat", type=int_in(1, 100), default=1)
    parser.add_argument("--out", type=output_file, default="benchmarks/results/dilation.md")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("error: run as root (it builds emulated networks)", file=sys.stderr)
        return 2
    rows = []
    for rep in range(args.repeat):
        for k in args.dilations:
            out = REPO / "runs" / f"dilation-{k}-{rep}"
            print(f"[dilation] K={k} (repeat {rep + 1}/{args.repeat}) ...", file=sys.stderr, flush=True)
            row = run_once(args, k, out)
            print(f"[dilation]   K={row['dilation']:g}: median {fmt(row['median'])}%, max {fmt(row['max'])}%, "
                  f"{row['ok']}/{row['jobs']} ok, {row['peak_ranks']} ranks at once, {row['wall_s']:.0f} s",
                  file=sys.stderr, flush=True)
            rows.append(row)
    lines = ["# `emulator run` accuracy against time dilation", "",
             f"`sudo .venv/bin/python benchmarks/dilation.py --topology {args.topology} --trace {args.trace} "
             f"--hosts-per-cluster {args.hosts_per_cluster} --iterations {args.iterations} "
             f"--dilations {','.join(args.dilations)} "
             f"--repeat {args.repeat}`", "",
             f"Machine: {os.cpu_count()} cores, {platform.machine()}, "
             f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2 ** 30:.0f} GiB, "
             f"Linux {platform.release()}, Python {platform.python_version()}; "
             f"run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.", "",
             "Errors: |predicted - measured| / measured of each ok job's iteration time (prediction at launch); "
             "start-up: specs handed over to the job's first op, wall seconds.", "",
             "| K asked | K used | jobs ok | peak ranks | median abs error | p90 | max | start-up median / max (s) "
             "| wall (s) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['requested']} | {r['dilation']:g} | {r['ok']}/{r['jobs']} | {r['peak_ranks']} | "
                     f"{fmt(r['median'])}% | {fmt(r['p90'])}% | {fmt(r['max'])}% | "
                     f"{fmt(r['startup_median'], '.2f')} / {fmt(r['startup_max'], '.2f')} | {r['wall_s']:.0f} |")
    auto = [r for r in rows if r["requested"] == "auto"]
    if auto:
        lines += ["", f"auto's reason: {auto[0]['reason']}"]
    lines += ["", "Per job, error % (sign: + predicted slower than measured):", "",
              "| job | " + " | ".join(f"K={r['dilation']:g}" + (" (auto)" if r["requested"] == "auto" else "")
                                    for r in rows) + " |",
              "|---|" + "---:|" * len(rows)]
    for job in rows[0]["per_job"]:
        lines.append(f"| {job} | " + " | ".join(fmt(r["per_job"].get(job)) for r in rows) + " |")
    write_output_file(args.out, "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
