"""The official evaluators' semantics, rewritten for the parity tests (tests/test_official_parity.py).

Each function follows its reference script step by step -- bird-bench/mini_dev `evaluation/evaluation_utils.py`
(`package_sqls`, `execute_sql`), `evaluation_ex.py` (`calculate_ex`, `compute_acc_by_diff`), `evaluation_f1.py`
(`calculate_f1_score`), `evaluation_ves.py` (`execute_sql` with `return_time`), `print_data`; and
taoyds/test-suite-sql-eval `evaluation.py` (`evaluate`: reading the files), `exec_eval.py` (`eval_exec_match`,
`result_eq`, `postprocess`, `replace_cur_year`, the cursor's text factory) and `parse.py` (`remove_distinct`, on
sqlparse as there) -- on plain `sqlite3` connections, with none of this project's code: the tests run these and
`sirius evaluate` on the same files and compare. Timeouts and process pools are left out (no input here needs
them). Test helpers, not part of the package.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
from collections import defaultdict
from itertools import permutations

BIRD_SEPARATOR = "\t----- bird -----\t"


# ------------------------------------------------------------------------------------------- BIRD mini-dev
def bird_predictions(path) -> list[str]:
    """`package_sqls(mode="pred")`: the entries in file order; the SQL before the separator, or the whole entry
    stripped when splitting does not give two parts; a non-string entry is " "."""
    with open(path) as f:
        data = json.load(f)
    sqls = []
    for sql_str in data.values():
        if isinstance(sql_str, str):
            try:
                sql, _ = sql_str.split(BIRD_SEPARATOR)
            except ValueError:
                sql = sql_str.strip()
        else:
            sql = " "
        sqls.append(sql)
    return sqls


def bird_gold(path, db_root) -> list[tuple[str, str]]:
    """`package_sqls(mode="gt")`: (SQL, database path) per line."""
    out = []
    with open(path) as f:
        for line in f.readlines():
            sql, db_name = line.strip().split("\t")
            out.append((sql, os.path.join(str(db_root), db_name, db_name + ".sqlite")))
    return out


def _bird_run(predicted_sql: str, ground_truth: str, db_path: str, calculate):
    """`execute_sql` inside `execute_model`'s try: any exception scores 0."""
    try:
        conn = sqlite3.connect(db_path)
        cursor = conn.cursor()
        cursor.execute(predicted_sql)
        predicted = cursor.fetchall()
        cursor.execute(ground_truth)
        truth = cursor.fetchall()
        conn.close()
        return calculate(predicted, truth)
    except Exception:
        return 0


def bird_ex(predicted, truth) -> int:
    return 1 if set(predicted) == set(truth) else 0


def bird_f1(predicted, truth) -> float:
    """`calculate_f1_score`."""
    if not predicted and not truth:
        return 1.0
    predicted, truth = list(dict.fromkeys(predicted)), list(dict.fromkeys(truth))
    match, pred_only, truth_only = [], [], []
    for i, gt_row in enumerate(truth):
        if i >= len(predicted):
            match.append(0)
            truth_only.append(1)
            continue
        row = predicted[i]
        width = len(gt_row)
        match.append(sum(v in gt_row for v in row) / width)
        pred_only.append(sum(v not in gt_row for v in row) / width)
        truth_only.append(sum(v not in row for v in gt_row) / width)
    for _ in range(len(predicted) - len(truth)):
        match.append(0)
        pred_only.append(1)
        truth_only.append(0)
    tp, fp, fn = sum(match), sum(pred_only), sum(truth_only)
    precision = tp / (tp + fp) if tp + fp > 0 else 0
    recall = tp / (tp + fn) if tp + fn > 0 else 0
    return 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0


def bird_scores(pred_path, gold_path, db_root, calculate=bird_ex) -> list[float]:
    """Per question, as `run_sqls_parallel` then `sort_results` leave them: predictions zipped with gold lines."""
    return [_bird_run(p, g, db, calculate)
            for p, (g, db) in zip(bird_predictions(pred_path), bird_gold(gold_path, db_root))]


def bird_timed_ok(predicted_sql: str, ground_truth: str, db_path: str) -> bool:
    """Whether `iterated_execute_sql` gets past its first runs and one timing of each (else its reward is 0): the
    results compare, then `execute_sql(..., return_time=True)` runs both again."""
    try:
        for sql in (predicted_sql, ground_truth, predicted_sql, ground_truth):
            conn = sqlite3.connect(db_path)
            cursor = conn.cursor()
            cursor.execute(sql)
            cursor.fetchall()
            conn.close()
        return True
    except Exception:
        return False


def bird_by_difficulty(scores: list[float], diff_jsonl) -> dict[str, list[float]]:
    """`compute_acc_by_diff`: the i-th line of the difficulty JSONL buckets the i-th result."""
    buckets = defaultdict(list)
    with open(diff_jsonl) as f:
        for i, line in enumerate(f):
            buckets[json.loads(line)["difficulty"]].append(scores[i])
    return dict(buckets)


def bird_printed(scores: list[float]) -> str:
    """The total as `print_data` prints it: `{:<20.2f}` of the mean x 100."""
    return "{:.2f}".format(sum(scores) / len(scores) * 100)


# ------------------------------------------------------------------------------------------- Spider test suite
def spider_files(pred_path, gold_path) -> list[tuple[str, str, str]]:
    """`evaluate`'s reading, for Spider's single session: (prediction, gold, db_id) per line pair; each prediction
    line stripped, cut at its first TAB, ` value ` replaced by ` 1 `."""
    with open(gold_path) as f:
        gold = [line.strip().split("\t") for line in f.readlines() if line.strip()]
    with open(pred_path) as f:
        preds = [line.strip().split("\t") for line in f.readlines() if line.strip()]
    return [(p[0].replace(" value ", " 1 "), g, db) for p, (g, db) in zip(preds, gold)]


def _postprocess(query: str) -> str:
    return query.replace("> =", ">=").replace("< =", "<=").replace("! =", "!=")


def _remove_distinct(s: str) -> str:
    import sqlparse

    return "".join(t.value for t in sqlparse.parse(s)[0].flatten() if t.value.lower() != "distinct")


def _replace_cur_year(query: str) -> str:
    return re.sub(r"YEAR\s*\(\s*CURDATE\s*\(\s*\)\s*\)\s*", "2020", query, flags=re.IGNORECASE)


def _spider_run(db_path: str, query: str):
    """`exec_on_db_`: ("result", rows) or ("exception", error); bad text decodes with errors="ignore"."""
    connection = sqlite3.connect(db_path)
    connection.text_factory = lambda b: b.decode(errors="ignore")
    cursor = connection.cursor()
    try:
        cursor.execute(_replace_cur_year(query))
        return "result", cursor.fetchall()
    except Exception as e:
        return "exception", e
    finally:
        cursor.close()
        connection.close()


def _result_eq(result1: list, result2: list, order_matters: bool) -> bool:
    """`result_eq`: some column permutation makes the bags (lists, with ORDER BY) of rows equal."""
    if not result1 and not result2:
        return True
    if len(result1) != len(result2) or len(result1[0]) != len(result2[0]):
        return False
    for perm in permutations(range(len(result1[0]))):
        permuted = [tuple(row[i] for i in perm) for row in result2]
        if order_matters:
            if result1 == permuted:
                return True
        elif _bag(result1) == _bag(permuted):
            return True
    return False


def _bag(rows: list) -> dict:
    counts: dict = defaultdict(int)
    for row in rows:
        counts[row] += 1
    return counts


def spider_exec_match(db_path: str, p_str: str, g_str: str, keep_distinct: bool = False) -> int:
    """`eval_exec_match` (plug_value off): every `*.sqlite` beside `db_path` must agree."""
    p_str, g_str = _postprocess(p_str), _postprocess(g_str)
    if not keep_distinct:
        p_str, g_str = _remove_distinct(p_str), _remove_distinct(g_str)
    order_matters = "order by" in g_str.lower()
    db_dir = os.path.dirname(db_path)
    for name in os.listdir(db_dir):
        if ".sqlite" not in name:
            continue
        g_flag, g_rows = _spider_run(os.path.join(db_dir, name), g_str)
        assert g_flag != "exception", f"gold {g_str} fails on {name}"
        p_flag, p_rows = _spider_run(os.path.join(db_dir, name), p_str)
        if p_flag == "exception" or not _result_eq(g_rows, p_rows, order_matters):
            return 0
    return 1


def spider_scores(pred_path, gold_path, db_root, keep_distinct: bool = False) -> list[int]:
    return [spider_exec_match(os.path.join(str(db_root), db, db + ".sqlite"), p, g, keep_distinct)
            for p, g, db in spider_files(pred_path, gold_path)]
