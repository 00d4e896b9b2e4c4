"""Rank pools on every server of a multi-host emulation (``emulator run --servers``, issue 20).

    with ServerPools(emu) as pools:           # emu: a ClusterEmulation
        pool = pools.for_host("tokyo-h0")     # the pool on tokyo's server
        proc = pool.start(module=..., args=[spec_path], ..., files={spec_path: text})

The first server keeps its :class:`~emulator.jobs.pool.RankPool`. Each other server gets a
:class:`ServerRankPool`: the same fork server (``python -m emulator.jobs.pool --serve --files DIR``)
started in that server's root namespace over the emulation's SSH master connection, as root, in the
same project path and venv, its JSON lines carried by the SSH channel. What differs from the local
pool, because the ranks run on another machine:

- **pids**: a child's pid is the other machine's; it is never signalled or recorded here. Signals
  go through the protocol (``{"kill" | "killpg": PID, "sig": N}``, applied by the server to a child
  it has not reaped); the emulation's teardown ends the server (its stdin closes: it SIGKILLs its
  children), and the server's agent ends whatever carries the server's marker
  (``SPIDERFLOW_EMULATION=<run id>@<server>``), also after a crash of the first server;
- **files**: a rank's spec, JSON lines and log live in ``DIR`` = ``<the agent's scratch
  directory>/ranks`` on that server (removed by the agent at teardown). The spec travels in the
  start request; the runner asks sizes (``stat``: the log cap, "did it reach its rendezvous"),
  appends what the JSON lines gained to their copies in the run directory here every second
  (``fetch`` from an offset: a crash of the first server keeps what they wrote until then), and
  copies the rest and the log when the job ends.
  Nothing assumes a shared filesystem: ``DIR`` differs from the run directory even where the
  filesystem is shared (the fake server of scripts/multihost-test.sh), so the copy is exercised;
- **clock**: ``clock_offset_ns`` is that server's CLOCK_MONOTONIC minus ours (measured at build,
  :func:`emulator.net.servers.measure_offset`); the runner puts the ranks' ``mono`` stamps on our
  clock with it (:func:`emulator.jobs.replay.rank_ends`).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from emulator.jobs.pool import READY_TIMEOUT_S, REPO, RankPool, _die_with_parent
from emulator.net.servers import Ssh, remote_command
from emulator.net.state import MARKER_ENV
from spiderflow.errors import EmulatorError


def by_pool(ranks) -> list[list]:
    """Ranks with a ``pool`` (not None) grouped by it, in order: a replay's remote ranks, or
    calibrate's bench ranks (:mod:`emulator.calibrate.benchranks`)."""
    groups: dict[int, list] = {}
    for r in ranks:
        if r.pool is not None:
            groups.setdefault(id(r.pool), []).append(r)
    return list(groups.values())


def fetch_back(pool, files: list[tuple[str, Path, str, Path]], *, max_log_bytes: int,
               copied: dict[str, int] | None = None) -> None:
    """For each ``(lines there, lines here, log there, log here)``: copy the JSON lines and the log (at
    most ``max_log_bytes``) from ``pool``'s server and remove them there, one request each for all;
    a file that is not there is skipped. ``copied``: bytes of a JSON lines file already copied here
    (:func:`copy_lines`), appended to. EmulatorError when the pool does not answer."""
    copied = {there: n for there, n in (copied or {}).items() if n}
    lines = pool.fetch([f[0] for f in files], remove=True, offsets=copied)
    logs = pool.fetch([f[2] for f in files], max_bytes=max_log_bytes, remove=True)
    for there, here, log_there, log_here in files:
        if lines[there] is not None:
            with open(here, "ab" if there in copied else "wb") as fh:
                fh.write(lines[there])
        if logs[log_there] is not None:
            Path(log_here).write_bytes(logs[log_there])


def copy_lines(ranks, rank_dir: Path, *, prefix: str, log: Callable[[str], None]) -> None:
    """Append what each remote rank's JSON lines gained since the last copy (its ``remote_sizes``, as
    last asked) to ``rank_dir/<prefix>-r<rank>.jsonl`` here, one request per server; the files stay
    there until :func:`collect`, which copies the rest."""
    for group in by_pool(r for r in ranks if r.remote_log is not None):
        grown = [r for r in group if r.remote_sizes.get(r.spec.out, -1) > r.copied]
        if not grown:
            continue
        try:
            data = grown[0].pool.fetch([r.spec.out for r in grown], offsets={r.spec.out: r.copied for r in grown})
        except EmulatorError as exc:  # the pool is gone: collect says so too
            log(str(exc))
            continue
        for r in grown:
            chunk = data[r.spec.out]
            if chunk:
                with open(rank_dir / f"{prefix}-r{r.spec.rank}.jsonl", "ab") as fh:
                    fh.write(chunk)
                r.copied += len(chunk)


def ask_sizes(ranks, *, log: Callable[[str], None]) -> None:
    """Each remote rank's ``remote_sizes``: its JSON lines' and log's sizes on its server, one
    request per server (:class:`emulator.jobs.replay.Rank`)."""
    for group in by_pool(ranks):
        try:
            sizes = group[0].pool.stat([p for r in group for p in (r.spec.out, r.remote_log) if p])
        except EmulatorError as exc:  # the pool is gone: its ranks report -9 and fail their job
            log(str(exc))
            continue
        for r in group:
            r.remote_sizes = sizes


def collect(ranks, rank_dir: Path, *, prefix: str, max_log_bytes: int, log: Callable[[str], None]) -> None:
    """Copy each remote rank's JSON lines and log (at most ``max_log_bytes``) from its server to
    ``rank_dir/<prefix>-r<rank>.jsonl`` and its ``log`` here, and remove them there; once per rank."""
    for group in by_pool(r for r in ranks if r.remote_log is not None):
        pool = group[0].pool
        try:
            fetch_back(pool, [(r.spec.out, rank_dir / f"{prefix}-r{r.spec.rank}.jsonl", r.remote_log, r.log)
                              for r in group], max_log_bytes=max_log_bytes,
                       copied={r.spec.out: r.copied for r in group})
        except EmulatorError as exc:
            log(f"could not copy its ranks' files from {pool.server}: {exc}")
            continue
        for r in group:
            r.remote_log = None  # collected (and gone there)


class ServerRankPool(RankPool):
    """A :class:`RankPool` whose server runs on ``server``, reached with ``ssh``."""

    remote = True

    def __init__(self, emu=None, *, server: str, ssh: Ssh, files_dir: str, marker: str, clock_offset_ns: int = 0,
                 preload: Sequence[str] | None = None, cold: bool = False, log: Callable[[str], None] | None = None,
                 ready_timeout_s: float = READY_TIMEOUT_S, stderr_path: str | None = None, wait: bool = True) -> None:
        self.server, self.ssh, self.files_dir, self.marker = server, ssh, files_dir, marker
        self.clock_offset_ns = int(clock_offset_ns)
        self.role, self.label = f"rank-pool@{server}", f"rank pool on {server}"
        self._stderr_path = stderr_path
        super().__init__(emu, preload=preload, cold=cold, log=log, ready_timeout_s=ready_timeout_s, wait=wait)

    def wait_ready(self) -> None:
        try:
            super().wait_ready()
        except EmulatorError as exc:
            raise EmulatorError(f"{self.server}: the rank pool did not start over ssh ({self._stderr_tail() or exc}); "
                                "that server needs this project and its venv at the same path "
                                "(docs/multihost.md)") from None

    @classmethod
    def of_emulation(cls, emu, server: str, **kwargs) -> "ServerRankPool":
        """The pool of ``server``, one of ``emu``'s (a ClusterEmulation) other servers."""
        offset = emu.servers.offsets.get(server)
        return cls(emu, server=server, ssh=emu.servers.ssh, files_dir=f"{emu.remote_dir(server)}/ranks",
                   marker=emu.marker(server), clock_offset_ns=0 if offset is None else offset.monotonic_ns,
                   stderr_path=str(emu.local_dir() / f"rank-pool-{emu.marker(server).split('@', 1)[1]}.log"),
                   **kwargs)

    def _spawn(self, preload: list[str]) -> subprocess.Popen:
        argv = [sys.executable, "-m", "emulator.jobs.pool", "--serve", "--files", self.files_dir, *preload]
        cmd = self.ssh.argv(self.server) + [remote_command(
            argv, env={"OPENBLAS_NUM_THREADS": "1", MARKER_ENV: self.marker}, cwd=str(REPO))]
        stderr = open(self._stderr_path, "ab") if self._stderr_path else subprocess.DEVNULL
        try:
            return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
                                    env=self.emu.env if self.emu is not None else dict(os.environ),
                                    start_new_session=True,
                                    preexec_fn=lambda parent=os.getpid(): _die_with_parent(parent))
        finally:
            if stderr is not subprocess.DEVNULL:
                stderr.close()

    def _ended(self) -> str:
        """Here the server is its ssh client: what ssh said last, too (255 is ssh's own failure, a lost
        connection among them; the pool's own end there comes back as ssh's exit status)."""
        tail = self._stderr_tail()
        return f"{super()._ended()} (ssh: {tail})" if tail else super()._ended()

    def _stderr_tail(self) -> str:
        if not self._stderr_path:
            return ""
        try:
            with open(self._stderr_path, errors="replace") as fh:
                lines = fh.read().strip().splitlines()
        except OSError:
            return ""
        return lines[-1][:300] if lines else ""


class ServerPools:
    """One rank pool per server of a ClusterEmulation (the local one on the first), started together:
    every server is spawned before any is waited for, so their imports (torch: seconds of CPU each)
    overlap instead of adding up. ``cold``: every pool is cold, each rank a new interpreter that
    imports torch itself on its own server (``emulator run --servers --cold-start``)."""

    def __init__(self, emu, *, preload: Sequence[str] | None = None, cold: bool = False,
                 log: Callable[[str], None] | None = None) -> None:
        self.emu = emu
        self.pools: dict[str, RankPool] = {}
        try:
            self.pools[emu.servers.first] = RankPool(emu, preload=preload, cold=cold, log=log, wait=False)
            for server in emu.servers.remote:
                self.pools[server] = ServerRankPool.of_emulation(emu, server, preload=preload, cold=cold, log=log,
                                                                 wait=False)
            for pool in self.pools.values():
                pool.wait_ready()
        except BaseException:
            self.close()
            raise

    def for_host(self, host: str) -> RankPool:
        return self.pools[self.emu.server_of(host)]

    def check(self) -> None:
        """Raise if any server's pool has died (:meth:`RankPool.check`)."""
        for pool in self.pools.values():
            pool.check()

    def close(self) -> None:
        for pool in self.pools.values():
            with contextlib.suppress(OSError):
                pool.close()

    def __enter__(self) -> "ServerPools":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
