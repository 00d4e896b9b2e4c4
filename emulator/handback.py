"""A sudo run's outputs handed back to the user who ran sudo.

``sudo python -m emulator run|compare|calibrate|report`` runs as root, so all it writes would be
root's: the user could not then write ``emulator report`` into the run directory, add to it,
move or delete it without sudo again. So when the command was started through sudo
(``SUDO_UID`` / ``SUDO_GID`` name a user other than root) and its output directory lies in a
directory that user owns, then once the command ends (done, failed or interrupted) the
directories it made on the way and every entry root owns under the output directory become
that user's (group: ``SUDO_GID``). An output directory in a place root or another user owns is
left as it is, and so is whatever it holds that another user owns. Symbolic links are neither
followed nor changed; the state under /run/spiderflow stays root's.

Commands make their output directory with :func:`make_output_dir` (or name an existing one with
:func:`remember`); ``emulator.console`` calls :func:`hand_back` when the command returns.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from spiderflow import cliutil


@dataclass(frozen=True)
class _Output:
    path: Path
    made: tuple[Path, ...]  # the directories that did not exist before, deepest first
    anchor_uid: int  # owner of the deepest directory that did


_remembered: list[_Output] = []


def sudo_user() -> tuple[int, int] | None:
    """(uid, gid) of the user who ran sudo, when this process is root through sudo; else None."""
    if os.geteuid() != 0:
        return None
    try:
        uid, gid = int(os.environ["SUDO_UID"]), int(os.environ["SUDO_GID"])
    except (KeyError, ValueError):
        return None
    return (uid, gid) if uid > 0 and gid >= 0 else None


def remember(path: str | Path) -> None:
    """Note ``path``, an output directory about to be made or written into, for :func:`hand_back`."""
    path = Path(path)
    made, anchor = [], path
    for d in (path, *path.parents):
        anchor = d
        if d.exists():
            break
        made.append(d)
    try:
        anchor_uid = anchor.stat().st_uid
    except OSError:
        return  # nothing this could hand back
    _remembered.append(_Output(path=path, made=tuple(made), anchor_uid=anchor_uid))


def make_output_dir(path: str | Path, flag: str = "--out") -> Path:
    """:func:`spiderflow.cliutil.make_output_dir`, the directory remembered for :func:`hand_back`."""
    remember(path)
    return cliutil.make_output_dir(path, flag)


def hand_back() -> list[Path]:
    """Hand back what the remembered output directories hold (module docstring) and forget them;
    the paths whose owner changed. Never raises: a path that vanished or refuses is left as it is."""
    outputs, _remembered[:] = list(_remembered), []
    user = sudo_user()
    if user is None:
        return []
    changed: list[Path] = []
    for out in outputs:
        if out.anchor_uid != user[0]:
            continue  # not the user's place: leave it root's
        for d in out.made:
            _chown(d, user, changed)
        for top, dirs, files in os.walk(out.path):  # does not descend into linked directories
            for name in dirs + files:
                _chown(Path(top, name), user, changed)
    return changed


def _chown(path: Path, user: tuple[int, int], changed: list[Path]) -> None:
    """``path`` to ``user`` when root owns it and it is not a symbolic link."""
    try:
        st = path.lstat()
        if st.st_uid != 0 or path.is_symlink():
            return
        os.lchown(path, *user)
    except OSError:
        return
    changed.append(path)
