"""Measure the emulated links: throughput with iperf3, one-way delay with the UDP probe.

What is measured (and why it is the link itself): a WAN link is not always on
the route between its two clusters (``path(a, b)`` may go round it), so for
each link ``a-b`` we pick a host in ``a`` and one in ``b`` and pin /32 routes
on the two gateways that send their traffic over that link, in both
directions. A host-to-host flow then crosses exactly: the sender's egress
(intra rate), gateway ``a`` (this link's delay stage and rate), gateway ``b``
and ``b``'s bridge port -- so it sees the link's rate and delay plus
microseconds of veth/bridge forwarding. No pin ever conflicts (each gateway
reaches one cluster over one link), so all of them are installed at once.

Intra-cluster: host 0 <-> host 1 of each cluster (needs 2+ hosts per cluster).

Throughput is iperf3 TCP goodput as the receiver reads it (median of its
1-s intervals, see :func:`receiver_goodput_mbps`) after a warm-up that
excludes slow start: at least ``wan_omit_s`` and at least ``WARMUP_RTTS``
round trips (a 230 ms RTT path needs ~4 s to reach its rate). Delay is the
median of UDP probes per direction (:mod:`emulator.net.probe`), measured before
any throughput test, on idle links.
Flows on different links run concurrently (one direction of every link per
round, so a link's reverse direction carries only that flow's ACKs);
intra-cluster flows, at up to ``intra_cap_mbps``, run ``intra_parallel`` at a
time so two cores keep up.
"""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from emulator.net.hoststeal import StealMeter, noticeable
from emulator.net.linkcmds import pin_commands
from spiderflow.errors import EmulatorError
from emulator.net.tolerance import bandwidth_ok, delay_ok

ECHO_PORT = 7777
WARMUP_RTTS = 15
IPERF_BASE_PORT = 5201
STOLEN_TRIES = 3  # re-measurements of a flow out of tolerance while the host steals a noticeable share


@dataclass(frozen=True, kw_only=True)
class Target:
    """One direction to measure: traffic from host ``src`` (cluster ``a``) to ``dst`` (``b``)."""

    a: str
    b: str
    src: str
    dst: str
    src_ip: str
    dst_ip: str
    kind: str  # "wan" | "intra"
    configured_mbps: float
    configured_delay_ms: float
    mechanism: str


@dataclass(frozen=True, kw_only=True)
class Result:
    target: Target
    measured_mbps: float
    measured_delay_ms: float
    remeasured: bool = False  # out of tolerance in its concurrent round, measured again alone
    host_steal_pct: float = 0.0  # CPU the host stole from this machine while its rate was measured
    delay_steal_pct: float = 0.0  # ... while its delay was probed (the last probe of its pair)

    def as_json(self) -> dict:
        t = self.target
        return {"a": t.a, "b": t.b, "kind": t.kind, "src": t.src, "dst": t.dst,
                "configured_mbps": round(t.configured_mbps, 3), "measured_mbps": round(self.measured_mbps, 3),
                "configured_delay_ms": round(t.configured_delay_ms, 3),
                "measured_delay_ms": round(self.measured_delay_ms, 3), "mechanism": t.mechanism,
                "remeasured": self.remeasured, "host_steal_pct": round(self.host_steal_pct, 2),
                "delay_steal_pct": round(self.delay_steal_pct, 2)}


def targets(emu) -> list[Target]:
    """Both directions of every WAN link, then both directions of one pair per cluster."""
    plan = emu.plan
    used = {c.name: 0 for c in plan.clusters}

    def pick(cluster: str):
        hosts = plan.cluster(cluster).hosts
        host = hosts[used[cluster] % len(hosts)]
        used[cluster] += 1
        return host

    wan_mech = f"htb+{emu.mechanism}"
    out = []
    for link in plan.links:
        ha, hb = pick(link.a), pick(link.b)
        for (x, hx), (y, hy) in (((link.a, ha), (link.b, hb)), ((link.b, hb), (link.a, ha))):
            shape = plan.port(x, y).shape
            out.append(Target(a=x, b=y, src=hx.name, dst=hy.name, src_ip=hx.ip, dst_ip=hy.ip, kind="wan",
                              configured_mbps=shape.goodput_mbps, configured_delay_ms=shape.delay_ms,
                              mechanism=wan_mech))
    intra_mech = "htb+netem" if emu.mechanism == "netem" else "htb (delay not emulated)"
    for c in plan.clusters:
        if len(c.hosts) < 2:
            continue
        h0, h1 = c.hosts[0], c.hosts[1]
        for x, y in ((h0, h1), (h1, h0)):
            out.append(Target(a=c.name, b=c.name, src=x.name, dst=y.name, src_ip=x.ip, dst_ip=y.ip,
                              kind="intra", configured_mbps=c.intra.goodput_mbps,
                              configured_delay_ms=c.intra.delay_ms, mechanism=intra_mech))
    return out


def pin_routes(emu, wan: list[Target], verb: str = "replace") -> None:
    """Route each WAN target's destination over its link, at the sending gateway."""
    for t in wan:
        router = emu.plan.cluster(t.a).router.name
        port = emu.plan.port(t.a, t.b)
        emu.executor.run_all(router, emu.node(router).pid, pin_commands(t.dst_ip, port, verb))


def _python(*args: str) -> list[str]:
    return [sys.executable, "-m", *args]


def _wait_line(proc: subprocess.Popen, needle: bytes, timeout_s: float, what: str) -> None:
    import select

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        line = proc.stdout.readline()
        if not line:
            break
        if needle in line:
            return
    raise EmulatorError(f"{what} did not start (exit {proc.poll()})")


def _wait_listening(proc: subprocess.Popen, port: int, timeout_s: float, what: str) -> None:
    """Wait until ``proc``'s namespace has a TCP socket listening on ``port``.

    ``/proc/PID/net/tcp`` lists the sockets of PID's network namespace; state
    0A is LISTEN. Cheaper and surer than parsing a server's buffered output.
    """
    needle = f":{port:04X} "
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        for table in ("tcp", "tcp6"):  # iperf3 listens on [::] (dual stack)
            try:
                with open(f"/proc/{proc.pid}/net/{table}") as fh:
                    if any(f[1].endswith(needle.strip()) and f[3] == "0A"
                           for f in (line.split() for line in fh) if len(f) > 3):
                        return
            except OSError:
                pass
        time.sleep(0.01)
    raise EmulatorError(f"{what} did not start (exit {proc.poll()})")


def measure_delays(emu, pairs: list[Target], *, count: int = 20, interval_s: float = 0.02) -> dict:
    """``{(src, dst): (forward_ms, reverse_ms)}`` medians, all pairs probed concurrently."""
    echoes = {}
    for t in pairs:
        if t.dst not in echoes:
            proc = emu.popen(t.dst, _python("emulator.net.probe", "echo", "--port", str(ECHO_PORT)),
                             role="probe-echo", stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            echoes[t.dst] = proc
    for host, proc in echoes.items():
        _wait_line(proc, b"ready", 15.0, f"{host}: delay probe echo")
    senders = []
    for t in pairs:
        argv = _python("emulator.net.probe", "send", "--to", t.dst_ip, "--port", str(ECHO_PORT),
                       "--count", str(count), "--interval", str(interval_s), "--wait-go")
        senders.append((t, emu.popen(t.src, argv, role="probe", stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)))
    for t, proc in senders:  # all started before any measures: start-up costs CPU
        _wait_line(proc, b"ready", 15.0, f"{t.src}: delay probe")
    for _t, proc in senders:
        proc.stdin.write(b"go\n")
        proc.stdin.flush()
    out = {}
    for t, proc in senders:
        stdout, stderr = proc.communicate(timeout=60)
        if proc.returncode != 0:
            raise EmulatorError(f"{t.src}: delay probe to {t.dst} failed: {stderr.decode().strip()[-300:]}")
        rep = json.loads(stdout)
        if len(rep["forward_ms"]) < count // 2:
            raise EmulatorError(f"{t.src} -> {t.dst}: {rep['lost']} of {count} delay probes lost")
        # on several servers the two ends stamp with different clocks: put the far one on the near one's
        # (emulator.net.multihost; 0 on one machine, where every namespace shares CLOCK_MONOTONIC)
        skew_ms = emu.clock_offset_ms(t.src, t.dst) if hasattr(emu, "clock_offset_ms") else 0.0
        out[(t.src, t.dst)] = (statistics.median(rep["forward_ms"]) - skew_ms,
                               statistics.median(rep["reverse_ms"]) + skew_ms)
    for proc in echoes.values():
        proc.terminate()
        proc.wait(timeout=5)
    return out


def receiver_goodput_mbps(report: dict, omit_s: float, seconds: float) -> float:
    """Median goodput of the receiver's whole 1-s intervals within ``[omit_s, omit_s + seconds]``.

    From the receiver (``--get-server-output``) because iperf3's
    ``end.sum_received`` also counts bytes still queued at the bottleneck
    when the sender stops (over-reporting a deep-buffered link by up to
    buffer / duration), and its ``--omit`` intervals are irregular on the
    server side, so the flow simply runs ``omit_s + seconds``. The median,
    because a loss late in the ramp holds data out of order at the receiver
    until the retransmission lands, and the application then reads that
    backlog as one second "faster" than the link.
    """
    intervals = [i["sum"] for i in report.get("server_output_json", {}).get("intervals", [])]
    steady = [i for i in intervals if i["start"] >= omit_s - 0.05 and i["end"] <= omit_s + seconds + 0.05
              and i["seconds"] >= 0.5]
    if not steady:
        raise EmulatorError("iperf3 reported no receiver intervals after the warm-up; "
                            "measure for longer (--seconds)")
    return statistics.median(8 * i["bytes"] / i["seconds"] / 1e6 for i in steady)


def warmup_s(target: Target, minimum_s: float) -> float:
    """Whole seconds of warm-up: ``minimum_s``, or ``WARMUP_RTTS`` round trips if longer."""
    return float(max(minimum_s, math.ceil(WARMUP_RTTS * 2 * target.configured_delay_ms / 1e3)))


def measure_throughputs(emu, flows: list[Target], *, seconds: float, omit_s: float) -> dict:
    """``{(src, dst): goodput_mbps}`` for flows run concurrently (iperf3, receiver side).

    Each flow warms up for :func:`warmup_s` (``omit_s`` or longer), then is measured ``seconds``.
    """
    warm = [warmup_s(t, omit_s) for t in flows]
    servers = []
    for i, t in enumerate(flows):
        port = str(IPERF_BASE_PORT + i)
        proc = emu.popen(t.dst, ["iperf3", "-s", "-1", "-J", "-p", port], role="iperf3-server",
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        servers.append((t, port, proc))
    for t, port, proc in servers:
        if hasattr(emu, "wait_listening"):  # a host on another server (emulator.net.multihost)
            emu.wait_listening(t.dst, proc, int(port), 10.0, f"{t.dst}: iperf3 server on port {port}")
        else:
            _wait_listening(proc, int(port), 10.0, f"{t.dst}: iperf3 server on port {port}")
    clients = [(t, w, emu.popen(t.src, ["iperf3", "-c", t.dst_ip, "-p", port, "-t", f"{w + seconds:g}",
                                        "-J", "--get-server-output"], role="iperf3",
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE))
               for (t, port, _proc), w in zip(servers, warm)]
    out = {}
    for t, w, proc in clients:
        stdout, _ = proc.communicate(timeout=seconds + w + 60)
        try:
            report = json.loads(stdout)
        except ValueError:
            raise EmulatorError(f"{t.src} -> {t.dst}: iperf3 printed no JSON "
                                f"(exit {proc.returncode})") from None
        if "error" in report:
            raise EmulatorError(f"{t.src} -> {t.dst}: iperf3: {report['error']}")
        out[(t.src, t.dst)] = receiver_goodput_mbps(report, w, seconds)
    for _t, _port, proc in servers:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
    return out


def another_try(t: Target, measured_mbps: float, tries: int, stolen: float) -> bool:
    """Whether to measure a flow again, alone, after ``tries`` re-measurements: when out of
    tolerance, once, then while the host stole a noticeable share of the CPU (``stolen``, a fraction) during
    the last one (a reading the host held low is no verdict on the link), up to :data:`STOLEN_TRIES`."""
    return _again(bandwidth_ok(t.configured_mbps, measured_mbps), tries, stolen)


def another_probe(t: Target, measured_ms: float, tries: int, stolen: float) -> bool:
    """Whether to probe a pair's delay again after ``tries`` re-probes: the delay-side twin of
    :func:`another_try` (a delay the host held high is no verdict on the link)."""
    return _again(delay_ok(t.configured_delay_ms, measured_ms), tries, stolen)


def _again(within: bool, tries: int, stolen: float) -> bool:
    """The rule both follow: never within tolerance; else once, then while the host stole a noticeable
    share of the CPU during the last try, up to :data:`STOLEN_TRIES`."""
    return not within and (tries == 0 or (tries < STOLEN_TRIES and noticeable(100 * stolen)))


def measure_all(emu, *, wan_seconds: float = 4.0, wan_omit_s: float = 2.0, intra_seconds: float = 2.0,
                intra_omit_s: float = 1.0, intra_parallel: int = 2, retry: bool = True,
                progress: Callable[[str], None] = lambda _m: None) -> list[Result]:
    """Measure every target of :func:`targets`; results in the same order.

    With ``retry``, a flow out of tolerance is measured once more, alone (and
    its pair re-probed), so a burst of load from elsewhere on the machine
    during a concurrent round is not mistaken for a badly shaped link; such
    results say ``remeasured``. While the host (hypervisor) steals CPU from
    this machine during those, up to :data:`STOLEN_TRIES` times
    (:func:`another_try`, and :func:`another_probe` for a delay out of
    tolerance); each result says how much was stolen while its rate was
    measured (``host_steal_pct``) and while its delay was probed
    (``delay_steal_pct``).
    """
    todo = targets(emu)
    wan = [t for t in todo if t.kind == "wan"]
    intra = [t for t in todo if t.kind == "intra"]
    pin_routes(emu, wan)
    # one probe pair per link (and per cluster) yields both directions
    probe_pairs = wan[0::2] + intra[0::2]
    progress(f"delay: probing {len(probe_pairs)} host pairs, both directions")
    delay_of: dict[tuple[str, str], float] = {}
    delay_stolen_of: dict[tuple[str, str], float] = {}

    def probe(pairs: list[Target]) -> None:
        meter = StealMeter()
        delays = measure_delays(emu, pairs)
        stolen = meter.share()
        for (src, dst), (fwd, rev) in delays.items():
            delay_of[(src, dst)], delay_of[(dst, src)] = fwd, rev
            delay_stolen_of[(src, dst)] = delay_stolen_of[(dst, src)] = stolen

    probe(probe_pairs)
    rate_of: dict[tuple[str, str], float] = {}
    stolen_of: dict[tuple[str, str], float] = {}
    total = len(todo)

    def run(batch: list[Target], seconds: float, omit_s: float, what: str = "throughput") -> None:
        names = ", ".join(f"{t.a}->{t.b}" if t.kind == "wan" else f"{t.a}:{t.src}->{t.dst}" for t in batch)
        longest = max(warmup_s(t, omit_s) for t in batch) + seconds
        done = min(total, len(rate_of) + len(batch))
        progress(f"[{done}/{total}] {what} {names} ({longest:g} s)")
        meter = StealMeter()
        rate_of.update(measure_throughputs(emu, batch, seconds=seconds, omit_s=omit_s))
        stolen = meter.share()
        stolen_of.update({(t.src, t.dst): stolen for t in batch})
        if noticeable(100 * stolen):
            progress(f"the host stole {100 * stolen:.0f}% of this machine's CPU during that measurement")
        emu.check_daemons()

    if wan:
        run(wan[0::2], wan_seconds, wan_omit_s)
        run(wan[1::2], wan_seconds, wan_omit_s)
    for direction in (intra[0::2], intra[1::2]):  # never both directions of one pair at once
        for i in range(0, len(direction), intra_parallel):
            run(direction[i:i + intra_parallel], intra_seconds, intra_omit_s)

    def result(t: Target, remeasured: bool = False) -> Result:
        return Result(target=t, measured_mbps=rate_of[(t.src, t.dst)],
                      measured_delay_ms=delay_of[(t.src, t.dst)], remeasured=remeasured,
                      host_steal_pct=100 * stolen_of[(t.src, t.dst)],
                      delay_steal_pct=100 * delay_stolen_of[(t.src, t.dst)])

    results = [result(t) for t in todo]
    if not retry:
        return results
    again = set()
    for r in results:
        t = r.target
        key, tries = (t.src, t.dst), 0
        while another_try(t, rate_of[key], tries, stolen_of[key]):
            wan_flow = t.kind == "wan"
            run([t], wan_seconds if wan_flow else intra_seconds, wan_omit_s if wan_flow else intra_omit_s,
                what="re-measuring alone:")
            again.add(t)
            tries += 1
        tries = 0
        while another_probe(t, delay_of[key], tries, delay_stolen_of[key]):
            progress(f"re-probing {t.src} <-> {t.dst}")
            probe([t])
            again.add(t)
            tries += 1
    return [result(t, remeasured=t in again) for t in todo]
