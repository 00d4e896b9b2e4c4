"""One-way delay probe: UDP echo with timestamps from the shared clock.

All emulated hosts run on one kernel, so ``CLOCK_MONOTONIC`` is the same clock
in every namespace (the emulator creates no time namespaces). That makes
one-way delay directly measurable, per direction, instead of RTT/2:

- ``echo`` (in the far host) answers each datagram with the time it arrived;
- ``send`` (in the near host) sends ``--count`` datagrams ``--interval`` apart
  and reports, per probe, forward = arrival at far - send time and reverse =
  arrival back - arrival at far.

With ``--wait-go`` the sender prints ``ready`` and starts on a line from
stdin, so many senders can start (Python start-up is CPU-heavy) before any
of them measures. The first probe (which pays for ARP along the path) is sent
but not counted;
the report is JSON on stdout: ``{"forward_ms": [...], "reverse_ms": [...],
"lost": n}``. Run: ``python -m emulator.net.probe echo --port P`` and ``python -m
emulator.net.probe send --to IP --port P``.
"""

from __future__ import annotations

import argparse
import json
import select
import socket
import struct
import sys
import time

PACKET = struct.Struct("!IQQ")  # seq, sent_ns, echoed_ns


def echo(port: int, idle_timeout_s: float) -> int:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("0.0.0.0", port))
    print("ready", flush=True)
    while True:
        ready, _, _ = select.select([sock], [], [], idle_timeout_s)
        if not ready:
            return 0
        data, addr = sock.recvfrom(2048)
        now = time.monotonic_ns()
        if len(data) < PACKET.size:
            continue
        seq, sent, _ = PACKET.unpack_from(data)
        sock.sendto(PACKET.pack(seq, sent, now), addr)


def send(to: str, port: int, count: int, interval_s: float, wait_s: float, *, wait_go: bool = False) -> dict:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.connect((to, port))
    if wait_go:  # let a caller start many senders, then release them together
        print("ready", flush=True)
        sys.stdin.readline()
    forward: dict[int, float] = {}
    reverse: dict[int, float] = {}

    def drain(until: float, done=lambda: False) -> None:
        while not done():
            left = until - time.monotonic()
            ready, _, _ = select.select([sock], [], [], max(0.0, left))
            if not ready:
                return
            try:
                data = sock.recv(2048)
            except ConnectionRefusedError:  # echo not up yet: that probe is lost
                continue
            back = time.monotonic_ns()
            seq, sent, echoed = PACKET.unpack_from(data)
            forward[seq] = (echoed - sent) / 1e6
            reverse[seq] = (back - echoed) / 1e6

    for seq in range(count + 1):
        try:
            sock.send(PACKET.pack(seq, time.monotonic_ns(), 0))
        except ConnectionRefusedError:
            pass
        if seq == 0:  # warm-up: wait for its answer (or wait_s), so ARP is done
            drain(time.monotonic() + wait_s, lambda: 0 in forward)
        else:
            drain(time.monotonic() + interval_s)
    drain(time.monotonic() + wait_s, lambda: len(forward) >= count + 1)
    seqs = sorted(s for s in forward if s != 0)
    return {"forward_ms": [forward[s] for s in seqs], "reverse_ms": [reverse[s] for s in seqs],
            "lost": count - len(seqs)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m emulator.net.probe")
    sub = parser.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("echo")
    e.add_argument("--port", type=int, required=True)
    e.add_argument("--idle-timeout", type=float, default=600.0)
    s = sub.add_parser("send")
    s.add_argument("--to", required=True)
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--count", type=int, default=20)
    s.add_argument("--interval", type=float, default=0.02)
    s.add_argument("--wait", type=float, default=1.0, help="seconds to wait for the last answers")
    s.add_argument("--wait-go", action="store_true", help='print "ready", start on a line from stdin')
    args = parser.parse_args(argv)
    if args.cmd == "echo":
        return echo(args.port, args.idle_timeout)
    report = send(args.to, args.port, args.count, args.interval, args.wait, wait_go=args.wait_go)
    json.dump(report, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
