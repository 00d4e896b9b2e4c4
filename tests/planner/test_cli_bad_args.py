"""`python -m spiderflow`: bad arguments give one line naming the option and a non-zero exit, never a
traceback, a hang or a silently wrong result; --json is always valid JSON; a closed stdout ends quietly."""

import fcntl
import json
import math
import os
import subprocess
import sys

import pytest

from spiderflow.cli import build_parser
from spiderflow.cliutil import closed_stdout_exit, dumps, output_dir_for
from spiderflow.simulate.engine import SimConfig, simulate
from spiderflow.simulate.metrics import summarise
from spiderflow.topology import load_topology
from spiderflow.workload import Job

from .conftest import REPO

HEADER = "job_id,arrival_s,model,gpus,iterations,global_batch,seq_len\n"


def run(*args, **kwargs):
    return subprocess.run([sys.executable, "-m", "spiderflow", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120, **kwargs)


def strict_json(text: str):
    """json.loads refusing NaN, Infinity and -Infinity (which Python's json accepts by default)."""
    def refuse(name):
        raise ValueError(f"not JSON: {name}")
    return json.loads(text, parse_constant=refuse)


def one_line_error(stderr: str, option: str) -> str:
    assert "Traceback" not in stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: ") and option in lines[0], lines[0]
    return lines[0]


PLAN = ["plan", "--model", "gpt3-1.3b", "--gpus", "8"]
GEN = ["trace", "generate", "--jobs", "5", "--out", "/tmp/never-written.csv"]

BAD = [  # argv, the option the message must name, the value it must quote
    (PLAN + ["--time-limit", "-1"], "--time-limit", "'-1'"),
    (PLAN + ["--time-limit", "nan"], "--time-limit", "'nan'"),
    (PLAN + ["--time-limit", "inf"], "--time-limit", "'inf'"),
    (PLAN + ["--time-limit", "1e300"], "--time-limit", "'1e300'"),
    (PLAN + ["--clusters", ",,,"], "--clusters", "',,,'"),
    (PLAN + ["--clusters", "oregon,oregon"], "--clusters", "'oregon,oregon'"),
    (PLAN + ["--clusters", ""], "--clusters", "''"),
    (PLAN + ["--seed", "-1"], "--seed", "'-1'"),
    (PLAN + ["--global-batch", "0"], "--global-batch", "'0'"),
    (PLAN + ["--seq-len", "1e300"], "--seq-len", "'1e300'"),
    (["plan", "--model", "gpt3-1.3b", "--gpus", "0"], "--gpus", "'0'"),
    (["plan", "--model", "gpt3-1.3b", "--gpus", "9" * 5000], "--gpus", "999"),
    (["simulate", "--search-budget", "0"], "--search-budget", "'0'"),
    (["simulate", "--search-budget", "-5"], "--search-budget", "'-5'"),
    (["simulate", "--time-limit", "nan"], "--time-limit", "'nan'"),
    (["simulate", "--jobs", "0"], "--jobs", "'0'"),
    (["compare", "--planners", ""], "--planners", "''"),
    (["compare", "--planners", "spinsearch,nope"], "--planners", "'nope'"),
    (["compare", "--planners", "blind,blind"], "--planners", "'blind'"),
    (["compare", "--planners", "blind,,ilp"], "--planners", "'blind,,ilp'"),
    (["bench", "planner", "--clusters", "8,8"], "--clusters", "'8,8'"),
    (["bench", "planner", "--clusters", "1"], "--clusters", "'1'"),
    (["bench", "planner", "--planners", "x"], "--planners", "'x'"),
    (["bench", "planner", "--time-limit", "0"], "--time-limit", "'0'"),
    (["topology", "generate", "--clusters", "1", "--out", "/tmp/x.yaml"], "--clusters", "'1'"),
    (["topology", "generate", "--clusters", "100000", "--out", "/tmp/x.yaml"], "--clusters", "'100000'"),
    (GEN + ["--mean-interarrival", "nan"], "--mean-interarrival", "'nan'"),
    (GEN + ["--mean-interarrival", "-1"], "--mean-interarrival", "'-1'"),
    (GEN + ["--max-gpus", "100"], "--max-gpus", "'100'"),
    (["trace", "generate", "--jobs", "-3", "--out", "/tmp/x.csv"], "--jobs", "'-3'"),
    (["simulate", "--trace", "/nonexistent.csv", "--out", "a" * 5000], "--out", "(File name too long)"),
    (["simulate", "--trace", "/nonexistent.csv", "--out", "bad\0path"], "--out", "cannot use path"),
]


@pytest.mark.parametrize("argv, option, value", BAD, ids=[" ".join(b[0][-2:])[:40] for b in BAD])
def test_bad_argument_is_one_line_exit_2(argv, option, value, capsys):
    # only the parser runs: a check that let the value through fails here instead of starting the work
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(argv)
    assert exc.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    line = one_line_error(captured.err, f"argument {option}:")
    assert value in line


@pytest.mark.parametrize("argv, option", [
    (PLAN + ["--time-limit", "-1"], "--time-limit"),
    (["simulate", "--search-budget", "-5"], "--search-budget"),
    (PLAN + ["--clusters", ",,,"], "--clusters"),
    (["compare", "--planners", "spinsearch,spinsearch"], "--planners"),
])
def test_bad_argument_end_to_end(argv, option):
    proc = run(*argv)
    assert proc.returncode == 2 and proc.stdout == ""
    one_line_error(proc.stderr, option)


@pytest.mark.parametrize("clusters", ["mars", "oregon,mars"])
def test_unknown_cluster_is_one_line(clusters):
    proc = run(*PLAN, "--clusters", clusters)
    assert proc.returncode == 2
    assert "'mars' is not a cluster" in one_line_error(proc.stderr, "--clusters")


def test_out_file_where_a_directory_is_expected(tmp_path):
    f = tmp_path / "a-file"
    f.write_text("x")
    proc = run("simulate", "--trace", "traces/default.csv", "--topology", "topologies/default.yaml",
               "--out", str(f))
    assert proc.returncode == 2 and proc.stdout == ""
    assert "is a file, not a directory" in one_line_error(proc.stderr, "--out")
    assert f.read_text() == "x"


def test_out_directory_where_a_file_is_expected(tmp_path):
    proc = run("trace", "generate", "--jobs", "3", "--out", str(tmp_path))
    assert proc.returncode == 2
    assert "is a directory" in one_line_error(proc.stderr, "--out")


@pytest.mark.parametrize("cmd", [["topology", "generate", "--clusters", "3"], ["trace", "generate", "--jobs", "3"]])
def test_out_parent_missing(tmp_path, cmd):
    proc = run(*cmd, "--out", str(tmp_path / "nope" / "x.out"))
    assert proc.returncode == 2
    assert "does not exist" in one_line_error(proc.stderr, "--out")
    assert not (tmp_path / "nope").exists()


@pytest.mark.parametrize("cmd", [
    ["simulate", "--trace", "traces/default.csv", "--topology", "topologies/default.yaml"],
    ["compare", "--trace", "traces/default.csv", "--topology", "topologies/default.yaml", "--planners", "blind"],
    ["bench", "planner", "--clusters", "8", "--jobs", "1", "--planners", "spinsearch"]])
def test_out_the_file_system_refuses_is_one_line(cmd):
    """/proc takes no new directory, though root's permissions allow it (found by fuzzing: a
    traceback from mkdir); without root it is refused when the arguments are read."""
    proc = run(*cmd, "--out", "/proc/spiderflow-nope/x")
    assert proc.returncode == 2 and proc.stdout == "" and "Traceback" not in proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and proc.stderr.strip().splitlines()[-1] == errors[0], proc.stderr
    assert "--out" in errors[0] and ("cannot make the directory" in errors[0] or "permission denied" in errors[0])


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes everywhere")
def test_out_parent_not_writable(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        file_proc = run("trace", "generate", "--jobs", "3", "--out", str(ro / "x.csv"))
        dir_proc = run("simulate", "--out", str(ro / "sub" / "dir"))
    finally:
        ro.chmod(0o700)
    assert file_proc.returncode == 2 and "permission denied" in one_line_error(file_proc.stderr, "--out")
    assert dir_proc.returncode == 2 and "permission denied" in one_line_error(dir_proc.stderr, "--out")
    assert list(ro.iterdir()) == []


@pytest.mark.parametrize("cmd", [["simulate"], ["compare", "--planners", "blind,spinsearch"]])
def test_no_job_of_the_trace_can_ever_fit_is_one_line_exit_2(tmp_path, cmd):
    trace = tmp_path / "big.csv"
    trace.write_text(HEADER + "big-0,0,gpt3-1.3b,800,10,256,2048\nbig-1,5,gpt3-1.3b,1024,10,256,2048\n")
    (tmp_path / "kept").mkdir()
    proc = run(*cmd, "--topology", "topologies/default.yaml", "--trace", str(trace), "--json",
               "--out", str(tmp_path / "kept" / "new" / "out"))
    assert proc.returncode == 2 and proc.stdout == ""
    line = one_line_error(proc.stderr, str(trace))
    assert "none of its 2 jobs can be placed" in line and "wants 800 GPUs" in line
    # the directories the run made before it (its --out, said first) are gone; what was there stays
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.csv", "kept"] and not any((tmp_path / "kept").iterdir())


def test_an_output_directory_made_for_work_that_fails_is_removed_while_empty(tmp_path):
    (tmp_path / "kept").mkdir()
    with pytest.raises(KeyboardInterrupt), output_dir_for(tmp_path / "kept" / "a" / "b") as out:
        assert out.is_dir()
        raise KeyboardInterrupt  # an interrupt, as an error, removes what it made: a, b
    assert (tmp_path / "kept").is_dir() and not any((tmp_path / "kept").iterdir())
    with pytest.raises(ValueError), output_dir_for(tmp_path / "kept" / "a" / "b") as out:
        (out / "partial.csv").write_text("x\n")
        raise ValueError  # a directory with a file in it stays, and so do its parents
    assert (tmp_path / "kept" / "a" / "b" / "partial.csv").exists()
    with output_dir_for(tmp_path / "done") as out:
        pass
    assert out == tmp_path / "done" and out.is_dir()
    with output_dir_for(None) as out:
        assert out is None


@pytest.mark.parametrize("cmd", [["simulate"], ["compare", "--planners", "blind"]])
def test_simulate_and_compare_refuse_their_out_before_they_run(monkeypatch, capsys, cmd):
    """A directory the file system refuses is said before the replay's minutes, not after them."""
    from spiderflow.cli import main
    from spiderflow.simulate import commands

    monkeypatch.setattr(commands, "_run", lambda *a, **k: pytest.fail("replayed before --out was made"))
    argv = [*cmd, "--trace", str(REPO / "traces" / "default.csv"),
            "--topology", str(REPO / "topologies" / "default.yaml"), "--json"]
    assert main([*argv, "--out", "/proc/spiderflow-nope/x"]) == 2
    assert "--out" in capsys.readouterr().err


def test_some_jobs_rejected_json_is_valid_and_says_why(tmp_path):
    trace = tmp_path / "mixed.csv"
    trace.write_text(HEADER + "big-0,0,gpt3-1.3b,800,10,256,2048\nok-1,5,gpt3-1.3b,8,10,256,2048\n")
    proc = run("compare", "--topology", "topologies/default.yaml", "--trace", str(trace), "--json",
               "--planners", "blind,spinsearch")
    assert proc.returncode == 0, proc.stderr
    out = strict_json(proc.stdout)
    assert {n: (s["completed"], s["rejected"]) for n, s in out["planners"].items()} == \
        {"blind": (1, 1), "spinsearch": (1, 1)}
    assert "1 of 2 jobs rejected, e.g. big-0: wants 800 GPUs" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_summary_has_null_not_nan_when_nothing_completed():
    topo = load_topology(REPO / "topologies" / "default.yaml")
    jobs = [Job(job_id="big", arrival_s=0.0, model="gpt3-1.3b", gpus=800, iterations=1, global_batch=256,
                seq_len=2048)]
    summary = summarise(simulate(topo, jobs, SimConfig(planner="blind")), topo.total_gpus)
    assert (summary["completed"], summary["rejected"]) == (0, 1)
    for key in ("avg_jct_s", "p50_jct_s", "p95_jct_s", "avg_queue_s", "throughput_tokens_per_s",
                "gpu_utilization", "avg_overhead_s"):
        assert summary[key] is None, key
    assert strict_json(dumps(summary))["avg_jct_s"] is None


def test_dumps_never_writes_nan_or_infinity():
    text = dumps({"a": math.nan, "b": [math.inf, -math.inf, 1.5], "c": {"d": (math.nan,)}})
    assert strict_json(text) == {"a": None, "b": [None, None, 1.5], "c": {"d": [None]}}


def test_closed_stdout_ends_quietly():
    """`plan --json | head -1`: the reader closes after one line while the writer still has output."""
    proc = subprocess.Popen([sys.executable, "-m", "spiderflow", "plan", "--topology", "topologies/geo64.yaml",
                             "--model", "gpt3-175b", "--gpus", "256", "--json"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        # one page of pipe: the plan's JSON (about 12 KB: 32 stages) cannot all be written before the
        # reader is gone (paper8's 128-GPU plan of this model, 16 stages, fits in one page)
        fcntl.fcntl(proc.stdout.fileno(), fcntl.F_SETPIPE_SZ, 4096)
        first = b""
        while not first.endswith(b"\n"):
            chunk = os.read(proc.stdout.fileno(), 1)
            assert chunk, "stdout ended before one line"
            first += chunk
        proc.stdout.close()
        err = proc.stderr.read().decode()
        code = proc.wait(timeout=120)
    finally:
        proc.kill()
    assert first == b"{\n"
    assert code == 1, err
    assert err == ""


def test_a_full_disk_is_one_line_not_a_traceback(tmp_path):
    """Standard output on a full device (/dev/full answers every write with ENOSPC, as a full disk does):
    `trace generate --json` wrote its trace, then its summary could not be written. One line and exit 2;
    before, a traceback and exit 1. A file the error names is named (here the trace itself on /dev/full,
    which trace generate says in its own words)."""
    out = tmp_path / "t.csv"
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "spiderflow", "trace", "generate", "--jobs", "5",
                               "--out", str(out), "--json"], cwd=REPO, stdout=full, stderr=subprocess.PIPE, text=True,
                              timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == ["error: cannot write the output (No space left on device); free space there, "
                                        "or write elsewhere, and run again"], done.stderr
    assert len(out.read_text().splitlines()) == 7  # the trace (a comment, a header, 5 jobs) was written first
    # an error that names its file (open() on a full file system) names it; another errno is not hidden
    body = ("import errno, os, sys; from spiderflow.cliutil import run_main\n"
            "def body(argv):\n    raise OSError(int(argv[0]), os.strerror(int(argv[0])), '/data/out/jobs.csv')\n"
            "sys.exit(run_main(body, sys.argv[1:]))")
    named = subprocess.run([sys.executable, "-c", body, "28"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert named.returncode == 2 and named.stderr.splitlines() == [
        "error: /data/out/jobs.csv: cannot write (No space left on device); free space there, or write elsewhere, "
        "and run again"], named.stderr
    other = subprocess.run([sys.executable, "-c", body, "13"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert other.returncode == 1 and "PermissionError" in other.stderr  # EACCES: not a full disk


def test_a_broken_pipe_that_is_not_stdout_is_not_hidden():
    with pytest.raises(BrokenPipeError):
        closed_stdout_exit(BrokenPipeError("a child's stdin"))


def test_field_items_parses_each_field_and_names_the_bad_item():
    """The benchmark scripts' LOAD:SEED-style lists: each field by its own type; a wrong count of
    fields or a bad field refuses the whole value, naming the item."""
    import argparse

    from spiderflow.cliutil import field_items, float_in, seed_arg

    parse = field_items(float_in(0.0, 2.0), seed_arg, what="LOAD:SEED", ranges="a load in (0, 2]")
    assert parse("0.5:0, 0.9:12") == [(0.5, 0), (0.9, 12)]
    for bad, item in (("0.5:0,0.5", "0.5"), ("0.5:0:1", "0.5:0:1"), ("3:0", "3:0"), ("0.5:-1", "0.5:-1"), ("", "")):
        with pytest.raises(argparse.ArgumentTypeError) as err:
            parse(bad)
        assert str(err.value) == f"must be LOAD:SEED items, comma-separated, a load in (0, 2] (got {item!r} in {bad!r})"


def test_one_line_errors_says_a_known_error_in_one_line_and_lets_others_through(capsys):
    from spiderflow.cliutil import one_line_errors
    from spiderflow.errors import ConfigError

    def refuse():
        raise ConfigError("in/x.csv: row 3: gpus must be positive (got 0)")

    assert one_line_errors(lambda: None) == 0
    assert one_line_errors(refuse) == 2
    assert capsys.readouterr().err == "error: in/x.csv: row 3: gpus must be positive (got 0)\n"
    with pytest.raises(ZeroDivisionError):  # a bug stays a traceback
        one_line_errors(lambda: 1 / 0)
