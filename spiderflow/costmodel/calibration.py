"""Calibration parameters that the emulator's fits feed back into the cost model.

File format (JSON, real-equivalent units, i.e. after undoing the emulator's
scale factor)::

    {
      "paths": {"oregon->virginia": {"alpha_s": 0.0341, "beta_gbps": 0.77}, ...},
      "intra": {"oregon": {"alpha_s": 1e-5, "beta_gbps": 180.0}, ...},
      "rings": {"london+virginia": {"alpha_s": 0.039, "beta_gbps": 1.09}, ...},
      "gpu_efficiency": {"a100-80gb": 0.41, ...},
      "per_message_overhead_s": 0.0002,
      "scale": 10, "dilation": 2,
      "topology": {"name": "paper8", "sha256": "3f1c..."}
    }

Every section is optional. ``scale`` and ``dilation`` record how the
emulator measured the fits (informative; ``emulator run`` refuses a file
fitted at another dilation, whose per-op costs differ). ``topology`` records
the network the fits were made on (its ``Topology.sha256``: clusters and
links, not the file's bytes); :func:`check_calibration_applies` refuses the
file on another network. Ranges: ``alpha_s`` and ``per_message_overhead_s``
in [0, 3600] s, ``beta_gbps`` in [1e-6, 1e5] Gbit/s, ``gpu_efficiency`` in
[0.001, 1] (a smaller one makes compute times absurd and the solver fail).
A path entry applies to both directions unless the
reverse direction has its own entry. A ring entry (clusters joined by ``+``,
any order) is a measured ring all-reduce over exactly those clusters: alpha
per ring step, beta per hop; it replaces the ring the path entries would
make (a two-cluster ring loads both directions of its path at once, which a
one-way path measurement does not see).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from spiderflow.errors import ConfigError
from spiderflow.hardware import GPUS
from spiderflow.inputs import finite, load_json, read_text
from spiderflow.topology.model import Topology

MAX_ALPHA_S = 3600.0  # an hour per message: beyond it a value is a unit mistake
MIN_BETA_GBPS = 1e-6  # 1 kbit/s, as the topology loader's floor: times are bytes / beta
MAX_BETA_GBPS = 1e5  # 100 Tbit/s
MIN_GPU_EFFICIENCY = 1e-3  # below it predicted compute times are absurd and the ILP solver fails
MAX_FACTOR = 1e6  # scale and dilation
SHA256 = re.compile(r"^[0-9a-f]{64}$")


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
    # the network the fits were made on ("topology" in the file; None: an older file that does not say)
    topology_name: str | None = None
    topology_sha256: str | None = None
    source: str = "<none>"

    def path(self, a: str, b: str) -> AlphaBeta | None:
        return self.paths.get((a, b)) or self.paths.get((b, a))

    def ring(self, clusters) -> AlphaBeta | None:
        return self.rings.get(tuple(sorted(clusters)))


NO_CALIBRATION = Calibration()
_KEYS = {"paths", "intra", "rings", "gpu_efficiency", "per_message_overhead_s", "scale", "dilation", "fitted_from",
         "notes", "topology"}


def _number(source: str, field_path: str, value, *, low: float, high: float, allow_low: bool) -> float:
    """A finite number in [low, high] (``(low, high]`` unless ``allow_low``)."""
    if not finite(value) or value > high or value < low or (value == low and not allow_low):
        shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
        kind = ("non-negative " if allow_low else "positive ") if low == 0 else ""
        raise ConfigError(f"{source}: {field_path} must be a {kind}number in {'[' if allow_low else '('}{low:g}, "
                          f"{high:g}] (got {shown})")
    return float(value)


def _positive(source: str, field_path: str, value, *, allow_zero: bool = False, high: float = MAX_ALPHA_S) -> float:
    return _number(source, field_path, value, low=0.0, high=high, allow_low=allow_zero)


def _section(source: str, data: dict, key: str) -> dict:
    value = data.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{source}: {key} must be a JSON object keyed by name (got {type(value).__name__})")
    return value


def _alpha_beta(source: str, field_path: str, raw) -> AlphaBeta:
    if not isinstance(raw, dict) or set(raw) - {"alpha_s", "beta_gbps", "r2"} or \
            not {"alpha_s", "beta_gbps"} <= set(raw):
        raise ConfigError(f"{source}: {field_path} must be an object with alpha_s and beta_gbps "
                          f"(got {str(raw)[:60]})")
    return AlphaBeta(alpha_s=_positive(source, f"{field_path}.alpha_s", raw["alpha_s"], allow_zero=True),
                     beta_gbps=_number(source, f"{field_path}.beta_gbps", raw["beta_gbps"], low=MIN_BETA_GBPS,
                                       high=MAX_BETA_GBPS, allow_low=True))


def _topology(source: str, raw) -> tuple[str | None, str | None]:
    if raw is None:
        return None, None
    if not isinstance(raw, dict) or set(raw) - {"name", "sha256"}:
        raise ConfigError(f"{source}: topology must be an object with name and sha256 (got {str(raw)[:60]})")
    name, digest = raw.get("name"), raw.get("sha256")
    if name is not None and not isinstance(name, str):
        raise ConfigError(f"{source}: topology.name must be a string (got {type(name).__name__})")
    if digest is not None and not (isinstance(digest, str) and SHA256.match(digest)):
        raise ConfigError(f"{source}: topology.sha256 must be 64 lowercase hex digits (got {str(digest)[:70]})")
    return name, digest


def load_calibration(path: str | Path) -> Calibration:
    """Read and check a calibration file (format: module docstring); one ConfigError line otherwise."""
    source = str(path)
    data = load_json(read_text(path, what="calibration file"), source)
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: top level must be a JSON object")
    for key in data:
        if key not in _KEYS:
            raise ConfigError(f"{source}: {key} is not a known key; allowed: {', '.join(sorted(_KEYS))}")
    for key in ("fitted_from", "notes"):
        if data.get(key) is not None and not isinstance(data[key], str):
            raise ConfigError(f"{source}: {key} must be a string (got {type(data[key]).__name__})")
    paths = {}
    for key, raw in _section(source, data, "paths").items():
        ends = key.split("->")
        if len(ends) != 2 or not all(ends):
            raise ConfigError(f"{source}: paths.{key} must be named 'a->b'")
        paths[(ends[0], ends[1])] = _alpha_beta(source, f"paths.{key}", raw)
    intra = {name: _alpha_beta(source, f"intra.{name}", raw) for name, raw in _section(source, data, "intra").items()}
    rings = {}
    for key, raw in _section(source, data, "rings").items():
        names = key.split("+")
        if len(names) < 2 or not all(names) or len(set(names)) != len(names):
            raise ConfigError(f"{source}: rings.{key} must name two or more distinct clusters joined by '+'")
        rings[tuple(sorted(names))] = _alpha_beta(source, f"rings.{key}", raw)
    eff = {}
    for gpu, value in _section(source, data, "gpu_efficiency").items():
        if gpu not in GPUS:
            raise ConfigError(f"{source}: gpu_efficiency.{gpu} names no GPU profile; known: {', '.join(GPUS)}")
        eff[gpu] = _number(source, f"gpu_efficiency.{gpu}", value, low=MIN_GPU_EFFICIENCY, high=1.0,
                           allow_low=True)
    overhead = _positive(source, "per_message_overhead_s", data.get("per_message_overhead_s", 0.0),
                         allow_zero=True)
    dilation = data.get("dilation")
    if dilation is not None:
        dilation = _positive(source, "dilation", dilation, high=MAX_FACTOR)
    if data.get("scale") is not None:
        _positive(source, "scale", data["scale"], high=MAX_FACTOR)
    name, digest = _topology(source, data.get("topology"))
    return Calibration(paths=paths, intra=intra, rings=rings, gpu_efficiency=eff, per_message_overhead_s=overhead,
                       dilation=dilation, topology_name=name, topology_sha256=digest, source=source)


def check_calibration_applies(cal: Calibration, topo: Topology, *, allow_other_topology: bool = False) -> None:
    """Refuse ``cal`` on ``topo`` (ConfigError) when:

    - a ``paths``/``intra``/``rings`` entry names a cluster ``topo`` does not have: always, since the
      entry would silently apply to nothing;
    - the file records another network: its ``topology.sha256`` differs from ``topo.sha256`` (or, with no
      hash recorded, its ``topology.name`` differs from ``topo.name``), unless ``allow_other_topology``
      (CLI: ``--calibration-any-topology``).

    Files written before ``topology`` was recorded (e.g. the committed benchmarks/results ones) pass
    the second check: there is nothing to compare.
    """
    known = set(topo.names)
    entries = [(f"paths.{a}->{b}", (a, b)) for a, b in cal.paths] + \
              [(f"intra.{c}", (c,)) for c in cal.intra] + \
              [(f"rings.{'+'.join(names)}", names) for names in cal.rings]
    for field_path, names in entries:
        missing = [n for n in names if n not in known]
        if missing:
            raise ConfigError(f"{cal.source}: {field_path} names cluster {missing[0]!r}, which {topo.source} does "
                              f"not have (clusters: {', '.join(topo.names)}); use the calibration file fitted on "
                              "this topology (`emulator calibrate --topology ...`)")
    if allow_other_topology:
        return
    if cal.topology_sha256 is not None:
        other = cal.topology_sha256 != topo.sha256
    else:
        other = cal.topology_name is not None and cal.topology_name != topo.name
    if other:
        recorded = ", ".join(([repr(cal.topology_name)] if cal.topology_name is not None else []) +
                             ([f"sha256 {cal.topology_sha256[:12]}"] if cal.topology_sha256 else []))
        raise ConfigError(f"{cal.source}: fitted on topology {recorded}, not on {topo.source} ({topo.name!r}, "
                          f"sha256 {topo.sha256[:12]}); calibrate this topology, or pass "
                          "--calibration-any-topology to apply it anyway")
