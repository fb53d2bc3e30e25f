"""Difficulty smoothing (SPEC 2.4): exact behaviour of the pure planner and the fill loop."""

import json
import random
import re
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from data_synthesis.curriculum import build_curriculum
from data_synthesis.records import Example, write_examples
from data_synthesis.smoothing import (SmoothingConfig, allocate, attainable_rates, bin_of, bin_targets, bins_for,
                                      fill_requests, pick_parents, plan_curriculum, spread)

ROOT = Path(__file__).resolve().parents[1]
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
    assert max(uses.values()) <= 3 and len(plan.selection) == 80
    hard = [i for i in rates if rates[i] == 0.125]
    assert all(uses[i] == 3 for i in hard)  # capped: 2 x 3 = 6 of a share of 20
    assert plan.bins[0].selected == 6 and plan.bins[0].short == 14
    mid = [uses[i] for i in rates if rates[i] == 0.375]  # 20 + 1 of bin 0's 14 (its cap is 7 x 3 = 21)
    assert set(mid) == {3} and plan.bins[1].extra == 1
    assert [b.extra for b in plan.bins] == [0, 1, 7, 6]  # the other 13 split over the two bins with room
    assert fill_requests(plan, 3) == {0: 5}  # ceil(14 / 3): filling still aims at the bin's own share
    assert plan.notes[0] == "bin [0.00, 0.25) is short by 14 of its share 20: its 2 examples fill 6 at max_repeats=3"


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
    members = [[i for i in rates if bin_of(rates[i]) == b] for b in range(4)]
    capacity = [len(m) * max_repeats for m in members]
    assert all(0.0 < rates[i] < 1.0 for i in uses if rates[i] != 0.0)
    assert all(uses[i] == 1 for i in uses if rates[i] == 0.0)
    assert all(n <= max_repeats for n in uses.values())
    kept_zeros = sum(1 for i in uses if rates[i] == 0.0)
    # the budget is filled whenever the bins can hold it; short only when every bin is at its cap
    assert len(plan.selection) == min(budget, kept_zeros + sum(capacity))
    for b, report in enumerate(plan.bins):
        assert report.selected == sum(uses[i] for i in members[b]) <= capacity[b]
        assert report.short == max(0, targets[b] - report.selected)
        assert report.selected >= min(targets[b], capacity[b])  # a bin never loses its own share
        if report.extra:  # it took others' slots only while every short bin was at its cap
            assert all(r.selected == capacity[c] for c, r in enumerate(plan.bins) if r.short)
        counts = [uses[i] for i in members[b]]
        if counts and report.selected >= len(members[b]):
            assert max(counts) - min(counts) <= 1  # as even as the cap allows
    assert bool(plan.notes) == (any(r.short for r in plan.bins) or len(plan.selection) < budget
                                or plan.zero.short > 0 < plan.zero.target)
    assert plan_curriculum(rates, budget, config, seed).selection == plan.selection


def test_spread_is_the_flattest_filling():
    assert spread([10, 10, 10], [30, 30, 30], 30) == [10, 10, 10]
    assert spread([10, 10, 10], [0, 30, 30], 30) == [0, 15, 15]  # an empty bin's share goes to the others
    assert spread([10, 10, 10], [4, 12, 30], 30) == [4, 12, 14]
    assert spread([10, 10, 10], [4, 5, 6], 30) == [4, 5, 6]  # every bin full: the stage stays short
    assert spread([4, 3], [9, 9], 9) == [5, 4]  # a p = 0 share the zeros could not take goes to the bins


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


def test_bins_sit_on_the_rates_k_samples_can_produce():
    """Every bin holds an attainable rate j/k; one bin per rate while k - 1 <= 4; more bins than k - 1 are refused."""
    for k in range(2, 65):
        n = bins_for(k)
        assert n == min(4, k - 1)
        held = Counter(bin_of(p, n) for p in attainable_rates(k))
        assert sorted(held) == list(range(n)), (k, held)  # no bin empty by construction
        if k - 1 <= 4:
            assert set(held.values()) == {1}  # one bin per attainable rate
        for asked in range(1, k):
            assert len({bin_of(p, asked) for p in attainable_rates(k)}) == asked
        with pytest.raises(ValueError, match=f"at most {k - 1} bins can hold an example"):
            SmoothingConfig(n_bins=k, k=k)
    assert [bin_of(j / 8, 4) for j in range(1, 8)] == [0, 1, 1, 2, 2, 3, 3]  # k = 8: the bins as they always were
    with pytest.raises(ValueError, match="over k=1 sample is 0 or 1"):
        bins_for(1)


# The demo's stage 1 (runs/demo/stage1/curriculum.report.json before the bins sat on attainable rates): budget 320,
# k = 4, 4 equal bins on (0, 1): available 0 / 65 / 42 / 53 -- the first bin, (0, 1/4), empty by construction.
DEMO_STAGE1 = {0.0: 137, 0.25: 65, 0.5: 42, 0.75: 53, 1.0: 63}


def test_a_report_like_the_demos_fills_its_budget():
    rates = _rates(DEMO_STAGE1)
    old = plan_curriculum(rates, 320, SmoothingConfig(n_bins=4), seed=1)  # the old bins, k unknown
    assert [b.available for b in old.bins] == [0, 65, 42, 53]
    assert [b.short for b in old.bins] == [80, 0, 0, 0] and old.bins[0].extra == 0
    assert old.notes[0] == "bin [0.00, 0.25) is empty: no rated example has a pass rate in it"

    plan = plan_curriculum(rates, 320, SmoothingConfig(n_bins=bins_for(4), k=4), seed=1)
    assert [(b.attainable, b.available, b.target, b.selected) for b in plan.bins] == [
        ((0.25,), 65, 107, 107), ((0.5,), 42, 107, 107), ((0.75,), 53, 106, 106)]
    assert len(plan.selection) == 320 and not plan.notes
    assert Counter(rates[i] for i in plan.selection) == {0.25: 107, 0.5: 107, 0.75: 106}


def test_a_bin_the_pool_cannot_fill_gives_its_slots_to_the_others_and_says_why():
    # a SmolLM2 stage (k = 4): 96, 40 and 18 examples at 1/4, 1/2, 3/4
    rates = _rates({0.0: 200, 0.25: 96, 0.5: 40, 0.75: 18, 1.0: 50})
    plan = plan_curriculum(rates, 320, SmoothingConfig(n_bins=3, k=4), seed=0)
    assert len(plan.selection) == 320
    assert [(b.selected, b.short, b.extra) for b in plan.bins] == [(146, 0, 39), (120, 0, 13), (54, 52, 0)]
    assert plan.notes == ("bin [0.67, 1.00) is short by 52 of its share 106: its 18 examples fill 54 at max_repeats=3",
                          "52 slots went to the bins with room: [0.00, 0.33) +39, [0.33, 0.67) +13")
    tiny = plan_curriculum(_rates({0.25: 5, 0.5: 2}), 60, SmoothingConfig(n_bins=3, k=4), seed=0)
    assert len(tiny.selection) == 21 and tiny.notes == (
        "bin [0.00, 0.33) is short by 5 of its share 20: its 5 examples fill 15 at max_repeats=3",
        "bin [0.33, 0.67) is short by 14 of its share 20: its 2 examples fill 6 at max_repeats=3",
        "bin [0.67, 1.00) is empty: no rated example has a pass rate of 3/4",
        "the stage has 21 of its budget of 60: every bin is at max_repeats=3 (21 slots in all); a larger pool, "
        "more repeats or gap filling fills it")


def test_the_config_derives_the_bins_from_estimate_k_and_refuses_bins_k_cannot_fill():
    from sirius_train.config import ConfigError, load_config
    from sirius_train.schedule import stage_smoothing

    nano = load_config(ROOT / "configs" / "nano.yaml")  # estimate_k: 4, bins unset
    assert [(s.n_bins, s.k) for s in map(stage_smoothing, nano.stages)] == [(3, 4), (3, 4)]
    plan = plan_curriculum(_rates(DEMO_STAGE1), nano.stages[0].budget, stage_smoothing(nano.stages[0]), seed=1)
    assert len(plan.selection) == nano.stages[0].budget == 320
    big = load_config(ROOT / "configs" / "qwen7b_8gpu.yaml")  # estimate_k: 8: the 4 bins of before
    assert [stage_smoothing(s).n_bins for s in big.stages] == [4, 4]
    assert stage_smoothing(load_config(ROOT / "configs" / "nano.yaml", ["stages.0.bins=2"]).stages[0]).n_bins == 2
    with pytest.raises(ConfigError, match=re.escape(
            "stages.0.bins=4: with stages.0.estimate_k=4: 4 bins over pass rates of k=4 samples: the rates in (0, 1) "
            "are 1/4, 2/4, 3/4, so at most 3 bins can hold an example and 1 would stay empty; set stages.0.bins <= 3, "
            "raise stages.0.estimate_k to >= 5, or leave stages.0.bins unset")):
        load_config(ROOT / "configs" / "nano.yaml", ["stages.0.bins=4"])
    with pytest.raises(ConfigError, match=r"^stages\.1\.estimate_k=1: a pass rate over k=1 sample is 0 or 1"):
        load_config(ROOT / "configs" / "nano.yaml", ["stages.1.estimate_k=1"])
    uniform = load_config(ROOT / "configs" / "nano.yaml", ["stages.1.estimate_k=1", "stages.1.curriculum=uniform"])
    assert stage_smoothing(uniform.stages[1]).k is None  # a uniform stage does not bin


def test_synth_curriculum_bins_on_the_rates_k_and_says_what_is_short(tmp_path, demo_db_root):
    from typer.testing import CliRunner

    from sirius_train.cli import app

    demo = demo_db_root
    rates = {0.25: 6, 0.5: 4, 0.75: 1, 1.0: 2}
    pool = [Example(f"q{p}-{i}", "flights", f"q {p} {i}", f"SELECT {i}") for p, n in rates.items() for i in range(n)]
    write_examples(tmp_path / "pool.jsonl", pool)
    (tmp_path / "rates.jsonl").write_text("".join(
        json.dumps({"id": e.id, "pass_rate": float(e.id[1:].split("-")[0]), "k": 4, "gold_status": "ok"}) + "\n"
        for e in pool))
    args = ["synth", "curriculum", "--pool", str(tmp_path / "pool.jsonl"), "--rates", str(tmp_path / "rates.jsonl"),
            "--db-root", str(demo), "--budget", "40", "--out-dir", str(tmp_path / "out"), "--no-fill", "--quiet"]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "out" / "stage1.report.json").read_text())
    # shares 14 / 13 / 13; 1/2 holds 4 x 3 = 12 and 3/4 holds 3: 1/4 takes 4 of their 11, up to its cap of 18
    assert [(b["attainable"], b["selected"], b["short"], b["extra"]) for b in report["bins"]] == [
        ([0.25], 18, 0, 4), ([0.5], 12, 1, 0), ([0.75], 3, 10, 0)]
    assert report["config"]["k"] == 4 and report["selected"] == 33
    output = " ".join(result.output.split())
    assert re.search(r"bin \[0\.00, 0\.33\): 1/4 \W+ 18/14 \(6 distinct\)", output), output
    assert report["notes"] == [
        "bin [0.33, 0.67) is short by 1 of its share 13: its 4 examples fill 12 at max_repeats=3",
        "bin [0.67, 1.00) is short by 10 of its share 13: its 1 example fills 3 at max_repeats=3",
        "4 slots went to the bins with room: [0.00, 0.33) +4",
        "the stage has 33 of its budget of 40: every bin is at max_repeats=3 (33 slots in all); a larger pool, more "
        "repeats or gap filling fills it", "gap filling was off"]
    assert all(f"note: {note}" in output for note in report["notes"])
    refused = CliRunner().invoke(app, [*args, "--bins", "4"], env={"COLUMNS": "300"})
    assert refused.exit_code == 2 and "--bins 4 with the rates of" in refused.output
    assert "(k=4): 4 bins over pass rates of k=4 samples" in " ".join(refused.output.split())
