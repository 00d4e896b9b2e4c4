"""Alpha-beta fits, nccl-tests bandwidths and the calibration file (pure; no root, no network)."""

import json

import numpy as np
import pytest

from emulator.calibrate.fit import (algbw_gbps, bus_factor, busbw_gbps, calibration_json, fit_alpha_beta,
                                    fit_collective, fit_compute, fit_records, read_jsonl)
from spiderflow.errors import EmulatorError
from spiderflow.costmodel import GBPS, load_calibration

from .conftest import REPO

SIZES = [4096 * 4 ** k for k in range(10)]  # 4 KB .. 1 GB


def noisy(times, seed, rel=0.005, samples=3):
    """Each point the median of ``samples`` measurements with ``rel`` Gaussian noise, as the bench reports it."""
    rng = np.random.default_rng(seed)
    draws = np.asarray(times)[:, None] * (1 + rel * rng.standard_normal((len(times), samples)))
    return list(np.median(draws, axis=1))


def close(a, b, rel):
    return abs(a - b) <= rel * abs(b)


def test_p2p_recovers_alpha_and_beta_within_1pct_under_half_pct_noise():
    alpha, beta = 0.0335, 0.79
    for seed in range(5):
        times = noisy([alpha + n / (beta * GBPS) for n in SIZES], seed)
        fit = fit_alpha_beta(SIZES, times)
        assert close(fit.alpha_s, alpha, 0.01) and close(fit.beta_gbps, beta, 0.01), (seed, fit)
        assert fit.points == len(SIZES) and len(fit.residuals_pct) == len(SIZES)
        assert fit.r2 > 0.999
        assert max(abs(r) for r in fit.residuals_pct) < 2.5


@pytest.mark.parametrize("op, steps, factor", [("all_reduce", 6, 1.5), ("all_gather", 3, 0.75),
                                               ("reduce_scatter", 3, 0.75)])
def test_collective_over_4_ranks_recovers_per_step_alpha_and_per_link_beta(op, steps, factor):
    alpha, beta = 0.048, 0.52  # per step, per link; steps and factor written out by hand for p = 4
    times = noisy([steps * alpha + factor * n / (beta * GBPS) for n in SIZES], seed=11)
    fit = fit_collective(op, 4, SIZES, times)
    assert close(fit.alpha_s, alpha, 0.01) and close(fit.beta_gbps, beta, 0.01), fit


def test_exact_data_gives_zero_residuals_and_a_perturbed_point_shows_its_sign():
    times = [0.002 + n / (10 * GBPS) for n in SIZES[:5]]
    fit = fit_alpha_beta(SIZES[:5], times)
    assert max(abs(r) for r in fit.residuals_pct) < 1e-6 and fit.r2 == pytest.approx(1.0)
    slow = list(times)
    slow[2] *= 1.2  # measured 20 % slower than the rest: the model is below it
    residuals = fit_alpha_beta(SIZES[:5], slow).residuals_pct
    assert residuals[2] < -5 and residuals[2] == min(residuals)


def test_small_sizes_are_not_ignored():
    """Relative weighting: alpha is pinned by the small sizes even when the large ones are noisy."""
    alpha, beta = 0.0335, 0.79
    times = [alpha + n / (beta * GBPS) for n in SIZES]
    times[-1] *= 1.02  # 2 % off on a 10 s point is 200 ms, six alphas
    fit = fit_alpha_beta(SIZES, times)
    assert close(fit.alpha_s, alpha, 0.01)


def test_negative_intercept_is_clamped_and_refitted_through_the_origin():
    sizes = np.array([1e6, 2e6, 4e6, 8e6])
    times = sizes / (1.0 * GBPS) - 1e-3  # a line that crosses zero above n = 0
    fit = fit_alpha_beta(sizes, times)
    assert fit.alpha_s == 0.0
    # minimise sum((n*c - t)^2 / t) over c: c = sum(n) / sum(n^2 / t)
    assert fit.beta_gbps == pytest.approx(1 / (sizes.sum() / (sizes * sizes / times).sum()) / GBPS, rel=1e-9)
    model = sizes / (fit.beta_gbps * GBPS)
    assert fit.residuals_pct == pytest.approx(list((model - times) / times * 100))


@pytest.mark.parametrize("sizes, times", [([1e6, 1e6], [0.1, 0.11]), ([1e6], [0.1])])
def test_fewer_than_two_distinct_sizes_is_an_error_naming_the_count(sizes, times):
    with pytest.raises(ValueError, match=r"at least 2 distinct sizes .*\(got 1\)"):
        fit_alpha_beta(sizes, times)


def test_bad_inputs_name_the_value():
    with pytest.raises(ValueError, match="times_s must all be positive"):
        fit_alpha_beta([1e3, 1e6], [0.01, -1.0])
    with pytest.raises(ValueError, match="one length"):
        fit_alpha_beta([1e3, 1e6, 1e7], [0.01, 0.02])
    with pytest.raises(ValueError, match="do not grow with size"):
        fit_alpha_beta([1e3, 1e6], [0.02, 0.01])
    with pytest.raises(ValueError, match="op must be one of"):
        fit_collective("broadcast", 4, [1e3, 1e6], [0.01, 0.02])
    with pytest.raises(ValueError, match="ranks >= 2"):
        fit_collective("all_reduce", 1, [1e3, 1e6], [0.01, 0.02])


def test_bus_factors_and_bandwidths_by_hand():
    assert bus_factor("p2p", 2) == 1.0
    assert bus_factor("all_reduce", 4) == pytest.approx(1.5)  # 2 * 3 / 4
    assert bus_factor("all_reduce", 2) == pytest.approx(1.0)
    assert bus_factor("all_gather", 4) == pytest.approx(0.75)
    assert bus_factor("reduce_scatter", 8) == pytest.approx(0.875)
    assert algbw_gbps(125e6, 1.0) == pytest.approx(1.0)  # 125 MB in 1 s is 1 Gbit/s
    assert busbw_gbps("all_reduce", 4, 1e9, 2.0) == pytest.approx(4.0 * 1.5)  # 0.5 GB/s = 4 Gbit/s
    assert busbw_gbps("p2p", 2, 1e9, 2.0) == pytest.approx(4.0)


def record(name, n, t, *, op="p2p", scope="wan", ranks=2, topology="topologies/default.yaml"):
    return {"topology": topology, "op": op, "scope": scope, "name": name, "clusters": name.split("->"),
            "ranks": ranks, "bytes": n, "time_s": t, "configured_alpha_s": 0.0335, "configured_beta_gbps": 0.79}


def p2p_records(name, alpha, beta, **kw):
    return [record(name, n, alpha + n / (beta * GBPS), **kw) for n in SIZES[:5]]


def test_fit_records_groups_fits_and_skips_what_cannot_be_fitted():
    records = (p2p_records("oregon->virginia", 0.035, 0.77)
               + [record("oregon->tokyo", 4096, 0.05)]  # one size only: skipped
               + [record("oregon", 1e6, 0.002, scope="intra"), record("oregon", 4e6, 0.001, scope="intra")]
               + [record("oregon+virginia", n, 6 * 0.04 + 1.5 * n / (0.7 * GBPS), op="all_reduce", scope="cross",
                         ranks=4) for n in SIZES[2:6]]
               + [{"op": "compute", "device": "a100-80gb", "predicted_s": 1.0, "time_s": 1.2, "efficiency": 0.5}])
    fits = fit_records(records)
    assert [(f["name"], f["op"]) for f in fits] == [("oregon->virginia", "p2p"), ("oregon", "p2p"),
                                                   ("oregon+virginia", "all_reduce")]
    wan, intra, ring = fits
    assert wan["alpha_s"] == pytest.approx(0.035) and wan["beta_gbps"] == pytest.approx(0.77)
    assert wan["points"] == 5 and wan["configured_beta_gbps"] == 0.79 and wan["error"] is None
    assert intra["beta_gbps"] is None and "do not grow" in intra["error"]
    assert ring["alpha_s"] == pytest.approx(0.04) and ring["beta_gbps"] == pytest.approx(0.7)
    assert ring["clusters"] == ["oregon+virginia"]


def test_a_record_without_a_needed_field_is_a_one_line_error():
    bad = p2p_records("a->b", 0.01, 1.0)
    del bad[3]["time_s"]
    with pytest.raises(EmulatorError, match=r"run/microbench.jsonl: record 4 has no time_s"):
        fit_records(bad, source="run/microbench.jsonl")


def test_fit_compute_by_hand():
    recs = [{"op": "compute", "device": "a100-80gb", "predicted_s": 1.0, "time_s": 1.25, "efficiency": 0.5},
            {"op": "compute", "device": "a100-80gb", "predicted_s": 2.0, "time_s": 2.5, "efficiency": 0.5},
            # predicted with 0.25: FLOPs/peak = 0.25 * 4 = 1.0 s, measured 2.0 s -> 0.5
            {"op": "compute", "device": "h100", "predicted_s": 4.0, "time_s": 2.0, "efficiency": 0.25},
            record("a->b", 4096, 0.01)]
    assert fit_compute(recs) == pytest.approx({"a100-80gb": 0.5 * 3.0 / 3.75, "h100": 0.5})
    assert fit_compute([record("a->b", 4096, 0.01)]) == {}


def test_calibration_json_loads_and_a_wan_fit_becomes_a_path(tmp_path):
    fits = fit_records(p2p_records("oregon->virginia", 0.035, 0.77)
                       + p2p_records("oregon", 3e-4, 9.2, scope="intra")
                       + [record("oregon+virginia", n, 0.1 + n / (0.7 * GBPS), op="all_reduce", scope="cross",
                                 ranks=2) for n in SIZES[:4]]
                       + [record("oregon+virginia", n, 2 * 0.04 + n / (0.72 * GBPS), op="all_reduce", scope="pair",
                                 ranks=2) for n in SIZES[:5]])
    data = calibration_json(fits, scale=10.0, fitted_from="runs/x", compute={"a100-80gb": 1.3, "v100": 0.4})
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps(data))
    cal = load_calibration(path)
    assert set(cal.paths) == {("oregon", "virginia")}  # the collectives are not paths
    # the two-cluster ring becomes a ring entry (per-step alpha, per-hop beta); the all-cluster one does not
    assert set(cal.rings) == {("oregon", "virginia")}
    ring = cal.ring(["virginia", "oregon"])
    assert ring.alpha_s == pytest.approx(0.04) and ring.beta_gbps == pytest.approx(0.72)
    ab = cal.path("virginia", "oregon")  # one entry serves both directions
    assert ab.alpha_s == pytest.approx(0.035) and ab.beta_gbps == pytest.approx(0.77)
    assert cal.intra["oregon"].beta_gbps == pytest.approx(9.2)
    assert cal.gpu_efficiency == {"a100-80gb": 1.0, "v100": 0.4}  # clamped to <= 1
    assert cal.per_message_overhead_s == 0.0
    assert data["scale"] == 10.0 and data["fitted_from"] == "runs/x" and "Gbit/s" in data["notes"]
    assert data["paths"]["oregon->virginia"]["r2"] == pytest.approx(1.0)


def test_calibration_json_records_its_topology_and_applies_only_there(tmp_path):
    from spiderflow.costmodel.calibration import check_calibration_applies
    from spiderflow.errors import ConfigError
    from spiderflow.topology import load_topology

    topo = load_topology(REPO / "topologies/paper8.yaml")
    fits = fit_records(p2p_records("oregon->virginia", 0.035, 0.77))
    data = calibration_json(fits, scale=10.0, fitted_from="runs/x", dilation=2.0, topology=topo,
                            compute={"a100-80gb": 1e-6})
    assert data["topology"] == {"name": "paper8", "sha256": topo.sha256}
    path = tmp_path / "calibration-paper8.json"
    path.write_text(json.dumps(data))
    cal = load_calibration(path)
    assert (cal.topology_name, cal.topology_sha256, cal.dilation) == ("paper8", topo.sha256, 2.0)
    assert cal.gpu_efficiency == {"a100-80gb": 1e-3}  # clamped up to what the loader accepts
    check_calibration_applies(cal, topo)
    default = load_topology(REPO / "topologies/default.yaml")  # has oregon and virginia too, but is another network
    with pytest.raises(ConfigError, match="fitted on topology 'paper8'"):
        check_calibration_applies(cal, default)
    check_calibration_applies(cal, default, allow_other_topology=True)


@pytest.mark.parametrize("name", ["../../x", "/etc/x", ".hidden", "a/b", ""])
def test_calibrate_refuses_a_topology_name_that_is_not_a_file_name(name):
    from emulator.calibrate.command import file_stem

    with pytest.raises(EmulatorError, match="cannot be part of a file name"):
        file_stem(name)
    assert file_stem("geo64-s0.v2") == "geo64-s0.v2"


def test_one_path_fitted_in_two_topologies_is_refused():
    fits = fit_records(p2p_records("a->b", 0.01, 1.0, topology="t1.yaml")
                       + p2p_records("a->b", 0.02, 2.0, topology="t2.yaml"))
    with pytest.raises(ValueError, match="a->b was fitted in t1.yaml and in t2.yaml"):
        calibration_json(fits, scale=1.0, fitted_from="x")


def test_read_jsonl_names_file_and_line(tmp_path):
    path = tmp_path / "microbench.jsonl"
    path.write_text('{"op": "p2p"}\n\n{"op": "p2p", "bytes": 40\n')
    with pytest.raises(EmulatorError, match=rf"^{path}: line 3 is not valid JSON .*fix or delete") as err:
        read_jsonl(path)
    assert "\n" not in str(err.value)
    path.write_text('{"op": "p2p"}\n\n[1, 2]\n')
    with pytest.raises(EmulatorError, match="line 3 is not a JSON object"):
        read_jsonl(path)
    path.write_text('{"op": "p2p"}\n\n{"op": "all_reduce"}\n')
    assert read_jsonl(path) == [{"op": "p2p"}, {"op": "all_reduce"}]
    # JSON-lines lines end at "\n" only: U+2028 is valid inside a JSON string, not a line end
    path.write_text('{"name": "a\u2028b"}\n{"op": "p2p", "bytes": 1, "bytes": 2}\n', encoding="utf-8")
    with pytest.raises(EmulatorError, match=rf"^{path}: line 2: .*bytes"):
        read_jsonl(path)
    path.write_bytes(b'{"op": "p2p"}\n{"name": "\xe9"}\n')
    with pytest.raises(EmulatorError, match=rf"^{path}: line 2: byte 0xe9 .* not UTF-8"):
        read_jsonl(path)
