"""``emulator calibrate`` on a real two-cluster network: the fitted WAN bandwidth matches the shaped one."""

import json
import subprocess
import sys

import pytest

from spiderflow.costmodel import load_calibration

from .conftest import REPO, TWO_CLUSTER_1G_YAML, delay_ok_under_steal, rate_ok

TOPOLOGY = TWO_CLUSTER_1G_YAML


@pytest.mark.root
@pytest.mark.slow
def test_calibrate_fits_the_configured_bandwidth(tmp_path, state_dir, assert_no_leak):
    (tmp_path / "two.yaml").write_text(TOPOLOGY)
    out = tmp_path / "cal"
    # the command's default three samples a size: their median drops one outlier, where the median of two
    # is their mean (with two, a full suite on this 2-core host twice fitted one figure out of tolerance:
    # beta 0.87 Gbit/s, alpha 12.1 ms; each passed when run again)
    done = subprocess.run([sys.executable, "-m", "emulator", "calibrate", "--topology", str(tmp_path / "two.yaml"),
                           "--no-plans", "--samples", "3", "--out", str(out), "--json"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    cal = load_calibration(summary["calibration"][0])
    wan = cal.path("east", "west")
    assert wan is not None
    stolen = json.loads((out / "config.json").read_text())["host_steal_pct"]
    assert rate_ok(1000.0, wan.beta_gbps * 1000, stolen, wan), wan  # within 10% of the configured 1 Gbit/s
    # one-way 10 ms, within the shared delay tolerance (or a little over while the host stole the CPU): with
    # open TCP windows the fitted intercept may sit a little under the delay (htb lets the first burst through
    # at veth speed)
    assert delay_ok_under_steal(10.0, wan.alpha_s * 1e3, stolen, wan), wan
    assert set(cal.intra) == {"east", "west"}
    ring = cal.ring(["west", "east"])  # the two-cluster ring all-reduce: both directions loaded at once
    assert ring is not None and rate_ok(1000.0, ring.beta_gbps * 1000, stolen, ring), ring
    records = [json.loads(l) for l in (out / "microbench.jsonl").read_text().splitlines()]
    assert {r["op"] for r in records} == {"p2p", "all_reduce", "all_gather", "reduce_scatter"}
    assert (out / "report.md").read_text().count("MAPE") >= 1
    assert_no_leak()
