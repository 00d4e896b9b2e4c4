"""Run configuration commands inside nodes, checking every exit code.

The one place that executes :mod:`emulator.net.linkcmds` output. Commands are
argument lists, entered into a node's namespaces with Mininet's ``mnexec -a
PID`` (no shell anywhere); a non-zero exit raises :class:`EmulatorError`
naming the node, the command and the tool's last line of error output.
"""

from __future__ import annotations

import itertools
import shlex
import subprocess
from collections.abc import Callable, Iterable

from spiderflow.errors import EmulatorError

DEFAULT_TIMEOUT_S = 30.0
BATCH_TOOLS = ("tc", "ip")  # both read commands from stdin with -batch -


def in_namespace(pid: int | None, argv: list[str]) -> list[str]:
    """``argv`` run inside the namespaces of process ``pid`` (the root namespace if None)."""
    return list(argv) if pid is None else ["mnexec", "-a", str(pid), *argv]


class Executor:
    def __init__(self, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                 trace: Callable[[str], None] | None = None) -> None:
        self.timeout_s = timeout_s
        self.trace = trace
        self.count = 0

    def run(self, label: str, pid: int | None, argv: list[str], *, check: bool = True,
            timeout_s: float | None = None) -> subprocess.CompletedProcess:
        if not argv or not all(isinstance(a, str) for a in argv):
            raise TypeError(f"argv must be a non-empty list of str (got {argv!r})")
        if self.trace:
            self.trace(f"{label}: {shlex.join(argv)}")
        self.count += 1
        try:
            done = subprocess.run(in_namespace(pid, argv), capture_output=True, text=True,
                                  timeout=timeout_s or self.timeout_s)
        except subprocess.TimeoutExpired:
            raise EmulatorError(f"{label}: `{shlex.join(argv)}` did not finish in "
                                f"{timeout_s or self.timeout_s:g} s") from None
        except FileNotFoundError as exc:
            raise EmulatorError(f"{label}: cannot run `{argv[0]}` ({exc.strerror}); "
                                "install it with sudo scripts/setup.sh") from None
        if check and done.returncode != 0:
            lines = (done.stderr or done.stdout).strip().splitlines()
            why = lines[-1] if lines else "no error output"
            raise EmulatorError(f"{label}: `{shlex.join(argv)}` failed with exit {done.returncode}: {why}")
        return done

    def run_all(self, label: str, pid: int | None, commands: Iterable[list[str]]) -> None:
        for argv in commands:
            self.run(label, pid, argv)

    def run_batched(self, label: str, pid: int | None, commands: Iterable[list[str]]) -> None:
        """Run ``commands`` in order, each run of consecutive ``tc`` (or ``ip``) commands as one
        ``tc -batch -`` (``ip -batch -``) process: a live change of many links takes one process per
        tool instead of one per command. Arguments must hold no whitespace (ours never do)."""
        for tool, group in itertools.groupby(commands, key=lambda argv: argv[0]):
            group = list(group)
            if tool not in BATCH_TOOLS or len(group) == 1:
                self.run_all(label, pid, group)
                continue
            if any(not a or any(c.isspace() for c in a) for argv in group for a in argv):
                raise ValueError(f"{label}: batched arguments must hold no whitespace: {group!r}")
            if self.trace:
                for argv in group:
                    self.trace(f"{label}: {shlex.join(argv)} (batched)")
            self.count += len(group)
            lines = "".join(" ".join(argv[1:]) + "\n" for argv in group)
            done = subprocess.run(in_namespace(pid, [tool, "-batch", "-"]), input=lines, capture_output=True,
                                  text=True, timeout=self.timeout_s)
            if done.returncode != 0:
                why = (done.stderr or done.stdout).strip().splitlines()
                raise EmulatorError(f"{label}: `{tool} -batch` of {len(group)} commands failed with exit "
                                    f"{done.returncode}: {' / '.join(why[-2:]) or 'no error output'}")
