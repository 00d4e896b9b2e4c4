"""Fuzz the input boundary through the real command line (issue 16): the longer run of
tests/test_fuzz_inputs.py.

Every family of tests/fuzzkit/families.py (topology YAML, calibration JSON, our trace CSV,
the five public trace formats, WAN and capacity events files, the command lines of plan /
simulate / compare / trace / wan / topology, the run directory ``emulator report`` reads, the
command lines of ``emulator run / compare / calibrate / check``) is mutated ``--examples`` times;
each input runs as ``python -m spiderflow ...`` (the emulator's: ``emulator.console.main`` with
``os.geteuid`` answering 65534, so a valid command line stops at the root check) in a scratch
directory with a per-run timeout (past it: a hang), under ``PYTHONIOENCODING=utf-8`` (strict
stdout, as on a UTF-8 desktop locale; the C locale would escape undecodable bytes instead). Then
the curated KNOWN-BAD inputs (one per bad-input class named in the issue), every one of which must
be rejected with one line (exit 0 = silently accepted). Results go to
benchmarks/results/fuzz_inputs.md.

    .venv/bin/python benchmarks/fuzz_inputs.py [--examples 100] [--workers 2] [--out FILE]
    .venv/bin/python benchmarks/fuzz_inputs.py --replay trace-ours:17 --dir /tmp/case   # write one input out

An input is named ``family:index``; it is a pure function of ``--seed``, the family and the
index, so the lists below can be replayed.
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from spiderflow.bench import machine  # noqa: E402
from spiderflow.cliutil import (OneLineParser, float_in, int_in, make_output_dir, name_list,  # noqa: E402
                                one_line_errors, output_dir, output_file, seed_arg, write_output_file)
from tests.fuzzkit.families import Case, families, known_bad, valid_cases  # noqa: E402
from tests.fuzzkit.run import run_case_subprocess  # noqa: E402

OUT = REPO / "benchmarks" / "results" / "fuzz_inputs.md"
PYTHON = sys.executable
COLUMNS = [("accepted", "accepted (exit 0)"), ("rejected", "rejected, one line"), ("traceback", "tracebacks"),
           ("hang", "hangs"), ("unclean", "multi-line / no message"), ("badjson", "invalid JSON"),
           ("wrong", "wrong output"), ("crash", "crashes")]

_work: Path | None = None
_scratch: str | None = None  # the run's scratch folder (main), each worker's own folder inside it


def make_case(family: str, index: int, seed: int) -> Case:
    import random

    return families(subprocess_safe=True)[family](random.Random(f"{seed}:{family}:{index}"))


def _worker_dir() -> Path:
    global _work
    if _work is None:
        _work = Path(tempfile.mkdtemp(prefix="fuzz-inputs-", dir=_scratch))
    return _work


def run_one(job: tuple[str, int, int, float]) -> dict:
    family, index, seed, timeout_s = job
    case = make_case(family, index, seed)
    t0 = time.monotonic()
    outcome = run_case_subprocess(case, _worker_dir(), python=PYTHON, timeout_s=timeout_s)
    return {"family": family, "index": index, "kind": outcome.kind, "detail": outcome.detail,
            "seconds": time.monotonic() - t0, "case": _describe(case)}


def run_listed(job: tuple[str, int, float]) -> dict:
    """One case of the curated lists: ``known`` (must be rejected) or ``valid`` (must be accepted)."""
    which, index, timeout_s = job
    case = (known_bad() if which == "known" else valid_cases())[index]
    outcome = run_case_subprocess(case, _worker_dir(), python=PYTHON, timeout_s=timeout_s)
    return {"label": case.label, "family": case.family, "kind": outcome.kind, "detail": outcome.detail,
            "case": _describe(case)}


def _describe(case: Case) -> str:
    shown = " ".join(_quote(a) for a in case.argv) if case.argv is not None else f"loader {case.loader}"
    files = "; ".join(f"`{rel}` ({len(data):,} bytes, starts {_head(data)})" for rel, data in case.files.items())
    return f"`{shown}`" + (f"; files: {files}" if files else "")


def _quote(arg: str) -> str:
    if len(arg) > 60:
        arg = arg[:30] + f"...<{len(arg):,} chars>"
    return repr(arg) if not arg or re.search(r"[^\w./:,=+-]", arg) else arg


def _head(data: bytes, n: int = 100) -> str:
    return "`" + repr(data[:n]).replace("`", "'") + ("`..." if len(data) > n else "`")


def _cut(text: str, limit: int = 240) -> str:
    """One table cell: long runs of one character (a 300-character file name) shortened, and the
    middle cut out of a long message so its end (where the code raised it) stays."""
    text = re.sub(r"(.)\1{19,}", lambda m: m.group(1) * 5 + f"...<{len(m.group(0))}x>", text)
    text = text.replace("|", "/").replace("\n", " ")
    return text if len(text) <= limit else text[:limit - 80] + " ... " + text[-75:]


def _signature(row: dict) -> tuple:
    """Failures of one cause share family, kind and the message with numbers and quoted values blanked."""
    text = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", row["detail"])
    return row["family"], row["kind"], re.sub(r"\d+", "N", text)[:160]


def table(rows: list[dict], fams: list[str]) -> list[str]:
    lines = ["| family | tried | " + " | ".join(title for _, title in COLUMNS) + " | slowest run (s) |",
             "|---|---:|" + "---:|" * len(COLUMNS) + "---:|"]
    for fam in fams + ["all"]:
        mine = [r for r in rows if fam in ("all", r["family"])]
        counts = collections.Counter(r["kind"] for r in mine)
        slow = max((r["seconds"] for r in mine), default=0.0)
        cells = " | ".join(f"**{counts[k]}**" if counts[k] and k not in ("accepted", "rejected") else str(counts[k])
                           for k, _ in COLUMNS)
        lines.append(f"| {fam} | {len(mine)} | {cells} | {slow:.1f} |")
    return lines


def report(rows: list[dict], known: list[dict], valid: list[dict], args, elapsed: float) -> str:
    fams = list(dict.fromkeys(r["family"] for r in rows))
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "spiderflow", "emulator"], cwd=REPO,
                               capture_output=True, text=True).stdout.strip()
    except OSError:
        commit, dirty = "unknown", ""
    failing = [r for r in rows if r["kind"] not in ("accepted", "rejected")]
    bad_known = [k for k in known if k["kind"] != "rejected"]
    out = ["# Input fuzzing (issue 16)", "",
           f"{dt.datetime.now(dt.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}, {machine()}; "
           f"commit {commit}{' with uncommitted changes to spiderflow/ or emulator/' if dirty else ''}; "
           f"{elapsed:.0f} s with {args.workers} workers.", "",
           f"Command: `.venv/bin/python benchmarks/fuzz_inputs.py --examples {args.examples} --seed {args.seed} "
           f"--timeout {args.timeout:g}`", "",
           "Each input is a valid one from the repo, mutated (tests/fuzzkit/mutate.py), run as "
           "`python -m spiderflow ...` (families emulator-report and cli-emulator: the emulator's CLI, "
           "with os.geteuid answering 65534 so that a valid command line stops at the root check, which "
           "counts as accepted) with `PYTHONIOENCODING=utf-8` and a "
           f"{args.timeout:g} s timeout (past it: a hang). Accepted = exit 0 with sane output (strict JSON, "
           "finite non-negative times, every job accounted for, the file's values loaded as written; a report "
           "whose MAPE counts every plan with status ok); "
           "rejected = non-zero exit with one short `error:` line. Every other column is a failure.", "",
           *table(rows, fams), "",
           f"## Known-bad inputs: {len(known) - len(bad_known)} of {len(known)} rejected in one line", "",
           "| input | outcome | message |", "|---|---|---|"]
    for k in known:
        kind = "**silently accepted (exit 0)**" if k["kind"] == "accepted" else \
            k["kind"] if k["kind"] == "rejected" else f"**{k['kind']}**"
        out.append(f"| {k['label']} | {kind} | {_cut(k['detail'])} |")
    bad_valid = [v for v in valid if v["kind"] != "accepted"]
    out += ["", f"## Valid inputs (the seeds, the base command lines): {len(valid) - len(bad_valid)} of "
            f"{len(valid)} accepted", ""]
    out += [f"- **{v['label']}**: {v['kind']}: {_cut(v['detail'])}; {v['case']}" for v in bad_valid]
    out += ["", f"## Failing inputs ({len(failing)}, {len({_signature(r) for r in failing})} distinct)", ""]
    if not failing and not bad_known and not bad_valid:
        out.append("None.")
    groups: dict[tuple, list[dict]] = collections.defaultdict(list)
    for r in failing:
        groups[_signature(r)].append(r)
    for (fam, kind, _), members in sorted(groups.items()):
        first = members[0]
        ids = ", ".join(f"{fam}:{m['index']}" for m in members[:8]) + (" ..." if len(members) > 8 else "")
        out += [f"- **{fam}, {kind}** ({len(members)}x: {ids}): {_cut(first['detail'])}",
                f"  - input {fam}:{first['index']}: {first['case']}"]
    for k in bad_known:
        out.append(f"- **known-bad, {k['kind']}**: {k['label']}: {_cut(k['detail']) or 'exit 0'}; {k['case']}")
    out += ["", "Replay one: `.venv/bin/python benchmarks/fuzz_inputs.py --replay FAMILY:INDEX --dir /tmp/case` "
            "writes its files there and prints its command line.", ""]
    return "\n".join(out)


def replay_spec(text: str) -> tuple[str, int]:
    """argparse type for ``--replay``: FAMILY:INDEX, a known family and an index from 0."""
    family, _, index = text.rpartition(":")
    known = list(families())
    if family not in known or not index.isdigit():
        raise argparse.ArgumentTypeError(f"must be FAMILY:INDEX with FAMILY one of {', '.join(known)} and INDEX "
                                         f"an integer from 0 (got {text!r})")
    return family, int(index)


def replay(spec: tuple[str, int], seed: int, where: Path) -> None:
    family, index = spec
    case = make_case(family, index, seed)
    case.write(make_output_dir(where, "--dir"))
    print(f"wrote {case.family} input {family}:{index} ({case.label}) into {where}")
    if case.argv is not None:
        print("cd", where, "&&", PYTHON, "-m", case.program, " ".join(repr(a) for a in case.argv))
        if case.program == "emulator" and case.argv[:1] != ["report"]:
            print("(run it as a user without root: it stops at the root check; as root it builds the network)")
    else:
        print("loader:", case.loader)


def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(prog="benchmarks/fuzz_inputs.py", description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int_in(1, 1_000_000), default=100,
                    help="inputs per family (default %(default)s)")
    ap.add_argument("--seed", type=seed_arg, default=0)
    ap.add_argument("--timeout", type=float_in(0.0, 3600.0, "seconds"), default=20.0,
                    help="seconds per run before it counts as a hang")
    ap.add_argument("--workers", type=int_in(1, 256), default=min(2, os.cpu_count() or 1))
    ap.add_argument("--families", type=name_list(families(), "family"), help="comma-separated subset (default: all)")
    ap.add_argument("--out", type=output_file, default=str(OUT))
    ap.add_argument("--replay", type=replay_spec,
                    help="FAMILY:INDEX: write that input's files to --dir and print its command")
    ap.add_argument("--dir", type=output_dir, default=str(Path(tempfile.gettempdir()) / "fuzz-case"))
    args = ap.parse_args(argv)
    return one_line_errors(lambda: replay(args.replay, args.seed, Path(args.dir)) if args.replay else fuzz(args))


def fuzz(args: argparse.Namespace) -> None:
    os.environ["PYTHONIOENCODING"] = "utf-8"
    fams = args.families or list(families())
    jobs = [(f, i, args.seed, args.timeout) for f in fams for i in range(args.examples)]
    t0 = time.monotonic()
    rows: list[dict] = []
    global _scratch
    # the workers' scratch folders live in one the run removes at its end (forked workers are
    # terminated with the pool and would leave their own behind)
    with tempfile.TemporaryDirectory(prefix="fuzz-inputs-") as _scratch, \
            multiprocessing.get_context("fork").Pool(args.workers) as pool:
        for n, row in enumerate(pool.imap_unordered(run_one, jobs, chunksize=4), 1):
            rows.append(row)
            if row["kind"] not in ("accepted", "rejected"):
                print(f"  {row['family']}:{row['index']} {row['kind']}: {row['detail'][:160]}", flush=True)
            if n % 100 == 0:
                print(f"{n}/{len(jobs)} inputs, {time.monotonic() - t0:.0f} s", flush=True)
        known = pool.map(run_listed, [("known", i, args.timeout) for i in range(len(known_bad()))])
        valid = pool.map(run_listed, [("valid", i, args.timeout) for i in range(len(valid_cases()))])
    rows.sort(key=lambda r: (fams.index(r["family"]), r["index"]))
    md = report(rows, known, valid, args, time.monotonic() - t0)
    write_output_file(args.out, md)
    print(md)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    sys.exit(main())
