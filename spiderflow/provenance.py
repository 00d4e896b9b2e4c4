"""What produced a result: version, git commit, argv, Python, time. Every ``config.json`` carries it.

The commit is read from the checkout's ``.git`` directly (``HEAD``, then the
ref it names, loose or packed), so the planner library runs no subprocess;
``git_commit`` is None outside a checkout (an installed package) and
``git_dirty`` is not attempted: it would need ``git status``.
"""

from __future__ import annotations

import datetime as dt
import platform
import sys
from pathlib import Path

from spiderflow import __version__

REPO = Path(__file__).resolve().parent.parent


def git_commit(repo: Path = REPO) -> str | None:
    """The checked-out commit's id, or None when ``repo`` is not a git checkout (or is unreadable)."""
    git = repo / ".git"
    try:
        if git.is_file():  # a worktree: "gitdir: <path>"
            git = (repo / git.read_text().split(":", 1)[1].strip()).resolve()
        head = (git / "HEAD").read_text().strip()
        if not head.startswith("ref: "):
            return head or None  # detached
        ref = head[5:]
        loose = git / ref
        if loose.is_file():
            return loose.read_text().strip() or None
        common = git / "commondir"
        base = (git / common.read_text().strip()).resolve() if common.is_file() else git
        for where in (base / ref, base / "packed-refs"):
            if where.name == "packed-refs" and where.is_file():
                for line in where.read_text().splitlines():
                    if line.endswith(" " + ref):
                        return line.split(" ", 1)[0]
            elif where.is_file():
                return where.read_text().strip() or None
    except (OSError, IndexError, UnicodeDecodeError):
        return None
    return None


def provenance(argv: list[str] | None = None) -> dict:
    """The fields every run's ``config.json`` starts with."""
    return {"version": __version__, "git_commit": git_commit(), "argv": list(sys.argv if argv is None else argv),
            "python": platform.python_version(),
            "started": dt.datetime.now().isoformat(timespec="seconds")}
