"""An empty gold result makes `[] == []` a full reward for any query that returns nothing: curricula leave such
examples out by default, and the reward table can pay an empty-vs-empty match less."""

from __future__ import annotations

import sqlite3

import pytest

from data_synthesis.curriculum import EMPTY_GOLD, build_curriculum, uniform_curriculum
from data_synthesis.records import Example
from rewards.reward import RewardTable
from rewards.scoring import Scorer

POOL = [Example(str(i), "shop", f"q{i}", f"SELECT id FROM items WHERE price > {i}", meta={"gold_rows": rows})
        for i, rows in enumerate([3, 0, 2, 0, 5, 1])] + [Example("unvalidated", "shop", "q", "SELECT 1")]
RATES = {e.id: 0.5 for e in POOL}


@pytest.mark.parametrize("make", [build_curriculum, uniform_curriculum])
def test_curricula_drop_empty_gold_examples_by_default_and_report_it(make):
    default = make(POOL, RATES, 10)
    assert default.examples and not {"1", "3"} & {e.id for e in default.examples}
    assert default.report["dropped"][EMPTY_GOLD] == 2 and default.report["pool"] == len(POOL)
    kept = make(POOL, RATES, 10, drop_empty_gold=False)
    assert EMPTY_GOLD not in kept.report["dropped"] and kept.report["pool"] == len(POOL)


def test_kept_on_request():
    ids = {e.id for e in uniform_curriculum(POOL, RATES, 10, drop_empty_gold=False).examples}
    assert ids == {e.id for e in POOL}  # the budget covers the pool: every example, the empty-gold ones too
    assert {e.id for e in uniform_curriculum(POOL, RATES, 10).examples} == {"0", "2", "4", "5", "unvalidated"}


def test_defaults_drop_empty_gold_and_pay_empty_matches_in_full():
    from sirius_train.config import RewardConfig, StageConfig

    assert StageConfig().drop_empty_gold is True
    assert RewardConfig().empty_match is None and RewardTable().empty_match is None


def test_the_reward_table_can_pay_an_empty_vs_empty_match_less(tmp_path):
    (tmp_path / "shop").mkdir()
    with sqlite3.connect(tmp_path / "shop" / "shop.sqlite") as con:
        con.executescript("CREATE TABLE items (id INTEGER, price REAL); INSERT INTO items VALUES (1, 5.0), (2, 7.5);")
    empty_gold, empty_pred = "SELECT id FROM items WHERE price > 100", "SELECT id FROM items WHERE id < 0"
    rows_gold = "SELECT id FROM items WHERE price > 6"
    for table, expected in ((RewardTable(), 1.0), (RewardTable(empty_match=0.0), 0.0)):
        scorer = Scorer(tmp_path, table=table)
        match, reward, status, gold_status, *_ = scorer.score_fields("shop", empty_gold, empty_pred)
        assert (match, status, gold_status, reward) == (True, "empty", "empty", expected)
        match, reward, *_ = scorer.score_fields("shop", rows_gold, "SELECT 2")  # a real match is paid in full
        assert (match, reward) == (True, 1.0)
        scorer.close()
