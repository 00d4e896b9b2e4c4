"""Format sniffing, and the public-trace mapping rules on their own."""

import pytest

from spiderflow.errors import ConfigError
from spiderflow.traces import FORMATS, MappingOptions, sniff_format
from spiderflow.traces.load import READERS
from spiderflow.traces.mapping import (BATCH_BY_MODEL, MODEL_BY_GPUS, MODEL_LADDER, PublicJob, map_jobs,
                                       model_for, round_gpus)
from spiderflow.workload import MODELS


@pytest.mark.parametrize("name, fmt", [
    ("ours_ok.csv", "ours"), ("acme_seren.csv", "acme"), ("acme_kalos.csv", "acme"),
    ("helios.csv", "helios"), ("philly.json", "philly"), ("philly.jsonl", "philly"),
    ("alibaba2020", "alibaba-v2020"), ("alibaba2020/pai_task_table.csv", "alibaba-v2020"),
    ("alibaba2020/pai_job_table.csv", "alibaba-v2020"), ("alibaba2023.csv", "alibaba-v2023"),
    ("../../../traces/default.csv", "ours"),
])
def test_sniff_each_fixture(data, name, fmt):
    assert sniff_format(data / name) == fmt


@pytest.mark.parametrize("text", ["a,b,c\n1,2,3\n", '{"id": 1}\n', "", "\x00\x01"])
def test_unrecognised_file_lists_formats_and_flag(tmp_path, text):
    path = tmp_path / "mystery.txt"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        sniff_format(path)
    message = str(err.value)
    assert message.startswith(f"{path}: cannot tell the trace format")
    assert "ours, acme, helios, philly, alibaba-v2020, alibaba-v2023" in message and "--format" in message
    assert "\n" not in message


def test_every_format_has_a_reader():
    assert tuple(READERS) == FORMATS


@pytest.mark.parametrize("gpus, rounded", [(0.5, 1), (1, 1), (3, 4), (8, 8), (9, 16), (24, 32),
                                           (511, 512), (600, 512), (2048, 512)])
def test_round_gpus_to_power_of_two_clamped(gpus, rounded):
    assert round_gpus(gpus, MappingOptions(gpu_scale=1, min_gpus=1)) == rounded


@pytest.mark.parametrize("gpus, scale, rounded", [(1, 8, 8), (2, 8, 16), (3, 8, 32), (8, 8, 64), (100, 8, 512),
                                                  (1, 1, 8), (0.3, 8, 8), (16, 0.5, 8), (48, 0.5, 32)])
def test_gpu_scale_then_power_of_two_within_min_and_max(gpus, scale, rounded):
    assert round_gpus(gpus, MappingOptions(gpu_scale=scale)) == rounded  # min_gpus 8, max_gpus 512


def test_model_table_and_kind_shift():
    assert [model_for(g) for g in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)] == [
        "gpt3-125m", "gpt3-350m", "gpt3-1.3b", "gpt3-1.3b", "gpt3-2.7b", "gpt3-6.7b", "gpt3-13b",
        "gpt3-13b", "llama2-70b", "gpt3-175b"]
    assert model_for(8, "pretrain") == "gpt3-2.7b" and model_for(8, "eval") == "gpt3-350m"
    assert model_for(512, "pretrain") == "gpt3-175b"  # top of the ladder
    assert model_for(1, "debug") == "gpt3-125m"  # bottom of the ladder
    assert model_for(16, "sft") == model_for(16, "mllm") == model_for(16, "unknown") == "gpt3-2.7b"


def test_every_mapped_model_leaves_memory_for_activations():
    """The promise in mapping.py: Adam state <= 14% of the GPUs' memory at 40 GB (30% one rung up)."""
    for gpus, model in MODEL_BY_GPUS.items():
        assert 16 * MODELS[model].params <= 0.14 * gpus * 40e9, (gpus, model)
        up = model_for(gpus, "pretrain")
        assert 16 * MODELS[up].params <= 0.30 * gpus * 40e9, (gpus, up)
    assert model_for(64, "pretrain") == "gpt3-13b"  # llama2-70b would take 43%: no step up
    assert model_for(128, "pretrain") == "llama2-70b"
    assert set(MODEL_LADDER) <= set(BATCH_BY_MODEL)
    assert list(MODEL_LADDER) == sorted(MODEL_LADDER, key=lambda m: MODELS[m].params)


def pj(**kw):
    base = dict(job_id="x", submit_s=0.0, gpus=8, duration_s=10.0, finished=True)
    return PublicJob(**{**base, **kw})


def test_each_rule_drops_for_its_reason_and_reports_a_line():
    public = [pj(job_id="cpu", gpus=0), pj(job_id="failed", finished=False), pj(job_id="never", duration_s=None),
              pj(job_id="zero", duration_s=0.0), pj(job_id="none", gpus=None), pj(job_id="small", gpus=7),
              pj(job_id="ok")]
    jobs, dropped, report = map_jobs(public, MappingOptions(gpu_scale=1, unfinished="drop", small="drop"))
    assert [j.job_id for j in jobs] == ["ok"]
    assert dropped == {"no_gpus": 1, "not_finished": 1, "no_runtime": 3, "fractional": 0,
                       "below_min_gpus": 1, "merged": 0}
    assert [line.split(":")[0] for line in report] == ["gpus", "unfinished=drop", "runtime",
                                                       "fractional=aggregate", "scale", "result"]
    jobs, dropped, _ = map_jobs(public, MappingOptions(gpu_scale=1))  # censor, raise: failed and small kept
    assert [j.job_id for j in jobs] == ["failed", "small", "ok"] and jobs[1].gpus == 8
    assert sum(dropped.values()) == 4


def test_still_running_is_censored_at_the_trace_end():
    public = [pj(job_id="run", duration_s=None, open_since_s=100.0, finished=False),
              pj(job_id="done", submit_s=50.0, duration_s=10.0, end_s=1100.0)]
    jobs, _, report = map_jobs(public, MappingOptions(iteration_time_s=1.0))
    assert {j.job_id: j.iterations for j in jobs} == {"run": 1000, "done": 10}  # 1100 - 100 s
    assert "and 1 still running, cut at the trace end (1100 s" in report[1]
    jobs, dropped, _ = map_jobs(public, MappingOptions(iteration_time_s=1.0, unfinished="drop"))
    assert [j.job_id for j in jobs] == ["done"] and dropped["not_finished"] == 1


def test_fractional_shares_aggregate_into_whole_gpus_keeping_gpu_time():
    shares = [pj(job_id=f"p{i}", submit_s=float(i), gpus=g, duration_s=100.0)
              for i, g in enumerate((0.5, 0.5, 0.3, 0.81, 0.2))]
    jobs, dropped, report = map_jobs(shares + [pj(job_id="whole", submit_s=1.5, gpus=1)],
                                     MappingOptions(gpu_scale=1, iteration_time_s=1.0))
    # p0+p1 = 1 GPU; p2+p3 = 1.11; p4 left over. Run = sum of share x run time.
    assert [(j.job_id, j.arrival_s, j.gpus, j.iterations) for j in jobs] == [
        ("p0+1", 0.0, 8, 100), ("whole", 1.5, 8, 10), ("p2+1", 2.0, 8, 111), ("p4", 4.0, 8, 20)]
    assert dropped["merged"] == 2 and dropped["fractional"] == 0
    assert "packed 5 holding a share of one GPU into 3 1-GPU jobs" in report[3]
    jobs, dropped, _ = map_jobs(shares, MappingOptions(fractional="drop", unfinished="drop"))
    assert dropped["fractional"] == 5
    taken = [pj(job_id="p0+1", gpus=1)] + shares[:2]  # a real id that looks like a group's
    jobs, _, _ = map_jobs(taken, MappingOptions())
    assert sorted(j.job_id for j in jobs) == ["p0+1", "p0+1#2"]


@pytest.mark.parametrize("kwargs, message", [
    ({"min_gpus": 0}, "min_gpus must be a power of two"),
    ({"max_gpus": 4}, "max_gpus must be >= min_gpus=8"),
    ({"fractional": "keep"}, "fractional must be one of aggregate, drop"),
    ({"unfinished": True}, "unfinished must be one of censor, drop"),
    ({"small": "x"}, "small must be one of raise, drop"),
    ({"gpu_scale": 0}, r"gpu_scale must be a number in \(0, 1024\]"),
    ({"gpu_scale": float("nan")}, "gpu_scale must be a number"),
    ({"gpu_scale": 2048}, "gpu_scale must be a number"),
    ({"iteration_time_s": 0}, "iteration_time_s must be a number > 0"),
    ({"global_batch": 1.5}, "global_batch must be a positive integer"),
])
def test_mapping_options_validated(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        MappingOptions(**kwargs)
