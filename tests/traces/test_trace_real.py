"""Importers on real rows of the public traces (tests/traces/data/real/README.md cites each sample).

Only Alibaba v2023 has rows we could take (the other traces ship as archives or LFS
files; see the README). The counts below were checked by hand against the rows.
"""

import statistics
from collections import Counter

import pytest

from spiderflow.traces import load_trace
from spiderflow.traces.mapping import model_for

REAL = "real/alibaba2023_openb_pod_list_default_3402-4310.csv"


def test_v2023_sample_rows_as_published(data):
    lines = (data / REAL).read_text().splitlines()
    assert lines[0] == ("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
                        "creation_time,deletion_time,scheduled_time")
    rows = [ln.split(",") for ln in lines[1:]]
    assert [r[0] for r in rows] == [f"openb-pod-{i:04d}" for i in range(3402, 4311)]
    assert Counter(r[7] for r in rows) == {"Running": 571, "Failed": 197, "Pending": 121, "Succeeded": 20}
    assert Counter(r[3] for r in rows) == {"1": 797, "0": 109, "2": 1, "4": 1, "8": 1}
    assert sum(r[3] == "1" and r[4] != "1000" for r in rows) == 399  # GPU-sharing pods


def test_v2023_default_mapping_keeps_hundreds_of_jobs(data):
    load = load_trace(data / REAL)  # format told from the header
    assert load.format == "alibaba-v2023" and load.skipped == 0
    # 909 pods: 109 CPU-only, 119 never scheduled (121 Pending, 2 of them CPU-only);
    # 336 GPU shares that ran pack into 148 whole GPUs (188 merged); 197 Failed kept.
    assert len(load.jobs) == 493
    assert load.dropped == {"no_gpus": 109, "not_finished": 0, "no_runtime": 119, "fractional": 0,
                            "below_min_gpus": 0, "merged": 188}
    assert len(load.jobs) + sum(load.dropped.values()) == 909
    assert Counter(j.gpus for j in load.jobs) == {8: 490, 16: 1, 32: 1, 64: 1}  # x8: 1, 2, 4, 8 GPUs
    assert [line.split(":")[0] for line in load.report] == [
        "gpus", "unfinished=censor", "runtime", "fractional=aggregate", "scale", "result"]
    assert "kept 197 that failed" in load.report[1]
    assert "packed 336 holding a share of one GPU into 148 1-GPU jobs" in load.report[3]


def test_v2023_mapped_jobs_are_sane(data):
    jobs = load_trace(data / REAL).jobs
    assert len({j.job_id for j in jobs}) == len(jobs)
    assert jobs[0].arrival_s == 0.0 and all(a.arrival_s <= b.arrival_s for a, b in zip(jobs, jobs[1:]))
    # arrivals keep the trace's clock: pod-3402 at 11304463 s, the last pod at 11622264 s
    assert jobs[-1].arrival_s == pytest.approx(11621915 - 11304463, abs=400)
    assert all(j.model == model_for(j.gpus) and j.iterations >= 1 for j in jobs)
    gaps = [b.arrival_s - a.arrival_s for a, b in zip(jobs, jobs[1:])]
    assert 300 < statistics.mean(gaps) < 1000  # about one job every 10 minutes, as in the trace


def test_v2023_legacy_mapping_kept_nothing(data):
    """The mapping before issue 15 (GPUs as traced, >= 8, finished only, no shares) keeps no job
    of these rows: the one 8-GPU pod failed. Each rule alone keeps hundreds."""
    counts = {}
    for opts in ({"fractional": "drop"}, {"unfinished": "drop"}, {"gpu_scale": 1}):
        counts[tuple(opts.items())] = len(load_trace(data / REAL, **opts).jobs)
    assert counts == {(("fractional", "drop"),): 345, (("unfinished", "drop"),): 377, (("gpu_scale", 1),): 493}
    with pytest.raises(Exception, match="no jobs left"):
        load_trace(data / REAL, gpu_scale=1, unfinished="drop", fractional="drop", small="drop")


def test_cli_import_reports_each_rule_on_stderr(data, tmp_path, capsys, cli):
    main = cli
    out = tmp_path / "ali.csv"
    assert main(["trace", "import", str(data / REAL), "--out", str(out)]) == 0
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 6 and all(ln.startswith(f"{data / REAL}: ") for ln in lines)
    assert "wrote" in captured.out and "493 jobs" in captured.out
    assert load_trace(out).jobs == load_trace(data / REAL).jobs  # our CSV reads back the same jobs
    assert main(["trace", "import", str(data / REAL), "--gpu-scale", "1", "--fractional", "drop",
                 "--unfinished", "drop", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "unfinished=drop: dropped 316" in err and "fractional=drop: dropped 162" in err
    assert len(load_trace(out).jobs) == 322  # 800 GPU pods - 316 failed or pending - 162 shares
    assert main(["trace", "import", str(data / REAL), "--fractional", "keep", "--out", str(out)]) == 2
