"""`wan generate`: reproducible by seed, its output loads, the diurnal pattern and outages as documented."""

import math
import subprocess
import sys
from pathlib import Path

from spiderflow.topology import load_topology
from spiderflow.wan import load_wan_events
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
