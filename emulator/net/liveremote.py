"""A live WAN change on a router of another server (``emulator run --servers --wan-events``, issue 20).

:class:`emulator.net.live.LiveNetwork` changes a local router by running its ``tc`` / ``ip``
batch in the router's namespace, writing its delay daemon's control file, signalling the daemon
and reading the daemon's ``.ack``. For a router on another server of a
:class:`emulator.net.multihost.ClusterEmulation` all of that happens there, through
a ``sh`` kept running in that router's namespace there (:func:`start_shells`, started by
:class:`LiveNetwork` through ``emu.popen`` over the emulation's master connection; a new SSH
session per change cost 0.25-0.45 s here, a Python start-up there another 0.5 s), as one script
(:func:`remote_script`): the batch, grouped as
:meth:`emulator.net.executor.Executor.run_batched` groups it (``mnexec -a PID tc -batch -``); the
control file written as :func:`emulator.net.delayd.write_control` writes it (``.tmp``, then a
rename: the daemon never reads half of it); SIGHUP to the daemon by the pid file its SSH launch
wrote (:meth:`ClusterEmulation.popen`); the ack polled there and printed. The ack's time is the
daemon's (that server's) monotonic clock: :func:`apply_remote` puts it on ours with the server's
measured offset (:func:`emulator.net.servers.to_local_ns`, as :mod:`emulator.jobs.replay` does
the ranks' stamps). A change without new delays (netem on every server, or a route or rate alone)
is in force when the script's answer is back here: that moment, on our clock.
"""

from __future__ import annotations

import itertools
import os
import select
import shlex
import subprocess
import time

from emulator.net.executor import BATCH_TOOLS
from emulator.net.servers import to_local_ns
from spiderflow.errors import EmulatorError

ACK_TIMEOUT_S = 5.0  # as emulator.net.live's for a local daemon
ACK_POLL_S = 0.002
SSH_TIMEOUT_S = 30.0 + ACK_TIMEOUT_S  # the batch (the Executor's own timeout) and the ack
DONE = "__spiderflow_live_done"  # the line that ends a script's output, with its exit status


def remote_script(pid: int, commands: list[list[str]], control: str | None = None,
                  daemon_pidfile: str | None = None, seq: int = 0, delays: list[str] = ()) -> str:
    """The ``sh`` script that makes one router's change on its server: ``commands`` in the namespaces
    of process ``pid`` (runs of ``tc`` / ``ip`` as one ``-batch -`` each), then, with ``delays``
    (``QueueSpec.arg()`` strings), the daemon's control file ``control`` for ``seq``, SIGHUP to the
    pid in ``daemon_pidfile`` and the ack (printed as ``ack SEQ TIME``; exit 3 if refused, 4 if late)."""
    lines = ["set -e"]
    for tool, group in itertools.groupby(commands, key=lambda argv: argv[0]):
        group = list(group)
        if tool in BATCH_TOOLS and len(group) > 1:
            if any(not a or any(c.isspace() for c in a) for argv in group for a in argv):
                raise ValueError(f"batched arguments must hold no whitespace: {group!r}")
            text = "".join(" ".join(argv[1:]) + "\n" for argv in group)
            lines.append(f"printf %s {shlex.quote(text)} | mnexec -a {int(pid)} {tool} -batch -")
        else:
            lines += [shlex.join(["mnexec", "-a", str(int(pid)), *argv]) for argv in group]
    if delays:
        ctl, ack = shlex.quote(control), shlex.quote(f"{control}.ack")
        body = "".join(f"{x}\n" for x in [str(int(seq)), *delays])
        lines += [f"printf %s {shlex.quote(body)} > {shlex.quote(control + '.tmp')}",
                  f"mv -f {shlex.quote(control + '.tmp')} {ctl}",
                  f"kill -HUP \"$(cat {shlex.quote(daemon_pidfile)})\"",
                  f"n={int(ACK_TIMEOUT_S / ACK_POLL_S)}",
                  "while :; do",
                  f"  a=$(cat {ack} 2>/dev/null || true)",
                  f'  case "$a" in "{int(seq)} "*) echo "ack $a"; exit 0 ;; error*) echo "$a" >&2; exit 3 ;; esac',
                  '  n=$((n - 1)); [ "$n" -gt 0 ] || exit 4',
                  f"  sleep {ACK_POLL_S}",
                  "done"]
    return "\n".join(lines) + "\n"


def start_shells(emu, shells: dict[str, subprocess.Popen]) -> None:
    """A ``sh`` in each router of another server (into ``shells``, by router; a dead one replaced), kept
    for the live changes (an SSH session costs ~0.25 s here, a line to a running shell a few ms).
    Started with ``emu.popen``, so they carry the emulation's marker there and end at teardown like
    every other process; all started, then each waited for until it answers, so that the first
    change does not pay for the sessions (it was in force ~0.25 s after due, the next ones ~15 ms)."""
    started = []
    for c in emu.plan.clusters:
        router = c.router.name
        if emu.is_remote(router) and (router not in shells or shells[router].poll() is not None):
            shells[router] = emu.popen(router, ["sh"], role="live-shell", stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, bufsize=0)
            started.append(router)
    for router in started:
        try:
            run_in_shell(shells[router], ":", SSH_TIMEOUT_S)
        except (OSError, TimeoutError, EOFError) as exc:
            raise EmulatorError(f"{router}@{emu.server_of(router)}: its shell for live changes did not start "
                                f"({exc})") from None


def run_in_shell(shell: subprocess.Popen, script: str, timeout_s: float) -> tuple[int, str]:
    """Run ``script`` in a subshell of ``shell`` (its ``exit`` ends the subshell only); its exit status
    and output (stdout and stderr)."""
    shell.stdin.write(f"(\n{script}) 2>&1; echo \"{DONE} $?\"\n".encode())
    shell.stdin.flush()
    out, deadline = b"", time.monotonic() + timeout_s
    while f"\n{DONE} ".encode() not in b"\n" + out or not out.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([shell.stdout], [], [], left)[0]:
            raise TimeoutError(f"no answer in {timeout_s:g} s")
        chunk = os.read(shell.stdout.fileno(), 65536)
        if not chunk:
            raise EOFError("its shell is gone")
        out += chunk
    text = out.decode(errors="replace")
    body, _, status = text.rpartition(f"{DONE} ")
    return int(status.strip()), body


def apply_remote(emu, change, seq: int, shells: dict[str, subprocess.Popen]) -> float:
    """Make ``change`` (a :class:`emulator.net.reshape.RouterChange`) on its router's server (``emu``:
    a ClusterEmulation) through its shell in ``shells`` (:func:`start_shells`); the moment it was in
    force (the daemon's ack if it has new delays, else when the batch returned here), on this
    machine's monotonic clock."""
    router = change.router
    server = emu.server_of(router)
    control = pidfile = None
    if change.delays:
        cluster = next(c.name for c in emu.plan.clusters if c.router.name == router)
        daemon = emu.delay_daemons().get(router)
        if daemon is None or daemon.poll() is not None or getattr(daemon, "remote", None) is None:
            raise EmulatorError(f"{router}@{server}: no delay daemon running to take the new delays")
        control, pidfile = str(emu.delay_control(cluster)), daemon.remote[2]
    commands = [list(argv) for argv in change.commands]
    script = remote_script(emu.node(router).pid, commands, control, pidfile, seq, [d.arg() for d in change.delays])
    if emu.executor.trace:
        for argv in commands:
            emu.executor.trace(f"{router}@{server}: {shlex.join(argv)} (live)")
    emu.executor.count += len(commands)
    if router not in shells or shells[router].poll() is not None:
        start_shells(emu, shells)
    shell = shells[router]
    try:
        rc, out = run_in_shell(shell, script, SSH_TIMEOUT_S)
    except (OSError, TimeoutError, EOFError) as exc:
        raise EmulatorError(f"{router}@{server}: live change got no answer from its shell there ({exc})") from None
    returned = time.monotonic()
    lines = out.strip().splitlines()
    if rc != 0:
        what = {3: "delay daemon refused the new delays", 4: f"delay daemon did not take the new delays in "
                f"{ACK_TIMEOUT_S:g} s"}.get(rc, f"live change failed with exit {rc}")
        raise EmulatorError(f"{router}@{server}: {what}: {(lines or ['no error output'])[-1]}")
    if not change.delays:
        return returned
    fields = (lines or [""])[-1].split()
    if len(fields) != 3 or fields[0] != "ack" or fields[1] != str(seq):
        raise EmulatorError(f"{router}@{server}: unexpected answer from the live change: {out.strip()!r}")
    return to_local_ns(int(float(fields[2]) * 1e9), emu.servers.offsets[server].monotonic_ns) / 1e9
