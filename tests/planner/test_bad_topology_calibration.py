"""Bad topology and calibration files: one ConfigError line naming the file and the field, never a
traceback, a hang or a silently wrong result (issue 16); and a calibration is only applied to the
network it was fitted on."""

import json
import re
import subprocess
import sys
import time

import pytest

from spiderflow.cli import main
from spiderflow.costmodel import load_calibration
from spiderflow.costmodel.calibration import check_calibration_applies
from spiderflow.errors import ConfigError
from spiderflow.topology import load_topology

from .conftest import REPO

GOOD = """\
name: t
clusters:
  - {name: a, gpu: a100-80gb, nodes: 1, gpus_per_node: 8}
  - {name: b, gpu: a100-80gb, nodes: 1, gpus_per_node: 8}
links:
  - {a: a, b: b, bandwidth_gbps: 1.0, latency_ms: 10}
"""

LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n" for i in range(9))

# (file text, what the one error line must contain)
BAD_TOPOLOGIES = {
    "latin1-comment": (b"# caf\xe9\n" + GOOD.encode(), "line 1: byte 0xe9 at offset 5 is not UTF-8"),
    "list-as-gpu": (GOOD.replace("gpu: a100-80gb, nodes", "gpu: [a100-80gb], nodes", 1),
                    "clusters[0].gpu must be one of"),
    "mapping-as-link-end": (GOOD.replace("{a: a, b: b,", "{a: a, b: {x: 1},"), "links[0].b names no cluster"),
    "400-digit-nodes": (GOOD.replace("nodes: 1,", "nodes: 1" + "0" * 399 + ",", 1),
                        "clusters[0].nodes must be <= 1e+06 (got an integer of 400 digits)"),
    "huge-bandwidth": (GOOD.replace("bandwidth_gbps: 1.0", "bandwidth_gbps: 1.0e+400"),
                       "links[0].bandwidth_gbps must be <= 1e+06 (got inf)"),
    "tiny-bandwidth": (GOOD.replace("bandwidth_gbps: 1.0", "bandwidth_gbps: 1.0e-300"),
                       "links[0].bandwidth_gbps must be >= 1e-06"),
    "absurd-gpus-per-node": (GOOD.replace("gpus_per_node: 8", "gpus_per_node: 100000", 1),
                             "clusters[0].gpus_per_node must be <= 1024"),
    "deep-nesting": ("clusters: " + "[" * 100 + "]" * 100 + "\n", "nested deeper than 32 levels"),
    "billion-laughs": (LAUGHS, "expands to more than 1,000,000 values"),
    "duplicate-gpu": (GOOD.replace("gpu: a100-80gb, nodes", "gpu: a100-80gb, gpu: v100, nodes", 1),
                      "key 'gpu' appears twice in one mapping"),
    "name-escapes-dir": (GOOD.replace("name: t", "name: ../../x"), "name must be 1-64 characters"),
    "name-as-list": (GOOD.replace("name: t", "name: [t]"), "name must be a string (got ['t'])"),
    "routing-as-list": (GOOD + "routing: [shortest]\n", "routing must be one of shortest, widest"),
    "top-level-list": ("- 1\n- 2\n", "top level must be a mapping"),
    "links-as-zero": (GOOD.split("links:")[0] + "links: 0\n", "links must be a list of links (got 0)"),
}


def write(tmp_path, name, content):
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return path


@pytest.mark.parametrize("case", BAD_TOPOLOGIES)
def test_bad_topology_is_one_config_error_line(tmp_path, case):
    text, message = BAD_TOPOLOGIES[case]
    path = write(tmp_path, "bad.yaml", text)
    t0 = time.monotonic()
    with pytest.raises(ConfigError) as err:
        load_topology(path)
    assert time.monotonic() - t0 < 1.0  # the alias bomb is refused before it is expanded
    line = str(err.value)
    assert line.startswith(f"{path}: "), line
    assert message in line
    assert "\n" not in line and len(line) < 400


@pytest.mark.parametrize("case", ["latin1-comment", "list-as-gpu", "mapping-as-link-end", "400-digit-nodes",
                                  "deep-nesting", "billion-laughs", "duplicate-gpu", "name-escapes-dir"])
def test_plan_cli_bad_topology_exits_2_with_one_line(tmp_path, capsys, case):
    text, message = BAD_TOPOLOGIES[case]
    path = write(tmp_path, "bad.yaml", text)
    assert main(["plan", "--topology", str(path), "--model", "gpt3-125m", "--gpus", "8"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {path}: ") and message in err
    assert "Traceback" not in err


def test_plan_cli_bad_topology_subprocess_has_no_traceback(tmp_path):
    path = write(tmp_path, "bad.yaml", BAD_TOPOLOGIES["400-digit-nodes"][0])
    proc = subprocess.run([sys.executable, "-m", "spiderflow", "plan", "--topology", str(path), "--model",
                           "gpt3-125m", "--gpus", "8"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "clusters[0].nodes" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_topology_without_name_takes_a_safe_name_from_the_file(tmp_path):
    path = write(tmp_path, "my topo (v2).yaml", GOOD.replace("name: t\n", ""))
    assert load_topology(path).name == "my-topo--v2-"


def test_topology_sha256_is_of_the_network_not_the_bytes(tmp_path):
    base = load_topology(write(tmp_path, "a.yaml", GOOD))
    same = GOOD.replace("name: t", "# a comment\nname: other\nrouting: widest").replace(
        "{a: a, b: b, bandwidth_gbps: 1.0, latency_ms: 10}", "{latency_ms: 10.0, b: a, a: b, bandwidth_gbps: 1}")
    assert load_topology(write(tmp_path, "b.yaml", same)).sha256 == base.sha256
    changed = GOOD.replace("bandwidth_gbps: 1.0", "bandwidth_gbps: 2.0")
    assert load_topology(write(tmp_path, "c.yaml", changed)).sha256 != base.sha256
    assert re.fullmatch(r"[0-9a-f]{64}", base.sha256)


# ---- calibration ----------------------------------------------------------------------------------------

AB = {"alpha_s": 0.01, "beta_gbps": 1.0}


def cal_file(tmp_path, data, name="cal.json"):
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


@pytest.mark.parametrize("data, message", [
    ({"paths": [AB]}, "paths must be a JSON object keyed by name (got list)"),
    ({"intra": "a"}, "intra must be a JSON object keyed by name (got str)"),
    ({"gpu_efficiency": [0.5]}, "gpu_efficiency must be a JSON object"),
    ({"gpu_efficiency": {"a100-80gb": 1e-9}}, "gpu_efficiency.a100-80gb must be a number in [0.001, 1]"),
    ({"gpu_efficiency": {"a100-80gb": 0}}, "gpu_efficiency.a100-80gb must be a number in [0.001, 1]"),
    ({"paths": {"a->b": {"alpha_s": 1e9, "beta_gbps": 1.0}}},
     "paths.a->b.alpha_s must be a non-negative number in [0, 3600]"),
    ({"paths": {"a->b": {"alpha_s": 0.01, "beta_gbps": 1e9}}}, "paths.a->b.beta_gbps must be a number in [1e-06, "),
    ({"paths": {"a->b": {"alpha_s": 0.01, "beta_gbps": 1e-300}}}, "paths.a->b.beta_gbps must be a number in"),
    ('{"per_message_overhead_s": 1' + "0" * 400 + "}",
     "per_message_overhead_s must be a non-negative number in [0, 3600] (got 1000000000"),
    ('{"per_message_overhead_s": NaN}', "NaN is not a number JSON allows"),
    ('{"paths": {}, "paths": {}}', "key 'paths' appears twice"),
    ({"topology": "t"}, "topology must be an object with name and sha256"),
    ({"topology": {"name": "t", "sha256": "abc"}}, "topology.sha256 must be 64 lowercase hex digits"),
    ({"topology": {"name": ["t"]}}, "topology.name must be a string (got list)"),
    ({"notes": 3}, "notes must be a string (got int)"),
    ({"scale": -1}, "scale must be a positive number in (0, 1e+06]"),
])
def test_bad_calibration_is_one_config_error_line(tmp_path, data, message):
    path = cal_file(tmp_path, data)
    with pytest.raises(ConfigError) as err:
        load_calibration(path)
    line = str(err.value)
    assert line.startswith(f"{path}: ") and message in line, line
    assert "\n" not in line and len(line) < 400


def test_calibration_latin1_byte_is_one_line(tmp_path):
    path = tmp_path / "cal.json"
    path.write_bytes(b'{"notes": "caf\xe9"}')
    with pytest.raises(ConfigError, match=r"cal.json: line 1: byte 0xe9 at offset 14 is not UTF-8"):
        load_calibration(path)


@pytest.fixture
def topo(tmp_path):
    return load_topology(write(tmp_path, "t.yaml", GOOD))


@pytest.mark.parametrize("section, key", [("paths", "a->zz"), ("intra", "zz"), ("rings", "a+zz")])
def test_calibration_naming_an_unknown_cluster_is_refused_even_with_override(tmp_path, topo, section, key):
    cal = load_calibration(cal_file(tmp_path, {section: {key: AB}}))
    for allow in (False, True):
        with pytest.raises(ConfigError, match=rf"cal.json: {re.escape(section)}\.{re.escape(key)} names cluster "
                                              r"'zz', which .*t.yaml does not have \(clusters: a, b\)"):
            check_calibration_applies(cal, topo, allow_other_topology=allow)


def test_calibration_fitted_on_another_topology_needs_the_override(tmp_path, topo):
    other = load_topology(write(tmp_path, "o.yaml", GOOD.replace("name: t", "name: o").replace(
        "bandwidth_gbps: 1.0", "bandwidth_gbps: 5.0")))
    cal = load_calibration(cal_file(tmp_path, {"paths": {"a->b": AB},
                                               "topology": {"name": "o", "sha256": other.sha256}}))
    check_calibration_applies(cal, other)
    with pytest.raises(ConfigError, match=r"cal.json: fitted on topology 'o', sha256 [0-9a-f]{12}, not on "
                                          r".*t.yaml \('t'.*pass --calibration-any-topology"):
        check_calibration_applies(cal, topo)
    check_calibration_applies(cal, topo, allow_other_topology=True)


def test_calibration_with_same_network_under_another_name_applies(tmp_path, topo):
    cal = load_calibration(cal_file(tmp_path, {"topology": {"name": "renamed", "sha256": topo.sha256}}))
    check_calibration_applies(cal, topo)
    by_name = load_calibration(cal_file(tmp_path, {"topology": {"name": "renamed"}}, name="n.json"))
    with pytest.raises(ConfigError, match="fitted on topology 'renamed'"):
        check_calibration_applies(by_name, topo)


def test_older_calibration_without_topology_applies(tmp_path, topo):
    cal = load_calibration(cal_file(tmp_path, {"paths": {"b->a": AB}, "scale": 10, "dilation": 2}))
    assert cal.topology_sha256 is None and cal.topology_name is None
    check_calibration_applies(cal, topo)
    for name in ("default", "paper8"):  # the committed files: old format, still valid on their topology
        shipped = load_calibration(REPO / f"benchmarks/results/calibrate-{name}/calibration-{name}.json")
        check_calibration_applies(shipped, load_topology(REPO / f"topologies/{name}.yaml"))


def test_plan_cli_refuses_other_topology_calibration_unless_told(tmp_path, capsys, topo):
    path = cal_file(tmp_path, {"paths": {"a->b": AB}, "topology": {"name": "o", "sha256": "0" * 64}})
    argv = ["plan", "--topology", topo.source, "--model", "gpt3-125m", "--gpus", "8", "--calibration", str(path),
            "--time-limit", "5", "--json"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"error: {path}: fitted on topology 'o'" in err
    assert main([*argv, "--calibration-any-topology"]) == 0
    assert sum(json.loads(capsys.readouterr().out)["placement"].values()) == 8


def test_plan_cli_bad_calibration_exits_2_with_one_line(tmp_path, capsys, topo):
    path = cal_file(tmp_path, {"paths": [AB]})
    assert main(["plan", "--topology", topo.source, "--model", "gpt3-125m", "--gpus", "8",
                 "--calibration", str(path)]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {path}: paths must be a JSON object keyed by name (got list)\n"
