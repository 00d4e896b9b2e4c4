"""The input families of issue 16, each a valid seed from the repo and a way to spoil it,
and the curated list of inputs every one of which must be rejected.

A :class:`Case` is files to write into a scratch working directory plus the command line
of ``python -m spiderflow`` that reads them (and, for file families, the loader to call
directly: the test calls it in-process, which is cheaper than the CLI, and checks that an
accepted file loaded as written). Paths in command lines are relative to the scratch
directory, which holds copies of the seeds (:func:`prepare_workdir`), so a mutated
``--out`` can never write into the repository.
"""

from __future__ import annotations

import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .mutate import (BIG_DIGITS, HUGE_DIGITS, OVERSIZE, laughs, mutate_argv, mutate_csv, mutate_json, mutate_yaml,
                     nested)

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "traces" / "data"
CALIB = REPO / "tests" / "emulator" / "data" / "calib_small"
CALIB_FILES = ("config.json", "microbench.jsonl", "plans.jsonl", "timelines/d1.json")  # a run of emulator calibrate

# scratch-directory path -> repo file it copies
COPIES = {
    "topologies/default.yaml": REPO / "topologies/default.yaml",
    "topologies/paper8.yaml": REPO / "topologies/paper8.yaml",
    "traces/default.csv": REPO / "traces/default.csv",
    "cal/calibration-default.json": REPO / "benchmarks/results/calibrate-default/calibration-default.json",
    "cal/calibration-paper8.json": REPO / "benchmarks/results/calibrate-paper8/calibration-paper8.json",
    "data/acme_seren.csv": DATA / "acme_seren.csv",
    "data/acme_kalos.csv": DATA / "acme_kalos.csv",
    "data/helios.csv": DATA / "helios.csv",
    "data/alibaba2023.csv": DATA / "alibaba2023.csv",
    "data/philly.json": DATA / "philly.json",
    "data/philly.jsonl": DATA / "philly.jsonl",
    "data/ours_ok.csv": DATA / "ours_ok.csv",
    "data/alibaba2020/pai_task_table.csv": DATA / "alibaba2020/pai_task_table.csv",
    "data/alibaba2020/pai_job_table.csv": DATA / "alibaba2020/pai_job_table.csv",
    **{f"calib/{rel}": CALIB / rel for rel in CALIB_FILES},
}


# WAN and capacity events for topologies/default.yaml (docs/wan-events.md): every column used,
# empty cells (unchanged), a link down and up again, a withdrawal with notice and return, one for good
EVENT_SEEDS = {
    "wan/default.csv": ("time_s,link,bandwidth_gbps,latency_ms,up\n"
                        "0,oregon-virginia,0.5,,1\n2,virginia-london,,40,1\n3,tokyo-oregon,,,0\n"
                        "6,oregon-tokyo,0.8,25,1\n9,tokyo-london,0.05,80.5,1\n"),
    "wan/capacity.csv": ("time_s,cluster,gpus,notice_s,return_s\n"
                         "2,tokyo,4,1,12\n5,oregon,16,0,\n7,london,8,2.5,30\n"),
}


def prepare_workdir(work: Path) -> Path:
    """Empty ``work`` (what the last case wrote or made) and copy the seeds into it, with an
    existing file and directory for ``--out`` to hit; every case starts from the same state."""
    for entry in work.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    for rel, src in COPIES.items():
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, work / rel)
    for rel, text in EVENT_SEEDS.items():
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_text(text)
    (work / "existing_file.txt").write_text("not a directory\n")
    (work / "existing_dir").mkdir(exist_ok=True)
    (work / "out").mkdir(exist_ok=True)
    return work


def seed_bytes(rel: str) -> bytes:
    return COPIES[rel].read_bytes()


@dataclass
class Case:
    family: str
    label: str  # how it was made, for reports
    argv: list[str] | None  # python -m <program> ...; None: only the loader
    files: dict[str, bytes] = field(default_factory=dict)  # scratch-relative path -> content
    loader: tuple[str, str, dict] | None = None  # (topology | calibration | trace, path, keyword arguments)
    program: str = "spiderflow"  # or "emulator" (as a user without root: tests/fuzzkit/run.py)

    def write(self, work: Path) -> None:
        """Reset ``work`` (:func:`prepare_workdir`) and write this case's files into it."""
        prepare_workdir(work)
        for rel, data in self.files.items():
            path = work / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)


# ---------------------------------------------------------------- file families

PLAN = ["--model", "gpt3-125m", "--gpus", "8", "--time-limit", "1", "--json"]
SIM = ["--planner", "spinsearch", "--search-budget", "20", "--time-limit", "1", "--json"]


def _topology(rng: random.Random) -> Case:
    seed = rng.choice(["topologies/default.yaml", "topologies/paper8.yaml"])
    data = mutate_yaml(rng, seed_bytes(seed))
    return Case("topology", f"mutated {seed}", ["plan", "--topology", "in/topo.yaml", *PLAN],
                {"in/topo.yaml": data}, ("topology", "in/topo.yaml", {}))


def _calibration(rng: random.Random) -> Case:
    name = rng.choice(["default", "paper8"])
    data = mutate_json(rng, seed_bytes(f"cal/calibration-{name}.json"))
    argv = ["plan", "--topology", f"topologies/{name}.yaml", "--calibration", "in/cal.json", "--model", "gpt3-350m",
            "--gpus", "24", "--time-limit", "1", "--json"]
    return Case("calibration", f"mutated calibration-{name}.json", argv, {"in/cal.json": data},
                ("calibration", "in/cal.json", {}))


def _trace_case(family: str, rng: random.Random, seed: str, fmt: str, data: bytes, topology: str,
                rel: str | None = None, files: dict[str, bytes] | None = None) -> Case:
    rel = rel or "in/trace" + Path(seed).suffix
    given = rng.choice([None, fmt])
    skip = rng.random() < 0.4
    argv = ["simulate", "--topology", topology, "--trace", rel, *SIM]
    argv += ["--format", given] if given else []
    argv += ["--skip-bad-rows"] if skip else []
    return Case(family, f"mutated {seed}", argv, files or {rel: data},
                ("trace", rel, {"format": given, "skip_bad_rows": skip}))


def _csv_family(family: str, fmt: str, seeds: list[str], topology: str) -> Callable[[random.Random], Case]:
    def make(rng: random.Random) -> Case:
        seed = rng.choice(seeds)
        return _trace_case(family, rng, seed, fmt, mutate_csv(rng, seed_bytes(seed)), topology)
    return make


def _philly(rng: random.Random) -> Case:
    seed = rng.choice(["data/philly.json", "data/philly.jsonl"])
    data = mutate_json(rng, seed_bytes(seed), lines=seed.endswith("l"))
    return _trace_case("trace-philly", rng, seed, "philly", data, "topologies/paper8.yaml")


def _alibaba2020(rng: random.Random) -> Case:
    tables = {name: seed_bytes(f"data/alibaba2020/{name}") for name in ("pai_task_table.csv", "pai_job_table.csv")}
    which = rng.choice(list(tables))
    tables[which] = mutate_csv(rng, tables[which], headed=False)
    if rng.random() < 0.2:
        del tables["pai_job_table.csv"]  # the job table is optional
    files = {f"in/ali/{name}": data for name, data in tables.items()}
    where = rng.choice(["in/ali", "in/ali/pai_task_table.csv"])
    return _trace_case("trace-alibaba-v2020", rng, f"alibaba2020/{which}", "alibaba-v2020", b"",
                       "topologies/paper8.yaml", rel=where, files=files)


def _events_family(family: str, seed: str, option: str) -> Callable[[random.Random], Case]:
    """A mutated events file replayed under the default trace (its loader, then the simulator's
    changes to the network or the GPU pool); now and then validated alone by ``wan check``."""
    def make(rng: random.Random) -> Case:
        data = mutate_csv(rng, EVENT_SEEDS[seed].encode())
        if rng.random() < 0.25:
            argv = ["wan", "check", "in/events.csv", "--topology", "topologies/default.yaml", "--json"]
            argv += ["--capacity"] if option == "--capacity-events" else []
        else:
            argv = ["simulate", "--topology", "topologies/default.yaml", "--trace", "traces/default.csv",
                    option, "in/events.csv", *SIM]
            argv += ["--no-replan"] if rng.random() < 0.3 else []
        return Case(family, f"mutated {seed}", argv, {"in/events.csv": data})
    return make


EVENT_FAMILIES = (("wan-events", "wan/default.csv", "--wan-events"),  # (family, seed, option)
                  ("capacity-events", "wan/capacity.csv", "--capacity-events"))


def _emulator_report(rng: random.Random) -> Case:
    """A run directory of ``emulator calibrate`` (tests/emulator/data/calib_small) with one file
    spoilt, through ``python -m emulator report``."""
    rel = rng.choice(CALIB_FILES)
    data = mutate_json(rng, seed_bytes(f"calib/{rel}"), lines=rel.endswith(".jsonl"))
    return Case("emulator-report", f"mutated calib/{rel}", ["report", "calib"], {f"calib/{rel}": data},
                program="emulator")


FILE_FAMILIES: dict[str, Callable[[random.Random], Case]] = {
    "topology": _topology,
    "calibration": _calibration,
    "trace-ours": _csv_family("trace-ours", "ours", ["traces/default.csv", "data/ours_ok.csv"],
                              "topologies/default.yaml"),
    "trace-acme": _csv_family("trace-acme", "acme", ["data/acme_seren.csv", "data/acme_kalos.csv"],
                              "topologies/paper8.yaml"),
    "trace-helios": _csv_family("trace-helios", "helios", ["data/helios.csv"], "topologies/paper8.yaml"),
    "trace-alibaba-v2023": _csv_family("trace-alibaba-v2023", "alibaba-v2023", ["data/alibaba2023.csv"],
                                       "topologies/paper8.yaml"),
    "trace-philly": _philly,
    "trace-alibaba-v2020": _alibaba2020,
    **{family: _events_family(family, seed, option) for family, seed, option in EVENT_FAMILIES},
    "emulator-report": _emulator_report,
}


# ---------------------------------------------------------------- command-line families

PATHS = ["nope.yaml", "existing_dir", "/dev/null", "traces/default.csv", "topologies/default.yaml",
         "cal/calibration-default.json", "", "\udcff.yaml", "data/philly.json", "data/alibaba2020", "x" * 300,
         "existing_file.txt", "data/acme_seren.csv"]
OUTS = ["existing_file.txt", "", "missing/deeper/x", "existing_dir", "/proc/nope/x", "/dev/null", "x" * 300,
        "\udcff", "out/new", "-"]
BAD_VALUES: dict[str, list[str]] = {
    "--topology": PATHS, "--trace": PATHS, "--calibration": PATHS,
    "--out": OUTS,
    "--model": ["gpt-4", "", "GPT3-125M", "llama2-70b", "\udcff", "gpt3-125m,gpt3-350m"],
    "--gpus": ["0", "-1", "1000001", "1e3", "8.0", BIG_DIGITS, HUGE_DIGITS, "", "nan", "1000000", "57", "3"],
    "--global-batch": ["0", "-1", "1000001", "1000000", "1", "7", "nan"],
    "--seq-len": ["0", "1048577", "1048576", "1", "nan", "-5"],
    "--clusters": [",,,", "a,a", "oregon,oregon", "mars", "oregon,,tokyo", "", " ", "OREGON", "oregon",
                   "tokyo,oregon,london,virginia", "1", "0", "4097", "-3", "2", "nan", "4,8"],
    "--planner": ["nope", "", "ILP", "spinsearch ", "\udcff"],
    "--planners": ["", ",", "spinsearch,spinsearch", "spinsearch,,blind", "nope", " ,blind", "blind", ",,,"],
    "--seed": ["-1", "4294967296", "1e3", "nan", "4294967295", BIG_DIGITS, ""],
    "--time-limit": ["-1", "0", "nan", "inf", "-inf", "1e400", "86401", "1e-300", "1e-9", "NaN", "0x1", "",
                     "1_0", "-0"],
    "--search-budget": ["0", "-1", "1000001", "1", "nan", "1.5", BIG_DIGITS, ""],
    "--jobs": ["0", "-1", "10000001", "1000001", "1", "nan", "2.5", ""],
    "--format": ["nope", "acme", "philly", "alibaba-v2020", "helios", "alibaba-v2023", "ours", ""],
    "--mean-interarrival": ["0", "-1", "nan", "inf", "1e400", "1e8", "1e-300", ""],
    "--max-gpus": ["7", "12", "0", "-8", "2097152", "nan", "8", ""],
    "--arrival": ["nope", "", "POISSON"],
    "--wan-events": PATHS + ["wan/capacity.csv"], "--capacity-events": PATHS + ["wan/default.csv"],
    "--hours": ["0", "-1", "nan", "inf", "1e400", "100000", "1e-300", ""],
    "--step-s": ["0", "-1", "nan", "1e-300", "86401", "1e400", ""],
    "--outages": ["-1", "0", "1000001", "1.5", "nan", BIG_DIGITS, ""],
    "--outage-s": ["0", "-1", "nan", "1e400", "2592001", "1e-300", ""],
    "--outage-link": ["oregon-london", "oregon-oregon", "mars-oregon", "oregon", "", "-", "tokyo-oregon"],
    "--diurnal-amplitude": ["1", "0.96", "-0.1", "nan", ""],
    "--start-hour-utc": ["24", "-1", "nan", ""],
}
GENERIC = ["-1", "0", "nan", "inf", "1e400", BIG_DIGITS, "", " ", ",,,", "a,a", "\x00", "\udcff", "\u00e9", "--json",
           "1.5", "/nonexistent/x", "existing_dir", "existing_file.txt", "-"]
# dropping these would make a run legitimately slow (all planners, the paper's 4,900-trial budget)
KEEP = ("--planners", "--search-budget", "--time-limit", "--planner")

CLI_BASES: dict[str, list[list[str]]] = {
    "cli-plan": [
        ["plan", "--topology", "topologies/default.yaml", *PLAN],
        ["plan", "--topology", "topologies/default.yaml", "--model", "gpt3-350m", "--gpus", "16", "--clusters",
         "oregon,virginia", "--planner", "ilp", "--time-limit", "1", "--seed", "1", "--global-batch", "64",
         "--seq-len", "1024", "--json"],
        ["plan", "--topology", "topologies/default.yaml", "--model", "gpt3-125m", "--gpus", "8", "--calibration",
         "cal/calibration-default.json", "--planner", "blind", "--time-limit", "1"],
    ],
    "cli-simulate": [
        ["simulate", "--topology", "topologies/default.yaml", "--trace", "traces/default.csv", *SIM, "--jobs", "3",
         "--seed", "1"],
        ["simulate", "--topology", "topologies/default.yaml", "--trace", "traces/default.csv", "--planner", "blind",
         "--search-budget", "20", "--time-limit", "1", "--out", "out/sim", "--backfill", "--charge-overhead",
         "--calibration", "cal/calibration-default.json"],
        ["simulate", "--topology", "topologies/paper8.yaml", "--trace", "data/acme_seren.csv", "--format", "acme",
         "--skip-bad-rows", *SIM],
    ],
    "cli-compare": [
        ["compare", "--topology", "topologies/default.yaml", "--trace", "traces/default.csv", "--planners",
         "spinsearch,blind", "--search-budget", "20", "--time-limit", "1", "--json", "--jobs", "3"],
        # with events: floors, or none when an event makes a link faster than the topology's
        ["compare", "--topology", "topologies/default.yaml", "--trace", "traces/default.csv", "--planners",
         "spinsearch,blind", "--wan-events", "wan/default.csv", "--capacity-events", "wan/capacity.csv", "--json",
         "--jobs", "3"],
    ],
    "cli-trace": [
        ["trace", "generate", "--jobs", "5", "--seed", "1", "--arrival", "bursty", "--mean-interarrival", "60",
         "--max-gpus", "16", "--out", "out/t.csv"],
    ],
    "cli-wan": [
        ["wan", "generate", "--topology", "topologies/default.yaml", "--seed", "1", "--hours", "6", "--step-s", "1800",
         "--diurnal-amplitude", "0.5", "--start-hour-utc", "3", "--outages", "2", "--outage-s", "600",
         "--out", "out/w.csv", "--json"],
        ["wan", "generate", "--topology", "topologies/default.yaml", "--hours", "2", "--outages", "1",
         "--outage-link", "oregon-virginia", "--out", "out/w.csv"],
        ["wan", "check", "wan/capacity.csv", "--topology", "topologies/default.yaml", "--capacity"],
        ["wan", "spot", "--topology", "topologies/default.yaml", "--seed", "2", "--hours", "12", "--withdrawals", "5",
         "--notice-s", "60", "--min-hours", "1", "--max-hours", "3", "--share", "0.5", "--out", "out/s.csv", "--json"],
        ["simulate", "--topology", "topologies/default.yaml", "--trace", "traces/default.csv", *SIM,
         "--wan-events", "wan/default.csv", "--capacity-events", "wan/capacity.csv"],
    ],
    "cli-topology": [
        ["topology", "generate", "--clusters", "4", "--seed", "1", "--out", "out/t.yaml"],
        ["topology", "check", "topologies/paper8.yaml"],
    ],
}


# the emulator's commands that need root, up to their root check (run with os.geteuid answering
# 65534: tests/fuzzkit/run.py); --dilation is given, as `auto` plans every job of the trace first
EMULATOR_NET = ["--hosts-per-cluster", "2", "--scale", "10", "--intra-cap-mbps", "1000", "--delay", "auto",
                "--dilation", "2"]
EMULATOR_BASES = [
    ["run", "--topology", "topologies/default.yaml", "--trace", "traces/default.csv", "--planner", "spinsearch",
     "--iterations", "5", "--warmup", "1", "--time-scale", "1", "--job-timeout", "60", "--time-limit", "1",
     "--search-budget", "20", "--seed", "1", "--out", "out/r", *EMULATOR_NET],
    ["run", "--topology", "topologies/default.yaml", "--trace", "traces/default.csv", "--calibration",
     "cal/calibration-default.json", "--wan-events", "wan/default.csv", "--capacity-events", "wan/capacity.csv",
     "--compute", "emulated", "--dilation", "1", "--json"],
    ["compare", "--topology", "topologies/default.yaml", "--trace", "traces/default.csv", "--planners",
     "spinsearch,blind", "--startup", "model", "--iterations", "5", "--out", "out/c", *EMULATOR_NET],
    ["calibrate", "--topology", "topologies/default.yaml", "--iterations", "5", "--warmup", "1", "--samples", "3",
     "--out", "out/cal", *EMULATOR_NET],
    ["check", "--topology", "topologies/default.yaml", "--seconds", "2", "--json", *EMULATOR_NET],
]
EMULATOR_VALUES: dict[str, list[str]] = {
    **BAD_VALUES,
    "--iterations": ["0", "1", "-1", "nan", "1e400", "100001", "1.5", ""], "--warmup": ["-1", "5", "6", "nan", ""],
    "--time-scale": ["0", "-1", "nan", "inf", "1e400", ""], "--job-timeout": ["0", "-1", "nan", "inf", ""],
    "--samples": ["0", "-1", "nan", "101", ""], "--seconds": ["0", "-1", "nan", "inf", "1e400", ""],
    "--hosts-per-cluster": ["0", "-1", "nan", "241", ""], "--scale": ["0", "-1", "nan", "inf", "1e-300", ""],
    "--intra-cap-mbps": ["0", "-1", "nan", "inf", ""], "--delay": ["x", "", "NETEM"],
    "--dilation": ["0", "-1", "nan", "inf", "auto ", "65", "0.5", ""], "--startup": ["x", "-1", "nan", "inf", ""],
    "--compute": ["x", "", "REAL"], "--planner": ["nope", "", "ILP", "\udcff"],
}


def _argument_pools(values: dict[str, list[str]], *, subprocess_safe: bool) -> tuple[dict[str, list[str]], list[str]]:
    """(per-option bad values, generic bad values) for mutate_argv; ``subprocess_safe``: without the
    NUL byte an operating system cannot pass in an argument."""
    if not subprocess_safe:
        return values, GENERIC
    return ({k: [v for v in vs if "\x00" not in v] for k, vs in values.items()},
            [g for g in GENERIC if "\x00" not in g])


def _cli_family(name: str, *, subprocess_safe: bool) -> Callable[[random.Random], Case]:
    values, generic = _argument_pools(BAD_VALUES, subprocess_safe=subprocess_safe)

    def make(rng: random.Random) -> Case:
        base = rng.choice(CLI_BASES[name])
        argv = mutate_argv(rng, base, values, generic, keep=KEEP)
        return Case(name, "mutated command line", argv)
    return make


def _cli_emulator(*, subprocess_safe: bool) -> Callable[[random.Random], Case]:
    values, generic = _argument_pools(EMULATOR_VALUES, subprocess_safe=subprocess_safe)

    def make(rng: random.Random) -> Case:
        base, draw = list(rng.choice(EMULATOR_BASES)), rng.random()
        if draw < 0.25:  # the topology, as the emulator reads it: with clusters pinned to servers
            seed = rng.choice([TOPO, PINNED_TOPO])
            base[base.index("--topology") + 1] = "in/topo.yaml"
            base += ["--servers", "alpha,beta"] if seed is PINNED_TOPO and rng.random() < 0.5 else []
            return Case("cli-emulator", "mutated topology", base, {"in/topo.yaml": mutate_yaml(rng, seed.encode())},
                        program="emulator")
        if draw < 0.4 and "--trace" in base:
            base[base.index("--trace") + 1] = "in/trace.csv"
            return Case("cli-emulator", "mutated trace", base,
                        {"in/trace.csv": mutate_csv(rng, seed_bytes("traces/default.csv"))}, program="emulator")
        argv = mutate_argv(rng, base, values, generic, keep=KEEP)
        return Case("cli-emulator", "mutated command line", argv, program="emulator")
    return make


def families(*, subprocess_safe: bool = False) -> dict[str, Callable[[random.Random], Case]]:
    """Every family: name -> ``make(rng) -> Case``. ``subprocess_safe``: no NUL in an argument
    (an operating system cannot pass one)."""
    out = dict(FILE_FAMILIES)
    out.update({name: _cli_family(name, subprocess_safe=subprocess_safe) for name in CLI_BASES})
    out["cli-emulator"] = _cli_emulator(subprocess_safe=subprocess_safe)
    return out


# ---------------------------------------------------------------- inputs that must be rejected

TOPO = seed_bytes("topologies/default.yaml").decode()
CAL = seed_bytes("cal/calibration-default.json").decode()
HEADER = "job_id,arrival_s,model,gpus,iterations,global_batch,seq_len\n"
PINNED_TOPO = TOPO.replace("name: oregon,", "name: oregon, server: alpha,", 1)  # emulator/net/servers.py


def _topo_case(name: str, text: str | bytes) -> Case:
    data = text if isinstance(text, bytes) else text.encode()
    return Case("topology", name, ["plan", "--topology", "in/topo.yaml", *PLAN], {"in/topo.yaml": data},
                ("topology", "in/topo.yaml", {}))


def _cal_case(name: str, text: str | bytes) -> Case:
    data = text if isinstance(text, bytes) else text.encode()
    return Case("calibration", name, ["plan", "--topology", "topologies/default.yaml", "--calibration",
                                      "in/cal.json", *PLAN], {"in/cal.json": data}, ("calibration", "in/cal.json", {}))


def _ours_case(name: str, text: str, *extra: str, family: str = "trace-ours") -> Case:
    return Case(family, name, ["simulate", "--topology", "topologies/default.yaml", "--trace", "in/trace.csv", *SIM,
                               *extra],
                {"in/trace.csv": text.encode()},
                ("trace", "in/trace.csv", {"skip_bad_rows": "--skip-bad-rows" in extra}))


def _cli(name: str, family: str, *argv: str) -> Case:
    return Case(family, name, list(argv))


SIM_DEFAULT = ["simulate", "--topology", "topologies/default.yaml", "--trace", "traces/default.csv", *SIM]
PLAN_DEFAULT = ["plan", "--topology", "topologies/default.yaml", *PLAN]
_ROW = "a,0,gpt3-125m,8,10,32,1024\n"


def known_bad() -> list[Case]:
    """One input per bad-input class named in issue 16; every one must be rejected with one line."""
    ali_task = "jobA,worker,1000000,Terminated,1000.0,4600.0,600.0,29.3,10000.0,V100\n"
    ali_job = "jobA,a1b2c3d4e5f6,u01,Terminated,900.0,4700.0\n"
    return [
        _topo_case("topology: a Latin-1 byte in a comment", b"# caf\xe9\n" + TOPO.encode()),
        _cal_case("calibration: a Latin-1 byte in a string", CAL.replace('"paths"', '"notes": "caf\xe9", "paths"', 1)
                  .encode("latin-1")),
        _topo_case("topology: a list as a cluster's gpu", TOPO.replace("gpu: v100", "gpu: [v100]")),
        _topo_case("topology: a mapping as a link end",
                   TOPO.replace("b: london, bandwidth", "b: {x: 1}, bandwidth", 1)),
        _topo_case("topology: nodes as a 400-digit integer", TOPO.replace("nodes: 1,", f"nodes: {BIG_DIGITS},", 1)),
        _topo_case("topology: 100-deep nested YAML", TOPO.replace("routing: shortest", "routing: " + nested(100))),
        _cal_case("calibration: 100-deep nested JSON", CAL.replace('"paths"', f'"notes": {nested(100)}, "paths"', 1)),
        _cal_case("calibration: section paths as a list", '{"paths": [["oregon", "virginia"]]}'),
        _ours_case("trace: a CSV field over 128 KiB", HEADER + _ROW + "b" * OVERSIZE + ",1,gpt3-125m,8,10,32,1024\n"),
        _ours_case("trace: a CSV field over 128 KiB (the only row) with --skip-bad-rows",
                   HEADER + "b" * OVERSIZE + ",1,gpt3-125m,8,10,32,1024\n", "--skip-bad-rows"),
        Case("trace-alibaba-v2020", "alibaba-v2020: inst_num 1e6 x plan_gpu 1e4 % = 1e8 GPUs, past the "
             "1,048,576 GPUs a job may have (loader only: a simulation rejects it for the topology's size)", None,
             {"in/ali2/pai_task_table.csv": ali_task.encode(), "in/ali2/pai_job_table.csv": ali_job.encode()},
             ("trace", "in/ali2", {})),
        Case("trace-alibaba-v2020", "alibaba-v2020: inst_num and plan_gpu of 1e300",
             ["simulate", "--topology", "topologies/paper8.yaml", "--trace", "in/ali3", *SIM],
             {"in/ali3/pai_task_table.csv": ali_task.replace("1000000", "1e300").replace("10000.0", "1e300").encode(),
              "in/ali3/pai_job_table.csv": ali_job.encode()},
             ("trace", "in/ali3", {})),
        _cli("simulate --out at an existing file", "cli-simulate", *SIM_DEFAULT, "--out", "existing_file.txt"),
        _cli("trace generate --out with a missing parent", "cli-trace", "trace", "generate", "--jobs", "3",
             "--out", "missing/parent/t.csv"),
        _cli("topology generate --out at an existing directory", "cli-topology", "topology", "generate", "--clusters",
             "3", "--out", "existing_dir"),
        _cli("simulate --search-budget -1", "cli-simulate", *SIM_DEFAULT, "--search-budget", "-1"),
        _cli("simulate --search-budget 0", "cli-simulate", *SIM_DEFAULT, "--search-budget", "0"),
        _cli("simulate --time-limit -1", "cli-simulate", *SIM_DEFAULT, "--time-limit", "-1"),
        _cli("simulate --time-limit nan", "cli-simulate", *SIM_DEFAULT, "--time-limit", "nan"),
        _cli("plan --time-limit -1", "cli-plan", *PLAN_DEFAULT, "--time-limit", "-1"),
        _cli("plan --time-limit nan", "cli-plan", *PLAN_DEFAULT, "--time-limit", "nan"),
        _cli("plan --clusters ,,,", "cli-plan", *PLAN_DEFAULT, "--clusters", ",,,"),
        _cli("plan --clusters a,a", "cli-plan", *PLAN_DEFAULT, "--clusters", "a,a"),
        _cli("plan --clusters oregon,oregon", "cli-plan", *PLAN_DEFAULT, "--clusters", "oregon,oregon"),
        _cli('compare --planners ""', "cli-compare", "compare", "--topology", "topologies/default.yaml", "--trace",
             "traces/default.csv", "--planners", "", "--json"),
        _topo_case("topology: a billion-laughs alias bomb used as the name",
                   TOPO.replace("name: default", f"description: {laughs(9)}\nname: *a8", 1)),
        _topo_case("topology: duplicate keys changing a cluster's GPU count",
                   TOPO.replace("gpus_per_node: 8}", "gpus_per_node: 8, nodes: 200}", 1)),
        _cal_case("calibration: names clusters the topology lacks",
                  '{"paths": {"mars->oregon": {"alpha_s": 0.01, "beta_gbps": 1.0}}}'),
        _ours_case("trace: jobs that can never fit (--json)",
                   HEADER + "big1,0,gpt3-125m,1024,10,32,1024\nbig2,5,gpt3-350m,4096,10,32,1024\n"),
        Case("topology", "topology: name: ../../x (emulator calibrate names files after it; loader only)", None,
             {"in/topo.yaml": TOPO.replace("name: default", "name: ../../x", 1).encode()},
             ("topology", "in/topo.yaml", {})),
        _topo_case("topology: 5,000-digit integer", TOPO.replace("nodes: 1,", f"nodes: {HUGE_DIGITS},", 1)),
        _topo_case("topology: a NUL byte", TOPO.replace("routing: shortest", "routing: short\x00est", 1)),
        _cli("simulate --trace with a 300-character file name", "cli-simulate", "simulate", "--topology",
             "topologies/default.yaml", "--trace", "x" * 300, *SIM),
        _cli("plan --topology with a 300-character file name", "cli-plan", "plan", "--topology", "x" * 300, *PLAN),
        # an empty path is not the option left out (`--wan-events "$UNSET"`): it was, silently, before 2026-11-29
        _cli("simulate --wan-events ''", "cli-simulate", *SIM_DEFAULT, "--wan-events", ""),
        _cli("plan --calibration ''", "cli-plan", *PLAN_DEFAULT, "--calibration", ""),
        Case("cli-emulator", "emulator run --capacity-events ''", [*EMULATOR_BASES[0], "--capacity-events", ""],
             program="emulator"),
        Case("cli-emulator", "emulator calibrate --topology with a 300-character file name (a traceback before "
             "2026-11-29)", ["calibrate", "--topology", "x" * 300, "--dilation", "2"], program="emulator"),
        Case("emulator-report", "emulator report with a 300-character RUN_DIR (a traceback before 2026-11-29)",
             ["report", "x" * 300], program="emulator"),
        Case("cli-emulator", "emulator clean --state-dir with a 300-character name (as root: a traceback before "
             "2026-11-29)", ["clean", "--state-dir", "x" * 300], program="emulator"),
        # '-' is not standard output: it made a file or directory named '-' without a word before 2026-11-29
        _cli("trace generate --out -", "cli-trace", "trace", "generate", "--jobs", "3", "--out", "-"),
        _cli("simulate --out -", "cli-simulate", *SIM_DEFAULT, "--out", "-"),
    ]


def valid_cases() -> list[Case]:
    """Every seed unchanged and every base command line: each must be accepted (the checks'
    own test: a valid input must pass them)."""
    cases = [_topo_case(f"valid {name}", seed_bytes(f"topologies/{name}.yaml")) for name in ("default", "paper8")]
    cases += [_cal_case("valid calibration-default.json", seed_bytes("cal/calibration-default.json"))]
    for seed, fmt, topology in (("traces/default.csv", "ours", "default"), ("data/ours_ok.csv", "ours", "default"),
                                ("data/acme_seren.csv", "acme", "paper8"), ("data/acme_kalos.csv", "acme", "paper8"),
                                ("data/helios.csv", "helios", "paper8"),
                                ("data/alibaba2023.csv", "alibaba-v2023", "paper8"),
                                ("data/philly.json", "philly", "paper8"), ("data/philly.jsonl", "philly", "paper8"),
                                ("data/alibaba2020", "alibaba-v2020", "paper8")):
        argv = ["simulate", "--topology", f"topologies/{topology}.yaml", "--trace", seed, *SIM]
        cases.append(Case(f"trace-{fmt}", f"valid {seed}", argv, {}, ("trace", seed, {})))
    cases += [Case(name, "valid " + " ".join(argv), argv) for name, bases in CLI_BASES.items() for argv in bases]
    for family, seed, option in EVENT_FAMILIES:
        cases.append(Case(family, f"valid {seed}", ["simulate", "--topology", "topologies/default.yaml", "--trace",
                                                      "traces/default.csv", option, seed, *SIM]))
    cases.append(Case("emulator-report", "valid calib/ (tests/emulator/data/calib_small)", ["report", "calib"],
                      program="emulator"))
    cases += [Case("cli-emulator", "valid " + " ".join(argv), argv, program="emulator") for argv in EMULATOR_BASES]
    cases.append(Case("cli-emulator", "valid emulator check of a topology pinning a cluster to a server",
                      ["check", "--topology", "in/topo.yaml", "--servers", "alpha,beta", "--dilation", "2"],
                      {"in/topo.yaml": PINNED_TOPO.encode()}, program="emulator"))
    # a file name that is not UTF-8 (bytes 0xff on the command line) is a valid name to write
    cases += [Case("cli-topology", "valid topology generate --out to a non-UTF-8 file name",
                   ["topology", "generate", "--clusters", "3", "--out", "out/\udcff.yaml"]),
              Case("cli-trace", "valid trace generate --out to a non-UTF-8 file name",
                   ["trace", "generate", "--jobs", "3", "--out", "out/\udcff.csv"])]
    return cases
