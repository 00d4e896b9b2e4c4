"""``report.md`` and its figures from a run directory of ``emulator calibrate`` (no root).

Reads config.json (required), microbench.jsonl, plans.jsonl and timelines/
(each optional), re-fits the microbenchmarks (so the report follows from
the measurements alone), writes fits.json, figures/*.png (and .pdf) and report.md.
Format of the run directory: docs/calibration.md. Figures use matplotlib's
object API (``Figure``), which renders PNGs with Agg and touches no global
backend state.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from emulator.calibrate.fit import (algbw_gbps, bus_factor, busbw_gbps, fit_compute, fit_records,
                                    group_records, latency_steps)
from emulator.calibrate.rundir import Run, load_run
from emulator.net.hoststeal import noticeable, stolen_sentence
from spiderflow.costmodel.network import GBPS
from spiderflow.errors import EmulatorError

KIND_COLOURS = {"F": "#4C72B0", "B": "#DD8452", "S": "#55A868"}
KIND_NAMES = {"F": "forward", "B": "backward", "S": "gradient sync"}
WAIT_COLOUR = "#EEEEEE"
TRANSFER_COLOURS = {"F": "#1F3A68", "B": "#8C3B0C"}
TRANSFER_NAMES = {"F": "activation", "B": "gradient"}
MAX_FIGURE_IN = 21.0  # inches: 2,310 px at the PNGs' 110 dpi
DASH = "–"


# ---- numbers ---------------------------------------------------------------------------------------------

def _positive(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def measured_plans(plans: list[dict]) -> list[dict]:
    """Plans that count in the MAPE: status ok, with a measurement (rundir.check_plan has made sure
    that such a plan has both predictions, and that every time is positive)."""
    return [p for p in plans if p["status"] == "ok" and p.get("measured_s") is not None]


def error_pct(predicted_s: float, measured_s: float) -> float:
    return (predicted_s - measured_s) / measured_s * 100


def unmeasured_plans(plans: list[dict]) -> list[dict]:
    """Plans with status ok that measured nothing (a run whose rank logs held no complete iteration
    after warm-up): not in the MAPE, and the MAPE line says how many."""
    return [p for p in plans if p["status"] == "ok" and p.get("measured_s") is None]


def mape_line(plans: list[dict], *, scale: float, mechanism: str, dilation: float = 1.0) -> str:
    ok = measured_plans(plans)
    unmeasured = len(unmeasured_plans(plans))
    knobs = f"scale {scale:g}, dilation {dilation:g}, delay by {mechanism}" + (
        f"; {unmeasured} plan{'s' * (unmeasured > 1)} with status ok measured nothing" if unmeasured else "")
    if not ok:
        return f"MAPE: no measured plans ({len(plans)} in plans.jsonl; {knobs})"
    mape = {k: sum(abs(error_pct(p[k], p["measured_s"])) for p in ok) / len(ok)
            for k in ("predicted_uncalibrated_s", "predicted_calibrated_s")}
    return (f"MAPE uncalibrated {mape['predicted_uncalibrated_s']:.1f}% -> calibrated "
            f"{mape['predicted_calibrated_s']:.1f}% over {len(ok)} plans ({knobs})")


def mape_summary(run: Run | Path) -> str:
    """The report's first line, from config.json and plans.jsonl (of ``run``, or of the run directory
    it names)."""
    run = _loaded(run)
    return mape_line(run.plans, scale=run.scale, mechanism=run.mechanism, dilation=run.dilation)


def _fmt(value, spec: str = ".3g") -> str:
    return DASH if value is None else format(value, spec)


def _ratio(fitted, configured) -> str:
    return f"{fitted / configured:.2f}" if fitted is not None and _positive(configured) else DASH


def _worst(fit: dict) -> str:
    return _fmt(max((abs(r) for r in fit["residuals_pct"]), default=None), ".1f")


def _label(fit: dict, many_topologies: bool) -> str:
    return f"{fit['name']} ({Path(fit['topology']).stem})" if many_topologies else fit["name"]


def _model_s(fit: dict, size_bytes: float) -> float:
    op, ranks = fit["op"], fit["ranks"]
    return latency_steps(op, ranks) * fit["alpha_s"] + bus_factor(op, ranks) * size_bytes / (fit["beta_gbps"] * GBPS)


def _cell(text) -> str:
    return str(text).replace("|", "\\|")


def _table(header: list[str], rows: list[list]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows] + [""]


_PARAM_HEADER = ["latency configured (ms)", "latency fitted (ms)", "fitted/configured",
                 "bandwidth configured (Gbit/s)", "bandwidth fitted (Gbit/s)", "fitted/configured", "R²",
                 "worst \\|residual\\| %", "points", "fit error"]


def _param_cells(f: dict) -> list:
    """Configured vs fitted alpha (ms) and beta (Gbit/s) of one fit: the cells under _PARAM_HEADER."""
    ms = lambda s: None if s is None else s * 1e3  # noqa: E731
    return [_fmt(ms(f["configured_alpha_s"])), _fmt(ms(f["alpha_s"])), _ratio(f["alpha_s"], f["configured_alpha_s"]),
            _fmt(f["configured_beta_gbps"]), _fmt(f["beta_gbps"]), _ratio(f["beta_gbps"], f["configured_beta_gbps"]),
            _fmt(f["r2"], ".4f"), _worst(f), f["points"], f["error"] or ""]


# ---- sections --------------------------------------------------------------------------------------------

def _links_section(fits: list[dict], groups: dict, many: bool, figures: Path) -> list[str]:
    p2p = [f for f in fits if f["op"] == "p2p"]
    out = ["## Links (p2p)", ""]
    if not p2p:
        return out + ["No p2p measurements with 2 or more sizes.", ""]
    out += _table(["link", "scope", *_PARAM_HEADER],
                  [[_label(f, many), f["scope"], *_param_cells(f)] for f in p2p])
    _links_figure(p2p, many, figures / "links.png")
    out += ["![configured vs fitted bandwidth and latency per link](figures/links.png)", ""]
    out += [line for f in p2p if not f["error"] for line in _size_details(f, groups)]
    return out


def _collectives_section(fits: list[dict], groups: dict, many: bool) -> list[str]:
    coll = [f for f in fits if f["op"] != "p2p"]
    out = ["## Collectives", ""]
    if not coll:
        return out + ["No collective measurements with 2 or more sizes.", ""]
    out += ["Effective ring parameters, latency = alpha per step and bandwidth = beta per link, from "
            "`t = steps * alpha + busfactor * n / beta` (all_reduce: steps 2(p-1), busfactor 2(p-1)/p; "
            "all_gather, reduce_scatter: (p-1) and (p-1)/p). The `pair` rings (all-reduce over two "
            "clusters, both directions of the path loaded) go into the calibration file's `rings`: "
            "the cost model's data-parallel sync over those two clusters uses them. A per-step latency "
            "near 1.5x the one-way delay is gloo's rendezvous: the first send waits for the peer's "
            "ready message, so a two-step ring pays three one-way delays.", ""]
    out += _table(["op", "clusters", "scope", "ranks", *_PARAM_HEADER], [
        [f["op"], _label(f, many), f["scope"], f["ranks"], *_param_cells(f)] for f in coll])
    return out + [line for f in coll if not f["error"] for line in _size_details(f, groups)]


def _size_details(fit: dict, groups: dict) -> list[str]:
    """nccl-tests-style rows of one fitted group, in a collapsible block."""
    records = groups[tuple(fit[k] for k in ("topology", "op", "scope", "name", "ranks"))]
    rows = []
    for r, resid in sorted(zip(records, fit["residuals_pct"]), key=lambda x: x[0]["bytes"]):
        t = r["time_s"]
        rows.append([r["bytes"], r.get("count", DASH), r.get("type", DASH), f"{t * 1e6:.1f}",
                     f"{algbw_gbps(r['bytes'], t):.3f}", f"{busbw_gbps(fit['op'], fit['ranks'], r['bytes'], t):.3f}",
                     f"{t * (1 + resid / 100) * 1e6:.1f}", f"{resid:+.2f}"])
    title = f"{_group_title(fit)}: per-size measurements"
    return ([f"<details><summary>{title}</summary>", ""]
            + _table(["size (B)", "count", "type", "time (us)", "algbw (Gbit/s)", "busbw (Gbit/s)",
                      "model (us)", "residual %"], rows) + ["</details>", ""])


def _group_title(fit: dict) -> str:
    return f"{fit['op']} {fit['name']}" + ("" if fit["op"] == "p2p" else f", {fit['ranks']} ranks")


def _compute_section(records: list[dict]) -> list[str]:
    fitted = fit_compute(records)
    if not fitted:
        return []
    rows = []
    for device, eff in fitted.items():
        mine = [r for r in records if r.get("op") == "compute" and r.get("device") == device]
        rows.append([device, _fmt(mine[0].get("efficiency")), f"{eff:.3f}", len(mine)])
    return ["## Compute", ""] + _table(["device", "profile efficiency", "fitted efficiency", "stages"], rows)


def _plans_section(plans: list[dict], figures: Path) -> list[str]:
    out = ["## Plans", ""]
    if not plans:
        return out + ["No plans.jsonl (or it is empty).", ""]
    rows = []
    for p in plans:
        meas, spread = p.get("measured_s"), p.get("measured_spread_s")
        measured = DASH if meas is None else f"{meas:.3f}" + (f" [{spread[0]:.3f}, {spread[1]:.3f}]" if spread else "")
        err = lambda k: DASH if meas is None or p.get(k) is None else f"{error_pct(p[k], meas):+.1f}"  # noqa: E731
        status = p["status"] + (f": {p['reason']}" if p.get("reason") else "")
        if p["status"] == "ok" and meas is None:
            status += " (nothing measured: not in the MAPE)"
        rows.append([p.get("plan_id"), Path(str(p.get("topology"))).stem, p.get("shape"), p.get("description"),
                     _fmt(p.get("predicted_uncalibrated_s"), ".3f"), _fmt(p.get("predicted_calibrated_s"), ".3f"),
                     measured, err("predicted_uncalibrated_s"), err("predicted_calibrated_s"), status])
    out += _table(["plan", "topology", "shape", "description", "predicted uncalibrated (s)",
                   "predicted calibrated (s)", "measured (s) [spread]", "error uncalibrated %",
                   "error calibrated %", "status"], rows)
    if measured_plans(plans):
        _plans_figure(measured_plans(plans), figures / "plans_scatter.png")
        out += ["![predicted vs measured iteration time per plan](figures/plans_scatter.png)", ""]
    return out


def pick_timeline(run: Run) -> str | None:
    """The plan whose timeline is drawn: the first pipeline plan with one, else the first with one."""
    ordered = [p.get("plan_id") for p in run.plans if p.get("plan_id") in run.timelines]
    ordered += [pid for pid in run.timelines if pid not in ordered]
    shapes = {p.get("plan_id"): p.get("shape") for p in run.plans}
    pipelines = [pid for pid in ordered if shapes.get(pid) == "pipeline"]
    return (pipelines or ordered or [None])[0]


def _model_name(timeline: dict) -> str:
    """Which cost model drew the predicted timeline: its optional "calibrated" flag says."""
    flag = timeline.get("predicted", {}).get("calibrated")
    return "cost model" if flag is None else ("calibrated" if flag else "uncalibrated") + " cost model"


def _timeline_section(run: Run, figures: Path) -> list[str]:
    plan_id = pick_timeline(run)
    if plan_id is None:
        return []
    model = _model_name(run.timelines[plan_id])
    _timeline_figure(run.timelines[plan_id], model, figures / "timeline.png")
    return ["## Timeline", "",
            f"Plan {plan_id}, one iteration: measured ops per rank (top) and the {model}'s "
            "1F1B schedule per stage (bottom), on one time axis. A measured op that receives (a forward "
            "after stage 0, a backward before the last stage) is drawn as its wait for the input (hatched) "
            "followed by its compute, taken as the stage's predicted op time (what emulated compute "
            "sleeps); arrows are the activation and gradient transfers, from the sender's op end to the "
            "receiver's compute start (measured: when the receive completed; predicted: when the stage "
            "started the op, at or after the arrival). Every figure is also written as PDF beside its PNG.", "",
            f"![measured vs predicted schedule of plan {plan_id}](figures/timeline.png)", ""]


def _how_to_read(run: Run, out: Path) -> list[str]:
    return ["## How to read this", "",
            f"Bytes and bandwidths are real-equivalent: the emulator divided every byte count and bandwidth by "
            f"the scale factor {run.scale:g} on the wire, and times are real-equivalent seconds (wall seconds "
            f"divided by the time dilation, {run.dilation:g} here). Each link and collective "
            "is fitted with `t = alpha + n / beta` (collectives: per ring step and per link), by least squares "
            "weighted by 1/t with alpha >= 0; a residual is (model - measured) / measured. "
            "A fitted/configured bandwidth well below 1 means the emulated link (or TCP over it) does not "
            "reach its configured rate; a fitted latency above the configured one is per-message overhead. "
            "algbw = size / time and busbw = algbw x bus factor as in nccl-tests, but in Gbit/s "
            "(nccl-tests prints GB/s, 8x smaller numbers), so a large-size busbw approaches the fitted beta. "
            "Plan errors are (predicted - measured) / measured; the MAPE counts plans with status ok. "
            "Method and formats: docs/calibration.md.", "",
            "Regenerate this report (no root needed):", "",
            f"    python -m emulator report {run.path}" + ("" if out == run.path else f" --out {out}"), ""]


# ---- figures ---------------------------------------------------------------------------------------------

def _log_if_wide(ax, values: list[float], axis: str = "y") -> None:
    values = [v for v in values if v is not None and v > 0]
    if values and max(values) / min(values) > 10:
        (ax.set_yscale if axis == "y" else ax.set_xscale)("log")


def _links_figure(p2p: list[dict], many: bool, path: Path) -> None:
    """Configured vs fitted bandwidth and latency per p2p fit: one row per link (horizontal bars), so
    the figure grows in height, not width, with the number of links (capped at MAX_FIGURE_IN)."""
    labels = [_label(f, many) + (" (intra)" if f["scope"] == "intra" else "") for f in p2p]
    fig = Figure(figsize=(10.0, min(MAX_FIGURE_IN, max(4.0, 1.6 + 0.24 * len(p2p)))), layout="constrained")
    axes = fig.subplots(1, 2, sharey=True)
    y = list(range(len(p2p)))
    for ax, key, unit, factor, title in ((axes[0], "beta_gbps", "Gbit/s", 1, "bandwidth"),
                                         (axes[1], "alpha_s", "ms", 1e3, "latency")):
        conf = [f[f"configured_{key}"] * factor if f[f"configured_{key}"] is not None else math.nan for f in p2p]
        fitd = [f[key] * factor if f[key] is not None else math.nan for f in p2p]
        ax.barh([i - 0.2 for i in y], conf, 0.4, label="configured", color="#BBBBBB", edgecolor="black",
                linewidth=0.5)
        bars = ax.barh([i + 0.2 for i in y], fitd, 0.4, label="fitted", color="#4C72B0")
        ax.bar_label(bars, labels=[DASH if math.isnan(v) else f"{v:.3g}" for v in fitd], fontsize=7, padding=2)
        _log_if_wide(ax, [v for v in conf + fitd if not math.isnan(v)], axis="x")
        ax.set_xlabel(f"{title} ({unit})")
        ax.set_title(f"p2p {title}: configured vs fitted", fontsize=10)
        ax.grid(True, axis="x", which="both", alpha=0.3)
        ax.margins(x=0.12)
    axes[0].set_yticks(y, labels, fontsize=8)
    axes[0].set_ylim(len(p2p) - 0.5, -0.5)
    fig.legend(handles=axes[1].get_legend_handles_labels()[0], fontsize=8, loc="outside upper right", ncols=2,
               frameon=False)
    fig.suptitle("Links (real-equivalent units)")
    _save(fig, path)


def _plans_figure(plans: list[dict], path: Path) -> None:
    fig = Figure(figsize=(6.4, 5.6), layout="constrained")
    ax = fig.subplots()
    meas = [p["measured_s"] for p in plans]
    unc = [p["predicted_uncalibrated_s"] for p in plans]
    cal = [p["predicted_calibrated_s"] for p in plans]
    lo, hi = min(meas + unc + cal) * 0.8, max(meas + unc + cal) * 1.2
    ax.plot([lo, hi], [lo, hi], color="black", lw=1, label="predicted = measured")
    ax.fill_between([lo, hi], [lo * 0.9, hi * 0.9], [lo * 1.1, hi * 1.1], color="#DDDDDD", label="±10 %")
    ax.scatter(meas, unc, marker="o", facecolors="none", edgecolors="#C44E52", s=55, label="uncalibrated")
    ax.scatter(meas, cal, marker="^", color="#4C72B0", s=55, label="calibrated")
    for p in plans:
        ax.annotate(p["plan_id"], (p["measured_s"], p["predicted_calibrated_s"]), textcoords="offset points",
                    xytext=(5, -10), fontsize=8)
    if hi / lo > 10:
        ax.set_xscale("log")
        ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured iteration time (s)")
    ax.set_ylabel("predicted iteration time (s)")
    ax.set_title("Plans: cost model vs emulator")
    ax.legend(fontsize=8, loc="upper left")
    _save(fig, path)


def _compute_s(predicted: list[list], stage, kind: str) -> float | None:
    """The predicted duration of one ``kind`` op of ``stage`` (what emulated compute sleeps), or None."""
    if not isinstance(stage, int) or not 0 <= stage < len(predicted):
        return None
    spans = sorted(op[3] - op[2] for op in predicted[stage] if op[0] == kind)
    return spans[len(spans) // 2] if spans else None


def _split_waits(ops: list, stage, stages: int, predicted: list[list]) -> list[tuple]:
    """A measured rank's ops as (kind, micro, start, end, compute_start): an op that receives
    (a forward past stage 0, a backward before the last stage) first waits for its input, then
    computes for the stage's predicted op time (measured ops of the rank that did not wait are as
    long, within per-op overhead); without a prediction the rank's shortest op of that kind is used.
    The input arrived at compute_start."""
    out = []
    for kind, micro, start, end in ops:
        receives = isinstance(stage, int) and ((kind == "F" and stage > 0) or (kind == "B" and stage < stages - 1))
        compute = _compute_s(predicted, stage, kind)
        if compute is None:
            compute = min((o[3] - o[2] for o in ops if o[0] == kind), default=end - start)
        begin = max(start, end - compute) if receives else start
        out.append((kind, micro, start, end, begin))
    return out


def _gantt(ax, rows: list[tuple[str, list]], title: str) -> None:
    """One bar row per rank or stage: compute (by kind), waiting for input (hatched), and the
    transfers between rows as arrows from the sender's op end to the receiver's compute start."""
    span = max((op[3] for _, ops in rows for op in ops), default=1.0) or 1.0
    for y, (_, ops) in enumerate(rows):
        for kind, micro, start, end, begin in ops:
            if begin > start:
                ax.broken_barh([(start, begin - start)], (y - 0.3, 0.6), facecolors=WAIT_COLOUR,
                               edgecolors="#999999", linewidth=0.4, hatch="////")
            ax.broken_barh([(begin, end - begin)], (y - 0.3, 0.6), facecolors=KIND_COLOURS.get(kind, "grey"),
                           edgecolors="white", linewidth=0.5)
            if end - begin > 0.025 * span and kind != "S":
                ax.text((begin + end) / 2, y, str(micro), ha="center", va="center", fontsize=7, color="white")
    # transfers: F k from the row of stage s to the row of stage s+1, B k from s+1 to s (same replica)
    where = {}
    for y, (key, ops) in enumerate(rows):
        for kind, micro, start, end, begin in ops:
            where[(key, kind, micro)] = (y, end, begin)
    for y, (key, ops) in enumerate(rows):
        replica, stage = key
        for kind, micro, _start, end, _begin in ops:
            if kind not in ("F", "B"):
                continue
            target = where.get(((replica, stage + (1 if kind == "F" else -1)), kind, micro))
            if target is None:
                continue
            ty, _, arrived = target
            sign = 1 if ty > y else -1
            ax.annotate("", xy=(arrived, ty - 0.3 * sign), xytext=(end, y + 0.3 * sign),
                        arrowprops={"arrowstyle": "->", "color": TRANSFER_COLOURS[kind], "lw": 0.8,
                                    "shrinkA": 0, "shrinkB": 0})
    ax.set_yticks(range(len(rows)), [_row_label(key) for key, _ in rows])
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_title(title, fontsize=10)
    ax.grid(True, axis="x", alpha=0.3)


def _row_label(key: tuple) -> str:
    replica, stage = key
    return f"stage {stage}" if replica is None else f"replica {replica}, stage {stage}"


def _timeline_figure(timeline: dict, model: str, path: Path) -> None:
    predicted = [list(ops) for ops in timeline.get("predicted", {}).get("stages", [])]
    ranks = sorted(timeline.get("measured", {}).get("ranks", []), key=lambda r: r.get("rank", 0))
    stages = max([len(predicted)] + [int(r["stage"]) + 1 for r in ranks if isinstance(r.get("stage"), int)])
    measured = [((r.get("replica"), r.get("stage")), _split_waits(r.get("ops", []), r.get("stage"), stages, predicted))
                for r in ranks]
    predicted_rows = [((None, i), [(k, mb, s, e, s) for k, mb, s, e in ops]) for i, ops in enumerate(predicted)]
    # the predicted rows' transfers join stages of one replica: key them as replica None
    fig = Figure(figsize=(11, min(MAX_FIGURE_IN, 2.4 + 0.55 * (len(measured) + len(predicted)))),
                 layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=[max(1, len(measured)), max(1, len(predicted))])
    _gantt(top, measured, f"measured, iteration {timeline.get('iteration', '?')} (per rank)")
    _gantt(bottom, predicted_rows, f"predicted by the {model} (per stage, one replica)")
    bottom.set_xlabel("time since the iteration's first op (s, real-equivalent)")
    handles = [Patch(color=c, label=f"{KIND_NAMES[k]} compute" if k != "S" else KIND_NAMES[k])
               for k, c in KIND_COLOURS.items()]
    handles.append(Patch(facecolor=WAIT_COLOUR, edgecolor="#999999", hatch="////", label="waiting for input"))
    handles += [Line2D([], [], color=c, lw=1, marker=">", markersize=4, label=f"{TRANSFER_NAMES[k]} transfer")
                for k, c in TRANSFER_COLOURS.items()]
    fig.legend(handles=handles, fontsize=8, loc="outside lower center", ncols=len(handles), frameon=False)
    fig.suptitle(f"Plan {timeline.get('plan_id')}: 1F1B schedule, measured vs predicted "
                 "(numbers = micro-batch; arrows: sender's end -> receiver's compute start)", fontsize=11)
    _save(fig, path)


FACETS = (("p2p", "wan", "p2p over WAN paths"), ("p2p", "intra", "p2p inside a cluster"),
          ("coll", "pair", "all-reduce over two clusters"), ("coll", "intra", "collectives inside a cluster"),
          ("coll", "cross", "collectives across clusters"))
MAX_SERIES = 6  # a panel with more series colours them by configured bandwidth instead of naming each


def _facet(f: dict) -> tuple[str, str]:
    return ("p2p" if f["op"] == "p2p" else "coll", f["scope"])


def _bandwidth_figure(fits: list[dict], groups: dict, path: Path) -> None:
    """busbw vs size, measured (dots) and fitted model (lines), one panel per kind of fit (FACETS).
    A panel of up to MAX_SERIES fits names each in its legend; a busier one (paper8's 28 WAN paths)
    colours its fits by configured bandwidth and names the classes: the per-pair numbers are in the
    report's tables."""
    ok = [f for f in fits if not f["error"]]
    known = [(kind, scope, title) for kind, scope, title in FACETS if any(_facet(f) == (kind, scope) for f in ok)]
    extra = sorted({_facet(f) for f in ok} - {(k, s) for k, s, _ in FACETS})
    panels = known + [(kind, scope, f"{kind} ({scope})") for kind, scope in extra]
    cols = min(3, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig = Figure(figsize=(4.6 * cols, 3.9 * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax, (kind, scope, title) in zip(axes, panels):
        mine = [f for f in ok if _facet(f) == (kind, scope)]
        by_class = len(mine) > MAX_SERIES
        classes = sorted({_fmt(f["configured_beta_gbps"]) for f in mine})
        seen = set()
        for i, f in enumerate(mine):
            records = sorted(groups[tuple(f[k] for k in ("topology", "op", "scope", "name", "ranks"))],
                             key=lambda r: r["bytes"])
            if by_class:
                cls = _fmt(f["configured_beta_gbps"])
                colour = f"C{classes.index(cls) % 10}"
                n = sum(_fmt(g["configured_beta_gbps"]) == cls for g in mine)
                label = None if cls in seen else f"configured {cls} Gbit/s ({n} fits)"
                seen.add(cls)
            else:
                name = f["name"] if len(f["name"]) <= 24 else f"{len(f['name'].split('+'))} clusters"
                colour, label = f"C{i % 10}", f"{f['op']} {name}" + ("" if kind == "p2p" else f", {f['ranks']} ranks")
            ax.plot([r["bytes"] for r in records],
                    [busbw_gbps(f["op"], f["ranks"], r["bytes"], r["time_s"]) for r in records], "o",
                    color=colour, markersize=3.5, alpha=0.8, label=label)
            lo, hi = math.log10(records[0]["bytes"]), math.log10(records[-1]["bytes"])
            grid = [10 ** (lo + (hi - lo) * k / 60) for k in range(61)]
            ax.plot(grid, [busbw_gbps(f["op"], f["ranks"], n, _model_s(f, n)) for n in grid], "-",
                    color=colour, lw=0.8, alpha=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("size (bytes, real-equivalent)")
        ax.set_ylabel("busbw (Gbit/s)")
        ax.set_title(f"{title} ({len(mine)} fits)", fontsize=10)
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=7, loc="lower right", framealpha=0.85)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    fig.suptitle("Bus bandwidth vs message size: measured (dots) and fitted alpha-beta model (lines)")
    _save(fig, path)


def _save(fig: Figure, path: Path) -> None:
    """``path`` (PNG, 110 dpi) and the same figure as PDF beside it. The constrained layout the PNG
    computed is kept for the PDF (it is in figure fractions, whatever the dpi) instead of computed again."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    fig.set_layout_engine("none")
    fig.savefig(path.with_suffix(".pdf"))


# ---- the report ------------------------------------------------------------------------------------------

def write_report(run: Run | Path, out_dir: Path | None = None) -> Path:
    """Write fits.json, figures/*.png and report.md of ``run`` (or of the run directory it names) into
    ``out_dir`` (default the run directory); return report.md's path. A directory the file system
    refuses is one EmulatorError line."""
    run = _loaded(run)
    out = run.path if out_dir is None else Path(out_dir)
    try:
        return _write(run, out)
    except OSError as exc:
        raise EmulatorError(f"{out}: cannot write the report there ({exc.strerror or exc}); "
                            "pass --out DIR to write it elsewhere") from None


def _loaded(run: Run | Path) -> Run:
    """``run``, or the run directory it names, read and checked (:func:`rundir.load_run`): a caller that
    writes the report and prints its MAPE line reads the directory once."""
    return run if isinstance(run, Run) else load_run(Path(run))


def _write(run: Run, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    source = str(run.path / "microbench.jsonl")
    fits = fit_records(run.microbench, source=source)
    groups = group_records(run.microbench, source=source)
    (out / "fits.json").write_text(json.dumps(
        {"scale": run.scale, "dilation": run.dilation, "fitted_from": "microbench.jsonl", "fits": fits,
         "gpu_efficiency": fit_compute(run.microbench)}, indent=1) + "\n")
    figures = out / "figures"
    many = len({f["topology"] for f in fits}) > 1
    topologies = ", ".join(run.config.get("topologies") or []) or DASH
    lines = [f"# Calibration report: {run.path.name}", "",
             mape_line(run.plans, scale=run.scale, mechanism=run.mechanism, dilation=run.dilation), "",
             f"Topologies: {topologies}. Scale {run.scale:g}, dilation {run.dilation:g}, delay by {run.mechanism}, "
             "compute "
             f"{run.config.get('compute', DASH)}, started {run.config.get('started', DASH)}.", ""]
    if run.config.get("note"):  # a hand correction of config.json, and why
        lines += [f"Note (config.json): {run.config['note']}", ""]
    stolen = run.config.get("host_steal_pct") or 0.0
    if noticeable(stolen):
        sentence = stolen_sentence(f"{stolen:.0f}%", "during the run")
        lines += [sentence[0].upper() + sentence[1:] + ", so measured times run long by up to about that much; "
                  "calibrate again when the host is quieter.", ""]
    lines += _links_section(fits, groups, many, figures)
    lines += _collectives_section(fits, groups, many)
    if any(not f["error"] for f in fits):
        _bandwidth_figure(fits, groups, figures / "bandwidth_vs_size.png")
        lines += ["![bus bandwidth vs size, measured and fitted](figures/bandwidth_vs_size.png)", ""]
    lines += _compute_section(run.microbench)
    lines += _plans_section(run.plans, figures)
    lines += _timeline_section(run, figures)
    lines += _how_to_read(run, out)
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path
