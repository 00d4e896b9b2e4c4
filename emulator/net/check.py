"""``sudo python -m emulator check``: build the network, measure every link, tear down.

Measures both directions of every WAN link and of one host pair per cluster
(see :mod:`emulator.net.measure` for exactly what each measurement crosses),
prints configured vs measured with the shaping mechanism and a verdict per
measurement (:mod:`emulator.net.tolerance`): ok, FAIL, or no verdict (out of
tolerance the way a host stealing the CPU reads a link, while it did). Exits
0 when every measurement is ok, 1 when any failed, :data:`EXIT_NO_VERDICT`
when none failed but some gave no verdict (check again when the host is
quieter). Progress goes to stderr, the table (or ``--json``) to stdout.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

from emulator.net.capability import require_root
from emulator.jobs.dilation import Choice, parse_dilation
from emulator.net.hoststeal import noticeable, stolen_sentence
from emulator.net.measure import Result, measure_all
from emulator.net.emulation import Emulation
from emulator.net.layout import MAX_HOSTS, MECHANISMS, NetConfig
from emulator.net.step import APPLY_MS, SETTLE_REL, WINDOW_S, Step, step_test
from emulator.net.tolerance import BANDWIDTH_REL, DELAY_ABS_MS, FAIL, NO_VERDICT, OK, Assessment, assess, worst
from spiderflow.errors import ConfigError
from spiderflow.shipped import exists
from spiderflow.topology import Topology
from spiderflow.wan.events import resolve_link
from spiderflow.cliutil import dumps, float_in, int_in
from emulator.net.servers import add_server_arguments, load_topology_with_servers, server_set

HELP = "build the emulated network, measure every link's bandwidth and delay, tear down"
DEFAULT_TOPOLOGY = "topologies/default.yaml"
# Sanity bounds of the options (a value past them is a typo; 1e300 would overflow the rates)
MAX_SECONDS = 3600.0
MIN_SCALE, MAX_SCALE = 0.01, 10_000.0
MAX_INTRA_CAP_MBPS = 1_000_000.0  # 1 Tbit/s
MAX_QUEUE_BDP = 100.0  # WAN router buffers, in bandwidth-delay products
EXIT_NO_VERDICT = 3  # no measurement failed, some gave no verdict (the host stole the CPU meanwhile)
EPILOG = (f"exit status: 0 every measurement within tolerance; 1 one failed (or a --step did); {EXIT_NO_VERDICT} none "
          "failed, but some were out of tolerance only as a host stealing the CPU reads a link, while it did (no "
          "verdict: check again when the host is quieter); 2 bad arguments or input, or the emulation failed (one line "
          "says which); 130 interrupted (the network torn down)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--topology", default=DEFAULT_TOPOLOGY, help="topology YAML (default %(default)s)")
    add_network_arguments(parser)
    parser.add_argument("--seconds", type=float_in(0.0, MAX_SECONDS, "seconds"), default=4.0,
                        help="measured seconds per WAN flow, after a warm-up of at least 2 s and 15 "
                             f"round trips; both x K under dilation K; in (0, {MAX_SECONDS:g}] (default %(default)s)")
    parser.add_argument("--step", nargs="?", const="", default=None, metavar="A-B",
                        help="also step a WAN link's bandwidth (default the first) to half and back under one "
                             "flow, and report when each step was in force and when the rate settled "
                             "(emulator/net/step.py)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--trace", action="store_true", help="log every configuration command")
    add_server_arguments(parser)
    parser.add_argument("--no-overhead", action="store_true",
                        help="with --servers: skip measuring the SSH tunnel's own overhead")


def add_network_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of :class:`NetConfig`; other subcommands (run, calibrate) can reuse them."""
    d = NetConfig()
    parser.add_argument("--hosts-per-cluster", type=int_in(1, MAX_HOSTS), default=d.hosts_per_cluster, metavar="K",
                        help=f"emulated hosts (ranks) per cluster, 1..{MAX_HOSTS} (default %(default)s)")
    parser.add_argument("--scale", type=float_in(MIN_SCALE, MAX_SCALE, lo_open=False), default=d.scale,
                        help="divide every bandwidth by this on the wire; latencies are not scaled; "
                             f"in [{MIN_SCALE:g}, {MAX_SCALE:g}] (default %(default)g)")
    parser.add_argument("--intra-cap-mbps", type=float_in(0.0, MAX_INTRA_CAP_MBPS, "Mbit/s"),
                        default=d.intra_cap_mbps,
                        help="cap on intra-cluster wire rates after scaling, in "
                             f"(0, {MAX_INTRA_CAP_MBPS:g}] (default %(default)g)")
    parser.add_argument("--queue-bdp", type=float_in(0.0, MAX_QUEUE_BDP), default=d.queue_bdp, metavar="Q",
                        help="router buffer on each direction of a WAN link, in bandwidth-delay products of the "
                             "longest round trip of the routes across it (what a bulk flow can keep queued ahead "
                             f"of other traffic there); in (0, {MAX_QUEUE_BDP:g}] (default %(default)g)")
    parser.add_argument("--delay", choices=MECHANISMS, default=d.delay,
                        help="delay mechanism: netem if the kernel has it, else the NFQUEUE stage "
                             "on the gateways (default %(default)s)")
    parser.add_argument("--dilation", type=parse_dilation, default="auto", metavar="K|auto",
                        help="time dilation: wire rates / K, delays x K (and in run/calibrate compute x K, "
                             "measured times / K); wall time grows K-fold. auto: see emulator/jobs/dilation.py; in "
                             "run/compare with --calibration, the K it was fitted at (default %(default)s)")


def network_config(args: argparse.Namespace, dilation: float | None = None) -> NetConfig:
    """The NetConfig of the options; ``dilation`` replaces ``--dilation`` (which may be 'auto')."""
    k = args.dilation if dilation is None else dilation
    if k == "auto":
        raise ValueError("resolve --dilation auto before building the NetConfig")
    return NetConfig(hosts_per_cluster=args.hosts_per_cluster, scale=args.scale,
                     intra_cap_mbps=args.intra_cap_mbps, delay=args.delay, queue_bdp=args.queue_bdp, dilation=k)


def resolve_topology(path: str) -> str:
    """``path`` as given, or relative to the repository when run from elsewhere (a name the OS
    refuses, too long or with a NUL byte, comes back as given: the loader says so in one line)."""
    if exists(path) or Path(path).is_absolute():
        return path
    repo = Path(__file__).resolve().parents[2] / path
    return str(repo) if exists(repo) else path


# Check has no ranks: what auto guards against (per-op costs of many ranks) is not there, and the
# links measure within tolerance at K = 1 (README).
CHECK_AUTO = Choice(dilation=1.0, reason="emulator check runs no ranks: its measurements need no dilation")


def real_equivalent(r: Result, k: float) -> Result:
    """A wire measurement in the topology's time: rates x K, delays / K (configured and measured)."""
    t = r.target
    target = dataclasses.replace(t, configured_mbps=t.configured_mbps * k, configured_delay_ms=t.configured_delay_ms / k)
    return dataclasses.replace(r, target=target, measured_mbps=r.measured_mbps * k,
                               measured_delay_ms=r.measured_delay_ms / k)


def main(args: argparse.Namespace) -> int:
    servers = server_set(args)  # bad --servers fail here, before root
    topo, pins = load_topology_with_servers(resolve_topology(args.topology))  # bad files fail here, too
    if servers is not None and len(servers.names) > 1:
        from emulator.net.multihost_check import main_multihost  # Mininet's cluster mode only when asked

        return main_multihost(args, topo, pins, servers)
    step_link = step_link_of(args, topo)
    choice = CHECK_AUTO if args.dilation == "auto" else Choice(dilation=args.dilation, reason="--dilation")
    config = network_config(args, choice.dilation)
    require_root()
    progress = lambda msg: print(f"[check] {msg}", file=sys.stderr, flush=True)  # noqa: E731
    progress(f"dilation {config.dilation:g} ({choice.reason})")
    t0 = time.monotonic()
    with Emulation(topo, config, log=progress, trace=args.trace) as emu:
        mechanism = emu.mechanism
        # the same real-equivalent window (round trips) as at K = 1: K times the wall seconds
        k = config.dilation
        results = [real_equivalent(r, k)
                   for r in measure_all(emu, wan_seconds=args.seconds * k, wan_omit_s=2.0 * k, progress=progress)]
        steps = step_test(emu, link=step_link, progress=progress) if args.step is not None else []
    verdict = overall(results, steps)
    progress(f"done in {time.monotonic() - t0:.0f} s")
    if args.json:
        print(dumps({"topology": topo.source, "scale": config.scale, "dilation": config.dilation,
                     "dilation_reason": choice.reason, "mechanism": mechanism,
                     "hosts_per_cluster": config.hosts_per_cluster, "intra_cap_mbps": config.intra_cap_mbps,
                     "tolerance": {"bandwidth_rel": BANDWIDTH_REL, "delay_abs_ms": DELAY_ABS_MS},
                     "links": [link_json(r) for r in results],
                     **({"steps": [st.as_json() for st in steps]} if args.step is not None else {}),
                     "verdict": verdict, "ok": verdict == OK}, indent=1))
    else:
        print(format_table(topo.source, config, mechanism, results, verdict))
        if steps:
            print(format_steps(steps))
    return exit_code(verdict)


def overall(results: list[Result], steps: list[Step]) -> str:
    """The check's verdict: FAIL when a measurement or a step failed, else NO_VERDICT when a measurement
    gave none, else OK."""
    return worst([assessment_of(r).verdict for r in results] + [OK if st.ok else FAIL for st in steps])


def exit_code(verdict: str) -> int:
    return {OK: 0, FAIL: 1, NO_VERDICT: EXIT_NO_VERDICT}[verdict]


def link_json(r: Result) -> dict:
    """A measurement's JSON with its verdict and the reasons for it."""
    a = assessment_of(r)
    return dict(r.as_json(), verdict=a.verdict, problems=list(a.reasons))


def step_link_of(args: argparse.Namespace, topo: Topology) -> tuple[str, str] | None:
    """``--step A-B`` as the topology's link (None: no --step, or its default link); ConfigError naming the fix."""
    if not args.step:
        return None
    link = resolve_link(args.step, topo)
    if isinstance(link, str):
        raise ConfigError(f"--step: {link}")
    return link


def format_steps(steps: list[Step]) -> str:
    lines = ["", f"bandwidth steps under one flow (settled: windows of {WINDOW_S * 1e3:g} ms within "
                 f"{SETTLE_REL:.0%} of the rate before x the step, for the rest of the phase)",
             f"{'direction':<22} {'Gbit/s':>13} {'Mbit/s before':>13} {'after':>8} {'in force':>9} {'settled':>8}  ok"]
    for st in steps:
        settle = "never" if st.settle_s is None else f"{st.settle_s:.2f} s"
        lines.append(f"{st.direction:<22} {st.from_gbps:>6g} -> {st.to_gbps:<4g} {st.rate_before_mbps:>13.1f} "
                     f"{st.rate_after_mbps:>8.1f} {st.apply_ms:>6.0f} ms {settle:>8}  "
                     + ("ok" if st.ok else f"FAIL: in force after > {APPLY_MS:g} ms or never settled")
                     + (f" (host stole {st.host_steal_pct:.0f}% of the CPU)" if noticeable(st.host_steal_pct) else ""))
    return "\n".join(lines)


def assessment_of(r: Result) -> Assessment:
    t = r.target
    return assess(t.configured_mbps, r.measured_mbps, t.configured_delay_ms, r.measured_delay_ms,
                  rate_steal_pct=r.host_steal_pct, delay_steal_pct=r.delay_steal_pct)


def format_table(source: str, config: NetConfig, mechanism: str, results: list[Result], verdict: str) -> str:
    k = config.dilation
    dilated = (f"; dilation {k:g}: wire rates / {k:g}, delays x {k:g}, shown here x {k:g} and / {k:g} "
               "(real-equivalent)") if k != 1 else "; dilation 1"
    lines = [f"emulator check: {source}, {config.hosts_per_cluster} hosts per cluster, delay by {mechanism}",
             f"scale {config.scale:g}: wire bandwidth = topology bandwidth / {config.scale:g} "
             f"(intra-cluster capped at {config.intra_cap_mbps:g} Mbit/s); delays unscaled{dilated}",
             "",
             f"{'link':<22} {'configured':>10} {'measured':>9} {'':>6}  {'configured':>10} {'measured':>9}  "
             f"{'mechanism':<24} {'ok'}",
             f"{'':<22} {'Mbit/s':>10} {'Mbit/s':>9} {'':>6}  {'delay ms':>10} {'delay ms':>9}"]
    assessed = [assessment_of(r) for r in results]
    for r, a in zip(results, assessed):
        t = r.target
        if t.kind == "wan":
            name = f"{t.a} -> {t.b}"
        else:  # "oregon h0->h1"
            name = f"{t.a} {t.src[len(t.a) + 1:]}->{t.dst[len(t.a) + 1:]}"
        pct = f"{100 * r.measured_mbps / t.configured_mbps:.1f}%"
        said = {OK: "ok", FAIL: "FAIL: ", NO_VERDICT: "no verdict: "}[a.verdict] + "; ".join(a.reasons)
        notes = (["re-measured alone"] if r.remeasured else []) + (  # a rate without a verdict says it already
            [f"host stole {r.host_steal_pct:.0f}% of the CPU"] if noticeable(r.host_steal_pct) and a.rate != NO_VERDICT
            else [])
        if notes:
            said += f" ({'; '.join(notes)})"
        lines.append(f"{name:<22} {t.configured_mbps:>10.1f} {r.measured_mbps:>9.1f} {pct:>6}  "
                     f"{t.configured_delay_ms:>10.2f} {r.measured_delay_ms:>9.2f}  {t.mechanism:<24} {said}")
    lines.append("")
    tolerance = f"tolerance (bandwidth +-{BANDWIDTH_REL:.0%}, one-way delay +-{DELAY_ABS_MS:g} ms)"
    undecided = sum(a.verdict == NO_VERDICT for a in assessed)
    if verdict == OK:
        lines.append(f"all within {tolerance} over {len(results)} measurements")
    elif verdict == FAIL:
        lines.append(f"NOT all within {tolerance} over {len(results)} measurements"
                     + (f"; {undecided} gave no verdict" if undecided else ""))
    else:
        were = "was" if undecided == 1 else "were"
        lines.append(f"no verdict: none of {len(results)} measurements failed, but {undecided} {were} out of "
                     f"{tolerance} the way a host stealing the CPU reads a link (rates low, delays high), while it "
                     f"did: check again when the host is quieter (exit {EXIT_NO_VERDICT})")
    stolen = max((max(r.host_steal_pct, r.delay_steal_pct) for r in results), default=0.0)
    if noticeable(stolen):
        lines.append(stolen_sentence(f"up to {stolen:.0f}%", "while measuring") + ", so rates read low and "
                     "delays high: such a reading out of tolerance by a bounded amount is no verdict on its link "
                     "(emulator/net/tolerance.py)")
    return "\n".join(lines)
