"""Calibration parameters that the emulator's fits feed back into the cost model.

File format (JSON, real-equivalent units, i.e. after undoing the emulator's
scale factor)::

    {
      "paths": {"oregon->virginia": {"alpha_s": 0.0341, "beta_gbps": 0.77}, ...},
      "intra": {"oregon": {"alpha_s": 1e-5, "beta_gbps": 180.0}, ...},
      "rings": {"london+virginia": {"alpha_s": 0.039, "beta_gbps": 1.09}, ...},
      "gpu_efficiency": {"a100-80gb": 0.41, ...},
      "per_message_overhead_s": 0.0002,
      "scale": 10, "dilation": 2
    }

Every section is optional. ``scale`` and ``dilation`` record how the
emulator measured the fits (informative; ``emulator run`` refuses a file
fitted at another dilation, whose per-op costs differ). A path entry applies to both directions unless the
reverse direction has its own entry. A ring entry (clusters joined by ``+``,
any order) is a measured ring all-reduce over exactly those clusters: alpha
per ring step, beta per hop; it replaces the ring the path entries would
make (a two-cluster ring loads both directions of its path at once, which a
one-way path measurement does not see).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from spiderflow.errors import ConfigError
from spiderflow.hardware import GPUS


@dataclass(frozen=True, kw_only=True)
class AlphaBeta:
    alpha_s: float
    beta_gbps: float


@dataclass(frozen=True, kw_only=True)
class Calibration:
    paths: dict[tuple[str, str], AlphaBeta] = field(default_factory=dict)
    intra: dict[str, AlphaBeta] = field(default_factory=dict)
    rings: dict[tuple[str, ...], AlphaBeta] = field(default_factory=dict)  # key: sorted cluster names
    gpu_efficiency: dict[str, float] = field(default_factory=dict)
    per_message_overhead_s: float = 0.0
    # the emulator's time dilation the fits were measured under (None: not from the emulator / unknown)
    dilation: float | None = None
    source: str = "<none>"

    def path(self, a: str, b: str) -> AlphaBeta | None:
        return self.paths.get((a, b)) or self.paths.get((b, a))

    def ring(self, clusters) -> AlphaBeta | None:
        return self.rings.get(tuple(sorted(clusters)))


NO_CALIBRATION = Calibration()
_KEYS = {"paths", "intra", "rings", "gpu_efficiency", "per_message_overhead_s", "scale", "dilation", "fitted_from",
         "notes"}


def _positive(source: str, field_path: str, value, *, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(f"{source}: {field_path} must be a {'non-negative' if allow_zero else 'positive'} "
                          f"number (got {value!r})")
    return float(value)


def _alpha_beta(source: str, field_path: str, raw) -> AlphaBeta:
    if not isinstance(raw, dict) or set(raw) - {"alpha_s", "beta_gbps", "r2"} or \
            not {"alpha_s", "beta_gbps"} <= set(raw):
        raise ConfigError(f"{source}: {field_path} must be an object with alpha_s and beta_gbps (got {raw!r})")
    return AlphaBeta(alpha_s=_positive(source, f"{field_path}.alpha_s", raw["alpha_s"], allow_zero=True),
                     beta_gbps=_positive(source, f"{field_path}.beta_gbps", raw["beta_gbps"]))


def load_calibration(path: str | Path) -> Calibration:
    source = str(path)
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read calibration file ({exc.strerror})") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{source}: line {exc.lineno} is not valid JSON ({exc.msg})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: top level must be a JSON object")
    for key in data:
        if key not in _KEYS:
            raise ConfigError(f"{source}: {key} is not a known key; allowed: {', '.join(sorted(_KEYS))}")
    paths = {}
    for key, raw in (data.get("paths") or {}).items():
        ends = key.split("->")
        if len(ends) != 2 or not all(ends):
            raise ConfigError(f"{source}: paths.{key} must be named 'a->b'")
        paths[(ends[0], ends[1])] = _alpha_beta(source, f"paths.{key}", raw)
    intra = {name: _alpha_beta(source, f"intra.{name}", raw) for name, raw in (data.get("intra") or {}).items()}
    rings = {}
    for key, raw in (data.get("rings") or {}).items():
        names = key.split("+")
        if len(names) < 2 or not all(names) or len(set(names)) != len(names):
            raise ConfigError(f"{source}: rings.{key} must name two or more distinct clusters joined by '+'")
        rings[tuple(sorted(names))] = _alpha_beta(source, f"rings.{key}", raw)
    eff = {}
    for gpu, value in (data.get("gpu_efficiency") or {}).items():
        if gpu not in GPUS:
            raise ConfigError(f"{source}: gpu_efficiency.{gpu} names no GPU profile; known: {', '.join(GPUS)}")
        eff[gpu] = _positive(source, f"gpu_efficiency.{gpu}", value)
        if eff[gpu] > 1:
            raise ConfigError(f"{source}: gpu_efficiency.{gpu} must be <= 1 (got {value!r})")
    overhead = _positive(source, "per_message_overhead_s", data.get("per_message_overhead_s", 0.0),
                         allow_zero=True)
    dilation = data.get("dilation")
    if dilation is not None:
        dilation = _positive(source, "dilation", dilation)
    return Calibration(paths=paths, intra=intra, rings=rings, gpu_efficiency=eff, per_message_overhead_s=overhead,
                       dilation=dilation, source=source)
