"""Tiny ``main(args)`` entry points for children of the rank pool (tests/emulator/test_rank_pool.py).

``raise``: fails with a RuntimeError; ``sleep S``: sleeps S seconds; ``exit N``: returns N;
``report PATH``: writes what the child sees (namespaces, session, nice, cwd, environment, command
line, whether torch and spiderflow.errors -- which the pool server imports -- are imported) to PATH
as JSON; ``lines PATH N GATE``: appends N JSON lines to PATH, then waits for the file GATE and
appends N more (a rank writing while it runs). Also runs as ``python -m`` (a cold pool's children).
"""

import json
import os
import sys
import time
from pathlib import Path


def main(args: list[str]) -> int:
    what, *rest = args
    if what == "raise":
        raise RuntimeError("boom from a pooled child")
    if what == "sleep":
        time.sleep(float(rest[0]))
        return 0
    if what == "exit":
        return int(rest[0])
    if what == "report":
        Path(rest[0]).write_text(json.dumps({
            "ns": {ns: os.readlink(f"/proc/self/ns/{ns}") for ns in ("net", "mnt")},
            "pid": os.getpid(), "sid": os.getsid(0), "pgid": os.getpgid(0),
            "nice": os.getpriority(os.PRIO_PROCESS, 0), "cwd": os.getcwd(), "env": dict(os.environ),
            "cmdline": Path("/proc/self/cmdline").read_text().split("\0")[:-1], 
            "imported": {m: m in sys.modules for m in ("torch", "spiderflow.errors")}}))
        print("reported", flush=True)
        return 0
    if what == "lines":
        path, n, gate = rest[0], int(rest[1]), Path(rest[2])
        for k in range(2 * n):
            if k == n:
                while not gate.exists():
                    time.sleep(0.01)
            with open(path, "a") as fh:
                fh.write(json.dumps({"line": k}) + "\n")
        return 0
    raise SystemExit(f"unknown target {what!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
