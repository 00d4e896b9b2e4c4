"""What both command lines (``python -m spiderflow``, ``python -m emulator``) share at their boundary.

- :class:`OneLineParser`: a bad command line is one line on stderr (the
  option, the value, the fix) and exit 2, like every other known error.
- argparse ``type=`` factories (:func:`int_in`, :func:`float_in`,
  :func:`name_list`, ...) that refuse non-finite and out-of-range numbers,
  empty or repeated list items, and output paths that cannot be written,
  *before* any work starts. The ranges are documented where each option is
  defined; they are sanity bounds (a value past them is a typo, and values
  like 1e300 overflow as soon as they are multiplied), not limits of the model.
- :func:`dumps`: JSON without NaN/Infinity (a non-finite number becomes null).
- :func:`closed_stdout_exit`: ``... --json | head -1`` ends quietly.
- :func:`run_main`: the top of both CLIs' ``main`` (the two above, and paths that are not UTF-8).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import math
import os
import select
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from spiderflow.errors import ConfigError, SpiderFlowError


class OneLineParser(argparse.ArgumentParser):
    """argparse reporting a bad command line as one line (no usage block) and exit 2."""

    def error(self, message: str):
        self.exit(2, f"error: {message} (see `{self.prog} --help`)\n")


def _shown(text: str, limit: int = 80) -> str:
    """``text`` quoted for a message, cut to ``limit`` characters (a 5,000-digit value stays one short line)."""
    return repr(text if len(text) <= limit else text[:limit - 3] + "...")


def int_in(lo: int, hi: int, what: str = "an integer") -> Callable[[str], int]:
    """argparse type: an integer in lo..hi."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:  # also an integer of more digits than Python converts
            value = None
        if value is None or not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"must be {what} in {lo:,}..{hi:,} (got {_shown(text)})")
        return value
    parse.__name__ = "integer"  # argparse names the type in some messages
    return parse


def power_of_two_in(lo: int, hi: int) -> Callable[[str], int]:
    """argparse type: a power of two in lo..hi."""
    inner = int_in(lo, hi, "a power of two")

    def parse(text: str) -> int:
        value = inner(text)
        if value & (value - 1):
            raise argparse.ArgumentTypeError(f"must be a power of two in {lo:,}..{hi:,} (got {_shown(text)})")
        return value
    return parse


def float_in(lo: float, hi: float, unit: str = "", *, lo_open: bool = True) -> Callable[[str], float]:
    """argparse type: a finite number in (lo, hi] (``lo_open=False``: [lo, hi]); ``unit`` for the message."""
    span = f"{'(' if lo_open else '['}{lo:,.10g}, {hi:,.10g}]" + (f" {unit}" if unit else "")

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value > hi or value < lo or (lo_open and value == lo):
            raise argparse.ArgumentTypeError(f"must be a finite number in {span} (got {_shown(text)})")
        return value
    parse.__name__ = "number"
    return parse


def name_list(known: Iterable[str] | None = None, what: str = "name") -> Callable[[str], list[str]]:
    """argparse type: comma-separated names, none empty or repeated (and each in ``known`` if given)."""
    known = list(known) if known is not None else None

    def parse(text: str) -> list[str]:
        names = [n.strip() for n in text.split(",")]
        if not text.strip() or any(not n for n in names):
            raise argparse.ArgumentTypeError(f"must be comma-separated {what}s with no empty item (got {_shown(text)})")
        seen = set()
        for n in names:
            if known is not None and n not in known:
                raise argparse.ArgumentTypeError(f"unknown {what} {n!r} in {_shown(text)}; known: {', '.join(known)}")
            if n in seen:
                raise argparse.ArgumentTypeError(f"{what} {n!r} appears twice in {_shown(text)}; give each once")
            seen.add(n)
        return names
    return parse


def int_list(lo: int, hi: int) -> Callable[[str], list[int]]:
    """argparse type: comma-separated distinct integers, each in lo..hi."""
    one = int_in(lo, hi)

    def parse(text: str) -> list[int]:
        items = [x.strip() for x in text.split(",")]
        if not text.strip() or any(not x for x in items):
            raise argparse.ArgumentTypeError(f"must be comma-separated integers in {lo:,}..{hi:,} "
                                             f"with no empty item (got {_shown(text)})")
        values = []
        for x in items:
            try:
                values.append(one(x))
            except argparse.ArgumentTypeError:
                raise argparse.ArgumentTypeError(f"must be comma-separated integers in {lo:,}..{hi:,} "
                                                 f"(got {_shown(x)} in {_shown(text)})") from None
        if len(set(values)) != len(values):
            raise argparse.ArgumentTypeError(f"has a value twice (got {_shown(text)}); give each once")
        return values
    return parse


def field_items(*fields: Callable[[str], Any], what: str, ranges: str) -> Callable[[str], list[tuple]]:
    """argparse type: comma-separated items of colon-separated fields, each parsed by its own type in
    ``fields`` (``what``: the item's form, e.g. ``LOAD:SEED``; ``ranges``: what each field takes)."""
    def parse(text: str) -> list[tuple]:
        out = []
        for item in text.split(","):
            parts = item.strip().split(":")
            try:
                if len(parts) != len(fields):
                    raise argparse.ArgumentTypeError(what)
                out.append(tuple(field(x) for field, x in zip(fields, parts)))
            except argparse.ArgumentTypeError:
                raise argparse.ArgumentTypeError(f"must be {what} items, comma-separated, {ranges} "
                                                 f"(got {_shown(item.strip())} in {_shown(text)})") from None
        return out
    return parse


def one_line_errors(work: Callable[[], Any]) -> int:
    """``work()`` as a script's body: 0 once it returns; a known error (:class:`SpiderFlowError`: bad
    input the work found) one ``error:`` line on stderr, and its exit code."""
    try:
        work()
    except SpiderFlowError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


# Shared sanity bounds: a value past them is a typo, not a bigger experiment.
MAX_SEED = 2**32 - 1
MAX_TIME_LIMIT_S = 86_400.0  # one solver decision: a day
MAX_SEARCH_BUDGET = 1_000_000  # genetic trials per decision (the paper's default is 4,900)
seed_arg = int_in(0, MAX_SEED)
time_limit_arg = float_in(0.0, MAX_TIME_LIMIT_S, "seconds")


def _nearest_existing(path: Path) -> Path:
    for p in (path, *path.parents):
        if p.exists():
            return p
    return Path(".")


def _path_checked(check: Callable[[str], None], text: str) -> str:
    try:
        if "\0" in text:
            raise ValueError("a NUL byte")
        check(text)
    except (OSError, ValueError) as exc:  # a name too long, a NUL byte, an unreadable ancestor
        raise argparse.ArgumentTypeError(f"cannot use path {_shown(text)} "
                                         f"({getattr(exc, 'strerror', None) or exc}); give another path") from None
    return text


def _check_dir(text: str) -> None:
    if not text.strip():
        raise argparse.ArgumentTypeError("must be a directory path (got '')")
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a file, not a directory; give a directory (it is made if missing)")
    base = _nearest_existing(path)
    if not base.is_dir():
        raise argparse.ArgumentTypeError(f"cannot make directory {text}: {base} is a file")
    if not os.access(base, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"cannot write in {base} (permission denied); give another directory")


def _check_file(text: str) -> None:
    if not text.strip():
        raise argparse.ArgumentTypeError("must be a file path (got '')")
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory; give a file path")
    parent = path.parent
    if not parent.is_dir():
        what = "is a file" if parent.exists() else "does not exist"
        raise argparse.ArgumentTypeError(f"{parent} {what}; make the directory first or give another path")
    writable = os.access(path, os.W_OK) if path.exists() else os.access(parent, os.W_OK | os.X_OK)
    if not writable:
        raise argparse.ArgumentTypeError(f"cannot write {text} (permission denied); give another path")


def input_file(text: str) -> str:
    """argparse type of an optional input file (--calibration, --wan-events, --capacity-events): an
    empty path is refused, not taken for the option left out (``--wan-events "$UNSET"`` would
    otherwise replay a static WAN without a word); the loader says the rest (missing, a directory)."""
    if not text:
        raise argparse.ArgumentTypeError("must be a file path (got ''); give the file, or leave the option out")
    return text


def input_dir(text: str) -> str:
    """argparse type of a directory to read (``emulator report RUN_DIR``): not empty, and a name the
    OS takes (not too long); what it holds is the reader's to check."""
    if not text:
        raise argparse.ArgumentTypeError("must be a directory path (got '')")
    return _path_checked(lambda t: Path(t).exists(), text)


def output_dir(text: str) -> str:
    """argparse type: a directory that exists or can be made (its nearest existing ancestor is a
    writable directory)."""
    return _path_checked(_check_dir, _not_stdout(text))


def make_output_dir(path: str | Path, flag: str = "--out") -> Path:
    """Make the output directory ``path`` and its parents, or say in one line why the file system
    would not: what :func:`output_dir` cannot foresee at parse time (root may write anywhere by its
    permissions, yet ``/proc`` and read-only mounts still refuse it)."""
    out = Path(path)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"{flag} {_shown(str(path))}: cannot make the directory "
                          f"({exc.strerror or exc}); give another path") from None
    return out


@contextlib.contextmanager
def output_dir_for(path: str | Path | None, flag: str = "--out"):
    """Make the output directory ``path`` (:func:`make_output_dir`) before the work that fills it, so
    that a directory the file system refuses is said before minutes of work, not after; and, when that
    work ends in an error or an interrupt, remove the directories this made while they are still empty:
    input the work refuses leaves nothing behind. ``None``: no directory (yields None)."""
    if path is None:
        yield None
        return
    missing = [d for d in (Path(path), *Path(path).parents) if not d.exists()]  # deepest first
    out = make_output_dir(path, flag)
    try:
        yield out
    except BaseException:
        for d in missing:
            try:
                d.rmdir()
            except OSError:  # not empty (or gone): keep it and its parents
                break
        raise


def output_file(text: str) -> str:
    """argparse type: a file that can be written: not a directory, in an existing writable directory."""
    return _path_checked(_check_file, _not_stdout(text))


def _not_stdout(text: str) -> str:
    """An output path that is not ``-``: many tools take it for standard output, and here it would
    silently make a file or directory of that name."""
    if text == "-":
        raise argparse.ArgumentTypeError("'-' is not standard output here; give a path (./- for one named '-')")
    return text


def write_output_file(path: str, text: str, flag: str = "--out") -> None:
    """Write ``text`` to ``path`` (an :func:`output_file`); what the file system still refuses (a full
    disk, a read-only mount) is one ConfigError line naming ``flag``."""
    try:
        Path(path).write_text(text)
    except OSError as exc:
        raise ConfigError(f"{flag} {path}: cannot write ({exc.strerror or exc})") from None


def json_safe(value: Any) -> Any:
    """``value`` with every NaN or infinite float replaced by None: JSON has no such numbers."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def dumps(value: Any, *, indent: int | None = 2) -> str:
    """Valid JSON of ``value`` (non-finite numbers as null, see :func:`json_safe`)."""
    return json.dumps(json_safe(value), indent=indent, allow_nan=False)


def _stdout_closed() -> bool:
    """True when stdout is a pipe (or socket) whose reader has gone (poll reports an error)."""
    try:
        fd = sys.stdout.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (AttributeError, ValueError, OSError):
        return False


def write_nowhere(*fds: int) -> None:
    """Point each of ``fds`` at /dev/null: what is still written to them has nowhere to go (a closed
    pipe, a full disk, a terminal that hung up) and must not fail."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for fd in fds:
        os.dup2(devnull, fd)
    os.close(devnull)


def closed_stdout_exit(exc: BrokenPipeError) -> int:
    """Exit code 1 after a ``BrokenPipeError`` from a closed stdout (``| head -1``), quietly: stdout
    is pointed at /dev/null so the interpreter's last flush cannot fail again (the recipe of the
    Python docs' "Note on SIGPIPE"). A broken pipe elsewhere (a child's stdin) is a real error and is
    raised again."""
    if not _stdout_closed():
        raise exc
    write_nowhere(sys.stdout.fileno())
    return 1


NO_SPACE = (errno.ENOSPC, errno.EDQUOT)  # a write that found the file system (or the user's quota) full


def no_space_exit(exc: OSError) -> int:
    """Exit code 2 after a write found no space (:data:`NO_SPACE`), with one line naming the file
    where the error names one (a failed write to an open file, standard output too, names none);
    stdout is then pointed at /dev/null, so the interpreter's last flush cannot fail again."""
    what = f"{exc.filename}: cannot write" if exc.filename else "cannot write the output"
    with contextlib.suppress(OSError):  # stderr on the same full disk: nothing more can be said
        print(f"error: {what} ({exc.strerror}); free space there, or write elsewhere, and run again",
              file=sys.stderr)
    write_nowhere(sys.stdout.fileno())
    return 2


def run_main(body: Callable[[list[str] | None], int], argv: list[str] | None) -> int:
    """``body(argv)`` as a CLI's ``main`` runs it: a path that is not UTF-8 (bytes kept as surrogates)
    is printed escaped instead of raising, a closed stdout ends quietly (:func:`closed_stdout_exit`),
    and a write that finds the disk full is one line, not a traceback (:func:`no_space_exit`)."""
    with contextlib.suppress(AttributeError, ValueError):
        sys.stdout.reconfigure(errors="backslashreplace")
    try:
        try:
            return body(argv)
        finally:  # also after --help (SystemExit): a closed stdout is caught here, not at interpreter exit
            sys.stdout.flush()
    except BrokenPipeError as exc:  # `... --json | head -1`
        return closed_stdout_exit(exc)
    except OSError as exc:
        if exc.errno not in NO_SPACE:
            raise
        return no_space_exit(exc)


def add_scheduler_arguments(p: argparse.ArgumentParser) -> None:
    """The shared scheduler's options (:class:`spiderflow.scheduling.SchedulerConfig`), with its
    defaults: the same in ``spiderflow simulate``/``compare`` and ``emulator run``/``compare``."""
    from spiderflow.scheduling import SchedulerConfig

    d = SchedulerConfig()
    p.add_argument("--backfill", action="store_true",
                   help="let a later job start when the queue's head cannot (default: FIFO, the head blocks)")
    p.add_argument("--time-limit", type=time_limit_arg, default=d.time_limit_s, metavar="S",
                   help=f"ILP time limit per decision, seconds, in (0, {MAX_TIME_LIMIT_S:g}] (default %(default)g)")
    p.add_argument("--search-budget", type=int_in(1, MAX_SEARCH_BUDGET), default=d.search_budget, metavar="N",
                   help=f"genetic trials per decision, 1..{MAX_SEARCH_BUDGET:,} (default: the paper's 4,900)")
    p.add_argument("--seed", type=seed_arg, default=d.seed,
                   help=f"planner seed (genetic, tie-breaks), 0..{MAX_SEED} (default %(default)s)")
    p.add_argument("--no-wait", dest="wait", action="store_false",
                   help="SpinSearch starts every job at once when it fits, as the baselines do (default: it "
                        "waits when a placement expected once running jobs end finishes the job sooner, its run "
                        "time weighted by the jobs queued behind it)")
