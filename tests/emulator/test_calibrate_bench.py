"""Microbenchmark test lists, element counts and the combination of rank lines (pure, no root)."""

import pytest

from emulator.calibrate.opbench import CROSS_MAX_BYTES, MAX_BYTES, bench_tests, combine, configured
from emulator.calibrate.opbench_worker import elements
from emulator.calibrate.plans import hosts_needed, plan_cases
from emulator.jobs.launch import emulated_view, ranks_per_cluster
from emulator.net.layout import NetConfig
from spiderflow.topology import load_topology

DEFAULT = load_topology("topologies/default.yaml")
VIEW = emulated_view(DEFAULT, NetConfig())


def test_tests_cover_every_pair_every_cluster_and_the_collectives():
    tests = bench_tests(DEFAULT)
    wan = [t for t in tests if t["op"] == "p2p" and t["scope"] == "wan"]
    assert len(wan) == 6  # 4 clusters: every unordered pair, multi-hop ones included
    assert {"oregon->london", "virginia->tokyo"} <= {t["name"] for t in wan}
    intra = [t for t in tests if t["op"] == "p2p" and t["scope"] == "intra"]
    assert [t["ranks"] for t in intra] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    pairs = [t for t in tests if t["scope"] == "pair"]  # a two-member ring all-reduce per pair, to full size
    assert [t["name"] for t in pairs] == [t["name"].replace("->", "+") for t in wan]
    assert all(t["op"] == "all_reduce" and len(t["ranks"]) == 2 and max(t["sizes"]) == MAX_BYTES for t in pairs)
    cross = [t for t in tests if t["scope"] == "cross"]
    assert sorted(t["op"] for t in cross) == ["all_gather", "all_reduce", "reduce_scatter"]
    assert all(t["ranks"] == [0, 2, 4, 6] and max(t["sizes"]) == CROSS_MAX_BYTES for t in cross)
    assert [t["id"] for t in tests] == list(range(len(tests)))
    assert wan[0]["sizes"][0] == 4096 and wan[0]["sizes"][-1] == MAX_BYTES


def test_elements_divide_by_the_scale_and_the_ranks():
    assert elements(4096, 10) == 102  # 409.6 bytes on the wire -> 102 floats
    assert elements(4096, 10, ranks=4) == 104
    assert elements(1, 1000) == 1 and elements(1, 1000, ranks=3) == 3


def test_combine_takes_the_median_of_one_way_times_and_skips_warmup():
    tests = [t for t in bench_tests(DEFAULT) if t["name"] == "oregon->virginia"]
    size = tests[0]["sizes"][0]
    lines = []
    for rep, (start, end) in enumerate([(0.0, 5.0), (10.0, 10.040), (20.0, 20.050), (30.0, 30.045)]):
        common = {"test": tests[0]["id"], "bytes": size, "count": 102, "rep": rep, "warmup": rep == 0}
        lines += [{**common, "rank": 0, "t_start": start}, {**common, "rank": 2, "t_end": end}]
    [rec] = combine(tests, lines, topology="t.yaml", view=VIEW)
    assert rec["time_s"] == pytest.approx(0.045) and len(rec["samples_s"]) == 3
    assert rec["configured_beta_gbps"] == pytest.approx(0.79)
    assert rec["configured_alpha_s"] == pytest.approx(0.0335)


def test_collective_time_runs_from_the_last_arrival_to_the_last_finish():
    test = next(t for t in bench_tests(DEFAULT) if t["op"] == "all_reduce" and t["scope"] == "cross")
    common = {"test": test["id"], "bytes": test["sizes"][0], "count": 104, "rep": 1, "warmup": False}
    lines = [{**common, "rank": r, "t_start": s, "t_end": e}
             for r, s, e in [(0, 1.0, 2.0), (2, 1.2, 2.1), (4, 1.1, 2.5), (6, 1.3, 2.2)]]
    [rec] = combine([test], lines, topology="t.yaml", view=VIEW)
    assert rec["time_s"] == pytest.approx(2.5 - 1.3)
    assert rec["ranks"] == 4
    alpha, beta = configured(test, VIEW)
    assert alpha == pytest.approx(0.115) and beta == pytest.approx(0.35)  # the ring's worst hop


def test_plan_set_mixes_shapes_and_fits_the_hosts():
    for path in ("topologies/default.yaml", "topologies/paper8.yaml"):
        topo = load_topology(path)
        cases = plan_cases(topo, topo.name)
        view = emulated_view(topo, NetConfig())
        assert {"pipeline", "data-parallel", "mixed", "local"} <= {c.shape for c in cases}
        for c in cases:
            plan = c.plan(5)
            assert plan.global_batch == plan.job.global_batch and plan.gpus == plan.job.gpus
            assert max(ranks_per_cluster(plan, view).values()) <= hosts_needed(cases, view)
    assert len(plan_cases(DEFAULT, "d")) + len(plan_cases(load_topology("topologies/paper8.yaml"), "p")) >= 10
