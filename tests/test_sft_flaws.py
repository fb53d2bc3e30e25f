"""Systematic mistakes put into SFT demonstrations (`data.sft_flaws`): what they edit, at what rate, and where not."""

from __future__ import annotations

import pytest
from tiny_run import NANO

from data_synthesis.records import Example
from data_synthesis.sqlgen.flaws import flawed_variants, inject_flaws
from sirius_train.config import ConfigError, load_config

TOP = "SELECT name FROM t WHERE age > 30 ORDER BY pay DESC LIMIT 3"


def test_each_flaw_edits_its_construct_only():
    assert flawed_variants(TOP) == {
        "order": "SELECT name FROM t WHERE age > 30 ORDER BY pay ASC LIMIT 3",
        "comparison": "SELECT name FROM t WHERE age < 30 ORDER BY pay DESC LIMIT 3",
        "limit": "SELECT name FROM t WHERE age > 30 ORDER BY pay DESC"}
    assert flawed_variants("SELECT COUNT(DISTINCT city) FROM t", ["distinct"]) == {
        "distinct": "SELECT COUNT(city) FROM t"}
    assert flawed_variants("SELECT DISTINCT city FROM t", ["distinct"]) == {"distinct": "SELECT city FROM t"}
    assert flawed_variants("SELECT MAX(pay) FROM t", ["aggregate"]) == {"aggregate": "SELECT MIN(pay) FROM t"}
    assert flawed_variants("SELECT COUNT(*) FROM t") == {}


def test_share_is_the_rate_per_construct_and_questions_stay():
    examples = [Example(f"e{i}", "d", f"q{i}", TOP) for i in range(2000)]
    flawed = inject_flaws(examples, 0.7, ["order", "comparison"], seed=0)
    assert [e.question for e in flawed] == [e.question for e in examples]
    for kind in ("order", "comparison"):
        rate = sum(kind in e.meta.get("flaw", []) for e in flawed) / len(flawed)
        assert 0.66 < rate < 0.74
    both = next(e for e in flawed if e.meta.get("flaw") == ["order", "comparison"])
    assert both.gold_sql == "SELECT name FROM t WHERE age < 30 ORDER BY pay ASC LIMIT 3"
    assert both.meta["clean_sql"] == TOP
    assert inject_flaws(examples, 0.7, ["order", "comparison"], seed=0) == flawed  # seeded
    assert inject_flaws(examples, 0.0, ["order"], seed=0) == examples
    assert inject_flaws(examples, 1.0, [], seed=0) == examples


def test_bad_kinds_and_shares_are_one_line_errors():
    with pytest.raises(ValueError, match=r"unknown flaw kind\(s\) \['ordering'\]; known"):
        inject_flaws([], 0.5, ["ordering"])
    with pytest.raises(ValueError, match="share"):
        inject_flaws([], 1.5, ["order"])
    with pytest.raises(ConfigError, match="data.sft_flaw_share"):
        load_config(NANO, ["data.sft_flaw_share=2"])
