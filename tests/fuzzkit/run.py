"""Run a :class:`~tests.fuzzkit.families.Case` in-process (the test) or as subprocesses (the
benchmark), and judge it (:mod:`tests.fuzzkit.judge`)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from .families import Case
from .judge import (Outcome, Problem, call_loader, check_calibration_file, check_floors, check_plan, check_summary,
                    check_topology_file, check_trace_load, judge_exit, no_nonfinite_text, read_bytes, run_main,
                    strict_json)


@contextlib.contextmanager
def cwd(path: Path):
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def _loader(kind: str):
    if kind == "topology":
        from spiderflow.topology import load_topology
        return load_topology
    if kind == "calibration":
        from spiderflow.costmodel import load_calibration
        return load_calibration
    from spiderflow.traces import load_trace
    return load_trace


def check_loaded(kind: str, path: str, kwargs: dict, result) -> None:
    """Raise :class:`Problem` if what a loader accepted does not match the file."""
    if kind == "topology":
        check_topology_file(Path(path).read_bytes(), result)
    elif kind == "calibration":
        check_calibration_file(Path(path).read_bytes(), result)
    else:
        check_trace_load(result, data=read_bytes(path), fmt=result.format,
                         skip_bad_rows=kwargs.get("skip_bad_rows", False))


def load_case(case: Case, *, timeout_s: float) -> Outcome:
    """Call the case's loader in-process (cwd: the scratch directory) and check what it accepted."""
    kind, path, kwargs = case.loader
    outcome, result = call_loader(lambda: _loader(kind)(path, **kwargs), timeout_s=timeout_s)
    if outcome.kind == "accepted":
        try:
            check_loaded(kind, path, kwargs, result)
        except Problem as p:
            return Outcome(p.kind, str(p))
    return outcome


def check_cli_output(argv: list[str], out: str) -> None:
    """Raise :class:`Problem` unless the output of an exit-0 run of ``argv`` is sane (cwd: the
    scratch directory, as for the run)."""
    from spiderflow.cli import build_parser
    from spiderflow.topology import load_topology
    from spiderflow.traces import load_trace

    with contextlib.redirect_stdout(sys.stderr):  # a second parse prints nothing of its own
        args = build_parser().parse_args(argv)
    if args.command == "plan":
        if args.json:
            check_plan(strict_json(out, "plan --json"), args.gpus, set(load_topology(args.topology).names),
                       args.clusters)
        else:
            no_nonfinite_text(out, "plan")
    elif args.command in ("simulate", "compare"):
        trace = load_trace(args.trace, format=args.format, skip_bad_rows=args.skip_bad_rows)
        n = len(trace.jobs[:args.jobs] if args.jobs else trace.jobs)
        planners = [args.planner] if args.command == "simulate" else list(args.planners)
        if args.json:
            data = strict_json(out, f"{args.command} --json")
            summaries = {args.planner: data} if args.command == "simulate" else data.get("planners", {})
            if list(summaries) != planners:
                raise Problem(f"summaries for {list(summaries)}, asked for {planners}")
            for name, summary in summaries.items():
                check_summary(summary, n, name)
            if args.command == "compare":
                check_floors(data.get("floors"), n)
        else:
            no_nonfinite_text(out, args.command)
        if args.out:
            for name in ("summary.json", "config.json"):
                strict_json(Path(args.out, name).read_text(), f"{args.out}/{name}")
            for name in planners:
                if not Path(args.out, f"jobs-{name}.csv").is_file():
                    raise Problem(f"{args.out}/jobs-{name}.csv not written")
    elif args.command == "trace" and Path(args.out).is_file():
        jobs = load_trace(args.out).jobs
        if len(jobs) != args.jobs or max(j.gpus for j in jobs) > args.max_gpus:
            raise Problem(f"trace generate wrote {len(jobs)} jobs (asked {args.jobs}), "
                          f"largest {max(j.gpus for j in jobs)} GPUs (--max-gpus {args.max_gpus})")
    elif args.command == "topology" and args.topology_cmd == "generate" and Path(args.out).is_file():
        topo = load_topology(args.out)
        if len(topo.clusters) != args.clusters:
            raise Problem(f"topology generate wrote {len(topo.clusters)} clusters, asked {args.clusters}")
    elif args.command == "wan" and args.wan_cmd == "generate":
        from spiderflow.wan.events import load_wan_events

        if args.json:
            strict_json(out, "wan generate --json")
        if not Path(args.out).is_file():  # /dev/null: written, and gone
            return
        last = max(ev.time_s for ev in load_wan_events(args.out, load_topology(args.topology)))
        if last > args.hours * 3600:
            raise Problem(f"wan generate wrote an event at {last:g} s, past --hours {args.hours:g}")
    elif args.command == "wan" and args.wan_cmd == "spot":
        from spiderflow.wan.capacity import load_capacity_events

        if args.json:
            strict_json(out, "wan spot --json")
        if not Path(args.out).is_file():  # /dev/null: written, and gone
            return
        events = load_capacity_events(args.out, load_topology(args.topology))
        if len(events) > args.withdrawals or any(not args.notice_s <= ev.time_s < args.hours * 3600 for ev in events):
            raise Problem(f"wan spot wrote {len(events)} withdrawals (drew {args.withdrawals}), or one outside "
                          f"[--notice-s, --hours) {[ev.time_s for ev in events][:5]}")
    elif args.command == "wan" and args.wan_cmd == "check":
        if args.json:
            doc = strict_json(out, "wan check --json")
            if not (isinstance(doc, dict) and doc.get("ok") is True and doc.get("events", 0) >= 1
                    and 0 <= doc["first_s"] <= doc["last_s"]):
                raise Problem(f"wan check --json exited 0 but said {out[:200]!r}")
        elif ": ok (" not in out:
            raise Problem(f"wan check exited 0 but said {out[:200]!r}")
    elif args.command == "topology" and args.topology_cmd == "check":
        if getattr(args, "json", False):
            try:
                doc = json.loads(out)
            except json.JSONDecodeError:
                raise Problem(f"topology check --json printed no JSON: {out[:200]!r}") from None
            if not isinstance(doc, dict) or doc.get("ok") is not True:
                raise Problem(f"topology check --json exited 0 but said {out[:200]!r}")
        elif ": ok (" not in out:
            raise Problem(f"topology check exited 0 but said {out[:200]!r}")


_MAPE = re.compile(r"MAPE uncalibrated \d+\.\d% -> calibrated \d+\.\d% over (\d+) plans \(|MAPE: no measured plans \(")


def plan_records(plans: Path) -> list[dict]:
    """plans.jsonl's records, read as the project reads JSON lines: UTF-8 less a leading BOM, lines split
    at "\\n" only (``read_text`` would split at a bare "\\r" too, which JSON takes as whitespace: fuzz
    seed 63's two false alarms); none when there is no file."""
    text = plans.read_bytes().decode("utf-8").removeprefix("\ufeff") if plans.is_file() else ""
    return list(map(json.loads, filter(str.strip, text.split("\n"))))


def check_report_output(argv: list[str], out: str) -> None:
    """Raise :class:`Problem` unless an exit-0 ``emulator report DIR`` wrote a sane report of DIR:
    its path and the MAPE line printed, strict JSON fits, no NaN or inf in what it printed, and the
    MAPE over exactly the measured plans of plans.jsonl with status ok, saying how many measured
    nothing (none silently left out)."""
    run = Path(argv[-1])
    lines = out.splitlines()
    if len(lines) != 2 or lines[0] != str(run / "report.md") or not (match := _MAPE.match(lines[1])):
        raise Problem(f"emulator report exited 0 but printed {out[:300]!r}")
    report = (run / "report.md").read_text()
    if lines[1] not in report.splitlines():
        raise Problem("report.md does not hold the MAPE line printed")
    no_nonfinite_text(out, "emulator report")
    strict_json((run / "fits.json").read_text(), "fits.json")
    ok = [p for p in plan_records(run / "plans.jsonl") if p.get("status") == "ok"]
    measured = sum(p.get("measured_s") is not None for p in ok)
    if int(match[1] or 0) != measured:
        raise Problem(f"the MAPE counts {match[1] or 0} plans, plans.jsonl has {measured} measured with status ok")
    if len(ok) > measured and f"{len(ok) - measured} plan" not in lines[1]:
        raise Problem(f"{len(ok) - measured} plans with status ok measured nothing, and the MAPE line does not say")


def check_emulator_output(argv: list[str], out: str) -> None:
    """An emulator command that exits 0 without root can only be ``report`` (checked as such)."""
    if argv[:1] != ["report"]:
        raise Problem(f"emulator {' '.join(argv[:1])} exited 0 without root, printing {out[:200]!r}")
    check_report_output(argv, out)


def judge_cli(argv: list[str], rc: int, out: str, err: str, *, program: str = "spiderflow") -> Outcome:
    from emulator.net.capability import NOT_ROOT

    if program == "emulator" and rc == 2 and err == f"error: {NOT_ROOT}\n" and not out:
        return Outcome("accepted", "every input checked, then the root check")
    outcome = judge_exit(rc, out, err)
    if outcome is not None:
        return outcome
    try:
        check_emulator_output(argv, out) if program == "emulator" else check_cli_output(argv, out)
    except Problem as p:
        return Outcome(p.kind, str(p))
    except SystemExit:
        return Outcome("wrong", "exit 0, but the command line does not parse again")
    except Exception as exc:  # noqa: BLE001 - e.g. the loader refuses the trace the CLI replayed
        return Outcome("wrong", f"exit 0, but re-reading its inputs/outputs fails: {type(exc).__name__}: {exc}"[:300])
    return Outcome("accepted")


def run_case_inprocess(case: Case, work: Path, *, timeout_s: float, cli_if_rejected: bool = False) -> Outcome:
    """The loader first (cheap); the CLI when the loader accepted (or ``cli_if_rejected``)."""
    if case.program == "emulator":
        from emulator.console import main
    else:
        from spiderflow.cli import main

    case.write(work)
    with cwd(work):
        outcome = load_case(case, timeout_s=timeout_s) if case.loader else None
        if case.argv is None or (outcome is not None and (outcome.failed or
                                                          (outcome.kind == "rejected" and not cli_if_rejected))):
            return outcome
        with not_root() if case.program == "emulator" else contextlib.nullcontext():
            crash, rc, out, err = run_main(main, case.argv, timeout_s=timeout_s)
        return crash or judge_cli(case.argv, rc, out, err, program=case.program)


NOT_ROOT_UID = 65534  # nobody


@contextlib.contextmanager
def not_root():
    """``os.geteuid`` answers nobody's uid: the emulator's commands check every input, then stop at
    their root check (``emulator.net.capability.require_root``) without building anything, even
    when the tests run as root."""
    real = os.geteuid
    os.geteuid = lambda: NOT_ROOT_UID
    try:
        yield
    finally:
        os.geteuid = real


EMULATOR_DRIVER = f"""\
import os, sys
os.geteuid = lambda: {NOT_ROOT_UID}  # as tests/fuzzkit/run.py's not_root(): stop at the root check
from emulator.console import main
sys.exit(main(sys.argv[1:]))
"""


DRIVER = """\
import json, sys
from spiderflow.errors import SpiderFlowError
kind, path, kwargs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
try:
    if kind == "topology":
        from spiderflow.topology import load_topology as load
    elif kind == "calibration":
        from spiderflow.costmodel import load_calibration as load
    else:
        from spiderflow.traces import load_trace as load
    load(path, **kwargs)
except SpiderFlowError as exc:
    print(f"error: {exc}", file=sys.stderr)
    sys.exit(2)
print("ok")
"""


def run_process(cmd: list[str], work: Path, timeout_s: float) -> tuple[int | None, str, str]:
    """(exit code or None after a timeout, stdout, stderr); the process group is killed on timeout."""
    proc = subprocess.Popen(cmd, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return None, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")
    return proc.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")


def run_case_subprocess(case: Case, work: Path, *, python: str, timeout_s: float) -> Outcome:
    """The real CLI (``python -m spiderflow``), or the loader through ``python -c`` where the case
    has no command line; then, in this process, the checks of what was accepted."""
    case.write(work)
    if case.argv is not None and case.program == "emulator":
        cmd = [python, "-c", EMULATOR_DRIVER, *case.argv]
    elif case.argv is not None:
        cmd = [python, "-m", case.program, *case.argv]
    else:
        kind, path, kwargs = case.loader
        cmd = [python, "-c", DRIVER, kind, path, json.dumps(kwargs)]
    rc, out, err = run_process(cmd, work, timeout_s)
    if rc is None:
        return Outcome("hang", f"past {timeout_s:g} s")
    with cwd(work):
        if case.argv is None:
            outcome = judge_exit(rc, out, err) or Outcome("accepted")
        else:
            outcome = judge_cli(case.argv, rc, out, err, program=case.program)
        if outcome.kind == "accepted" and case.loader:
            checked = load_case(case, timeout_s=timeout_s)
            if checked.failed or checked.kind == "rejected":
                why = checked.detail if checked.failed else f"the loader rejects it: {checked.detail}"
                return Outcome(checked.kind if checked.failed else "wrong", f"exit 0, but {why}")
    return outcome
