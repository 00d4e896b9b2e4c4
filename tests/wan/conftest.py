import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def wan_file(tmp_path):
    """``wan_file(*argv, name=N)`` runs ``python -m spiderflow wan *argv --out TMP/N --json``, which must
    succeed, and returns the file it wrote and its JSON line (the generators' tests)."""

    def run(*argv: str, name: str) -> tuple[Path, dict]:
        out = tmp_path / name
        proc = subprocess.run([sys.executable, "-m", "spiderflow", "wan", *argv, "--out", str(out), "--json"],
                              cwd=REPO, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        return out, json.loads(proc.stdout)

    return run


@pytest.fixture
def seeded(wan_file):
    """``seeded(*argv)`` runs the generator ``argv`` (through :func:`wan_file`) at ``--seed 3`` twice and at
    ``--seed 4``: the two of seed 3 must have the same rows and that of seed 4 others. Returns the first
    file and its JSON line."""

    def run(*argv: str) -> tuple[Path, dict]:
        a, info = wan_file(*argv, "--seed", "3", name="a.csv")
        b, _ = wan_file(*argv, "--seed", "3", name="b.csv")
        c, _ = wan_file(*argv, "--seed", "4", name="c.csv")
        body = lambda p: [ln for ln in p.read_text().splitlines() if not ln.startswith("#")]  # noqa: E731
        assert body(a) == body(b) and body(a) != body(c)
        return a, info

    return run
