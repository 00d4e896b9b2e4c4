"""A parallel plan: pipeline stages over clusters, replicas, micro-batching.

Shape (Megatron-style, as DESIGN.md's vocabulary):

- ``replicas``: one or more pipelines that train the same layers on different
  data (data parallelism *across* clusters). All replicas split the layers at
  the same boundaries; replica ``r`` stage ``i`` may sit in any cluster.
- each :class:`Stage`: a cluster, a layer range ``[layer_start, layer_end)``
  and a tensor-parallel degree ``tp`` (inside one node).
- ``dp``: data-parallel width *inside* each stage: a stage holds ``tp * dp``
  GPUs of its cluster, and each of its ``dp`` groups processes micro-batches of
  ``micro_batch_size`` sequences.
- Global batch = ``len(replicas) * dp * micro_batch_size * micro_batches``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, replace

from spiderflow.workload import Job


def placement_text(gpus: Iterable[tuple[str, int]]) -> str:
    """GPUs per cluster as records, reports and reasons write them: ``a:8 b:4`` (the ``placement``
    column of the simulator's and the emulator's job CSVs)."""
    return " ".join(f"{c}:{g}" for c, g in gpus)


@dataclass(frozen=True, kw_only=True)
class Stage:
    cluster: str
    layer_start: int
    layer_end: int
    tp: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.layer_start < self.layer_end:
            raise ValueError(f"stage layers must satisfy 0 <= start < end "
                             f"(got {self.layer_start}..{self.layer_end})")
        if self.tp < 1:
            raise ValueError(f"tp must be >= 1 (got {self.tp})")

    @property
    def layers(self) -> int:
        return self.layer_end - self.layer_start


@dataclass(frozen=True, kw_only=True)
class Plan:
    job: Job
    replicas: tuple[tuple[Stage, ...], ...]
    dp: int
    micro_batch_size: int
    micro_batches: int
    recompute: bool = False
    zero1: bool = False

    def __post_init__(self) -> None:
        if not self.replicas or not all(self.replicas):
            raise ValueError("a plan needs at least one replica with at least one stage")
        bounds = [tuple((s.layer_start, s.layer_end) for s in rep) for rep in self.replicas]
        if any(b != bounds[0] for b in bounds):
            raise ValueError("all replicas must split the layers at the same boundaries")
        layers = self.job.spec.layers
        first = bounds[0]
        if first[0][0] != 0 or first[-1][1] != layers or any(
                a[1] != b[0] for a, b in zip(first, first[1:])):
            raise ValueError(f"stages must cover layers 0..{layers} contiguously (got {first})")
        for name in ("dp", "micro_batch_size", "micro_batches"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1 (got {getattr(self, name)})")

    def __hash__(self) -> int:
        # the fields' hash, as the dataclass's own, made once: the cost model's memos key on plans, and
        # a plan's hash is a Python call per stage and one for its job (1% of a 10,000-job replay)
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.job, self.replicas, self.dp, self.micro_batch_size, self.micro_batches,
                      self.recompute, self.zero1))
            object.__setattr__(self, "_hash", h)
        return h

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}  # string hashes differ per process

    def for_job(self, job: Job) -> Plan:
        """``dataclasses.replace(self, job=job)`` for a job of as many layers (a memoised plan handed to
        another job of the same shape), without checking the stages again: of the job, only its
        layers take part in those checks."""
        if job.spec.layers != self.job.spec.layers:
            return replace(self, job=job)  # (checks, and says what does not fit)
        out = object.__new__(Plan)
        out.__dict__.update(self.__dict__)
        out.__dict__["job"] = job
        out.__dict__.pop("_hash", None)
        return out

    @property
    def stages(self) -> tuple[Stage, ...]:
        """The first replica's stages (all replicas share the layer split)."""
        return self.replicas[0]

    @property
    def depth(self) -> int:
        return len(self.replicas[0])

    @property
    def data_parallel(self) -> int:
        """Total data-parallel degree: replicas x in-stage DP."""
        return len(self.replicas) * self.dp

    @property
    def global_batch(self) -> int:
        return self.data_parallel * self.micro_batch_size * self.micro_batches

    @property
    def placement(self) -> dict[str, int]:
        """GPUs taken per cluster, in first-use order."""
        used: Counter[str] = Counter()
        for rep in self.replicas:
            for s in rep:
                used[s.cluster] += s.tp * self.dp
        return dict(used)

    @property
    def gpus(self) -> int:
        return sum(self.placement.values())

    def describe(self) -> list[dict]:
        return [
            {"replica": r, "stage": i, "cluster": s.cluster, "layers": [s.layer_start, s.layer_end],
             "tp": s.tp, "dp": self.dp, "gpus": s.tp * self.dp}
            for r, rep in enumerate(self.replicas) for i, s in enumerate(rep)
        ]
