"""Format sniffing, and the public-trace mapping rules on their own."""

import pytest

from spiderflow.errors import ConfigError
from spiderflow.traces import FORMATS, MappingOptions, sniff_format
from spiderflow.traces.load import READERS
from spiderflow.traces.mapping import (BATCH_BY_MODEL, MODEL_BY_GPUS, MODEL_LADDER, PublicJob, drop_reason,
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
    assert round_gpus(gpus, MappingOptions()) == rounded


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


def test_drop_reasons_in_order():
    opts = MappingOptions()

    def pj(**kw):
        base = dict(job_id="x", submit_s=0.0, gpus=8, duration_s=10.0, finished=True)
        return PublicJob(**{**base, **kw})

    assert drop_reason(pj(gpus=0, finished=False), opts) == "no_gpus"
    assert drop_reason(pj(finished=False, duration_s=None), opts) == "not_finished"
    assert drop_reason(pj(duration_s=0.0, gpus=1), opts) == "no_runtime"
    assert drop_reason(pj(gpus=None), opts) == "no_runtime"
    assert drop_reason(pj(gpus=7), opts) == "below_min_gpus"
    assert drop_reason(pj(gpus=7.5), opts) is None  # fractions round up first: 7.5 -> 8
    assert drop_reason(pj(gpus=8), opts) is None
    assert drop_reason(pj(gpus=7), MappingOptions(keep_small=True)) is None
    assert drop_reason(pj(finished=False), MappingOptions(keep_unfinished=True)) is None


@pytest.mark.parametrize("kwargs, message", [
    ({"min_gpus": 0}, "min_gpus must be a power of two"),
    ({"max_gpus": 4}, "max_gpus must be >= min_gpus=8"),
    ({"keep_small": "yes"}, "keep_small must be true or false"),
    ({"iteration_time_s": 0}, "iteration_time_s must be a number > 0"),
    ({"global_batch": 1.5}, "global_batch must be a positive integer"),
])
def test_mapping_options_validated(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        MappingOptions(**kwargs)
