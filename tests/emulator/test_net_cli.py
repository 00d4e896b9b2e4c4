"""The command line: bad input gives one line and exit 2 (no root needed for these)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from emulator import console as cli
from spiderflow.errors import EmulatorError

REPO = Path(__file__).resolve().parents[2]


def run(*args, **kwargs):
    return subprocess.run([sys.executable, "-m", "emulator", *args], capture_output=True, text=True,
                          cwd=REPO, timeout=60, **kwargs)


def test_bad_topology_is_the_loaders_one_line_error_and_exit_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nclusters:\n  - {name: a, gpu: a100-80gb, nodes: 1, gpus_per_node: 8}\n"
                   "links:\n  - {a: a, b: a, bandwidth_gbps: -1, latency_ms: 5}\n")
    done = run("check", "--topology", str(bad))
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {bad}: links[0]")


def test_missing_topology_file(tmp_path):
    done = run("check", "--topology", str(tmp_path / "nope.yaml"))
    assert done.returncode == 2 and "no such topology file" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_bad_option_value_is_one_line():
    done = run("check", "--hosts-per-cluster", "0")
    assert done.returncode == 2
    assert done.stderr.strip() == ("error: argument --hosts-per-cluster: must be an integer in 1..240 (got '0') "
                                   "(see `python -m emulator check --help`)")


def test_not_root_says_run_with_sudo():
    argv = [sys.executable, "-m", "emulator", "check"]
    if os.geteuid() == 0:  # drop to nobody for this one command
        if shutil.which("setpriv") is None:
            pytest.skip("setpriv is needed to drop root")
        argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *argv]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=60,
                          env={**os.environ, "HOME": "/tmp"})
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == "error: run with sudo: the emulator needs root (network namespaces, tc, iptables)"


def test_subcommands_are_a_registry_of_modules():
    parser, modules = cli.build_parser()
    assert set(modules) >= {"check", "clean"}
    for module in modules.values():
        assert callable(module.add_arguments) and callable(module.main) and module.HELP
    args = parser.parse_args(["check", "--topology", "x.yaml", "--json", "--scale", "20"])
    assert (args.command, args.topology, args.json, args.scale) == ("check", "x.yaml", True, 20.0)


def test_check_help_states_its_exit_statuses():
    parser, _ = cli.build_parser()
    check = parser._subparsers._group_actions[0].choices["check"]
    text = " ".join(check.format_help().split())
    assert "exit status: 0 every measurement within tolerance; 1 one failed" in text and "; 3 none failed" in text


# Every numeric and path option is checked by argparse before any work (and before root): one line
# naming the option and the value, exit 2. Only the parser runs (never a subcommand's main), so a
# check that let a value through fails the test instead of building a network.
BAD_ARGS = [
    (["check", "--hosts-per-cluster", "241"], "--hosts-per-cluster", "'241'"),
    (["check", "--scale", "nan"], "--scale", "'nan'"),
    (["check", "--scale", "0"], "--scale", "'0'"),
    (["check", "--scale", "1e300"], "--scale", "'1e300'"),
    (["check", "--intra-cap-mbps", "inf"], "--intra-cap-mbps", "'inf'"),
    (["check", "--seconds", "-1"], "--seconds", "'-1'"),
    (["check", "--dilation", "nan"], "--dilation", "'nan'"),
    (["check", "--queue-bdp", "0"], "--queue-bdp", "'0'"),
    (["compare", "--queue-bdp", "101"], "--queue-bdp", "'101'"),
    (["run", "--iterations", "0"], "--iterations", "'0'"),
    (["run", "--iterations", "1"], "--iterations", "'1'"),
    (["run", "--warmup", "-1"], "--warmup", "'-1'"),
    (["run", "--time-scale", "nan"], "--time-scale", "'nan'"),
    (["run", "--time-scale=-inf"], "--time-scale", "'-inf'"),  # (a bare -inf reads as an option)
    (["run", "--job-timeout", "0"], "--job-timeout", "'0'"),
    (["run", "--hosts-per-cluster", "0"], "--hosts-per-cluster", "'0'"),
    (["calibrate", "--samples", "0"], "--samples", "'0'"),
    (["calibrate", "--iterations", "1e9"], "--iterations", "'1e9'"),
    (["calibrate", "--warmup", "x"], "--warmup", "'x'"),
    (["compare", "--planners", "spinsearch,nope"], "--planners", "'nope'"),
    (["compare", "--planners", "blind,blind"], "--planners", "'blind,blind'"),
    (["compare", "--startup", "-1"], "--startup", "'-1'"),
    (["compare", "--startup", "modle"], "--startup", "'modle'"),
    (["compare", "--iterations", "1"], "--iterations", "'1'"),
    (["run", "--time-limit", "0"], "--time-limit", "'0'"),
    (["compare", "--seed", "-3"], "--seed", "'-3'"),
]


@pytest.mark.parametrize("argv, option, value", BAD_ARGS, ids=[" ".join(b[0]) for b in BAD_ARGS])
def test_bad_numeric_option_is_one_line_exit_2(argv, option, value, capsys):
    parser, _ = cli.build_parser()
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(argv)
    assert exc.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: argument {option}:") and value in lines[0], lines


@pytest.mark.parametrize("command", ["run", "calibrate", "compare"])
def test_out_that_is_a_file_fails_before_any_work(tmp_path, command, capsys):
    f = tmp_path / "a-file"
    f.write_text("x")
    parser, _ = cli.build_parser()
    with pytest.raises(SystemExit) as exc:
        parser.parse_args([command, "--out", str(f)])
    assert exc.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "argument --out:" in lines[0] and "is a file, not a directory" in lines[0]


@pytest.mark.parametrize("command", ["run", "calibrate", "compare"])
def test_warmup_must_leave_two_measured_iterations(command):
    from spiderflow.errors import EmulatorError
    from emulator.run import check_warmup

    parser, _ = cli.build_parser()
    args = parser.parse_args([command, "--iterations", "4", "--warmup", "3"])  # each in its own range
    with pytest.raises(EmulatorError, match=r"--warmup must be in 0\.\.iterations-2 = 0\.\.2 \(got 3\)"):
        check_warmup(args)
    check_warmup(parser.parse_args([command, "--iterations", "4", "--warmup", "2"]))


def test_closed_stdout_ends_quietly():
    """`python -m emulator ... | head -1`: the top-level handler ends quietly with exit 1. The
    subcommand is replaced by one printing 1 MB (none of the real ones prints without root)."""
    code = ("import sys, emulator.console, emulator.calibrate.report_command as r\n"
            "def big(args):\n"
            "    for i in range(16000):\n"
            "        print(f'line {i} ' + 'x' * 60)\n"
            "    return 0\n"
            "r.main = big\n"
            "sys.exit(emulator.console.main(['report', 'unused']))\n")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        first = proc.stdout.readline()
        proc.stdout.close()
        err = proc.stderr.read().decode()
        rc = proc.wait(timeout=60)
    finally:
        proc.kill()
    assert first == b"line 0 " + b"x" * 60 + b"\n"
    assert (rc, err) == (1, "")


def test_a_write_that_finds_no_room_names_out(tmp_path):
    """unwritable_raises (run's and compare's results; calibrate's writes, only=NO_SPACE): a write that
    finds no room (/dev/full: ENOSPC) becomes the one line naming --out; with ``only``, any other
    OSError is left as it is."""
    from emulator.run import unwritable_raises
    from spiderflow.cliutil import NO_SPACE

    for only in (None, NO_SPACE):
        with pytest.raises(EmulatorError) as err:
            with unwritable_raises(tmp_path, only=only), open("/dev/full", "w") as fh:
                fh.write("a line\n")
        assert str(err.value) == (f"{tmp_path}: cannot write the run's results there (No space left on device); "
                                  "free space there, or pass --out DIR on another file system, and run again")
    with pytest.raises(FileNotFoundError), unwritable_raises(tmp_path, only=NO_SPACE):
        open(tmp_path / "no" / "such" / "file")
    with pytest.raises(EmulatorError, match="No such file or directory"), unwritable_raises(tmp_path):
        open(tmp_path / "no" / "such" / "file")
