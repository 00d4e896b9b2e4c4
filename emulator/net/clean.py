"""``python -m emulator clean``: remove what a crashed emulation left.

Reads the state file (see :mod:`emulator.net.state`) and ends exactly the
processes it lists or that carry its run's marker; their namespaces, veths,
bridges and iptables rules go with them. Refuses while an emulation is
running (its lock is held): stop that one instead.

An emulation over several servers (``--servers``, :mod:`emulator.net.multihost`) also left:

- on this machine, the taps of its SSH tunnels if one never left the root namespace (listed
  as ``root_links``);
- on each other server, what its agent (:mod:`emulator.net.agent`) did not remove: the agent
  removes it when our SSH connection closes, so this is only for an agent that was killed too.
  ``clean`` runs ``python -m emulator clean --remote-parts`` there over SSH (the state file names
  the servers and the SSH options), and every ``clean`` also finishes each ``remote-*`` state
  directory of its own machine whose lock is free (its agent is gone).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from emulator.net.agent import REMOTE_PREFIX, finish
from emulator.net.capability import require_root
from emulator.net.state import StateStore, remove_leftovers
from spiderflow.cliutil import output_dir
from spiderflow.errors import EmulatorError

HELP = "remove what a crashed emulation left (namespaces, links, daemons), using its state file"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--state-dir", type=output_dir, help="where the state file is (default /run/spiderflow)")
    parser.add_argument("--remote-parts", action="store_true",
                        help="only the parts that emulations run from other servers left here (remote-*)")


def main(args: argparse.Namespace) -> int:
    require_root()
    store = StateStore(args.state_dir)
    log = lambda msg: print(msg, file=sys.stderr)  # noqa: E731
    if args.remote_parts:
        if not clean_remote_parts(store.dir, log):
            print("nothing to clean here")
        return 0
    store.acquire()
    servers, ssh = [], {}
    try:
        state = store.read()
        if state is None:
            print(f"nothing to clean (no state file at {store.path})")
        else:
            ended = remove_leftovers(state, log=log)
            for tap in state.get("root_links", []):
                if subprocess.run(["ip", "link", "show", "dev", tap], capture_output=True).returncode == 0:
                    subprocess.run(["ip", "link", "del", "dev", tap], capture_output=True)
                    log(f"removed {tap} from the root namespace")
            servers, ssh = state.get("servers", [])[1:], state.get("ssh") or {}
            store.remove()
            print(f"cleaned emulation {state.get('run_id')} (pid {state.get('owner_pid')}, "
                  f"topology {state.get('topology')}): {ended} processes ended, state file removed")
    finally:
        store.release()
    for server in servers:
        clean_remote(server, ssh, log)
    clean_remote_parts(store.dir, log)
    return 0


def clean_remote(server: str, ssh: dict, log) -> None:
    """``python -m emulator clean`` on ``server`` (its agent's leftovers), reporting its answer."""
    from emulator.net.servers import REPO, Ssh, run_ssh

    try:
        done = run_ssh(Ssh(config=ssh.get("config"), key=ssh.get("key")), server,
                       [sys.executable, "-m", "emulator", "clean", "--remote-parts", *state_dir_args()],
                       cwd=str(REPO), check=False, timeout_s=120.0)
    except EmulatorError as exc:
        log(f"{server}: not cleaned ({exc}); run `python -m emulator clean` there")
        return
    for line in (done.stdout + done.stderr).strip().splitlines():
        log(f"{server}: {line}")


def state_dir_args() -> list[str]:
    """A private state directory (tests) is used on every server, as the agents use it."""
    from emulator.net.state import STATE_DIR_ENV

    return ["--state-dir", os.environ[STATE_DIR_ENV]] if os.environ.get(STATE_DIR_ENV) else []


def clean_remote_parts(state_dir: Path, log) -> int:
    """Finish the ``remote-*`` state directories here whose agent is gone (their lock is free)."""
    cleaned = 0
    netns = os.stat("/proc/self/ns/net").st_ino
    for d in sorted(Path(state_dir).glob(f"{REMOTE_PREFIX}*")):
        store = StateStore(d)
        if not store.path.exists():
            continue
        try:
            store.acquire()
        except EmulatorError:
            state = store.read() or {}
            log(f"{d.name}: its agent (pid {state.get('owner_pid')}) is still running; it removes its part "
                "when the first server's connection closes")
            continue
        try:
            state = store.read()
            if state is None:
                continue
            if state.get("netns") not in (None, netns):
                state = dict(state, root_links=[])  # made in another network namespace: not ours to delete
            ended = finish(state, store, log)
            cleaned += 1
            print(f"cleaned the part of emulation {state.get('run_id')} on this server: {ended} processes ended")
        finally:
            store.release()
    return cleaned
