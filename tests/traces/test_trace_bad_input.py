"""Bad trace input never gives a traceback, a hang or a silently wrong value.

Each case writes a real file with one bad row between good ones. Strict: one
ConfigError line naming the file, the line and the field. skip_bad_rows: the
bad row is counted, the good rows around it are kept.
"""

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from spiderflow.errors import ConfigError
from spiderflow.traces import MappingOptions, generate_trace, load_trace
from spiderflow.workload import Job

REPO = Path(__file__).resolve().parents[2]
HUGE_INT = "9" * 400  # no float holds it; int() refuses past 4,300 digits
LONG = "x" * 200_000  # over the csv module's 131,072-character field limit

# --- one row builder per format: defaults make a job the mapping keeps (8 GPUs, finished, 1 h) ---

OURS = ("job_id", "arrival_s", "model", "gpus", "iterations", "global_batch", "seq_len")
OURS_ROW = {"arrival_s": "0", "model": "gpt3-125m", "gpus": "8", "iterations": "100", "global_batch": "256",
            "seq_len": "1024"}
HELIOS = ("job_id", "user", "vc", "gpu_num", "cpu_num", "node_num", "state", "submit_time", "start_time",
          "end_time", "duration", "queue")
HELIOS_ROW = {"user": "u", "vc": "vc", "gpu_num": "8", "cpu_num": "48", "node_num": "1", "state": "COMPLETED",
              "submit_time": "2020-04-01 08:00:00", "start_time": "2020-04-01 08:00:20",
              "end_time": "2020-04-01 09:00:20", "duration": "3600", "queue": "20"}
TASK = ("job_name", "task_name", "inst_num", "status", "start_time", "end_time", "plan_cpu", "plan_mem",
        "plan_gpu", "gpu_type")
TASK_ROW = {"task_name": "worker", "inst_num": "2", "status": "Terminated", "start_time": "1000",
            "end_time": "4600", "plan_cpu": "600", "plan_mem": "29.3", "plan_gpu": "400", "gpu_type": "V100"}
A23 = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec", "qos", "pod_phase",
       "creation_time", "deletion_time", "scheduled_time")
A23_ROW = {"cpu_milli": "64000", "memory_mib": "262144", "num_gpu": "8", "gpu_milli": "1000", "gpu_spec": "",
           "qos": "BE", "pod_phase": "Succeeded", "creation_time": "500", "deletion_time": "4200",
           "scheduled_time": "600"}

FORMATS = {  # format -> (columns, defaults, id column, header line?, file name)
    "ours": (OURS, OURS_ROW, "job_id", True, "t.csv"),
    "helios": (HELIOS, HELIOS_ROW, "job_id", True, "cluster_log.csv"),
    "alibaba-v2020": (TASK, TASK_ROW, "job_name", False, "pai_task_table.csv"),
    "alibaba-v2023": (A23, A23_ROW, "name", True, "pods.csv"),
}


def csv_row(fmt, job_id, **values):
    columns, defaults, id_column, _, _ = FORMATS[fmt]
    row = {**defaults, id_column: job_id, **values}
    return ",".join(row[c] for c in columns)


def write_csv(tmp_path, fmt, bad_line_text):
    """Header (if the format has one), good row 'g1', the bad row, good row 'g2'; returns (path, bad line)."""
    columns, _, _, headed, name = FORMATS[fmt]
    lines = ([",".join(columns)] if headed else []) + [csv_row(fmt, "g1"), bad_line_text, csv_row(fmt, "g2")]
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path, lines.index(bad_line_text) + 1


def assert_one_line_error(err, path, line, field):
    text = str(err.value)
    assert "\n" not in text and len(text) < 400, text
    assert re.search(rf"{re.escape(str(path))}:{line}: {re.escape(field)} ", text), text


def load_both_ways(path, fmt, line, field):
    with pytest.raises(ConfigError) as err:
        load_trace(path, format=fmt)
    assert_one_line_error(err, path, line, field)
    load = load_trace(path, format=fmt, skip_bad_rows=True)
    assert load.skipped == 1
    assert sorted(j.job_id for j in load.jobs) == ["g1", "g2"]
    for job in load.jobs:
        assert math.isfinite(job.arrival_s) and 0 < job.iterations < 10**12


# --- numbers: overflow, 400 digits, nan/inf, negative, out of range, odd spellings ---

NUMBER_CASES = [
    ("ours", {"gpus": HUGE_INT}, "gpus"),
    ("ours", {"gpus": "1e3"}, "gpus"),
    ("ours", {"gpus": "1_000"}, "gpus"),
    ("ours", {"iterations": str(10**13)}, "iterations"),
    ("ours", {"global_batch": str(1 << 30)}, "global_batch"),
    ("ours", {"arrival_s": HUGE_INT}, "arrival_s"),
    ("ours", {"arrival_s": "1e308"}, "arrival_s"),
    ("ours", {"arrival_s": "nan"}, "arrival_s"),
    ("ours", {"arrival_s": "inf"}, "arrival_s"),
    ("ours", {"arrival_s": "-1"}, "arrival_s"),
    ("helios", {"gpu_num": "1e308"}, "gpu_num"),
    ("helios", {"gpu_num": HUGE_INT}, "gpu_num"),
    ("helios", {"gpu_num": "-8"}, "gpu_num"),
    ("helios", {"duration": "1e308"}, "duration"),
    ("helios", {"duration": "inf"}, "duration"),
    ("helios", {"duration": "-5"}, "duration"),
    ("helios", {"submit_time": "0001-01-01 00:00:00"}, "submit_time"),
    ("helios", {"end_time": "9999-01-01 00:00:00", "duration": ""}, "end_time"),
    # the case: plan_gpu 1e308 x instances overflowed to inf, then OverflowError in the mapping
    ("alibaba-v2020", {"plan_gpu": "1e308"}, "plan_gpu"),
    ("alibaba-v2020", {"inst_num": "1e308", "plan_gpu": "1e308"}, "inst_num"),
    ("alibaba-v2020", {"inst_num": HUGE_INT}, "inst_num"),
    ("alibaba-v2020", {"start_time": "-1"}, "start_time"),
    ("alibaba-v2020", {"end_time": "inf"}, "end_time"),
    ("alibaba-v2023", {"num_gpu": "1e308"}, "num_gpu"),
    ("alibaba-v2023", {"gpu_milli": "5000"}, "gpu_milli"),
    ("alibaba-v2023", {"creation_time": "-1e308"}, "creation_time"),
]


@pytest.mark.parametrize("fmt, values, field", NUMBER_CASES,
                         ids=[f"{f}-{','.join(v)}={next(iter(v.values()))[:8]}" for f, v, _ in NUMBER_CASES])
def test_bad_numbers(tmp_path, fmt, values, field):
    path, line = write_csv(tmp_path, fmt, csv_row(fmt, "bad", **values))
    load_both_ways(path, fmt, line, field)


def test_alibaba2020_values_at_the_bounds_stay_finite(tmp_path):
    """inst_num and plan_gpu each at their largest allowed value: 10^8 GPUs for one job is past the
    2^20 GPUs a job may have (as in every other format), so the row is bad, not clamped to 512."""
    rows = [csv_row("alibaba-v2020", "big", inst_num="1000000", plan_gpu="10000", task_name=f"t{i}")
            for i in range(2)] + [csv_row("alibaba-v2020", "ok", inst_num="2", plan_gpu="100")]
    (tmp_path / "pai_task_table.csv").write_text("\n".join(rows) + "\n")
    with pytest.raises(ConfigError, match=r"pai_task_table.csv:1: plan_gpu .* 100,000,000 GPUs, past the 1,048,576"):
        load_trace(tmp_path / "pai_task_table.csv", format="alibaba-v2020")
    load = load_trace(tmp_path / "pai_task_table.csv", format="alibaba-v2020", skip_bad_rows=True)
    assert [j.job_id for j in load.jobs] == ["ok"] and load.skipped == 2


# --- CSV shape: a field over 128 KiB, too few or too many fields ---

SHAPE_CASES = [
    ("ours", lambda: csv_row("ours", LONG), "job_id"),
    ("ours", lambda: csv_row("ours", '"' + LONG + '"'), "row"),  # quoted: the position is not known
    ("ours", lambda: "bad,0,gpt3-125m,8", "row"),
    ("ours", lambda: csv_row("ours", "bad") + ",5,6", "row"),
    ("helios", lambda: csv_row("helios", "bad", submit_time=LONG), "submit_time"),
    ("helios", lambda: csv_row("helios", "bad") + ",extra", "row"),
    ("alibaba-v2020", lambda: csv_row("alibaba-v2020", "bad", gpu_type=LONG), "gpu_type"),
    ("alibaba-v2020", lambda: ",".join(csv_row("alibaba-v2020", "bad").split(",")[:9]), "row"),
    ("alibaba-v2023", lambda: csv_row("alibaba-v2023", LONG), "name"),
]


@pytest.mark.parametrize("fmt, make, field", SHAPE_CASES, ids=[f"{f}-{i}" for i, (f, _, _) in enumerate(SHAPE_CASES)])
def test_bad_csv_shape(tmp_path, fmt, make, field):
    path, line = write_csv(tmp_path, fmt, make())
    load_both_ways(path, fmt, line, field)


def test_long_header_field_is_a_header_error(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text(",".join(OURS) + "," + LONG + "\n" + csv_row("ours", "g1") + "\n")
    with pytest.raises(ConfigError, match=r"t.csv:1: header .*longer than 131,072 characters"):
        load_trace(path, format="ours", skip_bad_rows=True)


# --- whole-file problems: always errors, with or without skip_bad_rows ---

@pytest.mark.parametrize("fmt", [*FORMATS, "philly", None])
@pytest.mark.parametrize("skip", [False, True])
def test_not_utf8_names_the_line(tmp_path, fmt, skip):
    """One Latin-1 byte in the bad row: the wrong encoding for the whole file, so an error even when skipping."""
    if fmt == "philly":
        path, _ = write_philly(tmp_path, json.dumps(philly_job("bad")))
    else:
        path, _ = write_csv(tmp_path, fmt or "ours", csv_row(fmt or "ours", "bad"))  # None: told from the header
    data = path.read_bytes().replace(b"bad", b"b\xe9d")
    path.write_bytes(data)
    with pytest.raises(ConfigError) as err:
        load_trace(path, format=fmt, skip_bad_rows=skip)
    line = data[:data.index(b"\xe9")].count(b"\n") + 1
    assert re.fullmatch(rf"{re.escape(str(path))}: line {line}: byte 0xe9 at offset \d+ is not UTF-8; .*",
                        str(err.value))


@pytest.mark.parametrize("fmt", ["ours", "helios", "philly", "alibaba-v2023", "acme"])
def test_directory_given_as_the_trace(tmp_path, fmt):
    folder = tmp_path / "traces"
    folder.mkdir()
    with pytest.raises(ConfigError, match=re.escape(f"{folder}: is a directory, not a trace file")):
        load_trace(folder, format=fmt)


@pytest.mark.parametrize("fmt, text, message", [
    ("ours", "", "t.csv: is empty; format ours needs a header line"),
    (None, "", "t.csv: cannot tell the trace format (the file is empty)"),
    (None, "\n\n   \n", "t.csv: cannot tell the trace format (the file is empty)"),
    ("ours", ",".join(OURS) + "\n", "t.csv: has no valid job rows"),
    ("helios", "", "t.csv: is empty; format helios needs a header line"),
    ("helios", ",".join(HELIOS) + "\n", "t.csv: no jobs left to replay"),
    ("alibaba-v2020", "", "t.csv: no jobs left to replay"),
    ("philly", "", "t.csv:1: must start with '['"),
    ("philly", "[]", "t.csv: no jobs left to replay"),
])
def test_empty_file_or_header_only(tmp_path, fmt, text, message):
    path = tmp_path / "t.csv"
    path.write_text(text)
    for skip in (False, True):
        with pytest.raises(ConfigError) as err:
            load_trace(path, format=fmt, skip_bad_rows=skip)
        assert message in str(err.value) and "\n" not in str(err.value)


# --- Philly (JSON): numbers no field can hold, bad dates, a bad JSON line, deep nesting ---

def philly_job(job_id, **changes):
    job = {"status": "Pass", "vc": "v", "jobid": job_id, "user": "u", "submitted_time": "2017-10-07 01:00:00",
           "attempts": [{"start_time": "2017-10-07 01:00:00", "end_time": "2017-10-07 02:00:00",
                         "detail": [{"ip": "m1", "gpus": [f"gpu{i}" for i in range(8)]}]}]}
    job.update(changes)
    return job


def write_philly(tmp_path, bad_text):
    path = tmp_path / "cluster_job_log"
    path.write_text("[\n" + ",\n".join([json.dumps(philly_job("g1")), bad_text, json.dumps(philly_job("g2"))])
                    + "\n]\n")
    return path, 3


PHILLY_CASES = [
    (json.dumps(philly_job("bad")).replace('"bad"', "NaN"), "jobs[1].jobid"),
    (json.dumps(philly_job("bad")).replace('"bad"', "1e999"), "jobs[1].jobid"),
    (json.dumps(philly_job("bad")).replace('"2017-10-07 01:00:00"', "1" * 5000, 1), "jobs[1].submitted_time"),
    (json.dumps(philly_job("bad", submitted_time="0001-01-01 00:00:00")), "jobs[1].submitted_time"),
    (json.dumps(philly_job("bad")).replace("2017-10-07 02:00:00", "9999-10-07 02:00:00"),
     "jobs[1].attempts[0].end_time"),
    (json.dumps(philly_job("bad", submitted_time="x" * 100_000)), "jobs[1].submitted_time"),
    ("1" * 5000, "jobs[1].job"),
]


@pytest.mark.parametrize("bad, field", PHILLY_CASES, ids=range(len(PHILLY_CASES)))
def test_philly_bad_values(tmp_path, bad, field):
    path, line = write_philly(tmp_path, bad)
    load_both_ways(path, "philly", line, field)


def test_philly_number_in_a_field_we_do_not_read_is_ignored(tmp_path):
    path, _ = write_philly(tmp_path, json.dumps(philly_job("g3")).replace('"u"', "1" * 5000))
    assert sorted(j.job_id for j in load_trace(path, format="philly").jobs) == ["g1", "g2", "g3"]


def test_philly_json_lines_bad_line_is_a_row(tmp_path):
    path = tmp_path / "log.jsonl"
    rows = [json.dumps(philly_job("g1")), '{"jobid": "bad", "status": ', json.dumps(philly_job("g2"))]
    path.write_text("\n".join(rows) + "\n")
    load_both_ways(path, "philly", 2, "jobs[1]")


@pytest.mark.parametrize("skip", [False, True])
def test_philly_deep_nesting_is_an_error(tmp_path, skip):
    path = tmp_path / "log.json"
    path.write_text("[" + "[" * 100_000 + "]" * 100_000 + "]")
    with pytest.raises(ConfigError, match=r"log.json:1: a job object is nested too deeply"):
        load_trace(path, format="philly", skip_bad_rows=skip)


# --- options, generator and Job: non-finite and out-of-range arguments name the parameter ---

@pytest.mark.parametrize("kwargs, message", [
    ({"iteration_time_s": 10**400}, "iteration_time_s must be from 0.001"),
    ({"iteration_time_s": math.inf}, "iteration_time_s must be from 0.001"),
    ({"iteration_time_s": math.nan}, "iteration_time_s must be a number > 0"),
    ({"iteration_time_s": 1e-300}, "iteration_time_s must be from 0.001"),
    ({"max_gpus": 1 << 40}, "max_gpus must be at most 1,048,576"),
    ({"global_batch": 1 << 40}, "global_batch must be a positive integer up to"),
    ({"seq_len": True}, "seq_len must be a positive integer"),
])
def test_mapping_options_out_of_range(kwargs, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        MappingOptions(**kwargs)


def test_alibaba_table_option_must_be_a_path(tmp_path):
    path, _ = write_csv(tmp_path, "alibaba-v2020", csv_row("alibaba-v2020", "g3"))
    with pytest.raises(ConfigError, match="trace option job_table must be a file path"):
        load_trace(path, format="alibaba-v2020", job_table=5)


@pytest.mark.parametrize("kwargs, message", [
    ({"mean_interarrival_s": math.nan}, "mean_interarrival_s must be a number > 0"),
    ({"mean_interarrival_s": math.inf}, "mean_interarrival_s must be at most"),
    ({"mean_interarrival_s": 10**400}, "mean_interarrival_s must be at most"),
    ({"mean_interarrival_s": True}, "mean_interarrival_s must be a number > 0"),
    ({"burst_jobs": math.inf}, "burst_jobs must be at most"),
    ({"burst_gap_ratio": math.nan}, "burst_gap_ratio must be a number in (0, 1)"),
    ({"burst_gap_ratio": 10**400}, "burst_gap_ratio must be a number in (0, 1)"),
    ({"mix": {"eval": 10**400}}, "mix[eval] must be a finite number >= 0"),
    ({"mix": {"eval": math.inf}}, "mix[eval] must be a finite number >= 0"),
    ({"mix": "eval"}, "mix must be a mapping"),
    ({"max_gpus": 1 << 40}, "max_gpus must be at most 1,048,576"),
    ({"jobs": 1_000_001}, "jobs must be at most 1,000,000"),  # the old code hung on 10**12
    ({"jobs": 100_000, "mean_interarrival_s": 1e6}, "jobs x mean_interarrival_s must be at most"),
])
def test_generator_refuses_non_finite_and_out_of_range(kwargs, message):
    args = {"jobs": 3, "seed": 0, **kwargs}
    with pytest.raises(ConfigError, match=re.escape(message)):
        generate_trace(args.pop("jobs"), args.pop("seed"), **args)


@pytest.mark.parametrize("changes, message", [
    ({"arrival_s": math.nan}, "arrival_s must be a finite number >= 0"),
    ({"arrival_s": math.inf}, "arrival_s must be a finite number >= 0"),
    ({"arrival_s": 10**400}, "arrival_s must be a finite number >= 0"),
    ({"deadline_s": math.inf}, "deadline_s must be a finite number"),
    ({"gpus": True}, "gpus must be a positive integer"),
    ({"priority": 1.5}, "priority must be an integer"),
])
def test_job_refuses_non_finite_values(changes, message):
    fields = {"job_id": "j", "arrival_s": 0.0, "model": "gpt3-125m", "gpus": 8, "iterations": 1,
              "global_batch": 8, "seq_len": 128, **changes}
    with pytest.raises(ValueError, match=re.escape(message)):
        Job(**fields)


# --- the CLI: one line on stderr, non-zero exit, no traceback ---

@pytest.mark.parametrize("skip", [[], ["--skip-bad-rows"]])
def test_cli_bad_trace_is_one_line(tmp_path, skip):
    path = tmp_path / "bad.csv"
    path.write_text(",".join(OURS) + "\n" + csv_row("ours", "bad", arrival_s="1e308") + "\n")
    proc = subprocess.run([sys.executable, "-m", "spiderflow", "simulate", "--topology", "topologies/paper8.yaml",
                           "--trace", str(path), *skip], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    want = "has no valid job rows (skipped 1 bad rows)" if skip else "bad.csv:2: arrival_s must be at most"
    assert lines[0].startswith("error: ") and want in lines[0]
