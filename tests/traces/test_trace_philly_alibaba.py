"""Philly (JSON) and Alibaba v2020 (two headerless tables) / v2023 importers."""

import re
import shutil

import pytest

from spiderflow.errors import ConfigError
from spiderflow.traces import load_trace
from spiderflow.workload import Job


def job(job_id, arrival_s, model, gpus, batch, seq, duration_s, iters):
    return Job(job_id=job_id, arrival_s=arrival_s, model=model, gpus=gpus, global_batch=batch,
               seq_len=seq, iterations=iters(model, gpus, batch, seq, duration_s))


def test_philly_jobs_field_by_field(data, iters, legacy, dropped):
    load = load_trace(data / "philly.json", **legacy)
    assert load.format == "philly" and load.skipped == 0
    assert load.jobs == (
        # 0006: the first attempt has no start (a logging gap): only the 30-min one counts; 8 GPUs.
        job("application_0001_0006", 0.0, "gpt3-1.3b", 8, 512, 2048, 1800, iters),
        # 0001: attempts held 8 then 16 GPUs -> 16; ran 74 s + 7200 s; submitted 11 min 39 s later.
        job("application_0001_0001", 699.0, "gpt3-2.7b", 16, 512, 2048, 7274, iters),
    )
    # 0002 Killed, 0005 still running (last end_time null); 0003 no attempts; 0004 4 GPUs
    assert load.dropped == dropped(not_finished=2, no_runtime=1, below_min_gpus=1)


def test_philly_json_lines(data, legacy):
    load = load_trace(data / "philly.jsonl", **legacy)
    assert load.format == "philly"
    assert [(j.job_id, j.arrival_s, j.gpus) for j in load.jobs] == [("a2", 0.0, 8), ("a1", 1800.0, 8)]


def test_philly_bad_object_names_its_line(data):
    with pytest.raises(ConfigError, match=re.escape(
            "philly_bad.json:6: jobs[1].submitted_time must be a date-time like "
            "'2023-03-01 00:18:22+08:00' (got 'yesterday')")):
        load_trace(data / "philly_bad.json")


def test_philly_skip_bad_rows(data, tmp_path):
    load = load_trace(data / "philly_bad.json", skip_bad_rows=True)
    assert load.skipped == 3 and [j.job_id for j in load.jobs] == ["application_0002_0001"]
    text = (data / "philly_bad.json").read_text().replace('"yesterday"', '"2017-10-07 01:00:00"')
    path = tmp_path / "cluster_job_log"
    path.write_text(text)
    with pytest.raises(ConfigError, match=re.escape(
            "cluster_job_log:9: jobs[2].status must be one of Pass, Killed, Failed (got 'Done')")):
        load_trace(path)
    path.write_text(text.replace('"Done"', '"Killed"'))
    with pytest.raises(ConfigError, match=re.escape(
            "cluster_job_log:11: jobs[3].attempts[0].detail[0].gpus must be a list of GPU names (got 'all')")):
        load_trace(path, format="philly")


def test_philly_broken_json(tmp_path, data):
    path = tmp_path / "log.json"
    path.write_text((data / "philly.json").read_text()[:-5])
    with pytest.raises(ConfigError, match=r"log.json:\d+: .*(JSON|cut short)"):
        load_trace(path, format="philly")
    path.write_text('"jobid attempts"')
    with pytest.raises(ConfigError, match=r"log.json:1: must start with '\['"):
        load_trace(path, format="philly")


def test_alibaba2020_task_and_job_tables(data, iters, legacy, dropped):
    for given in (data / "alibaba2020", data / "alibaba2020" / "pai_task_table.csv",
                  data / "alibaba2020" / "pai_job_table.csv"):
        load = load_trace(given, **legacy)
        assert load.format == "alibaba-v2020"
        assert load.jobs == (
            # jobA: worker 2 x 400% + ps (no GPU) = 8 GPUs; tasks ran 1000..4600; submitted at 900.
            job("jobA", 0.0, "gpt3-1.3b", 8, 512, 2048, 3600, iters),
            # jobC: 4 x 300% + 1 x 100% = 13 -> 16 GPUs; tasks ran 1400..9100; submitted at 1200.
            job("jobC", 300.0, "gpt3-2.7b", 16, 512, 2048, 7700, iters),
        )
        assert load.dropped == dropped(not_finished=1, fractional=1)  # jobD failed; jobB half a GPU


def test_alibaba2020_without_job_table(data, tmp_path, legacy):
    shutil.copy(data / "alibaba2020" / "pai_task_table.csv", tmp_path / "pai_task_table.csv")
    load = load_trace(tmp_path, **legacy)
    # Arrival falls back to the first task start: jobA 1000, jobC 1400.
    assert [(j.job_id, j.arrival_s) for j in load.jobs] == [("jobA", 0.0), ("jobC", 400.0)]
    alone = tmp_path / "jobs-only"
    alone.mkdir()
    shutil.copy(data / "alibaba2020" / "pai_job_table.csv", alone / "pai_job_table.csv")
    with pytest.raises(ConfigError, match="alibaba-v2020 needs pai_task_table.csv .* or pass task_table=PATH"):
        load_trace(alone / "pai_job_table.csv")
    with pytest.raises(ConfigError, match=r"missing.csv: cannot read trace file \(No such file"):
        load_trace(alone / "pai_job_table.csv", task_table=tmp_path / "missing.csv")


def test_alibaba2020_header_line_and_bad_rows(data, tmp_path, legacy):
    table = tmp_path / "pai_task_table.csv"
    header = "job_name,task_name,inst_num,status,start_time,end_time,plan_cpu,plan_mem,plan_gpu,gpu_type\n"
    rows = (data / "alibaba2020" / "pai_task_table.csv").read_text()
    table.write_text(header + rows)
    assert len(load_trace(table, **legacy).jobs) == 2  # header line skipped; no job table beside it
    table.write_text(header + rows + "jobE,worker,x,Terminated,1.0,2.0,600.0,1.0,100.0,T4\n")
    with pytest.raises(ConfigError, match=re.escape("pai_task_table.csv:8: inst_num must be a number >= 0 (got 'x')")):
        load_trace(table)
    table.write_text(header + rows + "jobE,worker,1.0,Done,1.0,2.0,600.0,1.0,100.0,T4\njobF,w,1.0\n")
    with pytest.raises(ConfigError, match=re.escape("pai_task_table.csv:8: status must be one of Terminated")):
        load_trace(table)
    load = load_trace(table, skip_bad_rows=True, **legacy)
    assert load.skipped == 2 and len(load.jobs) == 2


def test_alibaba2020_bad_job_table_row_names_that_file(data, tmp_path):
    shutil.copy(data / "alibaba2020" / "pai_task_table.csv", tmp_path / "pai_task_table.csv")
    text = (data / "alibaba2020" / "pai_job_table.csv").read_text().replace("1200.0", "soon")
    (tmp_path / "pai_job_table.csv").write_text(text)
    with pytest.raises(ConfigError, match=re.escape("pai_job_table.csv:3: start_time must be a number >= 0 (got 'soon')")):
        load_trace(tmp_path)


def test_alibaba2023_pods_field_by_field(data, iters, legacy, dropped):
    load = load_trace(data / "alibaba2023.csv", **legacy)
    assert load.format == "alibaba-v2023"
    assert load.jobs == (
        job("pod-f", 0.0, "gpt3-1.3b", 8, 512, 2048, 7200, iters),  # deleted while Running: kept
        job("pod-a", 20000.0, "gpt3-1.3b", 8, 512, 2048, 3500, iters),  # run = deletion - scheduled
    )
    # pod-b: a 0.3-GPU share; pod-c: CPU only; pod-d Failed; pod-e Pending (never scheduled)
    assert load.dropped == dropped(no_gpus=1, not_finished=2, fractional=1)


def test_alibaba2023_default_mapping(data, iters, dropped):
    load = load_trace(data / "alibaba2023.csv")
    assert load.jobs == (
        # pod-b alone in its group: 1 GPU x 8; runs its GPU seconds, 0.3 x 9990 s
        job("pod-b", 0.0, "gpt3-1.3b", 8, 512, 2048, 0.3 * 9990, iters),
        job("pod-d", 60000.0, "gpt3-6.7b", 32, 1024, 2048, 990, iters),  # Failed: kept for the 990 s it ran
        job("pod-f", 80000.0, "gpt3-13b", 64, 1024, 2048, 7200, iters),  # 8 GPUs x 8
        job("pod-a", 100000.0, "gpt3-13b", 64, 1024, 2048, 3500, iters),
    )
    assert load.dropped == dropped(no_gpus=1, no_runtime=1)  # pod-c CPU only, pod-e never scheduled
    assert len(load.report) == 6 and load.report[0].startswith("gpus: kept 5 of 6 jobs")


def test_alibaba2023_sampled_list_without_times(tmp_path):
    path = tmp_path / "openb_pod_list_multigpu50.csv"
    path.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\npod-1,8000,16384,8,1000\n")
    with pytest.raises(ConfigError, match=r"header lacks column\(s\) pod_phase, creation_time"):
        load_trace(path)


def test_alibaba2023_bad_row(tmp_path, data):
    path = tmp_path / "pods.csv"
    path.write_text((data / "alibaba2023.csv").read_text().replace("Burstable,Succeeded", "Burstable,Done"))
    with pytest.raises(ConfigError, match=re.escape("pods.csv:2: pod_phase must be one of Succeeded, Running")):
        load_trace(path)


def test_philly_default_mapping_censors_the_running_job(data, iters, dropped):
    load = load_trace(data / "philly.json")
    by_id = {j.job_id: j for j in load.jobs}
    # 0005 started 01:30:10 and never ended: it runs to the trace's last time, 03:13:30 (0001's end)
    assert by_id["application_0001_0005"] == job("application_0001_0005", 1800.0, "gpt3-13b", 64, 1024, 2048,
                                                 3 * 3600 + 13 * 60 + 30 - (1 * 3600 + 30 * 60 + 10), iters)
    assert by_id["application_0001_0002"].gpus == 64  # Killed after an hour: kept, 8 GPUs x 8
    assert by_id["application_0001_0004"].gpus == 32  # 4 GPUs x 8
    assert load.dropped == dropped(no_runtime=1)  # 0003: no attempts
    assert "kept 1 that failed or were killed, for the time they ran, and 1 still running" in load.report[1]


def test_alibaba2020_default_mapping_aggregates_half_a_gpu(data, iters):
    load = load_trace(data / "alibaba2020")
    assert [(j.job_id, j.gpus) for j in load.jobs] == [("jobA", 64), ("jobC", 128), ("jobB", 8), ("jobD", 64)]
    # jobB: 1 task at 50% for 600 s -> one 1-GPU job of 300 GPU-seconds, x8 GPUs
    assert load.jobs[2] == job("jobB", 1000.0, "gpt3-1.3b", 8, 512, 2048, 300, iters)
