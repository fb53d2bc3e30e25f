"""`sirius evaluate` in our JSONL and the official BIRD and Spider layouts; Spider hardness rules."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from sirius_train.evaluation.reports import EvaluationInputError, load_items
from sirius_train.evaluation.hardness import hardness_counts, spider_hardness

PARIS = "SELECT count(*) FROM customers WHERE city = 'Paris'"
ROME = "SELECT count(*) FROM customers WHERE city = 'Rome'"
BOOKS = "SELECT genre, count(*) FROM books GROUP BY genre"


@pytest.mark.parametrize("sql, bucket", [
    ("SELECT count(*) FROM singer", "easy"),
    ("SELECT name FROM singer WHERE age > 20", "easy"),
    ("SELECT name, age FROM singer", "medium"),
    ("SELECT avg(age), min(age), max(age) FROM singer WHERE country = 'France'", "medium"),
    ("SELECT T2.name, count(*) FROM concert AS T1 JOIN stadium AS T2 ON T1.stadium_id = T2.stadium_id "
     "GROUP BY T1.stadium_id", "medium"),
    ("SELECT name FROM stadium WHERE stadium_id NOT IN (SELECT stadium_id FROM concert)", "hard"),
    ("SELECT name FROM singer WHERE age > (SELECT avg(age) FROM singer)", "hard"),
    ("SELECT a FROM t WHERE b = 1 AND c = 2 AND d LIKE '%x%' ORDER BY a", "hard"),  # component1 = 3
    ("SELECT a FROM t WHERE b = 1 AND c = 2 AND d LIKE '%x%' ORDER BY a LIMIT 1", "extra"),  # component1 = 4
    ("SELECT country FROM singer WHERE age > 40 INTERSECT SELECT country FROM singer WHERE age < 30", "hard"),
    ("SELECT T1.name FROM a AS T1 JOIN b AS T2 ON T1.id = T2.id JOIN c AS T3 ON T2.id = T3.id WHERE T3.x = 1 "
     "GROUP BY T1.name HAVING count(*) > 1 ORDER BY count(*) DESC LIMIT 1", "extra"),
])
def test_spider_hardness(sql, bucket):
    assert spider_hardness(sql) == bucket


def test_hardness_keeps_the_published_quirks():
    # NOT IN counts as an aggregation (the evaluator reads the NOT flag as one) ...
    assert hardness_counts("SELECT max(a) FROM t WHERE b NOT IN (SELECT b FROM u)").others == 1
    # ... and so does every connector inside HAVING.
    assert hardness_counts("SELECT a, count(*) FROM t GROUP BY a HAVING count(*) > 1 AND max(b) < 3").others == 2
    assert spider_hardness("SELEC nonsense") == "extra"


# ------------------------------------------------------------------------------------------ layouts
def write(path, text):
    path.write_text(text)
    return path


def evaluate(tmp_path, db_root, pred, gold, *extra):
    result = subprocess.run([sys.executable, "-m", "sirius_train.cli", "evaluate", "--db-root", str(db_root),
                             "--pred", str(pred), "--gold", str(gold), "--out", str(tmp_path / "report"),
                             "--quiet", "--workers", "0", *extra], capture_output=True, text=True)
    return result


def test_jsonl_layout_with_dataset_difficulty(tmp_path, demo_db_root):
    gold = write(tmp_path / "gold.jsonl", "".join(json.dumps(r) + "\n" for r in [
        {"id": "a", "db_id": "retail", "gold_sql": PARIS, "difficulty": "simple"},
        {"id": "b", "db_id": "retail", "gold_sql": ROME, "difficulty": "challenging"},
        {"id": "c", "db_id": "library", "gold_sql": BOOKS, "difficulty": "simple"}]))
    pred = write(tmp_path / "picks.jsonl", "".join(json.dumps(r) + "\n" for r in [
        {"id": "a", "sql": PARIS.replace("SELECT", "select"), "source": "x", "score": 1.0},
        {"id": "c", "sql": "SELECT count(*), genre FROM books GROUP BY genre"}]))  # columns swapped, "b" missing
    result = evaluate(tmp_path, demo_db_root, pred, gold)
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "report" / "eval.json").read_text())
    assert (report["n"], report["correct"], report["missing"], report["compare"]) == (3, 1, 1, "bird")
    assert {b: {k: v[k] for k in ("n", "correct", "ex")} for b, v in report["buckets"].items()} == {
        "simple": {"n": 2, "correct": 1, "ex": 0.5}, "challenging": {"n": 1, "correct": 0, "ex": 0.0}}
    assert report["databases"]["library"]["ex"] == 0.0
    spider = evaluate(tmp_path, demo_db_root, pred, gold, "--compare", "spider")
    assert json.loads((tmp_path / "report" / "eval.json").read_text())["correct"] == 2  # column order ignored
    assert "# Execution accuracy (spider): 66.67% (2/3)" in spider.stdout
    assert (tmp_path / "report" / "eval.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| simple | 2 | 2 | 100.00% |" in (tmp_path / "report" / "eval.md").read_text()


def test_bird_layout(tmp_path, demo_db_root):
    dev = [{"question_id": 0, "db_id": "retail", "question": "q", "evidence": "", "SQL": PARIS, "difficulty": "simple"},
           {"question_id": 1, "db_id": "retail", "question": "q", "evidence": "", "SQL": ROME, "difficulty": "moderate"}]
    gold = write(tmp_path / "dev.json", json.dumps(dev))
    pred = write(tmp_path / "predict_dev.json", json.dumps({"0": f"{PARIS}\t----- bird -----\tretail",
                                                            "1": f"{PARIS}\t----- bird -----\tretail"}))
    assert evaluate(tmp_path, demo_db_root, pred, gold).returncode == 0
    report = json.loads((tmp_path / "report" / "eval.json").read_text())
    assert {b: {k: v[k] for k in ("n", "correct", "ex")} for b, v in report["buckets"].items()} == {
        "simple": {"n": 1, "correct": 1, "ex": 1.0}, "moderate": {"n": 1, "correct": 0, "ex": 0.0}}
    # dev.sql gold + difficulty from dev.json
    dev_sql = write(tmp_path / "dev.sql", f"{PARIS}\tretail\n{ROME}\tretail\n")
    items = load_items(pred, dev_sql, "bird", tmp_path / "dev.json")
    assert [it.bucket for it in items] == ["simple", "moderate"]


def test_spider_layout_uses_hardness_and_spider_equivalence(tmp_path, demo_db_root):
    gold = write(tmp_path / "dev_gold.sql", f"{PARIS}\tretail\n{BOOKS}\tlibrary\n")
    pred = write(tmp_path / "pred.sql", f"{PARIS}\nSELECT count(*), genre FROM books GROUP BY genre\n")
    result = evaluate(tmp_path, demo_db_root, pred, gold)
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "report" / "eval.json").read_text())
    assert report["compare"] == "spider" and report["correct"] == 2
    assert report["buckets"] == {"easy": {"n": 1, "correct": 1, "ex": 1.0, "ex_official": 1.0},
                                 "medium": {"n": 1, "correct": 1, "ex": 1.0, "ex_official": 1.0}}


def test_evaluate_scores_sql_the_analysis_cannot_read(tmp_path, demo_db_root):
    """Gold and predictions that break sqlglot (a self-join without aliases, 10k-deep nesting, NUL) get a
    bucket ("extra" when unanalysable) and an engine verdict; nothing raises."""
    self_join = "SELECT count(*) FROM customers JOIN customers"
    deep = "SELECT " + "(" * 10_000 + "1" + ")" * 10_000
    gold = tmp_path / "g.jsonl"
    gold.write_text("".join(json.dumps({"id": i, "db_id": "retail", "gold_sql": sql}) + "\n"
                            for i, sql in enumerate([self_join, deep, PARIS])))
    pred = tmp_path / "p.jsonl"
    pred.write_text("".join(json.dumps({"id": i, "sql": sql}) + "\n" for i, sql in enumerate([self_join, deep, "SELECT 1\x00"])))
    result = evaluate(tmp_path, demo_db_root, pred, gold)
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "report" / "eval.json").read_text())
    assert report["correct"] == 1 and report["n"] == 3  # the self-join; SQLite refuses the deep gold itself
    assert report["buckets"]["extra"]["n"] == 1  # the deep gold: too deep to count, as unparsable SQL is


@pytest.mark.parametrize("files, message", [
    ({"pred.sql": "SELECT 1\nSELECT 2\n", "dev_gold.sql": f"{PARIS}\tretail\n"}, "2 predictions for 1 gold"),
    ({"pred.sql": "SELECT 1\n", "dev_gold.sql": f"{PARIS}\n"}, "dev_gold.sql:1: expected 'SQL<TAB>db_id'"),
    ({"predict_dev.json": '["SELECT 1"]', "dev.json": "[]"}, "expected a JSON object"),
    ({"predict_dev.json": "{not json", "dev.json": "[]"}, "predict_dev.json:1: not valid JSON"),
    ({"p.jsonl": '{"id": 9, "sql": "SELECT 1"}\n', "g.jsonl": f'{{"id": 1, "db_id": "retail", "gold_sql": "{PARIS}"}}\n'},
     "1 prediction id(s) not in"),
    ({"p.jsonl": '{"id": 1, "sql": 5}\n', "g.jsonl": f'{{"id": 1, "db_id": "retail", "gold_sql": "{PARIS}"}}\n'},
     "p.jsonl:1: 'sql' must be a string or null"),
    ({"p.jsonl": '{"id": 1, "sql": "x"}\n', "g.jsonl": '{"id": 1, "db_id": "retail"}\n'},
     "g.jsonl:1: a gold entry needs db_id and one of"),
])
def test_bad_inputs_are_named(tmp_path, files, message):
    paths = [write(tmp_path / name, text) for name, text in files.items()]
    with pytest.raises(EvaluationInputError, match=re.escape(message)):
        load_items(*paths)


def test_bad_input_exits_2_and_writes_nothing(tmp_path, demo_db_root):
    pred = write(tmp_path / "pred.sql", "SELECT 1\nSELECT 2\n")
    gold = write(tmp_path / "dev_gold.sql", f"{PARIS}\tretail\n")
    result = evaluate(tmp_path, demo_db_root, pred, gold)
    assert result.returncode == 2
    assert f"error: {pred}: 2 predictions for 1 gold queries in {gold}" in result.stderr
    assert not (tmp_path / "report").exists()


def test_evaluate_agrees_with_sirius_score_on_real_predictions(tmp_path, spider_root, spider_pools):
    """One scorer for training and evaluation: EX from `evaluate` equals the mean `sirius score` match."""
    pred = write(tmp_path / "pred.sql", "".join(p["candidates"][15]["sql"].replace("\n", " ") + "\n"
                                                 for p in spider_pools))  # GPT-4 zero-shot
    gold = write(tmp_path / "dev_gold.sql", "".join(f"{p['gold_sql']}\t{p['db_id']}\n" for p in spider_pools))
    pairs = write(tmp_path / "pairs.jsonl", "".join(json.dumps({"id": k, "db_id": p["db_id"], "gold_sql": p["gold_sql"],
                                                                "pred_sql": p["candidates"][15]["sql"]}) + "\n"
                                                    for k, p in enumerate(spider_pools)))
    result = evaluate(tmp_path, spider_root / "databases", pred, gold, "--compare", "bird")
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "report" / "eval.json").read_text())
    subprocess.run([sys.executable, "-m", "sirius_train.cli", "score", "--db-root", str(spider_root / "databases"),
                    "--input", str(pairs), "--output", str(tmp_path / "scores.jsonl"), "--quiet"], check=True)
    matches = [json.loads(line)["match"] for line in (tmp_path / "scores.jsonl").read_text().splitlines()]
    assert report["n"] == len(spider_pools) and report["correct"] == sum(matches)
    assert sum(v["n"] for v in report["buckets"].values()) == report["n"]
    assert set(report["buckets"]) == {"easy", "medium", "hard", "extra"}
