"""The microbenchmark ranks' lifecycle: start, watch, end, bring their files back (issue 20).

:func:`run_ranks` starts one :mod:`~emulator.calibrate.opbench_worker` per host from the warm rank
pool of that host's server (``pool_of(host name)``: a :class:`~emulator.jobs.pool.RankPool` on one
machine, :meth:`emulator.jobs.remotepool.ServerPools.for_host` over several), waits for them, and
returns every rank's JSON lines with their times on this machine's monotonic clock.

- **A rank on this machine** (a pool without a files directory) writes its spec, JSON lines and
  log in ``work`` here, as before.
- **A rank on another server** (a pool with a files directory, ``emulator run --servers``'s
  ``ServerRankPool``) gets its spec in the start request (a copy stays in ``work``) and writes its
  JSON lines and log under that pool's directory *there*; progress is asked by size (``stat``, one
  request per server and poll), and when the ranks end (done, failed, stalled or interrupted) the
  files are copied into ``work`` here and removed there (``fetch``). Nothing assumes a shared
  filesystem: the pool's directory is never ``work``, even where the filesystem is shared.
- **One clock.** The worker stamps raw ``CLOCK_MONOTONIC`` seconds, and a p2p time is the sender's
  start to the *receiver's* end (two ranks, maybe two servers); a collective's is the last start to
  the last end over all its ranks. So a remote rank's ``t_start``/``t_end`` are put on this
  machine's clock with its server's measured offset (``pool.clock_offset_ns``, the same conversion
  as :func:`emulator.jobs.replay.rank_ends`) before :func:`emulator.calibrate.opbench.combine`
  mixes them.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from emulator.calibrate.opbench_worker import PEER_FAILED, unwritable_errno
from emulator.jobs.pool import REPO, RankPool
from emulator.jobs.ranklog import read_lines
from emulator.jobs.remotepool import by_pool, fetch_back
from emulator.jobs.replay import local_mono_s
from emulator.net.state import MARKER_ENV
from spiderflow.errors import EmulatorError

MODULE = "emulator.calibrate.opbench_worker"
PROGRESS_EVERY_S = 60.0
LOG_FETCH_BYTES = 8 * 2 ** 20  # a bench rank's log is a few lines; a runaway one is cut here
STAMPS = ("t_start", "t_end")


@dataclass(frozen=True, kw_only=True)
class BenchHost:
    """Where a rank runs: the host's name, address, interface, and the pid whose namespaces it joins
    (on the host's own server; None: this process's)."""

    name: str
    ip: str
    intf: str
    ns_pid: int | None


@dataclass(kw_only=True)
class BenchRank:
    rank: int
    host: BenchHost
    pool: RankPool
    proc: object  # emulator.jobs.pool.PooledProcess
    out: str  # its JSON lines, where it writes them (on its server)
    log: str  # its log, where it writes it
    fetched: bool = False  # a remote rank's files are here (and gone there)

    @property
    def remote(self) -> bool:
        return self.pool.files_dir is not None


def on_our_clock(lines: list[dict], offset_ns: int) -> list[dict]:
    """A rank's lines with ``t_start``/``t_end`` moved from its server's clock (``offset_ns`` ahead of
    ours; 0: this machine) onto ours."""
    if not offset_ns:
        return lines
    return [{**ln, **{k: local_mono_s(ln[k], offset_ns) for k in STAMPS if k in ln}} for ln in lines]


def start_rank(pool: RankPool, rank: int, host: BenchHost, spec: dict, work: Path, env: dict[str, str]) -> BenchRank:
    """Start one bench rank from ``pool`` (see the module docstring for where its files go)."""
    name = f"r{rank}"
    for stale in (work / f"{name}.jsonl", work / f"{name}.log"):
        stale.unlink(missing_ok=True)  # a reused --out: the rank appends, combine reads every line
    role = f"bench/{name}@{host.name}"
    if pool.files_dir is None:
        spec = {**spec, "rank": rank, "out": str(work / f"{name}.jsonl")}
        (work / f"{name}.json").write_text(json.dumps(spec))
        proc = pool.start(module=MODULE, args=[str(work / f"{name}.json")], env=env, log_path=str(work / f"{name}.log"),
                          ns_pid=host.ns_pid, cwd=str(REPO), role=role)
        return BenchRank(rank=rank, host=host, pool=pool, proc=proc, out=spec["out"], log=str(work / f"{name}.log"))
    there = f"{pool.files_dir}/{work.parent.name}-{name}"  # one folder per server: name it by topology too
    spec = {**spec, "rank": rank, "out": f"{there}.jsonl"}
    text = json.dumps(spec)
    (work / f"{name}.json").write_text(text)  # the copy here
    marker = getattr(pool, "marker", None)
    proc = pool.start(module=MODULE, args=[f"{there}.json"], env={**env, **({MARKER_ENV: marker} if marker else {})},
                      log_path=f"{there}.log", ns_pid=host.ns_pid, cwd=str(REPO), role=role,
                      files={f"{there}.json": text}, unlink=[spec["out"], f"{there}.log"])
    return BenchRank(rank=rank, host=host, pool=pool, proc=proc, out=spec["out"], log=f"{there}.log")


def _by_pool(ranks: list[BenchRank]) -> list[list[BenchRank]]:
    """The remote ranks whose files are still there, grouped by their pool."""
    return by_pool(r for r in ranks if r.remote and not r.fetched)


def written_bytes(ranks: list[BenchRank]) -> int:
    """What the ranks have written to their JSON lines, here and (one ``stat`` per server) there."""
    total = sum(Path(r.out).stat().st_size for r in ranks if not r.remote and Path(r.out).exists())
    for group in _by_pool(ranks):
        total += sum(max(0, n) for n in group[0].pool.stat([r.out for r in group]).values())
    return total


def newest_test(ranks: list[BenchRank]) -> int | None:
    """The highest test id any rank has stamped (for the progress line; a remote rank's lines are read
    through its pool, left there)."""
    last = []
    for r in ranks:
        if not r.remote and Path(r.out).exists():
            last += read_lines(Path(r.out))[-1:]  # a line still being written is skipped
    for group in _by_pool(ranks):
        for data in group[0].pool.fetch([r.out for r in group]).values():
            done = (data or b"").decode(errors="replace").split("\n")[:-1]  # complete lines only
            last += [json.loads(x) for x in done if x.strip()][-1:]
    ids = [ln["test"] for ln in last if ln.get("test") is not None]
    return max(ids) if ids else None


def collect(ranks: list[BenchRank], work: Path, log: Callable[[str], None]) -> None:
    """Copy every remote rank's JSON lines and log into ``work/r<rank>.jsonl`` / ``.log`` here and
    remove them there (once per rank); from then on the rank's files are local."""
    for group in _by_pool(ranks):
        pool = group[0].pool
        try:
            fetch_back(pool, [(r.out, work / f"r{r.rank}.jsonl", r.log, work / f"r{r.rank}.log") for r in group],
                       max_log_bytes=LOG_FETCH_BYTES)
        except EmulatorError as exc:
            log(f"could not copy the bench ranks' files from {getattr(pool, 'server', 'its server')}: {exc}")
            continue
        for r in group:
            r.fetched = True


def run_ranks(hosts: list[BenchHost], spec: dict, *, pool_of: Callable[[str], RankPool], work: Path,
              env_of: Callable[[BenchHost], dict[str, str]], stall_s: float, describe: Callable[[int], str],
              poll: Callable[[], None] = lambda: None, log: Callable[[str], None] = lambda _m: None) -> list[dict]:
    """Run one bench rank per host (rank = index) with ``spec`` (+ ``rank``, ``world_size``, ``out``);
    return all their lines, times on our clock. Fails with one line when a rank exits non-zero or no
    rank has written for ``stall_s``. ``describe(test id)`` names a test; ``poll`` runs once a second."""
    work.mkdir(parents=True, exist_ok=True)
    ranks: list[BenchRank] = []
    try:
        for rank, host in enumerate(hosts):
            ranks.append(start_rank(pool_of(host.name), rank, host, {**spec, "world_size": len(hosts)}, work,
                                    env_of(host)))
        n_tests = len(spec["tests"])
        remote = sum(r.remote for r in ranks)
        log(f"microbenchmarks: {n_tests} tests on {len(hosts)} ranks"
            + (f" ({remote} on other servers)" if remote else ""))
        t0 = time.monotonic()
        seen, moved, logged, shown = 0, t0, t0, None
        while any(r.proc.poll() is None for r in ranks):
            now = time.monotonic()
            written = written_bytes(ranks)
            if written != seen:
                seen, moved = written, now
            elif now - moved > stall_s:
                last = newest_test(ranks)
                raise EmulatorError(f"microbenchmarks made no progress for {stall_s:g} s (last test started: "
                                    f"{describe(last) if last is not None else 'none'}); logs in {work}")
            if now - logged >= PROGRESS_EVERY_S and (last := newest_test(ranks)) is not None and last != shown:
                log(f"microbenchmarks: test {last + 1}/{n_tests} ({describe(last)}), {now - t0:.0f} s")
                shown, logged = last, now
            poll()
            time.sleep(1.0)
    finally:
        for r in ranks:
            if r.proc.poll() is None:  # an error or Ctrl-C here: end them (a remote one through its pool)
                with contextlib.suppress(EmulatorError, ProcessLookupError):
                    r.proc.killpg(signal.SIGKILL)
                with contextlib.suppress(Exception):
                    r.proc.wait(timeout=5)
        collect(ranks, work, log)
    lines = [ln for r in ranks for ln in on_our_clock(read_lines(work / f"r{r.rank}.jsonl"), r.pool.clock_offset_ns)]
    bad = [r for r in ranks if r.proc.returncode != 0]
    if bad:
        raise failed(bad, lines, work)
    return lines


def failed(bad: list[BenchRank], lines: list[dict], work: Path) -> EmulatorError:
    """The one line for ranks that exited non-zero. It names a rank that ended for its own reason
    before one that only lost a peer (gloo's "Connection closed by peer" names no cause), and says
    so plainly when a rank could not write its lines (a full disk)."""
    r = min(bad, key=lambda b: b.proc.returncode == PEER_FAILED)  # rank order among equals
    where = f"microbenchmark rank {r.rank} on {r.host.name}"
    errnum = unwritable_errno(r.proc.returncode)
    if errnum is not None:
        why = os.strerror(errnum) if errnum else "an error it could not report"
        if r.remote:
            server = getattr(r.pool, "server", "its server")
            return EmulatorError(f"{server}:{Path(r.out).parent}: {where} cannot write its measurements there "
                                 f"({why}); free space there and run again")
        return EmulatorError(f"{work}: {where} cannot write its measurements there ({why}); free space there, "
                             "or pass --out DIR on another file system, and run again")
    reason = next((ln.get("reason") for ln in lines if ln.get("event") == "failed" and ln.get("rank") == r.rank),
                  None)
    return EmulatorError(f"{where} exited with {r.proc.returncode}"
                         + (f": {reason}" if reason else f"; see {work}/r{r.rank}.log"))
