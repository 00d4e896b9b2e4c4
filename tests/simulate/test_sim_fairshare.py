"""Max-min fair share: hand-checkable cases, and the defining property under hypothesis."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spiderflow.simulate.fairshare import max_min_fair_share

EPS = 1e-9


def test_two_flows_on_one_link_get_half_each():
    assert max_min_fair_share({"wan": 10.0}, {"a": ["wan"], "b": ["wan"]}) == {"a": 5.0, "b": 5.0}


def test_a_flow_alone_gets_its_bottleneck():
    rates = max_min_fair_share({"l1": 10.0, "l2": 2.5, "l3": 4.0}, {"a": ["l1", "l2", "l3"]})
    assert rates == {"a": 2.5}


def test_parking_lot():
    # Three links of capacity 1 in a row; one long flow crosses all, one short flow per link.
    # Every link carries two flows, so everyone gets 1/2 (Bertsekas & Gallager, sec. 6.5.2).
    cap = {"l1": 1.0, "l2": 1.0, "l3": 1.0}
    flows = {"long": ["l1", "l2", "l3"], "s1": ["l1"], "s2": ["l2"], "s3": ["l3"]}
    assert max_min_fair_share(cap, flows) == {"long": 0.5, "s1": 0.5, "s2": 0.5, "s3": 0.5}


def test_parking_lot_with_a_fat_link():
    # l2 has capacity 2: the long flow is held to 1/2 by l1, so s2 takes the remaining 1.5.
    rates = max_min_fair_share({"l1": 1.0, "l2": 2.0}, {"long": ["l1", "l2"], "s1": ["l1"], "s2": ["l2"]})
    assert rates == {"long": 0.5, "s1": 0.5, "s2": 1.5}


def test_three_levels():
    # l1 (cap 3) carries a, b, c; l2 (cap 4) carries c, d. l1 fills at 1 each; d takes 4 - 1 = 3.
    rates = max_min_fair_share({"l1": 3.0, "l2": 4.0}, {"a": ["l1"], "b": ["l1"], "c": ["l1", "l2"], "d": ["l2"]})
    assert rates == pytest.approx({"a": 1.0, "b": 1.0, "c": 1.0, "d": 3.0})


def test_demand_limited_flow_frees_capacity():
    rates = max_min_fair_share({"wan": 10.0}, {"a": ["wan"], "b": ["wan"], "c": ["wan"]}, {"a": 1.0})
    assert rates == {"a": 1.0, "b": 4.5, "c": 4.5}
    # Demands above the fair share change nothing; math.inf means unlimited.
    assert max_min_fair_share({"wan": 10.0}, {"a": ["wan"], "b": ["wan"]}, {"a": 7.0, "b": math.inf}) == \
        {"a": 5.0, "b": 5.0}


def test_edge_cases():
    assert max_min_fair_share({"l": 5.0}, {}) == {}
    assert max_min_fair_share({"l": 0.0}, {"a": ["l"], "b": ["l"]}) == {"a": 0.0, "b": 0.0}
    assert max_min_fair_share({}, {"local": []}, {"local": 3.0}) == {"local": 3.0}
    assert max_min_fair_share({"l": 6.0}, {"a": ["l", "l"], "b": ["l"]}) == {"a": 3.0, "b": 3.0}
    assert list(max_min_fair_share({"l": 1.0}, {"z": ["l"], "a": ["l"]})) == ["z", "a"]  # flows order
    # Keys need not be comparable with each other: tuples and ints mixed.
    assert max_min_fair_share({("a", "b"): 2.0, 7: 1.0}, {0: [("a", "b"), 7], "x": [("a", "b")]}) == \
        {0: 1.0, "x": 1.0}


@pytest.mark.parametrize("capacity, flows, demand, message", [
    ({"l": -1.0}, {"a": ["l"]}, None, "capacity['l'] must be a finite number >= 0 (got -1.0)"),
    ({"l": math.nan}, {"a": ["l"]}, None, "capacity['l'] must be a finite number"),
    ({"l": math.inf}, {"a": ["l"]}, None, "capacity['l'] must be a finite number"),
    ({"l": 1.0}, {"a": ["m"]}, None, "flows['a'] crosses link 'm', which has no capacity"),
    ({"l": 1.0}, {"a": "l"}, None, "must be a sequence of link keys, not a string"),
    ({"l": 1.0}, {"a": ["l"]}, {"a": -2.0}, "demand['a'] must be a number >= 0"),
    ({"l": 1.0}, {"a": ["l"]}, {"b": 1.0}, "demand['b'] names no flow"),
    ({"l": 1.0}, {"a": []}, None, "flows['a'] crosses no link and has no finite demand"),
])
def test_bad_input(capacity, flows, demand, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        max_min_fair_share(capacity, flows, demand)


def reference(capacity, flows, demand):
    """Textbook progressive filling, one level step at a time (O(F x P)), for comparison."""
    demand = demand or {}
    rate = dict.fromkeys(flows, 0.0)
    active = {f for f in flows}
    while active:
        load = {l: sum(1 for f in active if l in flows[f]) for l in capacity}
        used = {l: sum(rate[f] for f in flows if l in flows[f]) for l in capacity}
        steps = [(capacity[l] - used[l]) / load[l] for l in capacity if load[l]]
        steps += [demand.get(f, math.inf) - rate[f] for f in active]
        step = max(0.0, min(steps))
        for f in active:
            rate[f] += step
        used = {l: sum(rate[f] for f in flows if l in flows[f]) for l in capacity}
        full = {l for l in capacity if load[l] and used[l] >= capacity[l] - 1e-9}
        active = {f for f in active if rate[f] < demand.get(f, math.inf) - 1e-9 and not (set(flows[f]) & full)}
    return rate


@st.composite
def networks(draw):
    n_links = draw(st.integers(1, 6))
    capacity = {f"l{i}": draw(st.floats(0.0, 100.0, allow_nan=False)) for i in range(n_links)}
    links = sorted(capacity)
    flows = {f"f{j}": draw(st.lists(st.sampled_from(links), min_size=1, max_size=4, unique=True))
             for j in range(draw(st.integers(1, 8)))}
    demand = {f: draw(st.floats(0.0, 60.0)) for f in flows if draw(st.booleans())}
    return capacity, flows, demand


@settings(max_examples=300, deadline=None)
@given(networks())
def test_max_min_fairness_property(net):
    capacity, flows, demand = net
    rates = max_min_fair_share(capacity, flows, demand)
    assert set(rates) == set(flows)
    used = {l: sum(rates[f] for f in flows if l in flows[f]) for l in capacity}
    tol = lambda x: EPS * max(1.0, x)  # noqa: E731
    for l, cap in capacity.items():
        assert used[l] <= cap + tol(cap)  # no link over capacity
    for f, r in rates.items():
        want = demand.get(f, math.inf)
        assert -EPS <= r <= want + tol(want)
        at_demand = r >= want - tol(want)
        # A bottleneck: a saturated link of f's on which no flow gets more than f.
        bottlenecked = any(used[l] >= capacity[l] - 1e-7 * max(1.0, capacity[l])
                           and all(rates[g] <= r + 1e-7 * max(1.0, r) for g in flows if l in flows[g])
                           for l in flows[f])
        assert at_demand or bottlenecked, (f, r)
    assert rates == pytest.approx(reference(capacity, flows, demand), rel=1e-6, abs=1e-6)


def test_scales_to_thousands_of_flows():
    import random
    rng = random.Random(0)
    capacity = {i: rng.uniform(0.3, 10.0) for i in range(500)}
    flows = {j: rng.sample(range(500), rng.randint(1, 6)) for j in range(5000)}
    rates = max_min_fair_share(capacity, flows)
    assert len(rates) == 5000 and all(r > 0 for r in rates.values())
