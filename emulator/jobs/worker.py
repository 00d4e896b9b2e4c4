"""One emulated rank: executes its stage's 1F1B schedule with real torch.distributed traffic.

What a rank stands for: GPUs of one pipeline stage of one replica that sit in
one cluster. ``emulator run`` gives each (replica, stage) of a plan one rank
and folds the stage's ``dp`` in-stage data-parallel groups and their ``tp``
GPUs into it (:mod:`emulator.jobs.launch`, docs/emulator-run.md); the spec's byte
counts and sleeps say what the rank stands for. TP traffic stays inside a
node and is folded into the stage's compute time; what crosses a network is real:

- activations forward and gradients backward between pipeline neighbours,
  as tensors of the spec's (scaled) byte sizes (``activation_bytes`` with the
  next stage, ``prev_activation_bytes`` with the previous one), sent with
  ``isend`` (sends never block the schedule); every receive of an iteration
  is posted up front (gloo's send/recv is a rendezvous, see ``_post_receives``);
- the gradient sync of the stage, after its last backward: first
  ``sync_intra_s`` slept (the intra-cluster part the rank stands for), then,
  over ``sync_groups``: inside one cluster a ring all-reduce over the stage's
  group; across clusters hierarchical, as the cost model assumes (intra
  all-reduce, an inter-cluster all-reduce of a 1/g shard per local rank,
  intra all-gather).

Compute is *emulated* by default: the rank sleeps the cost model's predicted
forward / backward time of its stage for one micro-batch, on a GPU stream's
clock (:class:`GpuStream`): an op that need not wait for its input starts
when the previous one ended, not when the rank's Python got round to it, so
the host's own cost per op does not add up over an iteration. With ``compute =
"real"`` it runs a CPU proxy of its stage instead (:mod:`emulator.jobs.compute`,
shape in ``proxy``, built before the start barrier): GPT blocks sized so that
their forward FLOPs are ``forward_s`` times the machine's probed matmul rate,
backward by autograd. The tensors sent and received stay the real-size
(scaled) boundary tensors; the proxy's own input is a local tensor. Every operation is
timestamped and written as a JSON line as it happens; the ``start`` line
carries ``mono``, the CLOCK_MONOTONIC origin of the rank's times, so ranks'
times can be put on one clock.

Runs alone (``python -m emulator.jobs.worker SPEC.json``) or under the torchrun
contract (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` override
the spec). A collective that hangs hits the process-group timeout; the rank
then exits with status 3 and the reason on its last JSON line. The JSON lines
file is created (empty) just before the rank goes to its rendezvous: the
runner reads a missing file as "never reached its process group".

Tests only: ``SPIDERFLOW_TEST_FAULT=KIND:JOB:RANK`` makes that one rank
misbehave before its rendezvous (:func:`inject_test_fault`); nothing else sets it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from emulator.jobs.collectives import ring_all_reduce
from emulator.jobs.compute import COMPUTE_MODES, ProxyShape, StageProxy
from spiderflow.costmodel.schedule import one_f_one_b_order

FLOAT_BYTES = 4


@dataclass(frozen=True, kw_only=True)
class RankSpec:
    job_id: str
    rank: int
    world_size: int
    master_addr: str
    master_port: int
    stage: int
    depth: int
    micro_batches: int
    iterations: int
    forward_s: float
    backward_s: float
    activation_bytes: int  # one micro-batch's boundary tensor to the next stage, already divided by the scale
    grad_bytes: int  # this rank's gradient, already divided by the scale
    prev_rank: int | None
    next_rank: int | None
    # the stage's sync: list of clusters, each a list of ranks (same order on every rank)
    sync_groups: list[list[list[int]]] = field(default_factory=list)  # per stage index
    out: str = "-"
    timeout_s: float = 120.0
    backend: str = "gloo"
    compute: str = "emulated"
    # boundary tensor to/from the previous stage (None: same as activation_bytes)
    prev_activation_bytes: int | None = None
    # the intra-cluster part of the gradient sync, slept before the real (WAN) part
    sync_intra_s: float = 0.0
    # compute "real": the stage's proxy (the fields of emulator.jobs.compute.ProxyShape); None when emulated
    proxy: dict | None = None
    recompute: bool = False  # the plan recomputes activations (the proxy's forward keeps no graph)
    replica: int = 0  # the pipeline replica this rank's stage belongs to

    @staticmethod
    def load(path: str) -> "RankSpec":
        data = json.loads(Path(path).read_text())
        env = os.environ
        for key, name in (("rank", "RANK"), ("world_size", "WORLD_SIZE"), ("master_port", "MASTER_PORT")):
            if name in env:
                data[key] = int(env[name])
        if "MASTER_ADDR" in env:
            data["master_addr"] = env["MASTER_ADDR"]
        return RankSpec(**data)

    def dump(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(dataclasses.asdict(self)))


def nccl_env(interface: str, host_id: str) -> dict[str, str]:
    """Environment that keeps NCCL on TCP sockets over the emulated interface (DESIGN.md)."""
    return {"NCCL_SOCKET_IFNAME": interface, "NCCL_IB_DISABLE": "1", "NCCL_P2P_DISABLE": "1",
            "NCCL_SHM_DISABLE": "1", "NCCL_HOSTID": host_id}


def rank_env(interface: str, host_id: str, backend: str) -> dict[str, str]:
    """Per-host environment for a rank: gloo (or NCCL) bound to the host's emulated interface."""
    env = {"GLOO_SOCKET_IFNAME": interface, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    if backend == "nccl":
        env.update(nccl_env(interface, host_id))
    return env


@contextlib.contextmanager
def process_group(dist, backend: str, *, master: str, rank: int, world_size: int, timeout_s: float):
    """Join the job's process group (``master`` is ``addr:port``); leave it on the way out, best effort."""
    dist.init_process_group(backend, init_method=f"tcp://{master}", rank=rank, world_size=world_size,
                            timeout=dt.timedelta(seconds=timeout_s))
    try:
        yield
    finally:
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - best effort on the way out
            pass


def failure_reason(exc: BaseException) -> str:
    """A gloo error (timeout, dead peer) as one line for a rank's ``failed`` JSON line."""
    return str(exc).splitlines()[0][:300]


class Log:
    def __init__(self, spec: RankSpec) -> None:
        self.spec = spec
        self.fh = sys.stdout if spec.out == "-" else open(spec.out, "a", buffering=1)

    def write(self, **record) -> None:
        record.update(job_id=self.spec.job_id, rank=self.spec.rank, stage=self.spec.stage)
        self.fh.write(json.dumps(record) + "\n")


def _groups(spec: RankSpec, dist):
    """Create every sync group in the same order on every rank (torch.distributed requires it)."""
    mine = {}
    for stage, clusters in enumerate(spec.sync_groups):
        flat = sorted(r for ranks in clusters for r in ranks)
        whole = dist.new_group(flat) if len(flat) > 1 else None
        intra = [dist.new_group(sorted(ranks)) if len(ranks) > 1 else None for ranks in clusters]
        width = max((len(r) for r in clusters), default=0)
        inter = []
        for j in range(width):
            members = sorted(ranks[j] for ranks in clusters if j < len(ranks))
            inter.append(dist.new_group(members) if len(members) > 1 else None)
        if stage == spec.stage:
            mine = {"clusters": clusters, "whole": whole, "intra": intra, "inter": inter}
    return mine


def sync(spec: RankSpec, groups: dict, torch, dist) -> None:
    """The stage's gradient all-reduce: a ring inside one cluster, hierarchical across clusters
    (rings of :func:`emulator.jobs.collectives.ring_all_reduce`, the algorithm the cost model prices)."""
    clusters = groups.get("clusters") or []
    if sum(len(c) for c in clusters) <= 1:
        return
    n = max(1, spec.grad_bytes // FLOAT_BYTES)
    if len(clusters) == 1:
        ranks = sorted(clusters[0])
        ring_all_reduce(torch.ones(-(-n // len(ranks)) * len(ranks)), ranks, spec.rank, dist, groups["whole"])
        return
    ci = next(i for i, ranks in enumerate(clusters) if spec.rank in ranks)
    local = clusters[ci]
    g, j = len(local), local.index(spec.rank)
    members = sorted(ranks[j] for ranks in clusters if j < len(ranks))  # this rank's inter-cluster ring
    n = -(-n // (g * len(members))) * g * len(members)  # equal shards, each divisible by its ring
    grad = torch.ones(n)
    if g > 1:  # reduce inside the cluster (an all-reduce where the model has a reduce-scatter)
        ring_all_reduce(grad, sorted(local), spec.rank, dist, groups["intra"][ci])
    shard = grad[j * n // g:(j + 1) * n // g].clone()
    if groups["inter"][j] is not None:  # g parallel inter-cluster rings, one shard each
        ring_all_reduce(shard, members, spec.rank, dist, groups["inter"][j])
    if g > 1:
        parts = [torch.empty_like(shard) for _ in range(g)]
        dist.all_gather(parts, shard, group=groups["intra"][ci])


def _post_receives(spec: RankSpec, dist, act_in, grad_in) -> dict[str, list]:
    """Post every receive of one iteration (micro-batch k into row k), in micro-batch order.

    gloo's send/recv is a rendezvous: a send's payload moves only once the
    receiver has posted the matching recv. Posting them when the schedule
    reaches each op would add a one-way latency to every transfer and stop
    transfers from overlapping the receiver's compute; the cost model's p2p
    (alpha + n / beta from the moment the sender is done) assumes neither.
    Each peer's messages match in order, so row k gets micro-batch k.
    """
    out: dict[str, list] = {"F": [], "B": []}
    if spec.prev_rank is not None:
        out["F"] = [dist.irecv(act_in[k], src=spec.prev_rank) for k in range(spec.micro_batches)]
    if spec.next_rank is not None:
        out["B"] = [dist.irecv(grad_in[k], src=spec.next_rank) for k in range(spec.micro_batches)]
    return out


class GpuStream:
    """Emulated GPU time on the rank's one compute stream, slept to absolute ends.

    A GPU runs the kernels its host queued back to back: the host's own work between
    them (Python, the JSON lines, a late wake-up) delays the stream only when the stream
    has caught up with it. So an op starts when the stream is free (the previous op's end),
    or, when it had to wait for its input or the stream stood idle (a collective, the start
    barrier), when the wait ended; it ends its predicted time later, and the rank sleeps
    until then (the default timer slack is cut to 1 us by tight_timers). A host late by
    more than an op sleeps less on the next ones, as a GPU with queued work would run on.
    """

    def __init__(self) -> None:
        self.free_at = time.monotonic()

    def reset(self) -> None:
        """The next op starts from now: the rank waited outside the stream (a collective, its
        sends), or its host ran the op itself (real compute)."""
        self.free_at = time.monotonic()

    def run(self, seconds: float, *, waited: bool = False) -> None:
        """``seconds`` of GPU time; ``waited``: the op's input arrived only now."""
        begin = time.monotonic() if waited else self.free_at
        self.free_at = begin + max(0.0, seconds)
        left = self.free_at - time.monotonic()
        if left > 0:
            time.sleep(left)


def _wait(work) -> bool:
    """Wait for a posted receive; True if its data had not arrived yet (waited for even if it had:
    a receive that failed raises here)."""
    arrived = work.is_completed()
    work.wait()
    return not arrived


STARTUP_NICE_ENV = "SPIDERFLOW_STARTUP_NICE"
FAULT_ENV = "SPIDERFLOW_TEST_FAULT"
FAULTS = ("hang", "flood")


def inject_test_fault(spec: RankSpec) -> None:
    """Fault injection for the emulator's own tests (tests/emulator/test_run_root.py); a no-op unless
    ``SPIDERFLOW_TEST_FAULT=KIND:JOB:RANK`` names this rank.

    ``hang``: sleep for ever before the rendezvous (a rank that never joins its process group);
    ``flood``: write to stdout (the rank's log) without end. Runs once torch is imported, before the
    rank's JSON lines file and its rendezvous.
    """
    fault = os.environ.get(FAULT_ENV)
    if not fault:
        return
    kind, _, where = fault.partition(":")
    job_id, _, rank = where.rpartition(":")
    if kind not in FAULTS or not job_id or not rank.isdigit():
        raise SystemExit(f"{FAULT_ENV} must be KIND:JOB:RANK with KIND one of {', '.join(FAULTS)} (got {fault!r})")
    if (job_id, int(rank)) != (spec.job_id, spec.rank):
        return
    line = f"{spec.job_id} rank {spec.rank}: {FAULT_ENV}={fault}\n" * 64
    while True:
        if kind == "hang":
            time.sleep(3600)
        else:
            sys.stdout.write(line)


def _leave_startup_nice() -> None:
    """Back to priority 0 once every rank joined, if started niced with STARTUP_NICE_ENV=1.

    The runner starts ranks under ``nice`` so that many ranks importing torch at once on a
    small machine do not delay the schedules of jobs already running; lowering the nice
    value again needs root, which the emulator has (otherwise the rank stays niced).
    """
    if os.environ.get(STARTUP_NICE_ENV) == "1" and os.getpriority(os.PRIO_PROCESS, 0) > 0:
        try:
            os.setpriority(os.PRIO_PROCESS, 0, 0)
        except PermissionError:
            pass


def tight_timers() -> None:
    """Timer slack 1 us instead of the default 50 us: emulated compute sleeps many short
    intervals (a few ms per micro-batch), and the slack is added to every one of them."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(29, 1000, 0, 0, 0)  # PR_SET_TIMERSLACK, in ns
    except (OSError, AttributeError):
        pass


def run(spec: RankSpec) -> int:
    import torch
    import torch.distributed as dist

    if spec.compute not in COMPUTE_MODES:
        raise SystemExit(f"{spec.job_id} rank {spec.rank}: compute must be one of {', '.join(COMPUTE_MODES)} "
                         f"(got {spec.compute!r})")
    if spec.compute == "real" and not spec.proxy:
        raise SystemExit(f"{spec.job_id} rank {spec.rank}: compute 'real' needs the spec's proxy shape")
    inject_test_fault(spec)
    torch.set_num_threads(1)
    tight_timers()
    proxy = None
    if spec.compute == "real":  # built (and run once) before the start barrier: not measured
        # process-wide, so set here in the rank's own process: accumulated tiny gradients must not
        # fall onto the slow denormal path
        torch.set_flush_denormal(True)
        proxy = StageProxy(ProxyShape(**spec.proxy), recompute=spec.recompute, seed=spec.rank)
        proxy.warm_up()
    log = Log(spec)  # creates the JSON lines file: this rank goes to its rendezvous now
    with process_group(dist, spec.backend, master=f"{spec.master_addr}:{spec.master_port}", rank=spec.rank,
                       world_size=spec.world_size, timeout_s=spec.timeout_s):
        return _run_schedule(spec, log, proxy, torch, dist)


def _run_schedule(spec: RankSpec, log: Log, proxy, torch, dist) -> int:
    try:
        groups = _groups(spec, dist)
        n_next = max(1, spec.activation_bytes // FLOAT_BYTES)
        prev_bytes = spec.activation_bytes if spec.prev_activation_bytes is None else spec.prev_activation_bytes
        n_prev = max(1, prev_bytes // FLOAT_BYTES)
        m = spec.micro_batches
        act_out, grad_out = torch.zeros(n_next), torch.zeros(n_prev)
        # One receive buffer per micro-batch: every receive of an iteration is posted up front
        # (see _post_receives), so each transfer starts as soon as its sender is ready.
        act_in = torch.empty(m, n_prev) if spec.prev_rank is not None else None
        grad_in = torch.empty(m, n_next) if spec.next_rank is not None else None
        order = one_f_one_b_order(spec.stage, spec.depth, spec.micro_batches)
        dist.barrier()
        _leave_startup_nice()
        t0 = time.monotonic()
        extra = {"proxy": spec.proxy} if proxy is not None else {}
        log.write(event="start", wall=time.time(), mono=t0, **extra)  # mono: CLOCK_MONOTONIC, shared by all ranks
        pending = []
        recvs = _post_receives(spec, dist, act_in, grad_in)
        stream = GpuStream()
        for it in range(spec.iterations):
            for kind, k in order:
                start = time.monotonic() - t0
                if kind == "F":
                    waited = spec.prev_rank is not None and _wait(recvs["F"][k])
                    if proxy is not None:
                        proxy.forward(k)
                        stream.reset()
                    else:
                        stream.run(spec.forward_s, waited=waited)
                    if spec.next_rank is not None:
                        pending.append(dist.isend(act_out, dst=spec.next_rank))
                else:
                    waited = spec.next_rank is not None and _wait(recvs["B"][k])
                    if proxy is not None:
                        proxy.backward(k)
                        stream.reset()
                    else:
                        stream.run(spec.backward_s, waited=waited)
                    if spec.prev_rank is not None:
                        pending.append(dist.isend(grad_out, dst=spec.prev_rank))
                log.write(event="op", kind=kind, it=it, mb=k, start=start, end=time.monotonic() - t0)
            if it + 1 < spec.iterations:  # this iteration's buffers are consumed: post the next one's
                recvs = _post_receives(spec, dist, act_in, grad_in)
            start = time.monotonic() - t0
            stream.run(spec.sync_intra_s)
            sync(spec, groups, torch, dist)
            end = time.monotonic() - t0
            log.write(event="op", kind="S", it=it, mb=-1, start=start, end=end)
            log.write(event="iteration", it=it, end=end)
            for work in pending:
                work.wait()
            pending.clear()
            stream.reset()
            if proxy is not None:  # an optimizer step would consume and clear the gradients here
                proxy.zero_grad()
        log.write(event="done", wall=time.time())
        return 0
    except RuntimeError as exc:  # gloo timeouts and peer failures surface as RuntimeError
        log.write(event="failed", reason=failure_reason(exc))
        return 3


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    path = argv[0] if argv else os.environ.get("SPIDERFLOW_RANK_SPEC")
    if not path:
        print("usage: python -m emulator.jobs.worker SPEC.json (or SPIDERFLOW_RANK_SPEC)", file=sys.stderr)
        return 2
    return run(RankSpec.load(path))


if __name__ == "__main__":
    sys.exit(main())
