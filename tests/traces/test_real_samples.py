"""Every real sample under tests/traces/data/real/ (its README cites source, rows and licence)
read with the default mapping, the format told from the header, then replayed in the simulator.

Only Alibaba v2023 rows could be taken: the Philly, Helios, Acme and Alibaba v2020 traces are
stored as an LFS pointer, zip downloads or tar.gz archives (see the README). The counts below
were checked against the rows (test_trace_real.py takes the default-file sample apart further).
"""

import csv
from collections import Counter
from pathlib import Path

import pytest

from spiderflow.errors import ConfigError
from spiderflow.simulate.engine import SimConfig, simulate
from spiderflow.topology.load import load_topology
from spiderflow.traces import load_trace
from spiderflow.traces.sniff import sniff_format

REAL = Path(__file__).parent / "data" / "real"
PAPER8 = Path(__file__).parents[2] / "topologies" / "paper8.yaml"
V2023_HEADER = ["name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec", "qos", "pod_phase",
                "creation_time", "deletion_time", "scheduled_time"]

DEFAULT = "alibaba2023_openb_pod_list_default_3402-4310.csv"
SPEC = "alibaba2023_openb_pod_list_gpuspec33_3642-3862.csv"
NO_TIMES = "alibaba2023_openb_pod_list_multigpu50_0000-0019.csv"

# file -> (format, rows, jobs kept, TraceLoad.dropped) under the default mapping
SAMPLES = {
    # 909 pods: 109 CPU-only; 119 Pending never ran; 336 GPU shares pack into 148 whole GPUs
    DEFAULT: (
        "alibaba-v2023", 909, 493,
        {"no_gpus": 109, "not_finished": 0, "no_runtime": 119, "fractional": 0, "below_min_gpus": 0,
         "merged": 188}),
    # 221 pods: 22 CPU-only; 30 Pending never ran; 86 GPU shares that ran pack into 39 whole GPUs
    SPEC: (
        "alibaba-v2023", 221, 122,
        {"no_gpus": 22, "not_finished": 0, "no_runtime": 30, "fractional": 0, "below_min_gpus": 0,
         "merged": 47}),
}


def _rows(name):
    with open(REAL / name, newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_format_is_told_from_the_real_header(name):
    assert sniff_format(REAL / name) == SAMPLES[name][0]
    assert (REAL / name).read_text().splitlines()[0].split(",") == V2023_HEADER


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_default_mapping_keeps_a_sensible_share(name):
    fmt, rows, kept, dropped = SAMPLES[name]
    assert len(_rows(name)) == rows
    load = load_trace(REAL / name)
    assert (load.format, load.skipped, len(load.jobs), load.dropped) == (fmt, 0, kept, dropped)
    assert len(load.jobs) + sum(load.dropped.values()) == rows  # every row is a job or a counted drop
    assert len(load.jobs) > rows // 3
    assert [line.split(":")[0] for line in load.report] == [
        "gpus", "unfinished=censor", "runtime", "fractional=aggregate", "scale", "result"]


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_mapped_jobs_are_sane(name):
    jobs = load_trace(REAL / name).jobs
    arrivals = [j.arrival_s for j in jobs]
    assert arrivals[0] == 0.0 and arrivals == sorted(arrivals)
    assert all(j.gpus > 0 and j.iterations >= 1 for j in jobs)
    assert len({j.job_id for j in jobs}) == len(jobs)


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_first_jobs_replay_on_paper8(name):
    jobs = load_trace(REAL / name).jobs[:20]
    records = simulate(load_topology(PAPER8), jobs, SimConfig(planner="blind"))
    assert [r.job.job_id for r in records] == [j.job_id for j in jobs]
    assert all(r.status == "done" and r.end_s > r.start_s >= r.arrival_s for r in records)


def test_gpuspec_rows_map_as_the_default_files_rows():
    """openb_pod_list_gpuspec33.csv is the default list with GPU-type constraints added (the v2023
    README): its gpu_spec values ("P100|V100M16|V100M32", "T4", ...) are ignored, so its rows
    give the jobs the same pods of the default file give."""
    spec = _rows(SPEC)
    assert sum(bool(r["gpu_spec"]) for r in spec) == 73
    assert sum("|" in r["gpu_spec"] for r in spec) == 13
    default = {r["name"]: r for r in _rows(DEFAULT)}
    assert all({**r, "gpu_spec": ""} == default[r["name"]] for r in spec)
    assert Counter(r["pod_phase"] for r in spec) == {"Running": 139, "Failed": 47, "Pending": 30, "Succeeded": 5}
    assert Counter(j.gpus for j in load_trace(REAL / SPEC).jobs) == {8: 120, 16: 1, 64: 1}  # x8: 1, 2, 8 GPUs


def test_sampled_list_without_times_is_refused_by_name():
    """The workload lists sampled from the default one (multigpu50 here) keep only five columns:
    the header still says v2023, and the error names the missing time columns."""
    path = REAL / NO_TIMES
    assert sniff_format(path) == "alibaba-v2023"
    with pytest.raises(ConfigError, match="header lacks column.*pod_phase, creation_time, deletion_time, "
                                          "scheduled_time"):
        load_trace(path)
