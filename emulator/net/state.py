"""Lock, state file, and removal of exactly what an emulation made.

Everything an emulation makes lives inside network namespaces that exist only
while a process of ours is in them (Mininet's host shells, the delay daemons,
workers): the veths, the bridges, the addresses, routes, qdiscs and iptables
rules all vanish with the namespace when its last process exits. Nothing is
created in the root namespace. So "remove what we made" means "end every
process we started", and the state file lists them:

- each process as ``(pid, starttime, role)``: ``starttime`` (field 22 of
  ``/proc/PID/stat``) makes a recycled pid harmless;
- the run id, which every process we start carries in its environment as
  ``SPIDERFLOW_EMULATION=<run id>``, so children that a worker forked are
  found too (``/proc/PID/environ``);
- the inventory of what the namespaces held (informative, for ``clean``'s
  report), and the run's scratch directory.

The lock is an ``flock`` on ``emulator.lock`` next to the state file: the
kernel releases it when its holder dies, so a crash never leaves it stuck.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from spiderflow.errors import EmulatorError

MARKER_ENV = "SPIDERFLOW_EMULATION"
STATE_DIR_ENV = "SPIDERFLOW_STATE_DIR"
RUN_DIR_PREFIX = "spiderflow-emu-"


def default_state_dir() -> Path:
    if os.environ.get(STATE_DIR_ENV):
        return Path(os.environ[STATE_DIR_ENV])
    run = Path("/run")
    return run / "spiderflow" if run.is_dir() and os.access(run, os.W_OK) else Path("/tmp/spiderflow")


def how_it_ended(returncode: int) -> str:
    """A process's end in words, from ``Popen.returncode``: "was killed by signal SIGKILL", "exited with 3"."""
    if returncode < 0:
        try:
            return f"was killed by signal {signal.Signals(-returncode).name}"
        except ValueError:  # a real-time signal has no name
            return f"was killed by signal {-returncode}"
    return f"exited with {returncode}"


def proc_starttime(pid: int) -> int | None:
    """Start time of a live (non-zombie) process, None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def proc_has_marker(pid: int, run_id: str) -> bool:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return f"{MARKER_ENV}={run_id}".encode() in environ.split(b"\0")


def all_pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def marked_pids(run_id: str) -> list[int]:
    """Live processes that carry this run's marker (never this process)."""
    me = os.getpid()
    return [pid for pid in all_pids()
            if pid != me and proc_has_marker(pid, run_id) and proc_starttime(pid) is not None]


@dataclass(frozen=True, kw_only=True)
class ProcRecord:
    pid: int
    starttime: int
    role: str

    def alive(self) -> bool:
        return proc_starttime(self.pid) == self.starttime


_LISTS_OF_TEXT = ("files", "servers", "root_links")


def state_problem(state) -> str | None:
    """What makes ``state`` unusable by ``clean`` (the fields it acts on, of the wrong shape), or None:
    a state file edited by hand or by another version must not turn ``clean`` into a traceback."""
    if not isinstance(state, dict):
        return f"the top level is a {type(state).__name__}, not an object"
    if not isinstance(state.get("run_id"), (str, type(None))):
        return f"run_id is {state['run_id']!r}, not a string"
    processes = state.get("processes", [])
    if not isinstance(processes, list):
        return "processes is not a list"
    for i, p in enumerate(processes):
        if not (isinstance(p, dict) and set(p) == {"pid", "starttime", "role"} and isinstance(p["role"], str)
                and all(isinstance(p[k], int) and not isinstance(p[k], bool) for k in ("pid", "starttime"))
                and p["pid"] > 0 and p["starttime"] >= 0):
            return f"processes[{i}] is not {{pid > 0, starttime >= 0, role}}"
    for key in _LISTS_OF_TEXT:
        value = state.get(key, [])
        if not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            return f"{key} is not a list of strings"
    if not isinstance(state.get("ssh") or {}, dict):
        return "ssh is not an object"
    return None


class StateStore:
    """``emulation.json`` and ``emulator.lock`` in one directory."""

    def __init__(self, directory: Path | str | None = None) -> None:
        self.dir = Path(directory) if directory else default_state_dir()
        self.path = self.dir / "emulation.json"
        self.lock_path = self.dir / "emulator.lock"
        self._lock_fd: int | None = None

    def acquire(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o755)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise EmulatorError(self.busy_message()) from None
        self._lock_fd = fd

    def busy_message(self) -> str:
        state = self.read() or {}
        who = f"pid {state['owner_pid']}, topology {state.get('topology', '?')}, since " \
              f"{state.get('started', '?')}" if "owner_pid" in state else "see " + str(self.path)
        return (f"another emulation is running ({who}); wait for it to finish or stop it "
                "(Ctrl-C or kill PID), then retry")

    def refuse_if_busy(self) -> None:
        """Raise :meth:`acquire`'s error now if an emulation holds the lock, else leave it free.

        For a command that writes output and prints progress before it builds its
        network (``emulator run``): a refused second run says one line and
        touches nothing. The lock itself is still taken by the Emulation."""
        self.acquire()
        self.release()

    def release(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def read(self) -> dict | None:
        try:
            state = json.loads(self.path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise EmulatorError(f"{self.path}: unreadable state file ({exc}); "
                                "inspect it, then delete it by hand") from None
        if problem := state_problem(state):
            raise EmulatorError(f"{self.path}: unreadable state file ({problem}); "
                                "inspect it, then delete it by hand")
        return state

    def write(self, state: dict) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=1))
        os.replace(tmp, self.path)

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _wait_gone(pids: dict[int, int], timeout_s: float) -> dict[int, int]:
    """Poll until every ``pid -> starttime`` is gone; return the survivors."""
    deadline = time.monotonic() + timeout_s
    left = dict(pids)
    while left:
        left = {p: st for p, st in left.items() if proc_starttime(p) == st}
        if not left or time.monotonic() >= deadline:
            break
        time.sleep(0.02)
    return left


def end_processes(pids: dict[int, int], *, grace_s: float = 2.0,
                  kill_now: frozenset[int] | set[int] = frozenset()) -> dict[int, int]:
    """SIGTERM (SIGKILL for ``kill_now``), wait ``grace_s``, SIGKILL the rest.

    ``pids`` maps pid -> starttime; returns processes still alive after all that.
    """
    for pid, start in pids.items():
        if proc_starttime(pid) == start:
            _signal(pid, signal.SIGKILL if pid in kill_now else signal.SIGTERM)
    left = _wait_gone(pids, grace_s)
    for pid in left:
        _signal(pid, signal.SIGKILL)
    return _wait_gone(left, 3.0)


def run_dirs(state: dict) -> list[Path]:
    """The run's scratch directories: those the state file lists, and any named after its run id
    (made in the moment before the state file could list it)."""
    dirs = {Path(p) for p in state.get("files", []) if Path(p).name.startswith(RUN_DIR_PREFIX)}
    if state.get("run_id"):
        dirs.update(Path(tempfile.gettempdir()).glob(f"{RUN_DIR_PREFIX}{state['run_id']}-*"))
    return sorted(dirs)


LATE_LOOKS = 3  # how many times remove_leftovers looks again for marked processes once it ended those it knew


def _marked_besides(run_id: str, known: dict[int, int]) -> dict[int, int]:
    """Live processes carrying ``run_id``'s marker that ``known`` (pid -> starttime) does not hold."""
    found = {}
    for pid in marked_pids(run_id):
        start = proc_starttime(pid)
        if start is not None and known.get(pid) != start:
            found[pid] = start
    return found


def remove_leftovers(state: dict, *, log: Callable[[str], None] = lambda _m: None,
                     grace_s: float = 2.0) -> int:
    """End every process the state file names or that carries its marker; remove its files.
    Once those are ended it looks again (up to ``LATE_LOOKS`` times) for marked processes it did not
    know: children forked while their parent was being ended (a rank pool starting a rank as the
    end came), or one that the first look missed.

    Returns how many processes were ended; raises EmulatorError if any survive.
    """
    records = [ProcRecord(**p) for p in state.get("processes", [])]
    targets = {r.pid: r.starttime for r in records if r.alive()}
    shells = {r.pid for r in records if r.role == "shell"}
    run_id = state.get("run_id")
    if run_id:
        targets.update(_marked_besides(run_id, targets))
    targets.pop(os.getpid(), None)
    workers = {p: s for p, s in targets.items() if p not in shells}
    left = end_processes(workers, grace_s=grace_s)
    left.update(end_processes({p: s for p, s in targets.items() if p in shells},
                              grace_s=grace_s, kill_now=shells))
    for _ in range(LATE_LOOKS if run_id else 0):
        late = _marked_besides(run_id, targets)
        if not late:
            break
        targets.update(late)
        left.update(end_processes(late, grace_s=grace_s))
    for path in run_dirs(state):
        shutil.rmtree(path, ignore_errors=True)
    if left:
        raise EmulatorError(f"could not end processes {sorted(left)}; they hold the emulated "
                            "network's namespaces: kill them by pid, then run python -m emulator clean")
    if targets:
        log(f"ended {len(targets)} processes of emulation {run_id} "
            f"({sum(p in shells for p in targets)} host shells); their namespaces are gone")
    return len(targets)
