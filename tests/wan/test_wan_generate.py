"""`wan generate`: reproducible by seed, its output loads, the diurnal pattern and outages as documented."""

import math
import subprocess
import sys
from pathlib import Path

import pytest

from spiderflow.topology import load_topology
from spiderflow.wan import load_wan_events
from spiderflow.wan import generate
from spiderflow.wan.generate import WanPattern, fraction, generate_wan_events, link_offset_h

REPO = Path(__file__).resolve().parents[2]
PAPER8 = load_topology(REPO / "topologies" / "paper8.yaml")


GENERATE = ("generate", "--topology", "paper8", "--hours", "6", "--outages", "2")


def test_same_seed_same_file_and_it_loads(seeded):
    a, info = seeded(*GENERATE)
    assert a.read_text().startswith("# python -m spiderflow wan generate --topology paper8 --seed 3 --hours 6")
    events = load_wan_events(a, PAPER8)
    assert len(events) == info["rows"] and info["down_rows"] == sum(not e.up for e in events) > 0
    assert [e.time_s for e in events] == sorted(e.time_s for e in events)


def test_outage_link_is_the_one_named(wan_file):
    out, _ = wan_file(*GENERATE, "--outage-link", "virginia-ohio", "--outage-s", "600", name="o.csv")
    down = {(e.a, e.b) for e in load_wan_events(out, PAPER8) if not e.up}
    assert down == {("ohio", "virginia")}


def test_bad_outage_link_is_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "spiderflow", "wan", "generate", "--topology", "paper8",
                           "--outage-link", "oregon-paris", "--outages", "1", "--out", str(tmp_path / "x.csv")],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("error: --outage-link is not a link of paper8 (got 'oregon-paris')")


@pytest.mark.parametrize("step_s", ["1e-300", "5e-324", "0.1"])
def test_a_step_too_small_for_the_horizon_is_one_line_at_once(tmp_path, step_s):
    """6 h at 1e-300 s steps listed 2e304 steps and never ended (fuzz seed 63); 0.1 s would be 1.9 million
    rows on paper8's 9 links, over MAX_GENERATED_ROWS; the denormal step's step count is infinite."""
    proc = subprocess.run([sys.executable, "-m", "spiderflow", "wan", "generate", "--topology", "paper8",
                           "--hours", "6", "--step-s", step_s, "--out", str(tmp_path / "x.csv")],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr[-2000:]
    assert proc.stderr.startswith(f"error: wan generate: a row every {float(step_s):g} s for 6 h on 9 links is "
                                  "over 1,000,000 rows; raise --step-s or shorten --hours")
    assert not (tmp_path / "x.csv").exists()


def test_the_largest_generated_file_is_written(monkeypatch):
    """Steps that make just MAX_GENERATED_ROWS rows pass (here 10 steps on 4 links, the cap set to 40);
    one row more is refused."""
    one = load_topology(REPO / "topologies" / "default.yaml")
    pattern = WanPattern(hours=1, step_s=360)
    monkeypatch.setattr(generate, "MAX_GENERATED_ROWS", 40)
    assert len(generate_wan_events(one, 0, pattern)) == 40
    monkeypatch.setattr(generate, "MAX_GENERATED_ROWS", 39)
    with pytest.raises(ValueError, match="1 h on 4 links is over 39 rows; raise --step-s or shorten --hours"):
        generate_wan_events(one, 0, pattern)


def test_diurnal_fraction_by_hand():
    """f = 1 - A (1 + cos(2 pi (h - 20) / 24)) / 2: 1 at 08:00 local, 1 - A at 20:00 local."""
    p = WanPattern(diurnal_amplitude=0.3)
    assert math.isclose(fraction(8 * 3600, 0.0, p), 1.0)
    assert math.isclose(fraction(20 * 3600, 0.0, p), 0.7)
    assert math.isclose(fraction(14 * 3600, 0.0, p), 0.85)
    # tokyo (+9) - seoul (+9): local time is UTC + 9; oregon (-8) - tokyo (+9) the short way: +12.5 -> -11.5
    import random
    assert link_offset_h("tokyo", "seoul", random.Random(0)) == 9.0
    assert link_offset_h("oregon", "tokyo", random.Random(0)) == -11.5


def test_bandwidth_never_exceeds_the_topology():
    events = generate_wan_events(PAPER8, 0, WanPattern(hours=24, diurnal_amplitude=0.5))
    nominal = {l.key: l.bandwidth_gbps for l in PAPER8.links}
    assert all(0.5 * nominal[e.key] - 1e-9 <= e.bandwidth_gbps <= nominal[e.key] + 1e-9 for e in events)
    assert len(events) == 9 * 96
