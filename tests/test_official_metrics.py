"""BIRD's Soft-F1 and R-VES, Spider's test-suite accuracy: hand-computed cases, a scripted clock, real databases.

The expected numbers below were worked out by hand from the reference scripts (bird-bench/mini_dev
evaluation_f1.py and evaluation_ves.py, taoyds/test-suite-sql-eval exec_eval.py), not by running our code.
"""

from __future__ import annotations

import json
import math
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from rewards.sandbox import Limits
from sirius_train.evaluation.official_eval import soft_f1_scores, time_pair, ts_matches, ves_reward_of, ves_rewards
from sirius_train.evaluation.official_metrics import clean_abnormal, r_ves, soft_f1, time_ratio, ts_normalize, ves_reward


# ---------------------------------------------------------------------------------------------- Soft-F1
@pytest.mark.parametrize("pred, gold, expected", [
    ([(1, "a")], [(1, "a")], 1.0),
    ([], [], 1.0),  # both empty
    ([], [(1,)], 0.0),  # nothing predicted
    ([(1,), (1,)], [(1,)], 1.0),  # duplicates dropped first
    ([(1.0,)], [(1,)], 1.0),  # cells compare with ==
    # rows pair by position: the same rows in the other order share no cell pairwise
    ([(1,), (2,)], [(2,), (1,)], 0.0),
    # row 0: cell 1 matches, 'a' is predicted only, 'b' is gold only (each 1/2 of the gold width);
    # gold row 1 has no partner: fn 1. tp 0.5, fp 0.5, fn 1.5 -> P 0.5, R 0.25 -> F1 1/3
    ([(1, "a")], [(1, "b"), (2, "c")], 1 / 3),
    # a cell matches anywhere in the paired gold row: ('x', 1) vs (1, 'x') is a full match
    ([("x", 1)], [(1, "x")], 1.0),
    # an extra predicted row: tp 1, fp 1, fn 0 -> P 0.5, R 1 -> F1 2/3
    ([(1,), (9,)], [(1,)], 2 / 3),
])
def test_soft_f1_hand_computed(pred, gold, expected):
    assert soft_f1(pred, gold) == pytest.approx(expected)


def test_soft_f1_scores_run_both_queries_and_score_failures_zero(tmp_path):
    from rewards.executor import Executor

    db = _db(tmp_path / "dbs", "shop", "CREATE TABLE t (a INTEGER, b TEXT); INSERT INTO t VALUES (1, 'x'), (2, 'y');")
    pairs = [("shop", "SELECT a, b FROM t ORDER BY a", "SELECT a, b FROM t ORDER BY a"),
             ("shop", "SELECT a, b FROM t ORDER BY a", "SELECT a FROM t ORDER BY a"),  # 1 cell of 2 per row
             ("shop", "SELECT a FROM t", "SELECT nope FROM t"),  # fails: 0
             ("shop", "SELECT a FROM t", None)]  # no prediction: 0
    with Executor(db.parent.parent, workers=0) as executor:
        scores = soft_f1_scores(executor, pairs)
    # pair 2: per row tp 1/2, fn 1/2 -> P 1, R 1/2 -> 2/3
    assert scores == pytest.approx([1.0, 2 / 3, 0.0, 0.0])


# ---------------------------------------------------------------------------------------------- R-VES
def test_reward_steps_and_the_r_ves_mean():
    assert [ves_reward(r) for r in (0, 0.2, 0.25, 0.5, 1.0, 1.999, 2.0)] == [0, 0.25, 0.5, 0.75, 1.0, 1.0, 1.25]
    # 100 * (sqrt(1.25) + 1 + 0 + 0.5) / 4
    assert r_ves([1.25, 1.0, 0, 0.25]) == pytest.approx(100 * (math.sqrt(1.25) + 1.5) / 4)


def test_outliers_beyond_three_standard_deviations_are_dropped():
    # ten ratios of 1 and one of 0.001: mean 0.9092, population std 0.2872, so the floor is 0.0477 > 0.001
    assert clean_abnormal([1.0] * 10 + [0.001]) == [1.0] * 10
    assert time_ratio([1.0] * 10 + [1000.0], [1.0] * 11) == 1.0  # without the filter: 0.909 -> reward 0.75
    assert clean_abnormal([1.0, 2.0]) == [1.0, 2.0]  # within 3 std: kept


class ScriptedClock:
    """Returns the start and end of each timed run: the run lasts the next of `durations` (seconds)."""

    def __init__(self, durations):
        self.durations, self.now, self.calls, self.running = list(durations), 0.0, 0, False

    def __call__(self) -> float:
        self.calls += 1
        if self.running:
            self.now += self.durations.pop(0)
        self.running = not self.running
        return self.now


def test_timing_alternates_prediction_and_gold_and_maps_the_ratio(tmp_path):
    db = _db(tmp_path / "dbs", "shop", "CREATE TABLE t (a INTEGER); INSERT INTO t VALUES (1), (2), (3);")
    pred, gold = "SELECT a FROM t WHERE a > 1", "SELECT a FROM t WHERE a >= 2"
    # 11 repetitions of (prediction, gold): ten at 1 ms each, one where the prediction took 1 s (ratio 0.001)
    durations = [0.001, 0.001] * 10 + [1.0, 0.001]
    clock = ScriptedClock(durations)
    pred_times, gold_times = time_pair(db, pred, gold, 11, clock=clock)
    assert clock.calls == 44 and pred_times[-1] == pytest.approx(1.0) and gold_times == pytest.approx([0.001] * 11)
    assert ves_reward_of(db, pred, gold, True, 11, clock=ScriptedClock(durations)) == 1.0  # the outlier dropped
    # the prediction half as fast as the gold every time: ratio 0.5 -> 0.75
    assert ves_reward_of(db, pred, gold, True, 4, clock=ScriptedClock([0.002, 0.001] * 4)) == 0.75
    # three times faster: 1.25; a prediction that did not match, or fails while timed: 0
    assert ves_reward_of(db, pred, gold, True, 4, clock=ScriptedClock([0.001, 0.003] * 4)) == 1.25
    assert ves_reward_of(db, pred, gold, False, 4, clock=ScriptedClock([0.001, 0.003] * 4)) == 0
    assert ves_reward_of(db, "SELECT nope FROM t", gold, True, 4, clock=ScriptedClock([0.001] * 8)) == 0
    rewards = ves_rewards(db.parent.parent, [("shop", gold, pred), ("atlantis", gold, pred)], [True, True], 2,
                          limits=Limits(timeout_s=2.0), clock=ScriptedClock([0.001, 0.002] * 2))
    assert rewards == [1.25, 0]  # an unknown database scores 0, like any failure


# ---------------------------------------------------------------------------------------------- test suites
def test_ts_normalization_follows_the_evaluator():
    assert ts_normalize("SELECT DISTINCT name FROM t WHERE a > = 2 AND b ! = 1") == \
        "SELECT  name FROM t WHERE a >= 2 AND b != 1"
    assert ts_normalize("SELECT count(DISTINCT name) FROM t") == "SELECT count( name) FROM t"
    assert ts_normalize("SELECT 'distinct', \"distinct\" FROM t") == "SELECT 'distinct', \"distinct\" FROM t"
    assert ts_normalize("SELECT YEAR(CURDATE()) - age FROM t") == "SELECT 2020- age FROM t"


def test_test_suite_accuracy_needs_every_database_of_the_folder(tmp_path):
    schema = "CREATE TABLE person (id INTEGER PRIMARY KEY, name TEXT, age INTEGER, city TEXT);"
    _db(tmp_path / "ts", "people", schema + "INSERT INTO person VALUES (1, 'Ann', 30, 'Rome'), "
                                           "(2, 'Bob', 40, 'Rome'), (3, 'Ann', 50, 'Oslo');")
    _db(tmp_path / "ts", "people", schema + "INSERT INTO person VALUES (1, 'Cid', 35, 'Oslo'), "
                                           "(2, 'Dee', 45, 'Rome'), (3, 'Eve', 45, 'Rome');", name="people_2")
    gold = "SELECT name FROM person WHERE city = 'Rome' AND age > 25"
    pairs = [("people", gold, gold),
             ("people", gold, "SELECT name FROM person WHERE age < 45"),  # right by luck on people.sqlite only
             ("people", "SELECT DISTINCT name FROM person WHERE age > 0", "SELECT name FROM person"),
             ("people", "SELECT name FROM person ORDER BY age DESC", "SELECT name FROM person ORDER BY age"),
             ("people", "SELECT name, age FROM person", "SELECT age, name FROM person"),  # columns permuted
             ("people", gold, None),
             # a tie at the cut on people_2: the official evaluator counts it (our tie rule is for our variants)
             ("people", "SELECT name FROM person ORDER BY age DESC LIMIT 1",
              "SELECT name FROM person WHERE age = (SELECT max(age) FROM person)")]
    assert ts_matches(tmp_path / "ts", pairs, workers=0) == [True, False, True, False, True, False, False]
    # DISTINCT kept: ('Ann', 'Bob') != ('Ann', 'Bob', 'Ann')
    assert ts_matches(tmp_path / "ts", pairs[2:3], keep_distinct=True, workers=0) == [False]


# ---------------------------------------------------------------------------------------------- the CLI
def test_evaluate_reports_the_official_metrics_per_bucket(tmp_path):
    schema = "CREATE TABLE person (id INTEGER PRIMARY KEY, name TEXT, age INTEGER, city TEXT);"
    rows = "INSERT INTO person VALUES (1, 'Ann', 30, 'Rome'), (2, 'Bob', 40, 'Rome'), (3, 'Cid', 50, 'Oslo');"
    _db(tmp_path / "dbs", "people", schema + rows)
    _db(tmp_path / "ts", "people", schema + rows)
    _db(tmp_path / "ts", "people", schema + rows.replace("'Oslo'", "'Rome'"), name="people_2")
    gold = [{"id": 1, "db_id": "people", "gold_sql": "SELECT name FROM person WHERE city = 'Rome'",
             "difficulty": "simple"},
            {"id": 2, "db_id": "people", "gold_sql": "SELECT name, age FROM person WHERE age > 35",
             "difficulty": "moderate"}]
    pred = [{"id": 1, "sql": "SELECT name FROM person WHERE age < 45"},  # EX right, wrong on people_2
            {"id": 2, "sql": "SELECT name FROM person WHERE age > 35"}]  # one column of two
    (tmp_path / "gold.jsonl").write_text("".join(json.dumps(r) + "\n" for r in gold))
    (tmp_path / "pred.jsonl").write_text("".join(json.dumps(r) + "\n" for r in pred))
    result = subprocess.run([sys.executable, "-m", "sirius_train.cli", "evaluate", "--db-root", str(tmp_path / "dbs"),
                             "--pred", str(tmp_path / "pred.jsonl"), "--gold", str(tmp_path / "gold.jsonl"),
                             "--out", str(tmp_path / "report"), "--quiet", "--workers", "0", "--ves-repeats", "5",
                             "--test-suite", str(tmp_path / "ts"), "--variants", "2"],
                            capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "report" / "eval.json").read_text())
    assert (report["ex"], report["ts"]) == (0.5, 0.0)
    # question 2, per row: 'Bob' and 40 in gold, only 'Bob' predicted: tp 1/2, fn 1/2 -> P 1, R 1/2 -> F1 2/3
    assert report["buckets"]["simple"]["soft_f1"] == 1.0
    assert report["buckets"]["moderate"]["soft_f1"] == pytest.approx(2 / 3, abs=1e-6)
    assert report["buckets"]["moderate"]["r_ves"] == 0.0 and 0.5 <= report["buckets"]["simple"]["r_ves"] <= 1.12
    assert report["ex_variants"] <= report["ex"]
    assert "R-VES" in result.stdout and "| Soft-F1 | TS | EX+variants |" in result.stdout


def _db(root: Path, db_id: str, script: str, name: str | None = None) -> Path:
    folder = root / db_id
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name or db_id}.sqlite"
    with sqlite3.connect(path) as conn:
        conn.executescript(script)
    return path
