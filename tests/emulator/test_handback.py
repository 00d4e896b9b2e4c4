"""A sudo run's outputs go back to the user who ran sudo (emulator/handback.py): real chowns, as root.

(`emulator run`'s end-to-end test checks the same on a real run: tests/emulator/test_run_root.py.)"""

import os
from pathlib import Path

import pytest

from emulator import handback

USER = 65534  # nobody, standing in for the user who ran sudo


@pytest.fixture
def sudo(monkeypatch):
    monkeypatch.setenv("SUDO_UID", str(USER))
    monkeypatch.setenv("SUDO_GID", str(USER))
    yield
    handback.hand_back()  # forget what a failed test left remembered


def users_place(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    os.chown(home, USER, USER)
    return home


def owners(root: Path) -> dict[str, int]:
    found = {".": root.lstat().st_uid}
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(top, name)
            found[str(path.relative_to(root))] = path.lstat().st_uid
    return found


def fill(out: Path) -> None:
    """What a run writes: files, a directory of files, a link (to a file root keeps), and a file that
    another user put there."""
    (out / "config.json").write_text("{}\n")
    (out / "ranks").mkdir()
    (out / "ranks" / "j-r0.jsonl").write_text("{}\n")
    (out / "link").symlink_to("/etc/hostname")
    (out / "theirs.txt").write_text("x\n")
    os.chown(out / "theirs.txt", 1234, 1234)


@pytest.mark.root
def test_outputs_in_the_users_place_are_handed_back_the_rest_is_left(tmp_path, sudo):
    home = users_place(tmp_path)
    out = handback.make_output_dir(home / "runs" / "r1")
    fill(out)
    etc_owner = Path("/etc/hostname").stat().st_uid
    handback.hand_back()
    assert (home / "runs").stat().st_uid == USER and (home / "runs").stat().st_gid == USER
    assert owners(out) == {".": USER, "config.json": USER, "ranks": USER, "ranks/j-r0.jsonl": USER,
                           "link": 0, "theirs.txt": 1234}
    assert Path("/etc/hostname").stat().st_uid == etc_owner  # the link was not followed
    assert handback.hand_back() == []  # forgotten once handed back


@pytest.mark.root
def test_an_existing_output_directory_of_the_user_gets_back_what_root_wrote(tmp_path, sudo):
    out = users_place(tmp_path)
    handback.remember(out)  # emulator report RUN_DIR: it writes into a directory that exists
    (out / "fits.json").write_text("{}\n")
    handback.hand_back()
    assert owners(out) == {".": USER, "fits.json": USER}


@pytest.mark.root
def test_outputs_in_roots_place_or_without_sudo_stay_roots(tmp_path, sudo, monkeypatch):
    out = handback.make_output_dir(tmp_path / "rootplace" / "r1")  # tmp_path is root's
    (out / "config.json").write_text("{}\n")
    handback.hand_back()
    assert set(owners(tmp_path / "rootplace").values()) == {0}
    monkeypatch.delenv("SUDO_UID")  # root, but not through sudo
    out = handback.make_output_dir(users_place(tmp_path) / "r2")
    (out / "config.json").write_text("{}\n")
    assert handback.hand_back() == [] and set(owners(out).values()) == {0}
    monkeypatch.setenv("SUDO_UID", "0")  # sudo from root
    handback.remember(out)
    assert handback.hand_back() == []
