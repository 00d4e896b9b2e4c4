"""Packaging: the console command, --version, the planner without the emulator stack, shipped data by name."""

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import spiderflow
from spiderflow import shipped
from spiderflow.topology import load_topology
from spiderflow.traces import load_trace

from .conftest import REPO

CONSOLE = Path(sys.executable).parent / "spiderflow"


def test_console_command_and_version_match_the_package():
    proc = subprocess.run([str(CONSOLE), "--version"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"spiderflow {spiderflow.__version__}"
    emu = subprocess.run([sys.executable, "-m", "emulator", "--version"], capture_output=True, text=True,
                         timeout=60, cwd=REPO)
    assert emu.stdout.strip() == f"spiderflow emulator {spiderflow.__version__}"


def test_the_planner_needs_neither_torch_nor_mininet():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    core = " ".join(project["dependencies"]).lower()
    assert "torch" not in core and "mininet" not in core
    extra = " ".join(project["optional-dependencies"]["emulator"]).lower()
    assert "torch" in extra and "mininet" in extra


def test_shipped_topologies_and_traces_by_name_from_any_directory(tmp_path):
    assert {"default", "paper8", "geo64"} <= set(shipped.names("topology"))
    assert "default" in shipped.names("trace")
    # by name, and by the checkout-relative path, from a directory that has neither
    for name in ("paper8", "topologies/paper8.yaml"):
        proc = subprocess.run([str(CONSOLE), "plan", "--topology", name, "--model", "gpt3-1.3b", "--gpus", "16",
                               "--json"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert '"placement"' in proc.stdout
    assert load_topology("paper8").name == load_topology(REPO / "topologies" / "paper8.yaml").name
    assert len(load_trace("default").jobs) == len(load_trace(REPO / "traces" / "default.csv").jobs) > 0


def test_an_unknown_name_lists_what_is_shipped(tmp_path):
    proc = subprocess.run([str(CONSOLE), "plan", "--topology", "nowhere", "--model", "gpt3-1.3b", "--gpus", "16"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: nowhere: no such topology file; give a path or a shipped name " \
                                  f"({', '.join(shipped.names('topology'))})"
    # a file of that name in the working directory wins over a shipped one
    (tmp_path / "paper8").write_text("not: [a topology\n")
    proc = subprocess.run([str(CONSOLE), "plan", "--topology", "paper8", "--model", "gpt3-1.3b", "--gpus", "16"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 2 and "not valid YAML" in proc.stderr


def test_the_readme_python_api_example_runs(tmp_path):
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Python API"):]
    code = section[section.index("```python\n") + len("```python\n"):section.index("```\n", section.index("```python"))]
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    placement, avg_jct = proc.stdout.strip().splitlines()
    assert "s/iteration" in placement and float(avg_jct) > 0


def test_every_simulate_config_says_what_produced_it(tmp_path):
    proc = subprocess.run([str(CONSOLE), "simulate", "--topology", "default", "--trace", "default", "--jobs", "2",
                           "--seed", "3", "--out", str(tmp_path / "out"), "--json"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["version"] == spiderflow.__version__ and config["seed"] == 3
    assert config["argv"][1:] == ["simulate", "--topology", "default", "--trace", "default", "--jobs", "2",
                                  "--seed", "3", "--out", str(tmp_path / "out"), "--json"]
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=REPO)
    if head.returncode == 0:  # a checkout (CI clones one); an unpacked source tree has no commit
        assert config["git_commit"] == head.stdout.strip()
    else:
        assert config["git_commit"] is None
