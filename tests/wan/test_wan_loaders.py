"""WAN and capacity events files: good files load; each bad input is one line naming the file, the
row (its line number), the field, the value and the fix; the CLI exits non-zero without a traceback."""

import subprocess
import sys
from pathlib import Path

import pytest

from spiderflow.errors import ConfigError
from spiderflow.topology import load_topology
from spiderflow.wan import CapacityEvent, WanEvent, load_capacity_events, load_wan_events

REPO = Path(__file__).resolve().parents[2]
PAPER8 = load_topology(REPO / "topologies" / "paper8.yaml")
WAN_HEADER = "time_s,link,bandwidth_gbps,latency_ms,up"
CAP_HEADER = "time_s,cluster,gpus,notice_s,return_s"


def write(tmp_path, text, name="events.csv"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_good_wan_file_loads_in_the_topology_orientation(tmp_path):
    path = write(tmp_path, f"# a comment\n{WAN_HEADER}\n0,oregon-virginia,0.4,,1\n\n"
                           "10,virginia-oregon,,50,0\n10,tokyo-seoul,1.5,17,1\n")
    events = load_wan_events(path, PAPER8)
    assert events == (
        WanEvent(time_s=0.0, a="oregon", b="virginia", bandwidth_gbps=0.4, latency_ms=None, up=True),
        WanEvent(time_s=10.0, a="oregon", b="virginia", bandwidth_gbps=None, latency_ms=50.0, up=False),
        WanEvent(time_s=10.0, a="tokyo", b="seoul", bandwidth_gbps=1.5, latency_ms=17.0, up=True))


def test_good_capacity_file_loads(tmp_path):
    path = write(tmp_path, f"{CAP_HEADER}\n100,tokyo,16,60,200\n300,seoul,8,0,\n")
    assert load_capacity_events(path, PAPER8) == (
        CapacityEvent(time_s=100.0, cluster="tokyo", gpus=16, notice_s=60.0, return_s=200.0),
        CapacityEvent(time_s=300.0, cluster="seoul", gpus=8, notice_s=0.0, return_s=None))


WAN_BAD = [
    ("0,oregon-london,1,,1", "link", "is not a link of paper8"),
    ("0,oregon-mars,1,,1", "link", "names no cluster of paper8"),
    ("0,oregon,1,,1", "link", "two cluster names joined by '-'"),
    ("0,oregon-virginia-ohio,1,,1", "link", "two cluster names"),
    ("x,oregon-virginia,1,,1", "time_s", "must be a number >= 0 (got 'x')"),
    ("-5,oregon-virginia,1,,1", "time_s", "must be a number >= 0"),
    ("0,oregon-virginia,0,,1", "bandwidth_gbps", "must be a number >= 1e-06 or empty (unchanged) (got '0')"),
    ("0,oregon-virginia,-1,,1", "bandwidth_gbps", "must be a number >= 1e-06"),
    # a topology file's least (1 kbit/s): 1e-300 Gbit/s ran a trace to an avg JCT of 1.2e301 s
    ("0,oregon-virginia,1e-300,,1", "bandwidth_gbps", "must be a number >= 1e-06 or empty (unchanged) (got '1e-300')"),
    ("0,oregon-virginia,nan,,1", "bandwidth_gbps", "(got 'nan')"),
    ("0,oregon-virginia,inf,,1", "bandwidth_gbps", "(got 'inf')"),
    ("0,oregon-virginia,1e9,,1", "bandwidth_gbps", "must be at most"),
    ("0,oregon-virginia,1,fast,1", "latency_ms", "(got 'fast')"),
    ("0,oregon-virginia,1,,2", "up", "must be 1 (up) or 0 (down) (got '2')"),
    ("0,oregon-virginia,1,,", "up", "must be 1 (up) or 0 (down) (got '')"),
    ("0,oregon-virginia,1,1", "row", "has 4 fields but the header has 5"),
]


@pytest.mark.parametrize("row, field, message", WAN_BAD)
def test_bad_wan_row_is_one_line(tmp_path, row, field, message):
    path = write(tmp_path, f"{WAN_HEADER}\n0,tokyo-seoul,1,,1\n{row}\n")
    with pytest.raises(ConfigError) as exc:
        load_wan_events(path, PAPER8)
    text = str(exc.value)
    assert "\n" not in text
    assert text.startswith(f"{path}: row 3: {field} "), text
    assert message in text


CAP_BAD = [
    ("100,mars,8,0,", "cluster", "names no cluster of paper8"),
    ("100,seoul,9,0,", "gpus", "must be at most 8"),
    ("100,seoul,0,0,", "gpus", "must be a positive integer (got '0')"),
    ("100,seoul,2.5,0,", "gpus", "(got '2.5')"),
    ("100,seoul,8,200,", "notice_s", "must be at most time_s=100"),
    ("100,seoul,8,-1,", "notice_s", "must be a number >= 0"),
    ("100,seoul,8,0,50", "return_s", "must be after time_s=100"),
    ("100,seoul,8,0,inf", "return_s", "(got 'inf')"),
    ("5,seoul,8,0,", "time_s", "must not go back in time: row 2 is at 10 s"),
]


@pytest.mark.parametrize("row, field, message", CAP_BAD)
def test_bad_capacity_row_is_one_line(tmp_path, row, field, message):
    path = write(tmp_path, f"{CAP_HEADER}\n10,tokyo,8,0,\n{row}\n")
    with pytest.raises(ConfigError) as exc:
        load_capacity_events(path, PAPER8)
    text = str(exc.value)
    assert "\n" not in text and text.startswith(f"{path}: row 3: {field} "), text
    assert message in text


@pytest.mark.parametrize("text, message", [
    ("", "is empty; a WAN events file needs the header time_s,link,bandwidth_gbps,latency_ms,up"),
    ("# only a comment\n\n", "is empty"),
    (f"{WAN_HEADER}\n", "has a header but no rows"),
    ("time_s,link,bandwidth_gbps,up\n0,tokyo-seoul,1,1\n", "header lacks column(s) latency_ms"),
    (f"{WAN_HEADER},extra\n0,tokyo-seoul,1,,1,2\n", "header column 'extra' is not known"),
    (f"{WAN_HEADER}\n10,tokyo-seoul,1,,1\n5,tokyo-seoul,1,,1\n", "row 3: time_s must not go back in time"),
])
def test_bad_wan_file(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as exc:
        load_wan_events(path, PAPER8)
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_missing_file_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match="cannot read WAN events file"):
        load_wan_events(tmp_path / "none.csv", PAPER8)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "spiderflow", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120)


def test_cli_bad_events_exit_nonzero_without_traceback(tmp_path):
    bad = write(tmp_path, f"{WAN_HEADER}\n0,oregon-london,1,,1\n")
    for args in (["simulate", "--topology", "paper8", "--trace", "paper8-emu", "--wan-events", str(bad)],
                 ["wan", "check", str(bad), "--topology", "paper8"]):
        proc = _cli(*args)
        assert proc.returncode == 2
        assert "Traceback" not in proc.stderr
        assert proc.stderr.strip() == f"error: {bad}: row 2: link is not a link of paper8 (got 'oregon-london'); " \
                                      "its links: oregon-virginia, oregon-ohio, ohio-virginia, virginia-london, " \
                                      "virginia-ireland, london-ireland, london-paris, oregon-tokyo, tokyo-seoul"
