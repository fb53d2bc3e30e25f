"""Difficulty smoothing (SPEC 2.4): exact behaviour of the pure planner and the fill loop."""

import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from data_synthesis.curriculum import build_curriculum
from data_synthesis.records import Example
from data_synthesis.smoothing import (SmoothingConfig, allocate, bin_of, bin_targets, fill_requests, pick_parents,
                                      plan_curriculum)

RATES = st.dictionaries(st.text("abcdefgh", min_size=1, max_size=6),
                        st.sampled_from([0.0, 0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1.0]), max_size=60)


def _rates(counts: dict[float, int]) -> dict[str, float]:
    """`{p: how many}` -> `{id: p}`."""
    return {f"{p}-{i}": p for p, n in counts.items() for i in range(n)}


def test_flattened_histogram_when_every_bin_has_enough():
    # a skewed pool: many easy, few hard -- the stage is flat anyway
    rates = _rates({0.125: 30, 0.375: 40, 0.625: 60, 0.875: 200})
    plan = plan_curriculum(rates, 100, seed=1)
    per_bin = Counter(bin_of(rates[i]) for i in plan.selection)
    assert [per_bin[b] for b in range(4)] == [25, 25, 25, 25]
    assert [b.short for b in plan.bins] == [0, 0, 0, 0]
    assert len(plan.selection) == 100


def test_uneven_budget_remainder_goes_to_lowest_bins():
    assert bin_targets(10, 4) == (0, [3, 3, 2, 2])
    rates = _rates({0.125: 9, 0.375: 9, 0.625: 9, 0.875: 9})
    per_bin = Counter(bin_of(rates[i]) for i in plan_curriculum(rates, 10).selection)
    assert [per_bin[b] for b in range(4)] == [3, 3, 2, 2]


def test_repeat_cap_and_even_use():
    rates = _rates({0.125: 2, 0.375: 7, 0.625: 40, 0.875: 40})
    plan = plan_curriculum(rates, 80, SmoothingConfig(max_repeats=3), seed=0)
    uses = Counter(plan.selection)
    assert max(uses.values()) <= 3
    hard = [i for i in rates if rates[i] == 0.125]
    assert all(uses[i] == 3 for i in hard)  # capped: 2 x 3 = 6 of a target of 20
    assert plan.bins[0].selected == 6 and plan.bins[0].short == 14
    mid = [uses[i] for i in rates if rates[i] == 0.375]  # 20 slots over 7 examples: 2 or 3 uses each
    assert sorted(set(mid)) == [2, 3] and sum(mid) == 20
    assert fill_requests(plan, 3) == {0: 5}  # ceil(14 / 3)


def test_p1_dropped_and_p0_dropped_unless_kept():
    rates = _rates({0.0: 10, 1.0: 7, 0.5: 20})
    plan = plan_curriculum(rates, 40)
    assert not any(rates[i] in (0.0, 1.0) for i in plan.selection)
    assert plan.dropped == {"all correct (p = 1)": 7, "all wrong (p = 0)": 10}

    kept = plan_curriculum(rates, 40, SmoothingConfig(keep_zero_share=0.1))
    zeros = [i for i in kept.selection if rates[i] == 0.0]
    assert len(zeros) == 4 and len(set(zeros)) == 4  # 10% of 40, never repeated
    assert kept.dropped["all wrong (p = 0)"] == 6
    assert not any(rates[i] == 1.0 for i in kept.selection)


def test_bin_edges():
    assert [bin_of(p) for p in (0.0, 1e-9, 0.2499, 0.25, 0.5, 0.7499, 0.75, 0.999, 1.0)] == \
        [None, 0, 0, 1, 2, 2, 3, 3, None]
    assert bin_of(0.5, n_bins=2) == 1 and bin_of(0.49, n_bins=2) == 0


def test_seed_determinism_and_input_order():
    rates = _rates({0.125: 13, 0.375: 5, 0.625: 22, 0.875: 31})
    a = plan_curriculum(rates, 64, seed=7)
    shuffled = dict(random.Random(3).sample(sorted(rates.items()), len(rates)))
    assert plan_curriculum(shuffled, 64, seed=7).selection == a.selection
    assert plan_curriculum(rates, 64, seed=8).selection != a.selection


def test_bad_inputs_are_clear():
    with pytest.raises(ValueError, match="pass rate of 'x' is 1.5"):
        plan_curriculum({"x": 1.5}, 4)
    with pytest.raises(ValueError, match="keep_zero_share must be in"):
        SmoothingConfig(keep_zero_share=1.0)
    with pytest.raises(ValueError, match="budget must be >= 0"):
        plan_curriculum({"x": 0.5}, -1)


@settings(max_examples=200, deadline=None)
@given(RATES, st.integers(0, 120), st.integers(1, 4), st.floats(0.0, 0.5), st.integers(0, 3))
def test_invariants(rates, budget, max_repeats, zero_share, seed):
    config = SmoothingConfig(max_repeats=max_repeats, keep_zero_share=zero_share)
    plan = plan_curriculum(rates, budget, config, seed)
    uses = Counter(plan.selection)
    zero_target, targets = bin_targets(budget, 4, zero_share)
    assert len(plan.selection) <= budget
    assert all(0.0 < rates[i] < 1.0 for i in uses if rates[i] != 0.0)
    assert all(uses[i] == 1 for i in uses if rates[i] == 0.0)
    assert all(n <= max_repeats for n in uses.values())
    for b, report in enumerate(plan.bins):
        members = [i for i in rates if bin_of(rates[i]) == b]
        expected = min(targets[b], len(members) * max_repeats)
        assert report.selected == expected == sum(uses[i] for i in members)
        assert report.short == targets[b] - expected
        counts = [uses[i] for i in members]
        if counts and expected >= len(members):
            assert max(counts) - min(counts) <= 1  # as even as the cap allows
    assert plan_curriculum(rates, budget, config, seed).selection == plan.selection


def test_pick_parents_prefers_own_bin_then_nearest():
    rng = random.Random(0)
    assert set(pick_parents({0: ["a"], 1: ["b"], 2: [], 3: []}, 1, 5, rng)) == {"b"}
    assert set(pick_parents({0: ["a"], 1: [], 2: [], 3: ["d"]}, 2, 5, rng)) == {"d"}
    assert set(pick_parents({0: ["a"], 1: [], 2: ["c"], 3: []}, 1, 20, rng)) == {"a", "c"}
    assert pick_parents({0: [], 1: []}, 0, 3, rng) == []


def test_allocate_takes_a_subset_without_repeats_when_plentiful():
    picked = allocate([str(i) for i in range(10)], 4, 3, random.Random(0))
    assert len(picked) == 4 and len(set(picked)) == 4


def test_fill_loop_fills_short_bins_with_what_the_filler_measures():
    pool = [Example(f"e{i}", "d", f"q{i}", f"SELECT {i}") for i in range(12)]
    rates = {f"e{i}": p for i, p in enumerate([0.125, 0.375, 0.375, 0.625, 0.625, 0.625, 0.875, 0.875, 0.875,
                                               0.875, 1.0, 0.0])}
    calls = []

    def filler(parents):  # a stand-in for MutationFiller: "mutants" land where their parents are
        calls.append([(p.id, b) for p, b in parents])
        return [(Example(f"{p.id}~{n}", p.db_id, p.question + "!", p.gold_sql + f" -- {n}", meta={"target_bin": b}),
                 rates[p.id]) for n, (p, b) in enumerate(parents)]

    plain = build_curriculum(pool, rates, 40, seed=0)
    assert [b["short"] for b in plain.report["bins"]] == [7, 4, 1, 0]
    filled = build_curriculum(pool, rates, 40, seed=0, filler=filler)
    assert [b["short"] for b in filled.report["bins"]] == [0, 0, 0, 0]
    assert len(filled.examples) == 40
    first = filled.report["fill_rounds"][0]
    assert first["requested"] == {"0": 3, "1": 2, "2": 1}  # ceil(7/3), ceil(4/3), ceil(1/3)
    assert first["parents"] == 12 and first["on_target"] == first["made"]  # overgenerate 2x
    assert {pid for pid, b in calls[0] if b == 0} == {"e0"}
    assert all(e.id in filled.pass_rates for e in filled.new_examples)
    assert max(Counter(e.id for e in filled.examples).values()) <= 3


def test_curriculum_counts_examples_without_rates():
    pool = [Example(str(i), "d", f"q{i}", "SELECT 1") for i in range(5)]
    c = build_curriculum(pool, {"0": 0.5, "1": 0.5, "unknown": 0.5}, 8)
    assert c.report["dropped"] == {"no pass rate (not estimated, or gold failed)": 3}
    assert sorted({e.id for e in c.examples}) == ["0", "1"]
