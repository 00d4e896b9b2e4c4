"""Rank start-up, cold processes vs the warm rank pool (needs root); writes benchmarks/results/rank_startup.md.

1. Memory (loopback, before the network is built): RSS and PSS
   (/proc/PID/smaps_rollup) of the idle pool server; the extra PSS per forked
   child, idle (``tests.emulator.pool_targets sleep``) and as a worker rank
   waiting at its rendezvous; the PSS of a cold worker rank waiting there.
2. Start-up on ``topologies/paper8.yaml`` with 3 hosts per cluster: 10
   two-rank jobs (world size 2, the two ranks in two clusters, 1 iteration of
   1 micro-batch, 1 ms compute) handed over at once, 20 ranks. Cold: each
   rank is ``emu.popen(host, ["nice", "-n", "10", python, "-m",
   "emulator.jobs.worker", SPEC])``, as the runner starts ranks today; pool:
   ``RankPool.start(..., ns_pid=<host shell>, nice=10)``. A job's start-up is
   the earliest ``start`` line's ``mono`` of its ranks (written after the
   job's first barrier) minus the ``time.monotonic()`` just before its first
   rank was started (CLOCK_MONOTONIC is one clock in every namespace).
3. Third mode, pool with a local resolver: ``nameserver 127.0.0.1`` bind-mounted
   over /etc/resolv.conf in every host's own mount namespace for that run.
   Without it, rank 0's TCPStore looks up the name of each peer that connects
   (only to log it): the query leaves through the gateway, which answers
   "unreachable" at most once a second per host (ICMP rate limit), so some
   lookups wait out glibc's 5 s timeout, cold or pooled. The three modes
   alternate, ``--repeat`` times each; then each job alone (pool, local
   resolver): its rendezvous over its emulated path, the floor.

Run: ``sudo .venv/bin/python benchmarks/rank_startup.py [--repeat 3]``.

Since this was measured, ``Emulation`` itself binds that local resolver in
every host (``emulator/net/emulation.py``, ``_local_resolver``), so a run of this
script today has it in all three modes (the third stacks a second bind mount
and removes only its own): the committed results, measured before, are the
ones that show the 5 s stalls.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from emulator.net.capability import require_root  # noqa: E402
from spiderflow.cliutil import OneLineParser, int_in, one_line_errors, output_file, write_output_file  # noqa: E402
from spiderflow.errors import EmulatorError  # noqa: E402
from emulator.net.emulation import Emulation  # noqa: E402
from emulator.net.layout import NetConfig  # noqa: E402
from emulator.jobs.pool import DEFAULT_PRELOAD, RankPool  # noqa: E402
from emulator.jobs.ranklog import read_lines  # noqa: E402
from emulator.jobs.worker import STARTUP_NICE_ENV, RankSpec, rank_env  # noqa: E402
from spiderflow.topology import load_topology  # noqa: E402

NICE = 10  # emulator.jobs.replay.STARTUP_NICE
# two ranks per job, in two clusters (3 hosts each): direct links of 8-67 ms RTT, one two-hop path
PAIRS = [("ohio", "virginia"), ("ohio", "virginia"), ("oregon", "ohio"), ("oregon", "virginia"),
         ("london", "paris"), ("london", "paris"), ("ireland", "london"), ("paris", "ireland"),
         ("tokyo", "seoul"), ("tokyo", "seoul")]


def pss_kib(pid: int) -> dict[str, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        key, value = line.split(":", 1)
        fields[key] = int(value.split()[0])
    return {"rss": fields["Rss"], "pss": fields["Pss"], "anon": fields["Pss_Anon"]}


def spec(tmp: Path, job: str, rank: int, addr: str, port: int, timeout_s: float = 120.0) -> Path:
    path = tmp / f"{job}-r{rank}.json"
    RankSpec(job_id=job, rank=rank, world_size=2, master_addr=addr, master_port=port, stage=rank, depth=2,
             micro_batches=1, iterations=1, forward_s=0.001, backward_s=0.001, activation_bytes=4096,
             grad_bytes=64, prev_rank=rank - 1 if rank else None, next_rank=None if rank else 1,
             out=str(tmp / f"{job}-r{rank}.jsonl"), timeout_s=timeout_s).dump(path)
    return path


def bench_memory(tmp: Path, n: int = 4) -> dict:
    """Idle server, idle children, ranks waiting at their rendezvous (rank 0 of 2, the peer never comes)."""
    env = {**os.environ, **rank_env("lo", "lo", "gloo"), "PYTHONPATH": str(REPO)}
    out = {}
    with RankPool() as pool:
        time.sleep(1.0)
        out["server"] = pss_kib(pool.pid)
        for key, module, argv in (("idle", "tests.emulator.pool_targets", lambda i: ["sleep", "60"]),
                                  ("waiting", "emulator.jobs.worker",
                                   lambda i: [str(spec(tmp, f"mem-pool{i}", 0, "127.0.0.1", 29400 + i, 60))])):
            procs = [pool.start(module=module, args=argv(i), env=env, log_path=str(tmp / "mem.log"), ns_pid=None)
                     for i in range(n)]
            time.sleep(4.0)
            # anonymous pages only: the file-backed part stays shared within the pool (its sum is constant),
            # but moves whenever some other process on the machine maps libtorch
            total = pss_kib(pool.pid)["anon"] + sum(pss_kib(p.pid)["anon"] for p in procs)
            out[key] = (total - out["server"]["anon"]) / n
            for p in procs:
                p.kill()
                p.wait(timeout=10)
    procs = [subprocess.Popen([sys.executable, "-m", "emulator.jobs.worker",
                               str(spec(tmp, f"mem-cold{i}", 0, "127.0.0.1", 29450 + i, 60))],
                              env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for i in range(n)]
    time.sleep(4.0 + 2.0 * n)  # n torch imports on this machine's cores
    out["cold"] = {key: statistics.mean(pss_kib(p.pid)[key] for p in procs) for key in ("rss", "pss", "anon")}
    for p in procs:
        p.kill()
        p.wait()
    return out


def launch(emu, pool, tmp: Path, tag: str, jobs: list[tuple], port: int) -> list[dict]:
    """Hand every job's specs over at once; wait for every rank; per job its start-up."""
    started = []
    for i, hosts in jobs:
        job = f"{tag}-j{i}"
        paths = [spec(tmp, job, r, hosts[0].ip, port + i) for r in range(2)]
        t0 = time.monotonic()
        procs = []
        for rank, (host, path) in enumerate(zip(hosts, paths)):
            env = {**os.environ, **rank_env(host.intf, host.name, "gloo"), STARTUP_NICE_ENV: "1",
                   "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
            log = tmp / f"{job}-r{rank}.log"
            if pool is None:
                with open(log, "wb") as fh:
                    procs.append(emu.popen(host.name, ["nice", "-n", str(NICE), sys.executable, "-m",
                                                       "emulator.jobs.worker", str(path)], env=env, role=f"{job}/r{rank}",
                                           stdout=fh, stderr=subprocess.STDOUT, cwd=str(REPO)))
            else:
                procs.append(pool.start(module="emulator.jobs.worker", args=[str(path)], env=env, log_path=str(log),
                                        ns_pid=emu.node(host.name).pid, nice=NICE, cwd=str(REPO),
                                        role=f"{job}/r{rank}"))
        started.append((job, hosts, t0, procs))
    rows = []
    for job, hosts, t0, procs in started:
        codes = [p.wait(timeout=180) for p in procs]
        monos = [line["mono"] for r in range(2) for line in read_lines(tmp / f"{job}-r{r}.jsonl")[:1]]
        if codes != [0, 0] or len(monos) != 2:
            raise SystemExit(f"{job}: ranks exited {codes}; see {tmp}/{job}-r*.log")
        rows.append({"job": job, "path": f"{hosts[0].cluster}-{hosts[1].cluster}", "startup_s": min(monos) - t0})
    return rows


LOCAL = "pool, local resolver"


def local_resolver(emu, tmp: Path, on: bool) -> None:
    """Bind-mount ``nameserver 127.0.0.1`` over /etc/resolv.conf in every host's own mount namespace
    (or take it away): a lookup then fails at once (ICMP to loopback is not rate-limited)."""
    conf = tmp / "resolv.conf"
    conf.write_text("nameserver 127.0.0.1\n")
    for hosts in emu.hosts.values():
        for h in hosts:
            emu.run(h.name, ["mount", "--bind", str(conf), "/etc/resolv.conf"] if on else ["umount", "/etc/resolv.conf"])
    if "127.0.0.1" in Path("/etc/resolv.conf").read_text():
        raise EmulatorError("the bind mount reached the root mount namespace; check the hosts' mount propagation")


def summarise(mode: str, rep: int, load: float, rows: list[dict]) -> dict:
    per_job = [r["startup_s"] for r in rows]
    print(f"  {mode} {rep + 1}: median {statistics.median(per_job):.2f} s, max {max(per_job):.2f} s", file=sys.stderr)
    return {"mode": mode, "rep": rep + 1, "load": load, "rows": rows}


def bench_startup(topology: Path, repeat: int, tmp: Path) -> dict:
    with Emulation(load_topology(topology), NetConfig(hosts_per_cluster=3)) as emu:
        free = {c: list(hs) for c, hs in emu.hosts.items()}
        jobs = [(i, (free[a].pop(0), free[b].pop(0))) for i, (a, b) in enumerate(PAIRS)]
        runs, port = [], 30000
        with RankPool(emu) as pool:
            for rep in range(repeat):
                for i, mode in enumerate(("cold", "pool", LOCAL)):
                    if mode == LOCAL:
                        local_resolver(emu, tmp, on=True)
                    load = os.getloadavg()[0]
                    rows = launch(emu, pool if mode != "cold" else None, tmp, f"m{i}r{rep}", jobs, port)
                    port += 100
                    runs.append(summarise(mode, rep, load, rows))
                local_resolver(emu, tmp, on=False)
            local_resolver(emu, tmp, on=True)
            alone = [launch(emu, pool, tmp, f"alone{i}", [job], port + 100 * i)[0] for i, job in enumerate(jobs)]
    return {"runs": runs, "alone": alone, "mechanism": emu.mechanism}


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (f"{os.cpu_count()} CPUs ({cpu}), {mem_gib:.0f} GiB RAM, Linux {platform.release()}, "
            f"Python {platform.python_version()}")


def report(mem: dict, res: dict, command: str) -> str:
    mib = lambda kib: f"{kib / 1024:.1f}"  # noqa: E731
    lines = [
        "# Rank start-up: cold processes vs the warm rank pool",
        "",
        f"Measured {dt.date.today().isoformat()} on {machine()}, by `{command}` "
        f"(load average {os.getloadavg()[0]:.1f} when it finished: the machine may have been shared).",
        "",
        f"## Memory (pool preloads {', '.join(DEFAULT_PRELOAD)})",
        "",
        "| process | RSS MiB | PSS MiB | anonymous PSS MiB |",
        "|---|---|---|---|",
        f"| idle pool server | {mib(mem['server']['rss'])} | {mib(mem['server']['pss'])} | "
        f"{mib(mem['server']['anon'])} |",
        f"| + each idle forked child | | | +{mib(mem['idle'])} |",
        f"| + each forked worker rank waiting at its rendezvous | | | +{mib(mem['waiting'])} |",
        f"| a cold worker rank waiting at its rendezvous (mean of 4) | {mib(mem['cold']['rss'])} | "
        f"{mib(mem['cold']['pss'])} | {mib(mem['cold']['anon'])} |",
        "",
        "A child's extra = (anonymous PSS of the server and its n = 4 children - that of the idle server) / n: "
        "the file-backed pages (libtorch) stay shared within the pool, so this is the whole extra PSS. File "
        "pages are also shared with every other process that maps them (the 4 cold ranks share theirs), "
        "so PSS moves with what else runs; anonymous memory does not.",
        "",
        "## Start-up of 20 ranks at once: `topologies/paper8.yaml`, 3 hosts per cluster",
        "",
        f"10 two-rank jobs handed over in one burst (delay by {res['mechanism']}); per job, from its specs "
        "handed over to its ranks' first `start` line (after the job's first barrier). Target: <= 1 s.",
        "",
        "| run | mode | load avg before | median per job s | max per job s |",
        "|---|---|---|---|---|",
    ]
    for run in res["runs"]:
        per_job = [r["startup_s"] for r in run["rows"]]
        lines.append(f"| {run['rep']} | {run['mode']} | {run['load']:.1f} | {statistics.median(per_job):.2f} | "
                     f"{max(per_job):.2f} |")
    jobs = [r["path"] for r in res["runs"][0]["rows"]]
    modes = ("cold", "pool", LOCAL)
    by_mode = {mode: [[r["startup_s"] for r in run["rows"]] for run in res["runs"] if run["mode"] == mode]
               for mode in modes}
    lines += [
        "",
        "Per job (median over the runs of each mode), and the same job started alone through the pool with "
        "the local resolver (its rendezvous over the emulated path: the floor):",
        "",
        "| job | path | cold s | pool s | pool, local resolver s | alone s |",
        "|---|---|---|---|---|---|",
    ]
    for i, path in enumerate(jobs):
        cells = " | ".join(f"{statistics.median(run[i] for run in by_mode[m]):.2f}" for m in modes)
        lines.append(f"| j{i} | {path} | {cells} | {res['alone'][i]['startup_s']:.2f} |")
    lines.append("")
    for mode in modes:
        every = [x for run in by_mode[mode] for x in run]
        lines.append(f"- {mode}: median **{statistics.median(every):.2f} s**, max {max(every):.2f} s over "
                     f"{len(every)} job starts ({sum(x > 1.0 for x in every)} over 1 s)")
    stalls = sum(x > 4.5 for run in by_mode["pool"] for x in run)
    lines += [
        "",
        f"Stalls: {stalls} of the pool's job starts without the local resolver took over 4.5 s. Such a stall is "
        "rank 0's TCPStore waiting out glibc's 5 s resolver timeout on a reverse lookup of its peer (made only "
        "to log it; item 3 of the script's docstring); it comes and goes with the gateways' ICMP rate limit, "
        "hits cold ranks too (hidden in their ~30 s), and the local resolver removes it.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="benchmarks/rank_startup.py", description=__doc__.split("\n")[0])
    parser.add_argument("--topology", default=str(REPO / "topologies" / "paper8.yaml"))
    parser.add_argument("--repeat", type=int_in(1, 100), default=3)
    parser.add_argument("--out", type=output_file, default=str(REPO / "benchmarks" / "results" / "rank_startup.md"))
    args = parser.parse_args(argv)
    bad = one_line_errors(lambda: load_topology(args.topology))  # a missing or bad file: before anything is built
    if bad:
        return bad
    require_root()
    tmp = Path(tempfile.mkdtemp(prefix="rank-startup-"))
    print(f"memory (files in {tmp}):", file=sys.stderr)
    mem = bench_memory(tmp)
    print("start-up:", file=sys.stderr)
    res = bench_startup(Path(args.topology).resolve(), args.repeat, tmp)
    text = report(mem, res, "sudo .venv/bin/python benchmarks/rank_startup.py " + " ".join(sys.argv[1:]))
    write_output_file(args.out, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
