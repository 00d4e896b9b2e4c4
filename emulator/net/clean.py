"""``python -m emulator clean``: remove what a crashed emulation left.

Reads the state file (see :mod:`emulator.net.state`) and ends exactly the
processes it lists or that carry its run's marker; their namespaces, veths,
bridges and iptables rules go with them. Refuses while an emulation is
running (its lock is held): stop that one instead.
"""

from __future__ import annotations

import argparse
import sys

from emulator.net.capability import require_root
from emulator.net.state import StateStore, remove_leftovers

HELP = "remove what a crashed emulation left (namespaces, links, daemons), using its state file"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--state-dir", help="where the state file is (default /run/spiderflow)")


def main(args: argparse.Namespace) -> int:
    require_root()
    store = StateStore(args.state_dir)
    store.acquire()
    try:
        state = store.read()
        if state is None:
            print(f"nothing to clean (no state file at {store.path})")
            return 0
        log = lambda msg: print(msg, file=sys.stderr)  # noqa: E731
        ended = remove_leftovers(state, log=log)
        store.remove()
        print(f"cleaned emulation {state.get('run_id')} (pid {state.get('owner_pid')}, "
              f"topology {state.get('topology')}): {ended} processes ended, state file removed")
        return 0
    finally:
        store.release()
