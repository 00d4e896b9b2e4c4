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
