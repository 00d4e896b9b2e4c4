"""The topologies and traces shipped with the package, found by name or by path from anywhere.

``spiderflow/data/topologies/*.yaml`` and ``spiderflow/data/traces/*.csv``
are package data (a checkout also links them as ``topologies/`` and
``traces/`` at its root). :func:`find` turns what a user typed into a file:

1. an existing path, as given;
2. a shipped name: ``paper8`` -> ``.../topologies/paper8.yaml``;
3. a path written relative to a checkout's root (``topologies/paper8.yaml``)
   run from another directory or an installed package: the shipped file of
   that name.

Anything else comes back unchanged, so the loader reports the missing file
(and :func:`names` lets it list what is shipped).
"""

from __future__ import annotations

from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
KINDS = {"topology": ("topologies", ".yaml"), "trace": ("traces", ".csv")}


def names(kind: str) -> list[str]:
    """Shipped names of ``kind`` ("topology" or "trace"), sorted."""
    folder, suffix = KINDS[kind]
    return sorted(p.stem for p in (DATA / folder).glob(f"*{suffix}"))


def exists(path: str | Path) -> bool:
    """``Path.exists`` that says False where the OS refuses the name (too long, ...) instead of raising;
    the loader that reads it then names the problem in one line."""
    try:
        return Path(path).exists()
    except (OSError, ValueError):
        return False


def find(text: str | Path, kind: str) -> str | Path:
    """What ``text`` names (see the module docstring); ``text`` itself when it names nothing shipped."""
    path = Path(text)
    if exists(path) or path.is_absolute():
        return text
    folder, suffix = KINDS[kind]
    if len(path.parts) == 1 and not path.suffix and exists(DATA / folder / f"{path.name}{suffix}"):
        return str(DATA / folder / f"{path.name}{suffix}")
    if len(path.parts) == 2 and path.parts[0] == folder and exists(DATA / folder / path.name):
        return str(DATA / folder / path.name)
    return text
