"""The emulation's agent on another server: its lock, its state file, its teardown.

The first server starts one agent per other server over SSH (in that server's root network
namespace) and keeps its stdin open for the emulation's lifetime:

    python -m emulator.net.agent hold --label gpu2 --run-id 1234-abcd [--state-dir D]

The agent takes the lock ``<state dir>/remote-<label>/emulator.lock`` (a second emulation using
this server as ``<label>`` is refused; the kernel releases an flock when its holder dies), removes
what an earlier, crashed one listed there, makes the run's scratch directory, writes
``emulation.json`` (run id ``<run id>@<label>``: every process started for the emulation on this
server carries ``SPIDERFLOW_EMULATION=<run id>@<label>``), prints ``ready <scratch dir>``, then
records what it is told, one JSON object a line on stdin, answering ``ok`` once it is written:

- ``{"shell": PID}``: a node's shell (its namespace dies with it);
- ``{"root_link": NAME}``: an interface about to be made in this server's root namespace
  (a tunnel's tap before it moves into its router; removed at teardown if still there).

On end of input -- the first server tore down, or it died and its SSH connection closed -- or on
SIGTERM/SIGHUP, it ends every process the state file lists or that carries the marker (their
namespaces, veths, bridges, qdiscs and iptables rules go with them), removes the listed root
links still present and the scratch directory, removes the state file, prints ``done N`` and
exits. If the agent itself was killed, ``python -m emulator clean`` on this server finishes the
job from the state file (it cleans every ``remote-*`` state directory whose lock is free).

``python -m emulator.net.agent exec`` runs a batch of configuration commands: stdin is a JSON list
of ``[label, pid, argv]``; each ``argv`` runs inside process ``pid``'s namespaces (``mnexec -a``),
in order; the first failure prints ``{"failed": i, "rc": N, "why": "..."}`` and exits 1.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from emulator.net.state import RUN_DIR_PREFIX, ProcRecord, StateStore, default_state_dir, proc_starttime, \
    remove_leftovers
from spiderflow.errors import EmulatorError

REMOTE_PREFIX = "remote-"


def label_of(server: str) -> str:
    """A server name as a file-name-safe label."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", server)


def remote_state_dir(label: str, base: Path | None = None) -> Path:
    return (base or default_state_dir()) / f"{REMOTE_PREFIX}{label_of(label)}"


def link_exists(name: str) -> bool:
    return subprocess.run(["ip", "link", "show", "dev", name], capture_output=True).returncode == 0


def finish(state: dict, store: StateStore, log) -> int:
    """End what ``state`` lists and carries its marker; remove its root links and the state file."""
    ended = remove_leftovers(state, log=log)
    for name in state.get("root_links", []):
        if link_exists(name):
            subprocess.run(["ip", "link", "del", "dev", name], capture_output=True)
            log(f"removed {name} from the root namespace")
    store.remove()
    return ended


def hold(label: str, run_id: str, state_dir: str | None) -> int:
    def log(msg: str) -> None:  # stderr may be a closed SSH channel by now: never fail on it
        try:
            print(f"[agent {label}] {msg}", file=sys.stderr, flush=True)
        except OSError:
            pass

    store = StateStore(remote_state_dir(label, Path(state_dir) if state_dir else None))
    try:
        store.acquire()
    except EmulatorError as exc:
        print(f"error: {label}: {exc}", flush=True)
        return 2
    stale = store.read()
    if stale:
        log(f"an earlier emulation ({stale.get('run_id')}) did not tear down here; removing what it listed")
        finish(stale, store, log)
    rid = f"{run_id}@{label_of(label)}"
    run_dir = tempfile.mkdtemp(prefix=f"{RUN_DIR_PREFIX}{rid}-")
    state = {"run_id": rid, "owner_pid": os.getpid(), "label": label, "files": [run_dir], "processes": [],
             "root_links": [], "netns": os.stat("/proc/self/ns/net").st_ino,
             "started": dt.datetime.now().isoformat(timespec="seconds")}
    store.write(state)
    stop = {"now": False}

    def on_signal(_signum, _frame):
        stop["now"] = True
        raise KeyboardInterrupt

    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, on_signal)
    records: list[ProcRecord] = []
    try:
        print(f"ready {run_dir}", flush=True)
        for line in sys.stdin:
            msg = json.loads(line)
            if "shell" in msg:
                pid = int(msg["shell"])
                records.append(ProcRecord(pid=pid, starttime=proc_starttime(pid) or 0, role="shell"))
                state["processes"] = [vars(r) for r in records]
            if "root_link" in msg:
                state["root_links"].append(str(msg["root_link"]))
            store.write(state)
            print("ok", flush=True)
    except (KeyboardInterrupt, BrokenPipeError, ValueError):
        pass
    finally:
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
        try:
            ended, status = finish(state, store, log), 0
        except EmulatorError as exc:  # the state file stays: `python -m emulator clean` here retries
            log(f"error: {exc}")
            ended, status = -1, 1
        store.release()
    try:
        print(f"done {ended}" if status == 0 else "failed", flush=True)
    except OSError:
        pass
    return status


def exec_batch(batch: list) -> int:
    for i, (label, pid, argv) in enumerate(batch):
        cmd = list(argv) if pid is None else ["mnexec", "-a", str(pid), *argv]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        except (subprocess.TimeoutExpired, FileNotFoundError) as exc:
            print(json.dumps({"failed": i, "rc": -1, "why": f"{label}: {exc}"}))
            return 1
        if done.returncode != 0:
            why = ((done.stderr or done.stdout).strip().splitlines() or ["no error output"])[-1]
            print(json.dumps({"failed": i, "rc": done.returncode, "why": why}))
            return 1
    print(json.dumps({"ok": len(batch)}))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m emulator.net.agent")
    sub = parser.add_subparsers(dest="action", required=True)
    h = sub.add_parser("hold")
    h.add_argument("--label", required=True)
    h.add_argument("--run-id", required=True)
    h.add_argument("--state-dir")
    sub.add_parser("exec")
    args = parser.parse_args(argv)
    if args.action == "hold":
        return hold(args.label, args.run_id, args.state_dir)
    return exec_batch(json.load(sys.stdin))


if __name__ == "__main__":
    sys.exit(main())
