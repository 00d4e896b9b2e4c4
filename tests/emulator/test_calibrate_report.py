"""The calibration report from a small hand-made run directory (no root, no network).

tests/emulator/data/calib_small: topologies/default.yaml at scale 10, four
p2p fits (3 WAN, 1 intra), two collectives, four plans (three ok, one
failed) and the timeline of the pipeline plan d1.
"""

import errno
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from emulator import console as cli
from emulator.calibrate.fit import fit_records, read_jsonl
from emulator.calibrate.report import _split_waits, mape_summary, write_report

DATA = Path(__file__).parent / "data" / "calib_small"
FIGURES = ("links.png", "plans_scatter.png", "timeline.png", "bandwidth_vs_size.png")
MAPE = re.compile(r"^MAPE uncalibrated (\d+\.\d)% -> calibrated (\d+\.\d)% over (\d+) plans "
                  r"\(scale (\S+), dilation (\S+), delay by (\S+)\)$")


def copy_run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(DATA, run)
    return run


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    run = copy_run(tmp_path_factory.mktemp("report"))
    path = write_report(run)
    return run, path.read_text()


def expected_mape(run: Path) -> tuple[float, float, int]:
    """From plans.jsonl: mean |predicted - measured| / measured over the plans that ran."""
    plans = [json.loads(line) for line in (run / "plans.jsonl").read_text().splitlines() if line.strip()]
    ok = [p for p in plans if p["status"] == "ok" and p["measured_s"]]
    unc = sum(abs(p["predicted_uncalibrated_s"] / p["measured_s"] - 1) for p in ok) / len(ok) * 100
    cal = sum(abs(p["predicted_calibrated_s"] / p["measured_s"] - 1) for p in ok) / len(ok) * 100
    return unc, cal, len(ok)


def test_first_line_is_the_mape_of_the_plans_that_ran(report):
    run, text = report
    lines = [line for line in text.splitlines() if line.strip()]
    assert lines[0].startswith("# ")
    match = MAPE.match(lines[1])
    assert match, lines[1]
    unc, cal, n = expected_mape(run)
    assert n == 3  # the failed plan is left out
    assert (float(match[1]), float(match[2]), int(match[3])) == (round(unc, 1), round(cal, 1), n)
    config = json.loads((run / "config.json").read_text())
    assert float(match[4]) == config["scale"] and match[6] == config["mechanism"]
    assert float(match[5]) == config.get("dilation", 1)  # older runs: no dilation, K = 1


def test_fits_json_is_the_refit_of_microbench_and_the_links_table_shows_it(report):
    run, text = report
    written = json.loads((run / "fits.json").read_text())
    refit = fit_records(read_jsonl(run / "microbench.jsonl"))
    assert written["fits"] == json.loads(json.dumps(refit)) and written["scale"] == 10.0
    assert len(refit) == 6
    links = text.split("## Links")[1].split("## Collectives")[0]
    for fit in (f for f in refit if f["op"] == "p2p"):
        row = next(line for line in links.splitlines() if line.startswith(f"| {fit['name']} |"))
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        assert cells[1] == fit["scope"]
        assert cells[3] == format(fit["alpha_s"] * 1e3, ".3g")
        assert cells[6] == format(fit["beta_gbps"], ".3g")
        assert cells[7] == f"{fit['beta_gbps'] / fit['configured_beta_gbps']:.2f}"
    collectives = text.split("## Collectives")[1].split("## Plans")[0]
    assert {f["op"] for f in refit if f["op"] != "p2p"} == {"all_reduce", "all_gather"}
    for fit in (f for f in refit if f["op"] != "p2p"):
        assert f"| {fit['op']} | {fit['name']} |" in collectives
    assert text.count("<details>") == len(refit)


def test_nccl_tests_columns_follow_from_the_measurements(report):
    run, text = report
    rec = next(r for r in read_jsonl(run / "microbench.jsonl")
               if r["op"] == "all_reduce" and r["bytes"] == 64 * 2 ** 20)
    algbw = rec["bytes"] / rec["time_s"] * 8 / 1e9
    row = next(line for line in text.splitlines() if line.startswith(f"| {rec['bytes']} | {rec['count']} |")
               and f"{algbw:.3f}" in line)
    cells = [c.strip() for c in row.strip("|").split(" | ")]
    assert cells[2] == "float" and float(cells[3]) == pytest.approx(rec["time_s"] * 1e6, abs=0.05)
    assert float(cells[5]) == pytest.approx(algbw * 2 * 3 / 4, abs=1e-3)  # 4 ranks


def test_plans_table_has_every_plan_with_its_errors(report):
    run, text = report
    plans = text.split("## Plans")[1].split("## Timeline")[0]
    for p in read_jsonl(run / "plans.jsonl"):
        row = next(line for line in plans.splitlines() if line.startswith(f"| {p['plan_id']} |"))
        if p["status"] == "ok":
            err = (p["predicted_calibrated_s"] - p["measured_s"]) / p["measured_s"] * 100
            assert f"| {err:+.1f} |" in row
        else:
            assert p["reason"] in row
    assert "\\|" in plans  # the data-parallel description's "|" is escaped, not a column


def is_png(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", path
    return struct.unpack(">II", data[16:24])


def test_figures_exist_are_pngs_of_a_readable_size_and_are_linked(report):
    run, text = report
    for name in FIGURES:
        path = run / "figures" / name
        width, height = is_png(path)
        assert width >= 600 and height >= 400 and path.stat().st_size > 20_000, (name, width, height)
        assert width <= 2400 and height <= 2400, (name, width, height)
        assert path.with_suffix(".pdf").read_bytes()[:5] == b"%PDF-", name
        assert f"(figures/{name})" in text
    timeline = text.split("## Timeline")[1]
    assert "Plan d1" in timeline and "calibrated cost model" in timeline  # d1's "predicted" says calibrated
    assert f"python -m emulator report {run}" in text


def test_cli_prints_the_report_path_and_the_mape_line(tmp_path, capsys):
    """With --out the report goes there and the run directory is left as calibrate wrote it."""
    run, elsewhere = copy_run(tmp_path), tmp_path / "elsewhere" / "report"
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    assert cli.main(["report", str(run), "--out", str(elsewhere)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == str(elsewhere / "report.md") and MAPE.match(out[1])
    text = (elsewhere / "report.md").read_text()
    assert out[1] in text.splitlines() and f"python -m emulator report {run} --out {elsewhere}" in text
    assert (elsewhere / "fits.json").is_file() and (elsewhere / "figures" / "timeline.png").is_file()
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before


def test_a_run_directory_the_user_may_not_write_is_one_line():
    """`sudo emulator calibrate` makes a directory of root's; `emulator report` (no root) on it said
    PermissionError in a traceback. Run as nobody (setpriv) when the tests run as root."""
    argv = [sys.executable, "-m", "emulator", "report"]
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("setpriv is needed to drop root")
        argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *argv]
    parent = Path(tempfile.mkdtemp(prefix="spiderflow-report-test-"))  # not under root's 0700 pytest dir
    try:
        parent.chmod(0o755)
        run = copy_run(parent)
        run.chmod(0o555)
        done = subprocess.run([*argv, str(run)], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "HOME": "/tmp"})
        assert done.returncode == 2 and done.stderr == (
            f"error: {run}: cannot write the report there (Permission denied); pass --out DIR to write it "
            "elsewhere\n"), done.stderr
        assert not (run / "fits.json").exists()
    finally:
        (parent / "run").chmod(0o755)
        shutil.rmtree(parent)


def test_missing_config_is_one_line_and_exit_2(tmp_path, capsys):
    (tmp_path / "plans.jsonl").write_text("")
    assert cli.main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {tmp_path}: no config.json; is this a directory written by `emulator calibrate`?\n"


def test_a_bad_line_is_one_line_naming_file_and_line(tmp_path, capsys):
    run = copy_run(tmp_path)
    with open(run / "microbench.jsonl", "a") as f:
        f.write('{"op": "p2p", "bytes": 4')
    assert cli.main(["report", str(run)]) == 2
    err = capsys.readouterr().err
    lines = read_jsonl(DATA / "microbench.jsonl")
    assert err.startswith(f"error: {run / 'microbench.jsonl'}: line {len(lines) + 1} is not valid JSON")
    assert err.count("\n") == 1


DELETE = object()


def edit_line(path: Path, number: int, changes: dict) -> None:
    """Set (or with DELETE remove) keys of the JSON object on line ``number`` of a JSON-lines file."""
    lines = path.read_text().splitlines()
    record = json.loads(lines[number - 1])
    for key, value in changes.items():
        record.pop(key) if value is DELETE else record.__setitem__(key, value)
    lines[number - 1] = json.dumps(record)
    path.write_text("\n".join(lines) + "\n")


def edit_json(path: Path, edit) -> None:
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))


FIX_LINE = "fix or delete that line"
FIX_TIMELINE = "fix or delete that file"
# (file, edit, what the one error line says after the file's name): each a record the report used to
# crash on (a traceback from a fit or a figure) or to leave silently out of a fit or of the MAPE
BAD_RECORDS = {
    "bytes-not-a-number": ("microbench.jsonl", lambda p: edit_line(p, 2, {"bytes": "x"}),
                           f"line 2: bytes must be a positive number up to 1e+15 (got 'x'); {FIX_LINE}"),
    "ranks-zero": ("microbench.jsonl", lambda p: edit_line(p, 20, {"ranks": 0}),
                   f"line 20: ranks must be an integer >= 2 (got 0); {FIX_LINE}"),
    "p2p-three-ranks": ("microbench.jsonl", lambda p: edit_line(p, 1, {"ranks": 3}),
                        f"line 1: ranks must be 2 for a p2p record (got 3); {FIX_LINE}"),
    "configured-beta-object": ("microbench.jsonl", lambda p: edit_line(p, 3, {"configured_beta_gbps": {"a": 1}}),
                               "line 3: configured_beta_gbps must be null or a positive number up to 1e+09 "
                               f"(got {{'a': 1}}); {FIX_LINE}"),
    "no-topology": ("microbench.jsonl", lambda p: edit_line(p, 4, {"topology": DELETE}),
                    f"line 4: topology must be a non-empty string (the field is missing); {FIX_LINE}"),
    "compute-efficiency": ("microbench.jsonl", lambda p: p.write_text(p.read_text() + json.dumps(
        {"op": "compute", "device": "a100-80gb", "predicted_s": 0.2, "time_s": 0.3, "efficiency": 2}) + "\n"),
                           f"line 29: efficiency must be a number in (0, 1] (got 2); {FIX_LINE}"),
    "ok-plan-unpredicted": ("plans.jsonl", lambda p: edit_line(p, 1, {"predicted_uncalibrated_s": None}),
                            "line 1: predicted_uncalibrated_s must be a positive number up to 1e+06 (got None); a "
                            f"plan with status ok has both predictions; {FIX_LINE}"),
    "huge-prediction": ("plans.jsonl", lambda p: edit_line(p, 4, {"predicted_calibrated_s": 1e300}),
                        f"line 4: predicted_calibrated_s must be null or a positive number up to 1e+06 "
                        f"(got 1e+300); {FIX_LINE}"),
    "spread-reversed": ("plans.jsonl", lambda p: edit_line(p, 2, {"measured_spread_s": [2.77, 2.66]}),
                        "line 2: measured_spread_s must be null or [min, max] of positive seconds, min <= max "
                        f"(got [2.77, 2.66]); {FIX_LINE}"),
    "plan-id-twice": ("plans.jsonl", lambda p: edit_line(p, 3, {"plan_id": "d1"}),
                      "plan_id 'd1' appears twice; plan ids name timelines and must be unique: rename or delete one"),
    "plans-not-utf8": ("plans.jsonl", lambda p: p.write_bytes(p.read_bytes().replace(b"gpt-350m", b"gpt-\xe9")),
                       "line 2: byte 0xe9 at offset "),
    "steal-overflows": ("config.json", lambda p: edit_json(p, lambda d: d.update(host_steal_pct=10 ** 400)),
                        "host_steal_pct must be a number from 0 to 100 (got 1000000000000000000000000000000"),
    "topologies-not-names": ("config.json", lambda p: edit_json(p, lambda d: d.update(topologies=[1])),
                             "topologies must be a list, each a string (got [1]); write the values the run used"),
    "op-of-three": ("timelines/d1.json",
                    lambda p: edit_json(p, lambda d: d["measured"]["ranks"][1]["ops"].__setitem__(2, ["F", 0, 1])),
                    "measured.ranks[1].ops[2] must be [kind F, B or S, micro-batch >= -1, start_s, "
                    f"end_s >= start_s] (got ['F', 0, 1]); {FIX_TIMELINE}"),
    "stage-named": ("timelines/d1.json", lambda p: edit_json(p, lambda d: d["measured"]["ranks"][0].update(stage="x")),
                    f"measured.ranks[0].stage must be an integer >= 0 (got 'x'); {FIX_TIMELINE}"),
}


@pytest.mark.parametrize("case", BAD_RECORDS)
def test_a_bad_record_is_one_line_naming_file_line_and_field(tmp_path, capsys, case):
    name, edit, says = BAD_RECORDS[case]
    run = copy_run(tmp_path)
    edit(run / name)
    assert cli.main(["report", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {run / name}: {says}") and err.count("\n") == 1, err
    assert not (run / "report.md").exists() and not (run / "figures").exists()


def test_an_ok_plan_that_measured_nothing_is_named_not_dropped(tmp_path):
    """The runner can end a job ok with no complete iteration after warm-up ("done, nothing
    measured"); calibrate then writes status ok and measured_s null."""
    run = copy_run(tmp_path)
    edit_line(run / "plans.jsonl", 2, {"measured_s": None, "measured_spread_s": None})
    line = mape_summary(run)
    assert line.endswith("over 2 plans (scale 10, dilation 1, delay by nfqueue; 1 plan with status ok measured "
                         "nothing)"), line
    assert MAPE.match(mape_summary(copy_run(tmp_path / "intact")))  # otherwise the line is as it was


def test_config_alone_gives_a_report_that_says_what_is_missing(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"scale": 4, "dilation": 2, "mechanism": "netem"}))
    text = write_report(tmp_path).read_text()
    assert "MAPE: no measured plans (0 in plans.jsonl; scale 4, dilation 2, delay by netem)" in text
    assert "No p2p measurements" in text and not (tmp_path / "figures").exists()


def test_the_report_says_when_the_host_stole_cpu_during_the_run(tmp_path):
    config = {"scale": 4, "dilation": 2, "mechanism": "netem", "host_steal_pct": 1.5}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert "stole" not in write_report(tmp_path).read_text()
    (tmp_path / "config.json").write_text(json.dumps({**config, "host_steal_pct": 6.3}))
    assert "The host (hypervisor) stole 6% of this machine's CPU during the run" in write_report(tmp_path).read_text()


def test_compute_records_give_a_compute_section(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"scale": 10, "mechanism": "nfqueue", "compute": "real"}))
    (tmp_path / "microbench.jsonl").write_text("".join(json.dumps(
        {"op": "compute", "device": "a100-80gb", "name": f"gpt/stage{i}", "predicted_s": p, "time_s": t,
         "efficiency": 0.45}) + "\n" for i, (p, t) in enumerate([(0.2, 0.25), (0.3, 0.35)])))
    text = write_report(tmp_path).read_text()
    assert f"| a100-80gb | 0.45 | {0.45 * 0.5 / 0.6:.3f} | 2 |" in text
    assert json.loads((tmp_path / "fits.json").read_text())["gpu_efficiency"]["a100-80gb"] == \
        pytest.approx(0.45 * 0.5 / 0.6)


def test_a_receiving_op_is_drawn_as_its_wait_then_the_predicted_compute():
    """Stage 1 of 2: its forward receives (wait, then the predicted 0.1 s of compute); its backward
    (last stage, input is its own forward) is all compute. Stage 0's backward receives; its forward
    does not. Without a prediction the rank's shortest op of the kind stands for the compute."""
    predicted = [[["F", 0, 0.0, 0.05], ["B", 0, 0.4, 0.5]], [["F", 0, 0.1, 0.2], ["B", 0, 0.2, 0.4]]]
    stage1 = _split_waits([["F", 0, 0.0, 0.5], ["B", 0, 0.5, 0.8]], 1, 2, predicted)
    assert stage1[0][:4] == ("F", 0, 0.0, 0.5) and stage1[0][4] == pytest.approx(0.4)  # waited 0.0-0.4
    assert stage1[1][4] == 0.5  # the last stage's backward: no wait drawn
    stage0 = _split_waits([["F", 0, 0.0, 0.05], ["B", 0, 0.1, 0.9], ["S", -1, 0.9, 1.0]], 0, 2, predicted)
    assert [op[4] for op in stage0] == [0.0, pytest.approx(0.8), 0.9]
    unpredicted = _split_waits([["F", 0, 0.0, 0.5], ["F", 1, 0.5, 0.6]], 1, 2, [])
    assert [op[4] for op in unpredicted] == [pytest.approx(0.4), 0.5]


def test_many_links_keep_the_figures_a_sane_size(tmp_path):
    """paper8's calibration: 36 p2p fits and 40 collectives; the links figure grows in height, not
    width, and the bandwidth figure names configured-bandwidth classes, not 28 pairs."""
    run = tmp_path / "paper8"
    src = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "calibrate-paper8"
    run.mkdir()
    for name in ("config.json", "microbench.jsonl", "plans.jsonl"):
        shutil.copy(src / name, run / name)
    shutil.copytree(src / "timelines", run / "timelines")
    write_report(run)
    for name in FIGURES:
        width, height = is_png(run / "figures" / name)
        assert 600 <= width <= 2400 and 400 <= height <= 2400, (name, width, height)
        assert (run / "figures" / name).with_suffix(".pdf").is_file()


def test_a_run_that_failed_keeps_its_failure_when_its_report_cannot_be_read(tmp_path):
    """`calibrate` writes the report also after a failure. A full disk cut microbench.jsonl's last line
    short: the report is not tried (before, load_run's "line N is not valid JSON; fix or delete that
    line" replaced the full disk as the run's error); another failure logs why there is no report and
    stays the run's error; with no failure a bad file is the error, as before."""
    from emulator.calibrate.command import report_on
    from spiderflow.errors import EmulatorError

    run = copy_run(tmp_path)
    lines = (run / "microbench.jsonl").read_text()
    (run / "microbench.jsonl").write_text(lines[:lines.rindex("\n", 0, -1) + 20])  # the last line cut short
    logged = []
    full = OSError(errno.ENOSPC, "No space left on device")
    assert report_on(run, full, logged.append, 0.0) is None and logged == []
    assert report_on(run, EmulatorError("rank 1 failed"), logged.append, 0.0) is None
    assert len(logged) == 1 and logged[0].startswith("no report: ") and "is not valid JSON" in logged[0]
    with pytest.raises(EmulatorError, match="is not valid JSON"):
        report_on(run, None, logged.append, 0.0)
    assert not (run / "report.md").exists()
    (run / "microbench.jsonl").write_text(lines)
    assert report_on(run, EmulatorError("rank 1 failed"), logged.append, 0.0).plans  # a failure later on
    assert (run / "report.md").exists() and logged[-1].startswith("report: ")
