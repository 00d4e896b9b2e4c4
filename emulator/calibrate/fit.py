"""Alpha-beta fits of microbenchmark times, and the calibration file they make (pure).

Model (docs/calibration.md, DESIGN.md "physics"): a p2p message of n bytes
takes ``alpha + n / beta``; a ring collective over p ranks takes
``steps * alpha + bus_factor * n / beta`` with ``steps = m(p-1)`` and
``bus_factor = m(p-1)/p``, m = 2 for all-reduce and 1 for all-gather and
reduce-scatter (n = the full buffer, as nccl-tests counts it).

Every fit is the straight line ``t = a + n * b`` by least squares weighted
by ``1/t`` (minimise ``sum((a + n b - t)^2 / t)``): sizes span 4 KB to 256 MB,
and plain least squares would fit the large sizes only and leave alpha to
chance; full relative weighting (``1/t^2``) lets the small sizes set beta,
and on the emulated network those are off the line (htb lets a burst of
~100 KB through at veth speed: the intra-cluster fit came out at 13-24
Gbit/s for a 10 Gbit/s link that moved 256 MB at 9.9). A negative ``a`` is
clamped to 0 (the line is refitted through the origin).
Bytes are real-equivalent (before the emulator's scale factor), so a fitted
beta is real-equivalent Gbit/s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from spiderflow.errors import ConfigError, EmulatorError
from spiderflow.costmodel.calibration import MIN_GPU_EFFICIENCY
from spiderflow.costmodel.network import GBPS  # bytes/s per Gbit/s
from spiderflow.inputs import load_json_lines, read_text
from spiderflow.topology import Topology

# op -> m: a ring collective over p ranks takes m(p-1) latency steps and moves
# m(p-1)/p * n bytes over each link. Source: nccl-tests doc/PERFORMANCE.md
# ("bus bandwidth": 2(n-1)/n for AllReduce, (n-1)/n for AllGather and ReduceScatter).
COLLECTIVE_FACTORS: dict[str, int] = {"all_reduce": 2, "all_gather": 1, "reduce_scatter": 1}
OPS = ("p2p", *COLLECTIVE_FACTORS)
GROUP_KEYS = ("topology", "op", "scope", "name", "ranks")
_RECORD_KEYS = (*GROUP_KEYS, "bytes", "time_s")


@dataclass(frozen=True, kw_only=True)
class Fit:
    alpha_s: float  # p2p: per message; collectives: per ring step
    beta_gbps: float  # p2p: path; collectives: per link (bus bandwidth)
    r2: float  # coefficient of determination of the model on the times
    residuals_pct: tuple[float, ...]  # (model - measured) / measured * 100, in input order
    points: int


def _check_op(op: str, ranks: int) -> None:
    if op not in OPS:
        raise ValueError(f"op must be one of {', '.join(OPS)} (got {op!r})")
    if op != "p2p" and (isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 2):
        raise ValueError(f"{op} needs an integer ranks >= 2 (got {ranks!r})")


def bus_factor(op: str, ranks: int) -> float:
    """busbw / algbw for ``op`` over ``ranks`` ranks: the bytes per link per buffer byte."""
    _check_op(op, ranks)
    return 1.0 if op == "p2p" else COLLECTIVE_FACTORS[op] * (ranks - 1) / ranks


def latency_steps(op: str, ranks: int) -> int:
    """How many alphas one ``op`` over ``ranks`` ranks pays (ring algorithm)."""
    _check_op(op, ranks)
    return 1 if op == "p2p" else COLLECTIVE_FACTORS[op] * (ranks - 1)


def algbw_gbps(size_bytes: float, time_s: float) -> float:
    """nccl-tests' algbw = size / time, in Gbit/s (nccl-tests prints GB/s: divide by 8)."""
    return size_bytes / time_s / GBPS


def busbw_gbps(op: str, ranks: int, size_bytes: float, time_s: float) -> float:
    """nccl-tests' busbw = algbw * bus factor, in Gbit/s; comparable to a fitted beta_gbps."""
    return algbw_gbps(size_bytes, time_s) * bus_factor(op, ranks)


def _line(sizes: np.ndarray, times: np.ndarray) -> tuple[float, float]:
    """(a, b) of ``t = a + n*b`` minimising sum((a + n*b - t)^2 / t), with a >= 0 (weighting: module docstring)."""
    w = np.sqrt(1.0 / times)
    design = np.column_stack([w, sizes * w])
    (a, b), *_ = np.linalg.lstsq(design, times * w, rcond=None)
    if a < 0:  # clamp: refit through the origin
        a, b = 0.0, float(np.sum(sizes) / np.sum(sizes * sizes / times))
    return float(a), float(b)


def _as_arrays(sizes_bytes: Sequence[float], times_s: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    sizes = np.asarray(sizes_bytes, dtype=float)
    times = np.asarray(times_s, dtype=float)
    if sizes.ndim != 1 or sizes.shape != times.shape:
        raise ValueError(f"sizes_bytes and times_s must be two lists of one length "
                         f"(got {sizes.shape} and {times.shape})")
    for label, values in (("sizes_bytes", sizes), ("times_s", times)):
        bad = values[~(np.isfinite(values) & (values > 0))]
        if bad.size:
            raise ValueError(f"{label} must all be positive and finite (got {bad[0]!r})")
    distinct = len(np.unique(sizes))
    if distinct < 2:
        raise ValueError(f"need at least 2 distinct sizes to fit alpha and beta (got {distinct})")
    return sizes, times


def _fit(op: str, ranks: int, sizes_bytes: Sequence[float], times_s: Sequence[float]) -> Fit:
    sizes, times = _as_arrays(sizes_bytes, times_s)
    a, b = _line(sizes, times)
    if not b > 0:
        raise ValueError(f"times do not grow with size (slope {b:.3g} s/byte over sizes "
                         f"{int(sizes.min())}..{int(sizes.max())}); measure larger sizes")
    model = a + sizes * b
    ss_res = float(np.sum((times - model) ** 2))
    ss_tot = float(np.sum((times - times.mean()) ** 2))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else 0.0
    return Fit(alpha_s=a / latency_steps(op, ranks),
               beta_gbps=bus_factor(op, ranks) / b / GBPS,
               r2=r2,
               residuals_pct=tuple(float(x) for x in (model - times) / times * 100),
               points=len(times))


def fit_alpha_beta(sizes_bytes: Sequence[float], times_s: Sequence[float]) -> Fit:
    """p2p: ``t = alpha + n / beta``; alpha >= 0; ValueError for fewer than 2 distinct sizes."""
    return _fit("p2p", 1, sizes_bytes, times_s)


def fit_collective(op: str, ranks: int, sizes_bytes: Sequence[float], times_s: Sequence[float]) -> Fit:
    """Per-step alpha and per-link beta of a ring ``op`` over ``ranks`` ranks (p2p: as fit_alpha_beta)."""
    _check_op(op, ranks)
    return _fit(op, ranks, sizes_bytes, times_s)


def _group_key(record: dict, index: int, source: str) -> tuple:
    missing = [key for key in _RECORD_KEYS if record.get(key) is None]
    if missing:
        raise EmulatorError(f"{source}: record {index + 1} has no {', '.join(missing)}; every "
                            f"microbenchmark line needs {', '.join(_RECORD_KEYS)}")
    return tuple(record[key] for key in GROUP_KEYS)


def group_records(records: list[dict], *, source: str = "microbench records") -> dict[tuple, list[dict]]:
    """Microbenchmark records (not op "compute") by (topology, op, scope, name, ranks), in first-seen order."""
    groups: dict[tuple, list[dict]] = {}
    for index, record in enumerate(records):
        if record.get("op") != "compute":
            groups.setdefault(_group_key(record, index, source), []).append(record)
    return groups


def fit_records(records: list[dict], *, source: str = "microbench records") -> list[dict]:
    """One fit dict per group with at least 2 sizes; a group whose fit fails keeps its reason in "error"."""
    out = []
    for key, group in group_records(records, source=source).items():
        sizes = [r["bytes"] for r in group]
        if len(set(sizes)) < 2:
            continue
        row = dict(zip(GROUP_KEYS, key), clusters=group[0].get("clusters") or [],
                   alpha_s=None, beta_gbps=None, r2=None, residuals_pct=[], points=len(group),
                   configured_alpha_s=group[0].get("configured_alpha_s"),
                   configured_beta_gbps=group[0].get("configured_beta_gbps"), error=None)
        try:
            fit = fit_collective(key[1], key[4], sizes, [r["time_s"] for r in group])
        except ValueError as exc:
            row["error"] = str(exc)
        else:
            row.update(alpha_s=fit.alpha_s, beta_gbps=fit.beta_gbps, r2=fit.r2,
                       residuals_pct=list(fit.residuals_pct))
        out.append(row)
    return out


def fit_compute(records: list[dict]) -> dict[str, float]:
    """Per device, the GPU efficiency that makes predicted compute times match the measured ones.

    Predicted time = FLOPs / (peak * e_profile), measured = FLOPs / (peak * e_true), so
    ``e_true = sum(e_profile * predicted) / sum(measured)`` (one scale over all of a device's stages).
    """
    num: dict[str, float] = {}
    den: dict[str, float] = {}
    for r in records:
        if r.get("op") == "compute" and r.get("time_s") and r.get("predicted_s") and r.get("efficiency"):
            num[r["device"]] = num.get(r["device"], 0.0) + r["efficiency"] * r["predicted_s"]
            den[r["device"]] = den.get(r["device"], 0.0) + r["time_s"]
    return {device: num[device] / den[device] for device in num}


NOTES = ("Fitted by emulator.calibrate.fit from microbenchmarks over the emulated network: "
         "alpha_s = per-message latency (one-way delay + overhead; rings: per ring step), "
         "beta_gbps = bandwidth (rings: per hop, both directions loaded) in real-equivalent "
         "Gbit/s (bytes before the emulator's scale factor), r2 on times; "
         "least squares weighted by 1/t, alpha clamped at >= 0.")


def _entries(fits: list[dict], op: str, scope: str) -> dict[str, dict]:
    out: dict[str, dict] = {}
    seen: dict[str, str] = {}
    for f in fits:
        if f["op"] != op or f["scope"] != scope or f.get("error") or f.get("beta_gbps") is None:
            continue
        if f["name"] in out:
            raise ValueError(f"{scope} {op} {f['name']} was fitted in {seen[f['name']]} and in "
                             f"{f['topology']}; a calibration file describes one network: pass the "
                             "fits of one topology")
        seen[f["name"]] = f["topology"]
        out[f["name"]] = {"alpha_s": f["alpha_s"], "beta_gbps": f["beta_gbps"], "r2": f["r2"]}
    return out


def calibration_json(fits: list[dict], *, scale: float, fitted_from: str,
                     compute: dict[str, float] | None = None, dilation: float = 1.0,
                     topology: Topology | None = None) -> dict:
    """The calibration file (spiderflow.costmodel.calibration): p2p fits per path and per cluster,
    two-cluster ring all-reduce fits (per-step alpha, per-hop beta) per pair, compute efficiencies
    (clamped to [MIN_GPU_EFFICIENCY, 1], the range the loader accepts), and the ``topology`` the
    fits were made on (name and ``Topology.sha256``), which the planner checks before applying it."""
    out = {"paths": _entries(fits, "p2p", "wan"),
           "intra": _entries(fits, "p2p", "intra"),
           "rings": _entries(fits, "all_reduce", "pair"),
           "gpu_efficiency": {device: min(1.0, max(MIN_GPU_EFFICIENCY, e)) for device, e in (compute or {}).items()},
           "per_message_overhead_s": 0.0,  # the fitted alpha already contains it
           "scale": scale,
           "dilation": dilation,
           "fitted_from": fitted_from,
           "notes": NOTES}
    if topology is not None:
        out["topology"] = {"name": topology.name, "sha256": topology.sha256}
    return out


def read_numbered_jsonl(path: str | Path) -> list[tuple[int, dict]]:
    """A run directory's JSON-lines file, strictly, each object with its line number: read and parsed
    as every input of the project is (:mod:`spiderflow.inputs`: size, UTF-8, duplicate keys,
    NaN/Infinity, nesting); one EmulatorError line naming the file and line otherwise."""
    try:
        return load_json_lines(read_text(path, what="JSON-lines file"), str(path))
    except ConfigError as exc:
        raise EmulatorError(str(exc)) from None


def read_jsonl(path: str | Path) -> list[dict]:
    """:func:`read_numbered_jsonl`'s objects."""
    return [record for _, record in read_numbered_jsonl(path)]
