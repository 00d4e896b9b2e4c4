"""Fixtures for the emulator tests.

Tests marked ``root`` build real networks; they are skipped (cleanly, with a
reason) when not running as root. CI runs as root, so they run there.
"""

import os
import socket
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import pytest

from emulator.net.state import RUN_DIR_PREFIX
from emulator.net.tolerance import FAIL, NO_VERDICT, delay_verdict, rate_verdict
from spiderflow.topology import parse_topology

REPO = Path(__file__).resolve().parents[2]
PYTHON = sys.executable


def pytest_runtest_setup(item):
    if item.get_closest_marker("root") and os.geteuid() != 0:
        pytest.skip("needs root (network namespaces, tc, iptables): run the tests with sudo")


def free_port() -> int:
    """A TCP port free on loopback now (a rank's rendezvous in the loopback tests)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rate_ok(configured_mbps: float, measured_mbps: float, steal_pct: float, what) -> bool:
    """A measured rate that ``emulator check`` would not fail (``rate_verdict``, emulator/net/tolerance.py):
    within the tolerance; or, read low by a bounded amount while the host (hypervisor) stole a noticeable
    share of this machine's CPU, no verdict, with a warning. A stolen virtual CPU reads a link low, never
    high: such readings failed these tests on links shaped right (benchmarks/results/delay_stalls.md)."""
    verdict = rate_verdict(configured_mbps, measured_mbps, steal_pct)
    if verdict == NO_VERDICT:
        warnings.warn(f"{what}: {measured_mbps:.1f} of {configured_mbps:.1f} Mbit/s while the host stole "
                      f"{steal_pct:.0f}% of the CPU: no verdict on its rate", stacklevel=2)
    return verdict != FAIL


def delay_ok_under_steal(configured_ms: float, measured_ms: float, steal_pct: float, what) -> bool:
    """A measured (or fitted) one-way delay that ``emulator check`` would not fail (``delay_verdict``): the
    delay-side twin of :func:`rate_ok`. A stolen virtual CPU reads a delay high, never low: a calibration
    that fitted 12.39 ms to a 10 ms link while 19.4% was stolen failed a CI run on a link shaped right,
    and passed when run again."""
    verdict = delay_verdict(configured_ms, measured_ms, steal_pct)
    if verdict == NO_VERDICT:
        warnings.warn(f"{what}: {measured_ms:.2f} ms against {configured_ms:.2f} ms while the host stole "
                      f"{steal_pct:.0f}% of the CPU: no verdict on its delay", stacklevel=2)
    return verdict != FAIL


def two_cluster_topology(bandwidth_gbps=0.6, latency_ms=20.0, jitter_ms=0.0):
    return parse_topology({
        "name": "two",
        "clusters": [{"name": "east", "gpu": "a100-80gb", "nodes": 1, "gpus_per_node": 8},
                     {"name": "west", "gpu": "a100-80gb", "nodes": 1, "gpus_per_node": 8}],
        "links": [{"a": "east", "b": "west", "bandwidth_gbps": bandwidth_gbps, "latency_ms": latency_ms,
                   "jitter_ms": jitter_ms}],
    }, source="<two-cluster test topology>")


TWO_CLUSTER_YAML = """\
name: two
clusters:
  - {name: east, gpu: a100-80gb, nodes: 1, gpus_per_node: 8}
  - {name: west, gpu: a100-80gb, nodes: 1, gpus_per_node: 8}
links:
  - {a: east, b: west, bandwidth_gbps: 0.6, latency_ms: 20}
"""


# Two clusters on a 1 Gbit/s, 10 ms link: the end-to-end root tests (run, calibrate) use it.
TWO_CLUSTER_1G_YAML = """\
name: two
clusters:
  - {name: east, gpu: a100-80gb, nodes: 1, gpus_per_node: 8}
  - {name: west, gpu: a100-80gb, nodes: 1, gpus_per_node: 8}
links:
  - {a: east, b: west, bandwidth_gbps: 1.0, latency_ms: 10}
"""


def _root_lines(argv):
    done = subprocess.run(argv, capture_output=True, text=True)
    return frozenset(done.stdout.splitlines())


TAG_ENV = "SPIDERFLOW_TEST_TAG"


def snapshot(tag: str) -> dict:
    """What the emulator could leak: root-namespace objects, and processes of this test.

    The machine may be shared (someone else's emulation may be running), so
    processes and namespaces count as ours only if they carry this test's tag
    in their environment: every process an emulation starts inherits it (the
    test sets it before building), including the shells that hold the
    namespaces. Root-namespace objects, and the emulations' scratch
    directories (emulator.net.state.RUN_DIR_PREFIX), are compared whole.
    """
    ours, netns = set(), set()
    needle = f"{TAG_ENV}={tag}".encode()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) == os.getpid():
            continue
        try:
            if needle not in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                continue
            inode = os.stat(f"/proc/{pid}/ns/net").st_ino
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        ours.add(f"{pid} {cmdline[:160]}")
        netns.add(inode)
    netns.discard(os.stat("/proc/self/ns/net").st_ino)
    return {
        "processes of this test": frozenset(ours),
        "their network namespaces": frozenset(netns),
        "named namespaces": _root_lines(["ip", "netns", "list"]),
        "veths": _root_lines(["ip", "-o", "link", "show", "type", "veth"]),
        "bridges": _root_lines(["ip", "-o", "link", "show", "type", "bridge"]),
        "iptables rules": _root_lines(["iptables", "-S"]),
        "scratch directories": frozenset(str(p) for p in Path(tempfile.gettempdir()).glob(f"{RUN_DIR_PREFIX}*")),
    }


def leaked(before: dict, after: dict) -> dict:
    """Whatever exists after that did not exist before (should be empty)."""
    return {key: sorted(map(str, after[key] - before[key])) for key in before if after[key] - before[key]}


@pytest.fixture
def state_dir(tmp_path, monkeypatch):
    """A private lock/state directory, so tests never touch a real emulation's."""
    path = tmp_path / "state"
    monkeypatch.setenv("SPIDERFLOW_STATE_DIR", str(path))
    return path


@pytest.fixture
def assert_no_leak(monkeypatch):
    """Tag this test's processes, snapshot; the callable asserts nothing new remains (waits up to 5 s)."""
    import time
    import uuid

    tag = uuid.uuid4().hex
    monkeypatch.setenv(TAG_ENV, tag)
    before = snapshot(tag)

    def check():
        deadline = time.monotonic() + 5.0
        while True:
            extra = leaked(before, snapshot(tag))
            if not extra or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert not extra, f"left behind: {extra}"

    return check


@pytest.fixture
def two_cluster():
    return two_cluster_topology()


@pytest.fixture
def two_cluster_yaml(tmp_path):
    path = tmp_path / "two.yaml"
    path.write_text(TWO_CLUSTER_YAML)
    return path


@pytest.fixture
def full_disk(tmp_path):
    """A directory on a file system with next to no room (a 64 KiB tmpfs, unmounted after the test;
    the test is skipped where none can be mounted): the full-disk tests' ``--out DIR`` goes under it."""
    tiny = tmp_path / "tiny"
    tiny.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(tiny)], capture_output=True,
                             text=True)
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield tiny
    finally:
        subprocess.run(["umount", str(tiny)], check=True)
