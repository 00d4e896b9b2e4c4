"""Acme (Seren, Kalos) and Helios importers on hand-written rows of their published schemas."""

import re
import shutil

import pytest

from spiderflow.errors import ConfigError
from spiderflow.traces import load_trace
from spiderflow.workload import Job


def job(job_id, arrival_s, model, gpus, batch, seq, duration_s, iters):
    return Job(job_id=job_id, arrival_s=arrival_s, model=model, gpus=gpus, global_batch=batch,
               seq_len=seq, iterations=iters(model, gpus, batch, seq, duration_s))


def test_acme_seren_rows_field_by_field(data, iters, legacy, dropped):
    load = load_trace(data / "acme_seren.csv", **legacy)
    assert load.format == "acme" and load.skipped == 0
    assert load.jobs == (
        # Pretrain on 16 GPUs: base gpt3-2.7b, one rung up; 36000 s run; first arrival is 0.
        job("9000101", 0.0, "gpt3-6.7b", 16, 1024, 2048, 36000, iters),
        # Eval on 8 GPUs: base gpt3-1.3b, one rung down; arrives 10 min later.
        job("9000102", 600.0, "gpt3-350m", 8, 256, 2048, 600, iters),
        # SFT on 24 GPUs -> 32 (power of two); its time is in UTC: 16:30Z = 00:30+08:00.
        job("9000106", 1800.0, "gpt3-6.7b", 32, 1024, 2048, 7200, iters),
    )
    # By hand: 3 x forward = 9.04e16 FLOPs per iteration over 16 x 140.4 TFLOP/s = 40.25 s;
    # 36000 s / 40.25 s = 894.4 iterations.
    assert load.jobs[0].iterations == 894
    assert load.dropped == dropped(no_gpus=1, not_finished=2, below_min_gpus=1)


def test_acme_kalos_extra_columns_and_blank_duration(data, iters, legacy):
    load = load_trace(data / "acme_kalos.csv", **legacy)
    assert load.format == "acme"
    assert load.jobs == (
        job("dlcaaaa1111bbbb2", 0.0, "llama2-70b", 128, 1024, 4096, 86400, iters),  # Pretrain: 13b + 1
        job("dlcaaaa1111bbbb4", 1800.0, "gpt3-350m", 8, 256, 2048, 900, iters),  # duration = end - start
    )
    assert load.dropped["not_finished"] == 1


def test_acme_default_mapping_keeps_small_and_unfinished_jobs(data, iters, dropped):
    load = load_trace(data / "acme_seren.csv")  # Acme: gpu_scale 1; raised to 8 GPUs; failures censored
    by_id = {j.job_id: j for j in load.jobs}
    assert list(by_id) == ["9000101", "9000103", "9000105", "9000102", "9000106", "9000107"]
    # Debug on 1 GPU: raised to 8 GPUs; base gpt3-1.3b, one rung down for Debug.
    assert by_id["9000103"] == job("9000103", 300.0, "gpt3-350m", 8, 256, 2048, 120, iters)
    assert by_id["9000105"] == job("9000105", 420.0, "gpt3-6.7b", 32, 1024, 2048, 60, iters)  # FAILED: ran 60 s
    assert by_id["9000107"].gpus == 8 and by_id["9000107"].model == "gpt3-1.3b"  # CANCELLED after 240 s
    assert load.dropped == dropped(no_gpus=1)
    assert "kept 2 that failed or were killed" in load.report[1]
    assert "raised 1 to 8" in load.report[4] and "x1, a power of two in [8, 512]" in load.report[4]


def test_acme_fixed_shape_options(data):
    load = load_trace(data / "acme_seren.csv", iteration_time_s=2.0, global_batch=64, seq_len=1024,
                      min_gpus=16, max_gpus=16, small="drop", unfinished="drop")
    assert [(j.job_id, j.gpus, j.iterations, j.global_batch, j.seq_len) for j in load.jobs] == [
        ("9000101", 16, 18000, 64, 1024), ("9000106", 16, 3600, 64, 1024)]
    assert load.dropped["below_min_gpus"] == 2  # the 1- and 8-GPU jobs


@pytest.mark.parametrize("line, message", [
    (3, "gpu_num must be a number >= 0 (got 'abc')"),
    (4, "submit_time must be a date-time like '2023-03-01 00:18:22+08:00' (got 'yesterday')"),
    (5, "type must be one of Pretrain, SFT, Eval, MLLM, Debug, Other (got 'Training')"),
    (6, "state must be one of COMPLETED, CANCELLED, FAILED"),
])
def test_acme_bad_rows_name_their_line(data, tmp_path, line, message):
    lines = (data / "acme_bad.csv").read_text().splitlines()
    path = tmp_path / "acme.csv"
    path.write_text("\n".join(lines[:2] + [lines[line - 1]]) + "\n")
    with pytest.raises(ConfigError, match=re.escape(f"acme.csv:3: {message}")):
        load_trace(path, format="acme")
    with pytest.raises(ConfigError, match=re.escape("acme_bad.csv:3: gpu_num")):
        load_trace(data / "acme_bad.csv")


def test_acme_skip_bad_rows(data):
    load = load_trace(data / "acme_bad.csv", skip_bad_rows=True)
    assert load.skipped == 4
    assert [(j.job_id, j.arrival_s, j.gpus) for j in load.jobs] == [("1", 0.0, 8), ("6", 3600.0, 16)]


def test_acme_header_missing_column(tmp_path, data):
    text = (data / "acme_seren.csv").read_text().replace(",duration,", ",runtime,", 1)
    path = tmp_path / "acme.csv"
    path.write_text(text)
    with pytest.raises(ConfigError, match=r"acme.csv:1: header lacks column\(s\) duration"):
        load_trace(path, format="acme")


def test_unknown_option_is_refused(data):
    with pytest.raises(ConfigError, match="trace option 'min_gpu' is not known for format acme; known: "):
        load_trace(data / "acme_seren.csv", min_gpu=8)
    with pytest.raises(ConfigError, match=r"min_gpus must be a power of two >= 1 \(got 12\)"):
        load_trace(data / "acme_seren.csv", min_gpus=12)


def test_everything_dropped_is_an_error(data):
    with pytest.raises(ConfigError, match="no jobs left .* dropped no_gpus=1, not_finished=2, below_min_gpus=4"):
        load_trace(data / "acme_seren.csv", min_gpus=64, small="drop", unfinished="drop")


def test_helios_rows_field_by_field(data, iters, legacy, dropped):
    load = load_trace(data / "helios.csv", **legacy)
    assert load.format == "helios"
    assert load.jobs == (
        job("1002", 0.0, "gpt3-13b", 64, 1024, 2048, 86400, iters),
        job("1001", 1800.0, "gpt3-1.3b", 8, 512, 2048, 3600, iters),
        job("1008", 5400.0, "gpt3-2.7b", 16, 512, 2048, 7200, iters),  # 12 -> 16 GPUs; end - start
    )
    # 1003: 2 GPUs; 1004: TIMEOUT; 1005: CPU only; 1006: "CANCELLED by 42"; 1007: ran 0 s
    assert load.dropped == dropped(no_gpus=1, not_finished=2, no_runtime=1, below_min_gpus=1)


def test_helios_bad_row(tmp_path, data):
    text = (data / "helios.csv").read_text().replace("2020-04-01 09:01:00,2020-04-01 11:01:00,,60",
                                                     "2020-04-01 11:01:00,2020-04-01 09:01:00,,60")
    path = tmp_path / "cluster_log.csv"
    path.write_text(text)
    with pytest.raises(ConfigError, match=r"cluster_log.csv:9: end_time must not precede start_time"):
        load_trace(path)
    assert load_trace(path, skip_bad_rows=True).skipped == 1


def test_ids_must_be_unique(tmp_path, data):
    path = tmp_path / "h.csv"
    shutil.copy(data / "helios.csv", path)
    with open(path, "a") as fh:
        fh.write("1001,uA,vcX,8,48,1,COMPLETED,2020-04-01 10:00:00,2020-04-01 10:00:20,"
                 "2020-04-01 11:00:20,3600,20\n")
    with pytest.raises(ConfigError, match=r"h.csv:10: job_id repeats line 2 \(got '1001'\)"):
        load_trace(path)


def test_helios_running_job_is_censored_at_the_trace_end(tmp_path):
    path = tmp_path / "cluster_log.csv"
    path.write_text("job_id,user,vc,gpu_num,cpu_num,node_num,state,submit_time,start_time,end_time,duration,queue\n"
                    "1,uA,vcX,8,48,1,COMPLETED,2020-04-01 08:00:00,2020-04-01 08:00:00,2020-04-01 10:00:00,7200,0\n"
                    "2,uB,vcX,8,48,1,RUNNING,2020-04-01 08:30:00,2020-04-01 09:00:00,,,1800\n")
    load = load_trace(path, iteration_time_s=1.0)
    assert [(j.job_id, j.arrival_s, j.iterations) for j in load.jobs] == [("1", 0.0, 7200), ("2", 1800.0, 3600)]
    assert "and 1 still running, cut at the trace end" in load.report[1]
    assert [j.job_id for j in load_trace(path, unfinished="drop").jobs] == ["1"]
