"""Our CSV format: parse field by field, reject bad rows with their line, write and read back."""

import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spiderflow.errors import ConfigError
from spiderflow.traces import format_trace, load_trace, write_trace
from spiderflow.workload import MODELS, Job

HEADER = "job_id,arrival_s,model,gpus,iterations,global_batch,seq_len\n"


def test_parses_every_field_and_sorts_stably(data):
    load = load_trace(data / "ours_ok.csv")
    assert load.format == "ours" and load.skipped == 0 and load.source.endswith("ours_ok.csv")
    assert [j.job_id for j in load.jobs] == ["j1", "j2", "j3"]  # j2 before j3: same time, file order
    j1, j2, j3 = load.jobs
    assert j1 == Job(job_id="j1", arrival_s=0.0, model="gpt3-125m", gpus=8, iterations=100,
                     global_batch=256, seq_len=1024, priority=0, deadline_s=None)
    assert j2 == Job(job_id="j2", arrival_s=30.5, model="gpt3-1.3b", gpus=16, iterations=200,
                     global_batch=512, seq_len=2048, priority=1, deadline_s=4000.0)
    assert j3 == Job(job_id="j3", arrival_s=30.5, model="llama2-7b", gpus=32, iterations=10,
                     global_batch=1024, seq_len=4096, priority=-1, deadline_s=None)
    assert isinstance(j1.arrival_s, float)


def test_keeps_times_as_written(tmp_path):
    path = tmp_path / "late.csv"
    path.write_text(HEADER + "x,100,gpt3-125m,8,1,32,1024\ny,250.25,gpt3-125m,8,1,32,1024\n")
    assert [j.arrival_s for j in load_trace(path).jobs] == [100.0, 250.25]


@pytest.mark.parametrize("row, message", [
    ("b,1,gpt3-125m,abc,10,32,1024", "gpus must be a positive integer (got 'abc')"),
    ("b,1,gpt3-125m,8,0,32,1024", "iterations must be a positive integer (got '0')"),
    ("b,1,gpt3-125m,8,10,2.5,1024", "global_batch must be a positive integer (got '2.5')"),
    ("b,1,gpt-4,8,10,32,1024", "model must be one of gpt3-125m"),
    ("b,-1,gpt3-125m,8,10,32,1024", "arrival_s must be a number >= 0 (got '-1')"),
    ("b,nan,gpt3-125m,8,10,32,1024", "arrival_s must be a number >= 0 (got 'nan')"),
    (",1,gpt3-125m,8,10,32,1024", "job_id must not be empty"),
    ("b,1,gpt3-125m,8", "row has 4 fields but the header has 7"),
    ("a,1,gpt3-125m,8,10,32,1024", "job_id repeats line 2 (got 'a')"),
])
def test_bad_row_names_file_line_field_and_value(tmp_path, row, message):
    path = tmp_path / "t.csv"
    path.write_text(HEADER + "a,0,gpt3-125m,8,10,32,1024\n" + row + "\n")
    with pytest.raises(ConfigError) as err:
        load_trace(path)
    text = str(err.value)
    assert text.startswith(f"{path}:3: ")
    assert message in text
    assert "skip" in text and "\n" not in text


@pytest.mark.parametrize("extra_header, extra, message", [
    (",deadline_s", ",5", "deadline_s must be later than arrival_s=10"),
    (",deadline_s", ",x", "deadline_s must be a number >= 0 (got 'x')"),
    (",priority", ",high", "priority must be an integer (got 'high')"),
])
def test_bad_optional_columns(tmp_path, extra_header, extra, message):
    path = tmp_path / "t.csv"
    path.write_text(HEADER.strip() + extra_header + "\n" + "a,10,gpt3-125m,8,10,32,1024" + extra + "\n")
    with pytest.raises(ConfigError, match=re.escape(f"t.csv:2: {message}")):
        load_trace(path)


def test_skip_bad_rows_skips_and_counts(data):
    with pytest.raises(ConfigError, match=r"ours_bad.csv:3: gpus must be a positive integer \(got 'abc'\)"):
        load_trace(data / "ours_bad.csv")
    load = load_trace(data / "ours_bad.csv", skip_bad_rows=True)
    assert [j.job_id for j in load.jobs] == ["ok1", "ok2"]
    assert load.skipped == 6
    assert load.jobs[1].model == "gpt3-350m" and load.jobs[1].gpus == 4


@pytest.mark.parametrize("text, message", [
    ("", "is empty"),
    ("job_id,arrival_s,model,gpus,iterations,global_batch\n", ":1: header lacks column(s) seq_len"),
    (HEADER.strip() + ",colour\n", ":1: header column 'colour' is not known"),
    (HEADER, "has no valid job rows"),
])
def test_bad_header_or_empty_file(tmp_path, text, message):
    path = tmp_path / "t.csv"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_trace(path, format="ours")
    assert message in str(err.value)


def test_all_rows_bad_is_an_error_even_when_skipping(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text(HEADER + "a,0,gpt-9,8,10,32,1024\n")
    with pytest.raises(ConfigError, match="no valid job rows"):
        load_trace(path, skip_bad_rows=True)


def test_mapping_options_are_refused_for_ours(data):
    with pytest.raises(ConfigError, match="'min_gpus' applies only to public traces"):
        load_trace(data / "ours_ok.csv", min_gpus=16)


def test_missing_file_and_unknown_format(tmp_path):
    with pytest.raises(ConfigError, match="no such trace file"):
        load_trace(tmp_path / "nope.csv")
    with pytest.raises(ConfigError, match=r"--format must be one of ours, acme, helios, philly"):
        load_trace(tmp_path / "nope.csv", format="slurm")


def test_write_omits_unused_optional_columns_and_reads_back(tmp_path):
    jobs = (Job(job_id="a", arrival_s=0.0, model="gpt3-125m", gpus=8, iterations=3, global_batch=32,
                seq_len=1024),
            Job(job_id="b", arrival_s=1 / 3, model="gpt3-350m", gpus=16, iterations=5, global_batch=64,
                seq_len=2048))
    text = format_trace(jobs, comment="made by a test\nsecond line")
    assert text.splitlines()[:3] == ["# made by a test", "# second line", HEADER.strip()]
    path = tmp_path / "out.csv"
    write_trace(jobs, path, comment="made by a test")
    assert load_trace(path).jobs == jobs  # 1/3 survives exactly: floats are written with repr


_jobs = st.lists(st.builds(
    Job, job_id=st.text("abcxyz-_.0123", min_size=1, max_size=8),
    arrival_s=st.floats(min_value=0, max_value=1e7, allow_nan=False),
    model=st.sampled_from(sorted(MODELS)), gpus=st.integers(1, 1024), iterations=st.integers(1, 10**6),
    global_batch=st.integers(1, 4096), seq_len=st.integers(1, 8192), priority=st.integers(-5, 5),
    deadline_s=st.none() | st.floats(min_value=2e7, max_value=3e7)),
    max_size=12, unique_by=lambda j: j.job_id)


@settings(max_examples=60, deadline=None)
@given(_jobs)
def test_round_trip_property(tmp_path_factory, jobs):
    path = tmp_path_factory.mktemp("rt") / "t.csv"
    if not jobs:
        return
    write_trace(jobs, path)
    back = load_trace(path).jobs
    assert back == tuple(sorted(jobs, key=lambda j: j.arrival_s))
    assert all(math.isfinite(j.arrival_s) for j in back)
