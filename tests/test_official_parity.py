"""`sirius evaluate` on official-format files with odd inputs agrees with the official scripts' semantics.

Each test writes BIRD- or Spider-layout files over real Spider databases, scores them with the official semantics
(tests/official_reference.py: the scripts' steps on plain sqlite3, none of our code) and with ours, and compares
question by question.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

import official_reference as official
from rewards.executor import Executor
from rewards.scoring import ScoreResult
from sirius_train.evaluation.official_eval import official_limits, soft_f1_scores, ves_rewards
from sirius_train.evaluation.reports import EvalItem, EvaluationInputError, ex_report, load_items, markdown_report, \
    score_items

SEP = official.BIRD_SEPARATOR
NOBODY = "SELECT Name FROM singer WHERE Age > 1000"  # an empty gold result on concert_singer
COUNT = "SELECT count(*) FROM singer"


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _ours(pred: Path, gold: Path, db_root: Path, layout: str) -> tuple[list[bool], list[float]]:
    """EX and Soft-F1 per question, as `sirius evaluate` computes them for the layout."""
    items = load_items(pred, gold, layout)
    limits = official_limits(layout, 30.0)
    results = score_items(items, db_root, "bird", workers=0, limits=limits)
    with Executor(db_root, workers=0, limits=limits) as executor:
        f1 = soft_f1_scores(executor, [(it.db_id, it.gold_sql, it.pred_sql) for it in items])
    return [r.match for r in results], f1


def _cli(tmp_path: Path, db_root: Path, pred: Path, gold: Path, *extra: str) -> tuple[dict, str]:
    done = subprocess.run([sys.executable, "-m", "sirius_train.cli", "evaluate", "--db-root", str(db_root),
                           "--pred", str(pred), "--gold", str(gold), "--out", str(tmp_path / "report"), "--quiet",
                           "--workers", "0", "--ves-repeats", "0", *extra], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return json.loads((tmp_path / "report" / "eval.json").read_text()), done.stdout


def _copy(spider_root: Path, tmp_path: Path, db_id: str) -> Path:
    """A writable copy of a Spider database under tmp_path/dbs (the official scripts open it read-write)."""
    target = tmp_path / "dbs" / db_id / f"{db_id}.sqlite"
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(spider_root / "databases" / db_id / f"{db_id}.sqlite", target)
    return target


# ---------------------------------------------------------------------------------------------- BIRD
def test_a_bird_entry_without_a_statement_is_right_where_the_gold_is_empty(spider_root, tmp_path):
    """Empty, comment-only and null entries run as nothing officially: no rows, so EX 1 and Soft-F1 1 against an
    empty gold (41 of 541 held-out questions have one), 0 against any other."""
    _copy(spider_root, tmp_path, "concert_singer")
    db_root = tmp_path / "dbs"
    gold = _write(tmp_path / "dev.sql", "".join(f"{sql}\tconcert_singer\n" for sql in (NOBODY, NOBODY, NOBODY, COUNT)))
    pred = _write(tmp_path / "predict_dev.json", json.dumps(
        {"0": "", "1": f"-- no idea{SEP}concert_singer", "2": None, "3": None}))
    reference = official.bird_scores(pred, gold, db_root), official.bird_scores(pred, gold, db_root, official.bird_f1)
    assert reference == ([1, 1, 1, 0], [1.0, 1.0, 1.0, 0])
    assert _ours(pred, gold, db_root, "bird") == ([True, True, True, False], [1.0, 1.0, 1.0, 0.0])
    report, _ = _cli(tmp_path, db_root, pred, gold)
    assert (report["ex"], report["soft_f1"], report["missing"]) == (0.75, 0.75, 0)


def test_bird_entries_pair_with_questions_by_file_order(spider_root, tmp_path):
    """Keys in reverse order: the first entry still answers the first question (officially 0 and 0 here)."""
    _copy(spider_root, tmp_path, "concert_singer")
    db_root = tmp_path / "dbs"
    first, second = COUNT, "SELECT count(*) FROM stadium"
    gold = _write(tmp_path / "dev.sql", f"{first}\tconcert_singer\n{second}\tconcert_singer\n")
    pred = _write(tmp_path / "predict_dev.json", json.dumps(
        {"1": f"{second}{SEP}concert_singer", "0": f"{first}{SEP}concert_singer"}))
    assert official.bird_scores(pred, gold, db_root) == [0, 0]
    assert _ours(pred, gold, db_root, "bird")[0] == [False, False]


def test_bird_text_that_is_not_utf8_and_large_results_score_as_officially(spider_root, tmp_path):
    """A result holding text that is not UTF-8 (sqlite3's default decoding fails the pair: EX, Soft-F1 and R-VES
    0); a result over our reward's 100,000-row cap (the scripts fetch it all)."""
    db = _copy(spider_root, tmp_path, "concert_singer")
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE singer SET Name = CAST(X'4AF673' AS TEXT) WHERE Singer_ID = 1")  # latin-1 'Jös'
    db_root = tmp_path / "dbs"
    latin = "SELECT Name FROM singer WHERE Singer_ID = 1"
    many = "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n LIMIT 150000) SELECT x FROM n"
    gold = _write(tmp_path / "dev.sql", f"{latin}\tconcert_singer\n{many}\tconcert_singer\n")
    pred = _write(tmp_path / "predict_dev.json", json.dumps({"0": f"{latin}{SEP}concert_singer",
                                                             "1": f"{many}{SEP}concert_singer"}))
    assert official.bird_scores(pred, gold, db_root) == [0, 1]
    assert official.bird_scores(pred, gold, db_root, official.bird_f1) == [0, 1.0]
    assert _ours(pred, gold, db_root, "bird") == ([False, True], [0.0, 1.0])
    assert not official.bird_timed_ok(latin, latin, str(db))  # its R-VES reward is 0
    assert ves_rewards(db_root, [("concert_singer", latin, latin)], [True], 2, limits=official_limits("bird", 30.0)) == [0]


def test_mini_dev_difficulties_pair_by_position(spider_root, tmp_path):
    """mini-dev's positional gold (`mini_dev_sqlite_gold.sql`) with its JSONL (`question_id`, no `id`) buckets
    question i by line i, as `compute_acc_by_diff` does; a difficulty file that leaves questions out is refused,
    never replaced by Spider's hardness."""
    _copy(spider_root, tmp_path, "concert_singer")
    db_root = tmp_path / "dbs"
    golds = [COUNT, NOBODY, "SELECT count(*) FROM stadium"]
    gold = _write(tmp_path / "mini_dev_sqlite_gold.sql", "".join(f"{sql}\tconcert_singer\n" for sql in golds))
    diff = _write(tmp_path / "mini_dev_sqlite.jsonl", "".join(json.dumps(
        {"question_id": 1471 + k, "db_id": "concert_singer", "SQL": sql, "difficulty": level}) + "\n"
        for k, (sql, level) in enumerate(zip(golds, ("moderate", "challenging", "simple")))))
    pred = _write(tmp_path / "predict_mini_dev.json", json.dumps(
        {str(k): f"{sql}{SEP}concert_singer" for k, sql in enumerate([COUNT, COUNT, COUNT])}))
    scores = official.bird_scores(pred, gold, db_root)
    assert official.bird_by_difficulty(scores, diff) == {"moderate": [1], "challenging": [0], "simple": [0]}
    report, _ = _cli(tmp_path, db_root, pred, gold, "--difficulty-file", str(diff))
    assert {b: v["correct"] for b, v in report["buckets"].items()} == {"simple": 0, "moderate": 1, "challenging": 0}
    dev_json = _write(tmp_path / "dev.json", json.dumps([{"question_id": 1471 + k, "difficulty": "simple"}
                                                         for k in range(3)]))
    assert [it.bucket for it in load_items(pred, gold, "bird", dev_json)] == ["simple"] * 3
    short = _write(tmp_path / "short.jsonl", diff.read_text().splitlines()[0] + "\n")
    with pytest.raises(EvaluationInputError, match="1 difficulties for 3 gold queries"):
        load_items(pred, gold, "bird", short)


def test_a_mean_is_rounded_once():
    """414 of 541: the official script prints 76.52 (76.5249...), as a report must; rounding the mean to six places
    first (0.76525) made it 76.53."""
    items = [EvalItem(k, "db", "q", "q", "simple") for k in range(541)]
    results = [ScoreResult(k, k < 414, 1.0, "ok", "ok") for k in range(541)]
    shown = markdown_report(ex_report(items, results, "bird")).splitlines()[0]
    assert official.bird_printed([1] * 414 + [0] * 127) == "76.52"
    assert shown == "# Execution accuracy (bird): 76.52% (414/541)"


# ---------------------------------------------------------------------------------------------- Spider
def test_spider_lines_and_distinct_follow_the_test_suite_evaluator(spider_root, tmp_path):
    """A prediction line is cut at its TAB and its ` value ` placeholder becomes 1; dropping DISTINCT keeps only the
    first statement. Our EX keeps DISTINCT (bags), so the report shows it beside the official EX."""
    pytest.importorskip("sqlparse")  # the official remove_distinct works on sqlparse's statements
    _copy(spider_root, tmp_path, "concert_singer")
    db_root = tmp_path / "dbs"
    golds = ["SELECT Name FROM singer WHERE Age > 40", "SELECT count(*) FROM singer WHERE Age > 1 AND Age < 100",
             COUNT, "SELECT Country FROM singer WHERE Age > 20"]
    preds = ["SELECT DISTINCT Name FROM singer WHERE Age > 40; SELECT 1",
             "SELECT count(*) FROM singer WHERE Age > value AND Age < 100",
             f"{COUNT}\tthe model's own note", "SELECT DISTINCT Country FROM singer WHERE Age > 20"]
    gold = _write(tmp_path / "dev_gold.sql", "".join(f"{sql}\tconcert_singer\n" for sql in golds))
    pred = _write(tmp_path / "pred.sql", "".join(f"{sql}\n" for sql in preds))
    assert official.spider_scores(pred, gold, db_root) == [1, 1, 1, 1]
    assert official.spider_scores(pred, gold, db_root, keep_distinct=True) == [0, 1, 1, 0]
    report, stdout = _cli(tmp_path, db_root, pred, gold, "--test-suite", str(db_root))
    assert (report["ex_official"], report["ts"], report["correct"]) == (1.0, 1.0, 2)
    assert "EX (official) 100.00" in stdout and "Execution accuracy (spider): 50.00%" in stdout
    kept, _ = _cli(tmp_path, db_root, pred, gold, "--keep-distinct")
    assert kept["ex_official"] == 0.5
