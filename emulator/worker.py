"""One emulated rank: executes its stage's 1F1B schedule with real torch.distributed traffic.

What a rank stands for: one pipeline-stage replica's tensor-parallel group,
i.e. the ``tp`` GPUs of one (replica, stage, dp-index) of a plan. TP traffic
stays inside a node and is folded into the stage's compute time; everything
that crosses a network is real:

- activations forward and gradients backward between pipeline neighbours of
  the same (replica, dp-index) line, as tensors of the plan's (scaled) byte
  size, with ``isend``/``irecv`` (sends never block the schedule; receives do);
- the gradient sync of the stage, after its last backward: inside one
  cluster a ring all-reduce over the stage's data-parallel group; across
  clusters hierarchical, as the cost model assumes (intra all-reduce, an
  inter-cluster all-reduce of a 1/g shard per local rank, intra all-gather).

Compute is *emulated* by default: the rank sleeps the cost model's predicted
forward / backward time of its stage for one micro-batch. Every operation is
timestamped and written as a JSON line as it happens.

Runs alone (``python -m emulator.worker SPEC.json``) or under the torchrun
contract (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` override
the spec). A collective that hangs hits the process-group timeout; the rank
then exits with status 3 and the reason on its last JSON line.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

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
    activation_bytes: int  # one micro-batch's boundary tensor, already divided by the scale
    grad_bytes: int  # this rank's gradient, already divided by the scale
    prev_rank: int | None
    next_rank: int | None
    # the stage's sync: list of clusters, each a list of ranks (same order on every rank)
    sync_groups: list[list[list[int]]] = field(default_factory=list)  # per stage index
    out: str = "-"
    timeout_s: float = 120.0
    backend: str = "gloo"
    compute: str = "emulated"

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
    """The stage's gradient all-reduce: flat inside one cluster, hierarchical across clusters."""
    clusters = groups.get("clusters") or []
    if sum(len(c) for c in clusters) <= 1:
        return
    n = max(1, spec.grad_bytes // FLOAT_BYTES)
    if len(clusters) == 1:
        dist.all_reduce(torch.ones(n), group=groups["whole"])
        return
    ci = next(i for i, ranks in enumerate(clusters) if spec.rank in ranks)
    local = clusters[ci]
    g, j = len(local), local.index(spec.rank)
    n = -(-n // g) * g  # equal shards
    grad = torch.ones(n)
    if g > 1:  # reduce inside the cluster (an all-reduce where the model has a reduce-scatter)
        dist.all_reduce(grad, group=groups["intra"][ci])
    shard = grad[j * n // g:(j + 1) * n // g].clone()
    if groups["inter"][j] is not None:  # g parallel inter-cluster rings, one shard each
        dist.all_reduce(shard, group=groups["inter"][j])
    if g > 1:
        parts = [torch.empty_like(shard) for _ in range(g)]
        dist.all_gather(parts, shard, group=groups["intra"][ci])


def run(spec: RankSpec) -> int:
    import torch
    import torch.distributed as dist

    if spec.compute != "emulated":
        raise SystemExit(f"{spec.job_id} rank {spec.rank}: compute mode {spec.compute!r} is not "
                         "implemented; use --compute emulated")
    log = Log(spec)
    torch.set_num_threads(1)
    dist.init_process_group(spec.backend, init_method=f"tcp://{spec.master_addr}:{spec.master_port}",
                            rank=spec.rank, world_size=spec.world_size,
                            timeout=dt.timedelta(seconds=spec.timeout_s))
    try:
        groups = _groups(spec, dist)
        n_act = max(1, spec.activation_bytes // FLOAT_BYTES)
        act_out, grad_out = torch.zeros(n_act), torch.zeros(n_act)
        act_in, grad_in = torch.empty(n_act), torch.empty(n_act)
        order = one_f_one_b_order(spec.stage, spec.depth, spec.micro_batches)
        dist.barrier()
        t0 = time.monotonic()
        log.write(event="start", wall=time.time())
        pending = []
        for it in range(spec.iterations):
            for kind, k in order:
                start = time.monotonic() - t0
                if kind == "F":
                    if spec.prev_rank is not None:
                        dist.recv(act_in, src=spec.prev_rank)
                    time.sleep(spec.forward_s)
                    if spec.next_rank is not None:
                        pending.append(dist.isend(act_out, dst=spec.next_rank))
                else:
                    if spec.next_rank is not None:
                        dist.recv(grad_in, src=spec.next_rank)
                    time.sleep(spec.backward_s)
                    if spec.prev_rank is not None:
                        pending.append(dist.isend(grad_out, dst=spec.prev_rank))
                log.write(event="op", kind=kind, it=it, mb=k, start=start, end=time.monotonic() - t0)
            start = time.monotonic() - t0
            sync(spec, groups, torch, dist)
            end = time.monotonic() - t0
            log.write(event="op", kind="S", it=it, mb=-1, start=start, end=end)
            log.write(event="iteration", it=it, end=end)
            for work in pending:
                work.wait()
            pending.clear()
        log.write(event="done", wall=time.time())
        return 0
    except RuntimeError as exc:  # gloo timeouts and peer failures surface as RuntimeError
        log.write(event="failed", reason=str(exc).splitlines()[0][:300])
        return 3
    finally:
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - best effort on the way out
            pass


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    path = argv[0] if argv else os.environ.get("SPIDERFLOW_RANK_SPEC")
    if not path:
        print("usage: python -m emulator.worker SPEC.json (or SPIDERFLOW_RANK_SPEC)", file=sys.stderr)
        return 2
    return run(RankSpec.load(path))


if __name__ == "__main__":
    sys.exit(main())
