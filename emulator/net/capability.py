"""What this machine can do: root, the tools, and which delay mechanism.

The netem probe adds a netem qdisc to a veth inside a scratch network
namespace (``unshare --net``), so it touches nothing of the machine's.
"""

from __future__ import annotations

import os
import shutil
import subprocess

from emulator.net.linkcmds import netem_probe_commands
from spiderflow.errors import EmulatorError
from emulator.net.executor import Executor

TOOLS = ("mnexec", "ip", "tc", "iptables", "sysctl", "unshare", "iperf3")
NOT_ROOT = "run with sudo: the emulator needs root (network namespaces, tc, iptables)"


def require_root() -> None:
    if os.geteuid() != 0:
        raise EmulatorError(NOT_ROOT)


def require_tools(tools: tuple[str, ...] = TOOLS) -> None:
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        raise EmulatorError(f"missing tools: {', '.join(missing)}; install them with sudo scripts/setup.sh")


def kernel_has_netem(executor: Executor | None = None) -> bool:
    """True if ``tc qdisc add ... netem`` works (tried in a throw-away namespace)."""
    executor = executor or Executor()
    scratch = subprocess.Popen(["unshare", "--net", "--", "sleep", "30"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for_own_netns(scratch.pid)
        add_veth, add_netem = netem_probe_commands()
        executor.run("netem probe", scratch.pid, add_veth)
        return executor.run("netem probe", scratch.pid, add_netem, check=False).returncode == 0
    finally:
        scratch.kill()
        scratch.wait()


def _wait_for_own_netns(pid: int, tries: int = 200) -> None:
    """``unshare`` has entered its namespace once its netns differs from ours."""
    import time

    mine = os.stat("/proc/self/ns/net").st_ino
    for _ in range(tries):
        try:
            if os.stat(f"/proc/{pid}/ns/net").st_ino != mine:
                return
        except FileNotFoundError:
            break
        time.sleep(0.005)
    raise EmulatorError("netem probe: `unshare --net` did not start a namespace")


def choose_mechanism(requested: str, has_netem: bool) -> str:
    """``netem`` or ``nfqueue`` for ``requested`` in auto | netem | nfqueue."""
    if requested == "auto":
        return "netem" if has_netem else "nfqueue"
    if requested == "netem" and not has_netem:
        raise EmulatorError("delay=netem, but this kernel has no sch_netem; "
                            "use --delay nfqueue (or auto)")
    return requested
