"""The command line: bad input gives one line and exit 2 (no root needed for these)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from emulator import cli

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
    assert done.returncode == 2 and "cannot read topology file" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_bad_option_value_is_one_line():
    done = run("check", "--hosts-per-cluster", "0")
    assert done.returncode == 2
    assert done.stderr.strip() == "error: hosts_per_cluster must be an integer in 1..240 (got 0)"


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
