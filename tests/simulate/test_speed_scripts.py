"""benchmarks/simulator_speed.py and benchmarks/planner_replay.py, the scripts the README's speed
figures come from: bad input is one line and exit 2, and a tiny run writes its table / recording."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def script(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "benchmarks" / name), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args, says", [
    (("--jobs", "0"), "argument --jobs: must be an integer in 1..1,000,000 (got '0')"),
    (("--load", "-1"), "argument --load: must be a finite number in (0, 2] (got '-1')"),
    (("--clusters", "1"), "argument --clusters: must be an integer in 2..4,096 (got '1')"),
    (("--planner", "nope"), "argument --planner: invalid choice: 'nope'"),
    (("--out", "/nonexistent-dir/x.md"), "/nonexistent-dir does not exist; make the directory first"),
    (("--jobs", "1", "--load", "0.5"), "error: trace generate: load needs at least 2 jobs"),
])
def test_simulator_speed_refuses_bad_arguments_in_one_line(args, says):
    done = script("simulator_speed.py", *args)
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.splitlines()) == 1 and says in done.stderr, done.stderr


def test_planner_replay_refuses_a_file_it_did_not_record(tmp_path):
    for path, why in ((tmp_path / "missing.pkl", "No such file or directory"),
                      (REPO / "README.md", "invalid load key")):
        done = script("planner_replay.py", "replay", str(path))
        assert done.returncode == 2 and done.stdout == ""
        assert done.stderr.startswith(f"error: {path}: cannot read a recording (") and why in done.stderr
        assert len(done.stderr.splitlines()) == 1 and "give a file that `record --out` wrote" in done.stderr


def test_a_tiny_run_writes_its_table_and_a_recording_replays(tmp_path):
    out = tmp_path / "speed.md"
    done = script("simulator_speed.py", "--jobs", "20", "--out", str(out))
    assert done.returncode == 0, done.stderr
    row = next(line for line in out.read_text().splitlines() if line.startswith("| 20 | 64 | 1944 |"))
    assert row.split("|")[9].strip() == "20"  # completed
    calls = tmp_path / "calls.pkl"
    done = script("planner_replay.py", "record", "--jobs", "20", "--out", str(calls))
    said = re.fullmatch(r"(\d+) SpinSearch calls recorded in (.+)\n", done.stdout)
    assert done.returncode == 0 and said and int(said[1]) >= 20 and said[2] == str(calls), done.stderr
    done = script("planner_replay.py", "replay", str(calls))
    assert done.returncode == 0 and done.stdout.startswith(f"{said[1]} calls: "), done.stderr
