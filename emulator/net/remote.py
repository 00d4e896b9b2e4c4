"""Mininet's cluster-mode classes as the emulator uses them (:mod:`emulator.net.multihost`).

- :class:`ServerHost`: Mininet's ``RemoteHost`` (a shell in a new namespace on another server,
  started over SSH), reached with our SSH options (root everywhere: no sudo), its processes
  marked with the server's run marker, its local SSH client dying with us, its start bounded;
- :class:`ClusterLink`: Mininet's ``RemoteLink``; a link between two servers is made by the
  emulation (SSH tunnel or VXLAN, each step checked);
- :class:`RemotePopen`: the local SSH client of a process started on another server, whose
  signals reach the remote process group.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import threading
from typing import TYPE_CHECKING

from mininet.examples.cluster import RemoteHost, RemoteLink
from mininet.node import Node

from emulator.net.emulation import _die_with
from emulator.net.servers import remote_command, run_ssh
from emulator.net.state import MARKER_ENV
from spiderflow.errors import EmulatorError

if TYPE_CHECKING:
    from emulator.net.multihost import ClusterEmulation

SHELL_TIMEOUT_S = 30.0


class ServerHost(RemoteHost):
    """Mininet's RemoteHost reached with our SSH options (root everywhere: no sudo); its processes
    carry the server's marker, and the local SSH client dies with us."""

    def __init__(self, name: str, *, dest: str, ssh, marker: str, serverIP: str, **params) -> None:
        self.ssh_dest, self.ssh_opts, self.marker = dest, ssh, marker
        self._start_failed = False
        super().__init__(name, server=dest, user="root", serverIP=serverIP, **params)

    def startShell(self, *args, **kwargs):
        """Mininet's, with a deadline: its prompt loop reads the pty for ever if ssh never starts the
        shell (e.g. sshd's MaxSessions reached), so a watchdog ends ssh and closes our end of the pty."""
        watchdog = threading.Timer(SHELL_TIMEOUT_S, self._abort_start)
        watchdog.start()
        try:
            super().startShell(*args, **kwargs)
        except (OSError, ValueError) as exc:
            if not self._start_failed:
                raise
            raise EmulatorError(f"{self.name}: its shell on {self.ssh_dest} did not start within "
                                f"{SHELL_TIMEOUT_S:g} s over ssh; check that server's sshd allows enough sessions "
                                "(MaxSessions: one per emulated host there, plus ~10; docs/multihost.md)") from exc
        finally:
            watchdog.cancel()

    def _abort_start(self) -> None:
        self._start_failed = True
        if self.shell is not None and self.shell.poll() is None:
            self.shell.kill()
        if self.slave is not None:
            os.close(self.slave)  # nothing else holds the pty's other end now: the read loop gets EIO
            self.slave = None

    def _popen(self, cmd_argv, sudo=True, tt=True, **params):  # noqa: ARG002 (root: no sudo)
        if isinstance(cmd_argv, str):
            cmd_argv = cmd_argv.split()
        if self.isRemote:
            cmd_argv = self.ssh_opts.argv(self.ssh_dest, tty=tt) + [
                remote_command(list(cmd_argv), env={MARKER_ENV: self.marker})]
        params.setdefault("preexec_fn", _die_with(os.getpid()))
        params.setdefault("start_new_session", True)
        return Node._popen(self, cmd_argv, **params)


class ClusterLink(RemoteLink):
    """Mininet's RemoteLink; the tunnel is made by the emulation (our SSH options, checked steps)."""

    emu: "ClusterEmulation | None" = None  # set on a per-emulation subclass

    def makeTunnel(self, node1, node2, intfname1, intfname2, addr1=None, addr2=None):
        local1 = getattr(node1, "server", "localhost") == "localhost"
        local2 = getattr(node2, "server", "localhost") == "localhost"
        if not local1 and local2:  # as Mininet does: the SSH client end is on this machine
            return self.makeTunnel(node2, node1, intfname2, intfname1, addr2, addr1)
        if not local1:
            raise EmulatorError(f"{node1.name}-{node2.name}: a tunnel between two other servers is not supported")
        return self.emu.make_tunnel(node1, node2, intfname1, intfname2, addr1, addr2)


class RemotePopen(subprocess.Popen):
    """The local SSH client of a process on another server; a signal goes to the remote process
    group too (by the pid file it wrote), then to the client."""

    remote: tuple | None = None  # (Ssh, server, pid file)

    def send_signal(self, sig: int) -> None:
        if self.remote is not None and self.poll() is None:
            ssh, server, pidfile = self.remote
            script = (f'p=$(cat {shlex.quote(pidfile)} 2>/dev/null) && [ -n "$p" ] && '
                      f'{{ kill -{int(sig)} -- -"$p" 2>/dev/null || kill -{int(sig)} "$p" 2>/dev/null; }}; true')
            try:
                run_ssh(ssh, server, ["sh", "-c", script], check=False, timeout_s=15.0)
            except EmulatorError:
                pass
        super().send_signal(sig)
