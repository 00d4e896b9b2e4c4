"""Why a pipeline over a thin WAN link runs faster than predicted (needs root); writes
benchmarks/results/thin_link_transfer.md.

On a two-cluster network with paper8's thinnest link (oregon-tokyo, 0.52 Gbit/s,
48.5 ms one way, scale 10) it measures:

1. isolated one-way p2p transfers (the calibrate microbenchmark, sizes largest
   first) at 256, 16, 4 and 1 MB, against ``alpha + n / beta``;
2. the ``pipe2-thin`` plan of ``emulator calibrate`` (gpt3-350m, 2 stages,
   8 micro-batches), and from its 1F1B timeline each transfer's time from the
   sender's op end to the receiver's data arrival (the receiver's op end minus
   its compute): those that start on an idle link, and the one queued behind
   another (micro-batch 1's activation, sent 6 ms after micro-batch 0's).

Run: ``sudo .venv/bin/python benchmarks/thin_link_transfer.py [--out FILE]`` (about half a minute).
"""

from __future__ import annotations

import datetime as dt
import platform
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from emulator.calibrate.opbench import LARGE_BYTES, run_microbench  # noqa: E402
from emulator.calibrate.plans import PlanCase, run_case  # noqa: E402
from emulator.net.capability import require_root  # noqa: E402
from emulator.jobs.launch import emulated_view  # noqa: E402
from emulator.net.emulation import Emulation  # noqa: E402
from emulator.net.layout import NetConfig  # noqa: E402
from emulator.jobs.pool import RankPool  # noqa: E402
from emulator.jobs.replay import RunConfig, warm_tcp  # noqa: E402
from spiderflow.cliutil import OneLineParser, output_file, write_output_file  # noqa: E402
from spiderflow.costmodel.calibration import Calibration  # noqa: E402
from spiderflow.topology import load_topology  # noqa: E402

TOPOLOGY = """name: thin2
routing: shortest
clusters:
  - {name: oregon, gpu: a100-80gb, nodes: 2, gpus_per_node: 8}
  - {name: tokyo, gpu: rtx4090, nodes: 4, gpus_per_node: 8}
links:
  - {a: oregon, b: tokyo, bandwidth_gbps: 0.52, latency_ms: 48.5}
"""
SIZES = [256 * 2 ** 20, 16 * 2 ** 20, 4 * 2 ** 20, 2 ** 20]
OUT = REPO / "benchmarks" / "results" / "thin_link_transfer.md"


def transfers(timeline: dict) -> tuple[list[float], float, float]:
    """(idle-link transfer times, the queued activation's extra time, the predicted transfer) in seconds."""
    r0, r1 = ({(o[0], o[1]): (o[2], o[3]) for o in r["ops"]} for r in timeline["measured"]["ranks"])
    s0, s1 = ({(o[0], o[1]): (o[2], o[3]) for o in ops} for ops in timeline["predicted"]["stages"])
    f1, b0 = s1[("F", 0)][1] - s1[("F", 0)][0], s0[("B", 0)][1] - s0[("B", 0)][0]
    act = {k: r1[("F", k)][1] - f1 - r0[("F", k)][1] for k in range(8)}
    grad = {k: r0[("B", k)][1] - b0 - r1[("B", k)][1] for k in range(8)}
    idle = [act[k] for k in range(2, 8, 2)] + list(grad.values())
    queued = (r1[("F", 1)][1] - f1) - (r1[("F", 0)][1] - f1)  # arrival gap of two back-to-back activations
    predicted = s1[("F", 2)][0] - s0[("F", 2)][1]
    return idle, queued, predicted


def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(prog="benchmarks/thin_link_transfer.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=output_file, default=str(OUT))
    args = ap.parse_args(argv)
    require_root()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "thin2.yaml").write_text(TOPOLOGY)
        topo = load_topology(str(work / "thin2.yaml"))
        net = NetConfig(hosts_per_cluster=2)
        view = emulated_view(topo, net)
        tests = [{"id": 0, "op": "p2p", "scope": "wan", "name": "oregon->tokyo", "clusters": ["oregon", "tokyo"],
                  "ranks": [0, 2], "sizes": SIZES, "samples": 5, "warmup": 1, "samples_large": 2,
                  "large_bytes": LARGE_BYTES}]
        case = PlanCase(plan_id="pipe2-thin", shape="pipeline", model="gpt3-350m", replicas=(("oregon", "tokyo"),),
                        dp=1)
        with Emulation(topo, net, log=print) as emu, RankPool(emu, log=print) as pool:  # ranks start warm
            warm_tcp(emu)
            records = run_microbench(emu, topo, tests, view, out_dir=work / "bench", pools=pool, log=print)
            record, timeline = run_case(emu, topo, case, RunConfig(iterations=5, warmup=1, time_scale=1.0, net=net),
                                        Calibration(), out_dir=work / "plans", log=print, pool=pool)
    chan = view.p2p("oregon", "tokyo")
    lines = ["# Transfers over a thin link: isolated p2p vs inside a pipeline", "",
             f"{dt.date.today()}, {platform.node()}, `sudo .venv/bin/python benchmarks/thin_link_transfer.py`; "
             f"oregon->tokyo 0.52 Gbit/s, 48.5 ms, scale 10, delay by {emu.mechanism}.", "",
             "| what | bytes (real) | measured (ms) | alpha + n / beta (ms) | measured - model (ms) |",
             "|---|---|---|---|---|"]
    for r in sorted(records, key=lambda r: r["bytes"]):
        model = chan.alpha_s + r["bytes"] / chan.bytes_per_s
        lines.append(f"| isolated p2p (median of {len(r['samples_s'])}) | {r['bytes']} | {r['time_s'] * 1e3:.1f} | "
                     f"{model * 1e3:.1f} | {(r['time_s'] - model) * 1e3:+.1f} |")
    idle, queued, predicted = transfers(timeline)
    n = (predicted - chan.alpha_s) * chan.bytes_per_s
    lines.append(f"| pipeline, link idle before (median of {len(idle)}, spread "
                 f"{min(idle) * 1e3:.1f}-{max(idle) * 1e3:.1f}) | {n:.0f} | {statistics.median(idle) * 1e3:.1f} | "
                 f"{predicted * 1e3:.1f} | {(statistics.median(idle) - predicted) * 1e3:+.1f} |")
    lines.append(f"| pipeline, queued behind the previous activation (its n / beta) | {n:.0f} | "
                 f"{queued * 1e3:.1f} | {(predicted - chan.alpha_s) * 1e3:.1f} | "
                 f"{(queued - predicted + chan.alpha_s) * 1e3:+.1f} |")
    lines += ["", f"Iteration: measured {record['measured_s']:.3f} s, predicted {record['predicted_uncalibrated_s']:.3f} s "
              f"({(record['predicted_uncalibrated_s'] / record['measured_s'] - 1) * 100:+.1f}%)."]
    write_output_file(args.out, "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
