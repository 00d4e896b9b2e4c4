"""A rank pool: a fork server that has imported torch forks one child per rank (warm; cold: below).

    with RankPool(emu) as pool:
        proc = pool.start(module="emulator.jobs.worker", args=[spec_path], env=env, log_path=log,
                          ns_pid=emu.node("east-h0").pid, nice=10, role="j1/r0")
        proc.poll()                 # None while it runs, then its exit status (-9: SIGKILLed)

A cold ``python -m emulator.jobs.worker`` spends ~2 s of CPU importing torch: 20
ranks starting at once on 2 cores took ~30 s. Here one server process
(``python -m emulator.jobs.pool --serve MODULE...``, root namespace, own session)
imports torch and the rank entry points once, says ready, then forks a
child per request. The child leads its own process group (the server calls
``setpgid`` too before replying, so the runner's ``os.killpg(pid, ...)``
works as soon as ``start`` returns and never hits the server; a ``setsid``
in the child could still be pending then, and the server's session has no
terminal to leave), dies with the server (``PR_SET_PDEATHSIG``), points fds
0/1/2 at /dev/null and ``log_path`` (opened in the server's mount namespace,
as the runner opens a cold rank's log), joins the network and mount
namespaces of ``ns_pid`` (``setns``, what ``mnexec -a`` does; that resets
the cwd to the namespace's root, so ``cwd`` is set after), adds ``nice``,
takes ``env`` as its whole environment and exits (``os._exit``) with what
``module.main(args)`` returns (an exception: traceback in the log, status 1).

The server is one thread in one loop: ``poll`` over stdin (a JSON request per
line) and a pidfd per child; a readable pidfd is reaped and reported as
``{"event": "exit", "pid": P, "exit": CODE}`` (``Popen.returncode``'s
convention, ``-N`` for signal N). On stdin EOF it SIGKILLs its children's
groups, reports them and exits. It refuses to serve if preloading left a
second thread (forking one can deadlock the child on a lock whose owner does
not exist there): torch imports numpy, whose OpenBLAS starts a thread server,
so the server runs with ``OPENBLAS_NUM_THREADS=1`` (cold ranks get
``OMP_NUM_THREADS=1`` from ``rank_env``, which OpenBLAS reads too). Nothing
starts a torch thread pool or process group before the fork; ``gc.freeze()``
keeps the children's garbage collector from copying every inherited page.

Memory (2 cores, torch 2.13 CPU, default preload; benchmarks/rank_startup.py):
the idle server has RSS 239 MiB, PSS 233 MiB, 157 MiB of it anonymous
(/proc/PID/smaps_rollup); each idle child adds 3.3 MiB of PSS, a worker rank
waiting at its rendezvous 4.2 MiB, where a cold one holds 156 MiB of
anonymous memory of its own. Ten 2-rank jobs handed over at once on
paper8 start in 0.31 s (median; max 0.77 s), ~0.1 s over each job alone.

Cold (``RankPool(..., cold=True)``, ``emulator run --cold-start``, on one server or several): the
server preloads nothing and each start request carries ``"exec": true``; the child does all of the
above set-up, then ``os.execve``s ``python -m MODULE ARGS`` instead of importing the module, so the
rank pays a whole interpreter start and its own imports, as a cold ``python -m
emulator.jobs.worker`` does. Its pid, process group, death signal (``PR_SET_PDEATHSIG`` survives
``execve``) and the server's exit reports are a warm child's.

Files (``--serve --files DIR``, the pool of another server, :mod:`emulator.jobs.remotepool`):
a start request may carry ``files`` (path -> text, written before the fork) and ``unlink``
(paths removed first); ``{"stat": [paths]}`` answers each file's size (-1: none),
``{"fetch": [paths], "max_bytes": N, "remove": bool, "offsets": {path: N}}`` their bytes from
each offset on (base64; null: none), and
``{"kill" | "killpg": PID, "sig": N}`` signals a child (its group) that the server has not reaped
yet, unanswered -- every path under DIR only. A pool without ``--files`` refuses the file
requests. The local pool never uses them: its owner shares its files and pids.

A :class:`PooledProcess` is ``subprocess.Popen``-like (its status comes from
the server's stdout, read without blocking), so ``Emulation.register`` and its
teardown treat it as any other process. If the server dies, its unfinished
children (killed by their death signal) report -9. Use a pool from one thread.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import gc
import importlib
import json
import os
import select
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

from spiderflow.errors import EmulatorError
from emulator.net.state import MARKER_ENV, how_it_ended

REPO = Path(__file__).resolve().parents[2]
DEFAULT_PRELOAD = ("torch", "torch.distributed", "emulator.jobs.worker", "emulator.calibrate.opbench_worker")
READY_TIMEOUT_S = 60.0
START_TIMEOUT_S = 10.0
GONE_WAIT_S = 1.0  # how long a request that found the server gone waits for its exit status
FETCH_TIMEOUT_S = 60.0
PR_SET_PDEATHSIG = 1
CLONE_NEWNS, CLONE_NEWNET = 0x00020000, 0x40000000  # <linux/sched.h>
_libc = ctypes.CDLL(None, use_errno=True)


def _die_with_parent(parent_pid: int) -> None:
    """SIGKILL this process when ``parent_pid`` (its parent thread) dies."""
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:  # parent already gone
        os._exit(1)


# ---------------------------------------------------------------------- the owner's side
class PooledProcess:
    """A forked rank, as ``subprocess.Popen`` looks to the emulation (``stdout`` is None)."""

    def __init__(self, pool: "RankPool", pid: int, args: list[str]) -> None:
        self.pid, self.args, self._pool = pid, args, pool
        self.returncode: int | None = None
        self.stdout = self.stderr = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self._pool._pump(0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self._pool._pump(left)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # not reaped by the server yet: the pid is still this child's
            if self._pool.remote:  # a pid of another machine: the server sends it
                return self._pool._signal("kill", self.pid, sig)
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def killpg(self, sig: int) -> None:
        """Signal the child's process group (it leads one), here or through its server."""
        if self._pool.remote:
            if self.poll() is None:
                self._pool._signal("killpg", self.pid, sig)
            return
        os.killpg(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class RankPool:
    remote = False  # True: the server runs on another machine (emulator.jobs.remotepool)
    files_dir: str | None = None  # where the server keeps rank files (None: the owner's own paths)
    clock_offset_ns = 0  # the server's CLOCK_MONOTONIC minus ours
    role = "rank-pool"  # what the emulation's process list calls the server
    label = "rank pool"  # what messages call it

    def __init__(self, emu=None, *, preload: Sequence[str] | None = None, cold: bool = False,
                 log: Callable[[str], None] | None = None, ready_timeout_s: float = READY_TIMEOUT_S,
                 wait: bool = True) -> None:
        """Start the server; ``preload`` (None: :data:`DEFAULT_PRELOAD`, or nothing if ``cold``);
        ``cold``: each child execs its module in a new interpreter (see the module docstring).
        ``wait`` False: return at once, and call :meth:`wait_ready` before using it (several pools
        then import their modules at the same time: remotepool.ServerPools)."""
        if cold and preload:
            raise ValueError(f"a cold rank pool preloads nothing (got preload={tuple(preload)})")
        preload = (() if cold else DEFAULT_PRELOAD) if preload is None else tuple(preload)
        self.emu, self.log, self.cold = emu, log or (lambda _msg: None), cold
        self._started, self._preload, self._ready_timeout_s = time.monotonic(), preload, ready_timeout_s
        self._server = self._spawn(list(preload))
        if emu is not None:
            emu.register(self._server, role=self.role)
        self._fd = self._server.stdout.fileno()
        os.set_blocking(self._fd, False)
        self._buf, self._eof, self._seq = b"", False, 0
        self._live: dict[int, PooledProcess] = {}  # pid -> handle, until its exit is read
        self._replies: dict[int, PooledProcess | str] = {}  # request id -> handle or error (0: the server's)
        self.ready_at: float | None = None  # when the server said it was ready (monotonic)
        if wait:
            self.wait_ready()

    def wait_ready(self) -> None:
        """Until the server has imported its modules; EmulatorError (and the server ended) if it fails."""
        if self.ready_at is not None:
            return
        if not isinstance(reply := self._reply(0, self._ready_timeout_s), dict):
            self.close()
            raise EmulatorError(f"rank pool server ({' '.join(self._preload)}): {reply}")
        self.ready_at = time.monotonic()
        what = "cold: each rank execs python -m MODULE" if self.cold else f"preloaded {', '.join(self._preload)}"
        self.log(f"{self.label} ready: pid {self.pid}, {what} ({self.ready_at - self._started:.1f} s)")

    def _spawn(self, preload: list[str]) -> subprocess.Popen:
        """The server process (here: a child in its own session; another machine's: over SSH)."""
        env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
        if self.emu is not None:
            env[MARKER_ENV] = self.emu.run_id
        return subprocess.Popen([sys.executable, "-m", "emulator.jobs.pool", "--serve", *preload],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, cwd=REPO,
                                start_new_session=True,
                                preexec_fn=lambda parent=os.getpid(): _die_with_parent(parent))

    @property
    def pid(self) -> int:
        return self._server.pid

    def for_host(self, _host: str) -> "RankPool":
        """The pool that starts ranks in ``host`` (one pool: this one; see remotepool.ServerPools)."""
        return self

    def start(self, *, module: str, args: list[str], env: dict[str, str], log_path: str,
              ns_pid: int | None, nice: int = 0, cwd: str | None = None, role: str = "rank",
              files: dict[str, str] | None = None, unlink: Sequence[str] = ()) -> PooledProcess:
        """Fork a child that runs ``module.main(args)`` (a cold pool's: execs ``python -m module args``; see
        the module docstring); returns once its pid is known.
        ``files`` / ``unlink``: written / removed by the server first (a pool with a files directory)."""
        self._seq += 1
        request = {"id": self._seq, "module": module, "args": [str(a) for a in args], "env": dict(env),
                   "log_path": str(log_path), "ns_pid": ns_pid, "nice": nice, "cwd": cwd}
        if self.cold:
            request["exec"] = True
        if files or unlink:
            request.update(files=dict(files or {}), unlink=[str(p) for p in unlink])
        self._send(request)
        reply = self._reply(self._seq, START_TIMEOUT_S)
        if not isinstance(reply, PooledProcess) and self._eof:  # the server died: check's line, not a rank's
            raise self._gone()
        if not isinstance(reply, PooledProcess):
            raise EmulatorError(f"{self.label} could not start {module} {' '.join(request['args'])}: {reply}")
        if self.emu is not None and not self.remote:  # another machine's pid: its server and agent end it
            self.emu.register(reply, role=role)
        return reply

    def check(self) -> None:
        """Raise if the server has died: its ranks died with it (their death signal), and no rank can start."""
        if self._server.poll() is not None:
            raise self._gone()

    def _gone(self) -> EmulatorError:
        """What :meth:`check` says, and a request that finds the server gone (it may still be ending: a
        broken pipe comes first)."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._server.wait(timeout=GONE_WAIT_S)
        return EmulatorError(f"the {self.label} (pid {self.pid}) {self._ended()}: the ranks it started died with "
                             "it and no other can start; run again")

    def _ended(self) -> str:
        """How the server ended, in words (:meth:`_gone`)."""
        code = self._server.poll()
        return "stopped reading its requests" if code is None else how_it_ended(code)

    def stat(self, paths: Sequence[str]) -> dict[str, int]:
        """Size of each file on the server's machine (-1: no such file)."""
        reply = self._ask({"stat": [str(p) for p in paths]})
        return {p: int(n) for p, n in reply["sizes"].items()}

    def fetch(self, paths: Sequence[str], *, max_bytes: int | None = None, remove: bool = False,
              offsets: dict[str, int] | None = None) -> dict:
        """Each file's bytes (at most ``max_bytes``; None: no such file) from the server's machine,
        from ``offsets[path]`` on (default 0: the whole file); ``remove``: delete them there once read."""
        request = {"fetch": [str(p) for p in paths], "max_bytes": max_bytes, "remove": remove}
        if offsets:
            request["offsets"] = {str(p): int(n) for p, n in offsets.items()}
        reply = self._ask(request, timeout_s=FETCH_TIMEOUT_S)
        return {p: None if b is None else base64.b64decode(b) for p, b in reply["files"].items()}

    def _ask(self, request: dict, timeout_s: float = START_TIMEOUT_S) -> dict:
        self._seq += 1
        self._send({"id": self._seq, **request})
        reply = self._reply(self._seq, timeout_s)
        if not isinstance(reply, dict) and self._eof:
            raise self._gone()
        if not isinstance(reply, dict):
            raise EmulatorError(f"{self.label}: {next(iter(request))} failed: {reply}")
        return reply

    def _signal(self, how: str, pid: int, sig: int) -> None:
        with contextlib.suppress(EmulatorError):  # the server is gone: so is the child (death signal)
            self._send({"id": 0, how: pid, "sig": int(sig)})

    def _send(self, request: dict) -> None:
        if self._server.stdin.closed:  # by close(): a caller's mistake
            raise EmulatorError(f"{self.label} (pid {self.pid}) was closed; start a new RankPool")
        try:
            if self._eof:
                raise BrokenPipeError
            self._server.stdin.write(json.dumps(request).encode() + b"\n")
            self._server.stdin.flush()
        except BrokenPipeError:
            raise self._gone() from None

    def close(self) -> None:
        """End the server, which SIGKILLs and reaps every child first (idempotent)."""
        with contextlib.suppress(BrokenPipeError):
            self._server.stdin.close()  # EOF: the server ends its children and exits
        try:
            self._server.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._server.kill()
        while not self._eof:
            self._pump(1.0)
        self._server.stdout.close()

    def __enter__(self) -> "RankPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _reply(self, key: int, timeout_s: float) -> PooledProcess | dict | str:
        deadline = time.monotonic() + timeout_s
        while key not in self._replies and not self._eof and time.monotonic() < deadline:
            self._pump(deadline - time.monotonic())
        default = f"the server exited ({self._server.returncode})" if self._eof else f"no reply in {timeout_s:g} s"
        return self._replies.pop(key, default)

    def _pump(self, timeout: float | None) -> None:
        """Read and apply what the server has written, waiting up to ``timeout`` for something."""
        if self._eof:
            return
        if self._server.stdout.closed:  # the emulation's teardown closes a tracked Popen's stdout
            return self._lost()
        if not select.select([self._fd], [], [], timeout)[0]:
            return
        with contextlib.suppress(BlockingIOError):
            while data := os.read(self._fd, 1 << 16):
                self._buf += data
            self._eof = True  # read returned b"": the server is gone
        *lines, self._buf = self._buf.split(b"\n")
        for line in lines:
            msg = json.loads(line)
            if msg["event"] == "started":
                proc = PooledProcess(self, msg["pid"], msg["args"])
                self._live[proc.pid] = self._replies[msg["id"]] = proc
            elif msg["event"] == "exit" and msg["pid"] in self._live:
                self._live.pop(msg["pid"]).returncode = msg["exit"]
            elif msg["event"] in ("ready", "stat", "files"):
                self._replies[msg.get("id", 0)] = msg
            elif msg["event"] == "error":
                self._replies[msg.get("id", 0)] = msg["error"]
        if self._eof:
            self._lost()

    def _lost(self) -> None:
        """The server is gone (or can no longer be heard): children it had not reaped died by their
        death signal, so they report -9."""
        self._eof = True
        if self._server.poll() is None:
            self._server.kill()
        self._server.wait()
        for proc in self._live.values():
            proc.returncode = -signal.SIGKILL
        self._live.clear()


# ---------------------------------------------------------------------- the server
def _say(**msg) -> None:
    os.write(1, json.dumps(msg).encode() + b"\n")  # unbuffered: nothing is left to fork into a child


def _enter_namespaces(pid: int) -> None:
    fds = {ns: os.open(f"/proc/{pid}/ns/{ns}", os.O_RDONLY) for ns in ("net", "mnt")}
    try:
        for ns, flag in (("net", CLONE_NEWNET), ("mnt", CLONE_NEWNS)):
            if _libc.setns(fds[ns], flag) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"setns into the {ns} namespace of pid {pid}: {os.strerror(err)}")
    finally:
        for fd in fds.values():
            os.close(fd)


def _exit_code(code) -> int:
    """``SystemExit.code`` or ``main``'s return value as an exit status (a message: printed, 1)."""
    if code is None or isinstance(code, int):
        return code or 0
    print(code, file=sys.stderr)
    return 1


def _child(request: dict, server_pid: int, close_fds: list[int]) -> None:
    """The forked rank: never returns."""
    code = 1
    try:
        os.setpgid(0, 0)  # the server does it too; either may run first
        _die_with_parent(server_pid)
        for fd in close_fds:
            os.close(fd)
        log = os.open(request["log_path"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        for src, dst in ((null, 0), (log, 1), (log, 2)):
            os.dup2(src, dst)
        os.close(log), os.close(null)
        sys.stdout.reconfigure(line_buffering=True)
        sys.stderr.reconfigure(line_buffering=True)
        cwd = request["cwd"] or os.getcwd()
        if request["ns_pid"] is not None:
            _enter_namespaces(request["ns_pid"])
        if request["nice"]:
            os.nice(request["nice"])
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(cwd)
        if request.get("exec"):  # a cold pool's child: a new interpreter imports the module itself
            argv = [sys.executable, "-m", request["module"], *request["args"]]
            os.execve(sys.executable, argv, os.environ)
        sys.path[:0] = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
        sys.argv = [request["module"], *request["args"]]
        code = _exit_code(importlib.import_module(request["module"]).main(request["args"]))
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except BaseException:  # noqa: BLE001 - whatever it was, it goes to the rank's log
        traceback.print_exc()
        code = 1
    finally:
        with contextlib.suppress(Exception):  # a broken log must not change the status
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _under(files_dir: str | None, path: str) -> str:
    """``path`` if it lies under the server's files directory, else ValueError."""
    if files_dir is None:
        raise ValueError("this pool serves no files (started without --files)")
    real = os.path.realpath(path)
    if os.path.commonpath([real, files_dir]) != files_dir:
        raise ValueError(f"{path}: not under the pool's files directory {files_dir}")
    return real


def _file_request(request: dict, files_dir: str | None, children: dict[int, int]) -> dict | None:
    """Apply a request that forks nothing (see the module docstring); its reply, or None."""
    if "kill" in request or "killpg" in request:
        pid = int(request.get("kill", request.get("killpg")))
        if pid in children.values():  # a child not reaped yet: the pid cannot be another process's
            with contextlib.suppress(ProcessLookupError):
                (os.kill if "kill" in request else os.killpg)(pid, int(request["sig"]))
        return None
    if "stat" in request:
        sizes = {}
        for path in request["stat"]:
            try:
                sizes[path] = os.stat(_under(files_dir, path)).st_size
            except FileNotFoundError:
                sizes[path] = -1
        return {"event": "stat", "id": request["id"], "sizes": sizes}
    out = {}
    offsets = request.get("offsets") or {}
    for path in request["fetch"]:
        real = _under(files_dir, path)
        try:
            with open(real, "rb") as fh:
                fh.seek(int(offsets.get(path, 0)))
                data = fh.read() if request.get("max_bytes") is None else fh.read(int(request["max_bytes"]))
        except FileNotFoundError:
            out[path] = None
            continue
        out[path] = base64.b64encode(data).decode()
        if request.get("remove"):
            os.unlink(real)
    return {"event": "files", "id": request["id"], "files": out}


def _put_files(request: dict, files_dir: str | None) -> None:
    """A start request's ``unlink`` and ``files``, before its fork."""
    for path in request.get("unlink", []):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(_under(files_dir, path))
    for path, text in request.get("files", {}).items():
        real = _under(files_dir, path)
        os.makedirs(os.path.dirname(real), exist_ok=True)
        Path(real).write_text(text)


def serve(preload: Sequence[str], files_dir: str | None = None) -> int:
    t0 = time.monotonic()
    if files_dir is not None:
        os.makedirs(files_dir, exist_ok=True)
        files_dir = os.path.realpath(files_dir)
    try:
        for name in preload:
            importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001 - reported to the owner as one line
        _say(event="error", error=f"preloading failed: {type(exc).__name__}: {exc}")
        return 1
    threads = [Path(f"/proc/self/task/{t}/comm").read_text().strip() for t in os.listdir("/proc/self/task")]
    if len(threads) > 1:
        _say(event="error", error=f"{len(threads)} threads after preloading ({', '.join(threads)}); forking "
                                  "them is unsafe: find the library that starts them and turn it off")
        return 1
    gc.freeze()
    _say(event="ready", pid=os.getpid(), preload_s=round(time.monotonic() - t0, 3))
    me, buf = os.getpid(), b""
    children: dict[int, int] = {}  # pidfd -> pid
    poller = select.poll()
    poller.register(0, select.POLLIN)
    while True:
        for fd, _mask in poller.poll():
            if fd in children:
                pid = children.pop(fd)
                poller.unregister(fd)
                os.close(fd)
                _say(event="exit", pid=pid, exit=os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
                continue
            data = os.read(0, 1 << 16)
            if not data:
                return _shutdown(children)
            *lines, buf = (buf + data).split(b"\n")
            for line in lines:
                request = json.loads(line)
                if "module" not in request:
                    try:
                        reply = _file_request(request, files_dir, children)
                    except (OSError, ValueError) as exc:
                        reply = {"event": "error", "id": request.get("id", 0), "error": str(exc)}
                    if reply is not None:
                        _say(**reply)
                    continue
                try:
                    if "files" in request or "unlink" in request:
                        _put_files(request, files_dir)
                except (OSError, ValueError) as exc:
                    _say(event="error", id=request["id"], error=f"files: {exc}")
                    continue
                try:
                    pid = os.fork()
                except OSError as exc:
                    _say(event="error", id=request["id"], error=f"fork: {exc}")
                    continue
                if pid == 0:
                    _child(request, me, list(children))
                # ProcessLookupError: a zombie already, no group to move. PermissionError (EACCES): a
                # cold pool's child has exec'd already, after its own setpgid(0, 0) (_child), so it
                # leads its group (seen once in CI, with both cores busy).
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.setpgid(pid, pid)  # before replying: the runner may killpg the rank at once
                pidfd = os.pidfd_open(pid)
                children[pidfd] = pid
                poller.register(pidfd, select.POLLIN)
                _say(event="started", id=request["id"], pid=pid, args=[request["module"], *request["args"]])


def _shutdown(children: dict[int, int]) -> int:
    """Stdin closed: SIGKILL every child's process group, reap and report them."""
    for pid in children.values():
        with contextlib.suppress(ProcessLookupError):  # exited already
            os.killpg(pid, signal.SIGKILL)
    for fd, pid in children.items():
        _say(event="exit", pid=pid, exit=os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
        os.close(fd)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] != "--serve" or argv[1:2] == ["--files"] and len(argv) < 3:
        print("usage: python -m emulator.jobs.pool --serve [--files DIR] [MODULE ...]  (started by RankPool)",
              file=sys.stderr)
        return 2
    files_dir, preload = (argv[2], argv[3:]) if argv[1:2] == ["--files"] else (None, argv[1:])
    try:
        return serve(preload, files_dir)
    except BrokenPipeError:  # the owner is gone; the children die with us
        return 0


if __name__ == "__main__":
    sys.exit(main())
