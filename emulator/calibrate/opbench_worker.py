"""One microbenchmark rank inside an emulated host: runs every test of its spec with real collectives.

``python -m emulator.calibrate.opbench_worker SPEC.json``. The spec (written by
:mod:`emulator.calibrate.opbench`) names this rank, the rendezvous and the
tests, in the same order on every rank. For each test this rank takes part
in, and for each size, it runs ``warmup + samples`` repetitions and writes one
JSON line per repetition with CLOCK_MONOTONIC times (all ranks share the
machine's clock, so the orchestrator can combine them):

- ``p2p``: the receiver posts its ``irecv`` first, the pair meets at a
  barrier, then the sender stamps ``t_start`` and sends; the receiver stamps
  ``t_end`` when the message is in. ``t_end - t_start`` is a one-way transfer
  from a ready sender to a ready receiver, what the cost model's
  ``alpha + n / beta`` prices (gloo send/recv is a rendezvous; the worker of
  ``emulator run`` pre-posts its receives for the same reason).
- collectives: ``all_reduce`` is the ring of :mod:`emulator.jobs.collectives`
  (what the worker's gradient sync runs), ``all_gather`` and
  ``reduce_scatter`` are gloo's own. For each the
  group meets at a barrier; each rank stamps ``t_start`` and ``t_end`` around
  the call. The orchestrator takes ``max(t_end) - max(t_start)``: from the last
  rank's arrival to the last rank's finish.

Tests run one at a time: every rank meets at a world barrier before each.
Sizes run largest first. A training job's connections carry a stream of
messages, so TCP's congestion and receive windows are open when a message
starts; smallest first would time each mid-size message while its own bytes
still grow those windows (up to 40% over ``alpha + n / beta`` on long-RTT
paths), and the fitted alpha would absorb it. The largest size's warm-up
repetition opens the windows; the emulator keeps them open across idle gaps
(``tcp_slow_start_after_idle=0``, :func:`emulator.jobs.replay.warm_tcp`).

Tensors are float32 of ``bytes / scale / 4`` elements (at least one): the
sizes in the spec are real-equivalent, the wire carries them divided by the
emulation's scale, as the shaped bandwidths are.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from emulator.jobs.collectives import ring_all_reduce
from emulator.jobs.worker import failure_reason, process_group

FLOAT_BYTES = 4
PEER_FAILED = 3  # a gloo error: a timeout, or a peer that went (its own exit tells why)
UNWRITABLE = 100  # 100 + errno (0: not known): this rank could not write its lines (a full disk: 128); its log
# is most likely on the same disk, so the exit code is what says so


class _Unwritable(Exception):
    """A write of this rank's JSON lines failed (``errno`` of the OSError)."""

    def __init__(self, errno: int) -> None:
        super().__init__(errno)
        self.errno = errno


def unwritable_errno(code: int | None) -> int | None:
    """The errno a rank's exit ``code`` carries when it could not write its lines, else None."""
    return code - UNWRITABLE if code is not None and UNWRITABLE <= code <= 255 else None


def elements(nbytes: float, scale: float, ranks: int = 1) -> int:
    """Float32 elements of a real-equivalent size on the wire, a multiple of ``ranks`` (at least ``ranks``)."""
    n = max(1, int(round(nbytes / scale / FLOAT_BYTES)))
    return max(ranks, -(-n // ranks) * ranks)


def _p2p(test: dict, me: int, n: int, torch, dist, pair) -> dict:
    src, dst = test["ranks"]
    buf = torch.ones(n)
    if me == dst:
        work = dist.irecv(buf, src=src)
        dist.barrier(group=pair)
        work.wait()
        return {"t_end": time.monotonic()}
    dist.barrier(group=pair)
    t0 = time.monotonic()
    dist.send(buf, dst=dst)
    return {"t_start": t0}


def _collective(test: dict, me: int, n: int, torch, dist, group) -> dict:
    p = len(test["ranks"])
    op = test["op"]
    if op == "all_reduce":
        buf = torch.ones(n)
        dist.barrier(group=group)
        t0 = time.monotonic()
        ring_all_reduce(buf, sorted(test["ranks"]), me, dist, group)
    elif op == "all_gather":  # n: the gathered size, as nccl-tests counts it
        shard, parts = torch.ones(n // p), [torch.empty(n // p) for _ in range(p)]
        dist.barrier(group=group)
        t0 = time.monotonic()
        dist.all_gather(parts, shard, group=group)
    elif op == "reduce_scatter":  # n: the input size
        out, parts = torch.empty(n // p), list(torch.ones(n).chunk(p))
        dist.barrier(group=group)
        t0 = time.monotonic()
        dist.reduce_scatter(out, parts, group=group)
    else:
        raise ValueError(f"unknown op {op!r}")
    return {"t_start": t0, "t_end": time.monotonic()}


def run(spec: dict) -> int:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    me, scale = spec["rank"], spec["scale"]
    fh = open(spec["out"], "a", buffering=1)

    def out(line: dict) -> None:
        try:
            fh.write(json.dumps(line) + "\n")  # line-buffered: the line reaches the file here
        except OSError as exc:
            raise _Unwritable(exc.errno or 0) from exc

    try:
        with process_group(dist, "gloo", master=f"{spec['master_addr']}:{spec['master_port']}", rank=me,
                           world_size=spec["world_size"], timeout_s=spec["timeout_s"]):
            return _run_tests(spec, me, scale, out, torch, dist)
    except _Unwritable as exc:
        return UNWRITABLE + min(exc.errno, 255 - UNWRITABLE)
    finally:
        with contextlib.suppress(OSError):  # only the part of a line a full disk refused is left to flush
            fh.close()


def _run_tests(spec: dict, me: int, scale: float, out: Callable[[dict], None], torch, dist) -> int:
    try:
        # every rank creates every group, in test order (torch.distributed requires it)
        groups = [dist.new_group(sorted(t["ranks"])) for t in spec["tests"]]
        dist.barrier()
        for test, group in zip(spec["tests"], groups):
            # one test at a time: ranks outside a test would otherwise start the next disjoint one,
            # whose flows share routes (and the machine's cores) with it (paper8: a 1.15 Gbit/s path
            # fitted at 0.67)
            dist.barrier()
            if me not in test["ranks"]:
                continue
            p = 1 if test["op"] == "p2p" else len(test["ranks"])
            for size in sorted(test["sizes"], reverse=True):  # largest first: see the module docstring
                n = elements(size, scale, p)
                reps = test["warmup"] + (test["samples_large"] if size >= test["large_bytes"] else test["samples"])
                for rep in range(reps):
                    stamp = (_p2p(test, me, n, torch, dist, group) if test["op"] == "p2p"
                             else _collective(test, me, n, torch, dist, group))
                    out({"test": test["id"], "bytes": size, "count": n, "rep": rep, "warmup": rep < test["warmup"],
                         "rank": me, **stamp})
        dist.barrier()
        out({"event": "done", "rank": me})
        return 0
    except RuntimeError as exc:  # gloo timeouts and peer failures
        out({"event": "failed", "rank": me, "reason": failure_reason(exc)})
        return PEER_FAILED


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m emulator.calibrate.opbench_worker SPEC.json", file=sys.stderr)
        return 2
    return run(json.loads(Path(argv[0]).read_text()))


if __name__ == "__main__":
    sys.exit(main())
