"""The field's official metrics beside EX, as pure functions of results and timings (no database, no clock).

Each follows its reference script line by line (the executing and timing edge is `sirius_train.evaluation.official_eval`):

- **Soft-F1** (BIRD mini-dev, `evaluation/evaluation_f1.py`): both results are de-duplicated keeping first
  occurrences; row i of the prediction is paired with row i of the gold (by position, not by content); in a
  pair a predicted cell is a match when it occurs anywhere in the gold row, a gold cell is missed when it
  occurs nowhere in the predicted row, all counted in units of the gold row's width; rows without a partner
  count wholly as false positives (extra predicted rows) or false negatives (missing gold rows). Two empty
  results score 1; a prediction that fails scores 0.
- **R-VES** (BIRD mini-dev, `evaluation/evaluation_ves.py`): for a prediction whose result set equals the
  gold's, the gold/prediction execution-time ratio is measured `iterate_num = 100` times, ratios outside
  mean +- 3 standard deviations (population) are dropped, the rest averaged, and the mean mapped to a
  reward: >= 2 -> 1.25, [1, 2) -> 1, [0.5, 1) -> 0.75, [0.25, 0.5) -> 0.5, below -> 0.25, a wrong or failed
  prediction -> 0. R-VES = 100 x the mean over questions of sqrt(reward).
- **Test-suite accuracy** (Zhong et al. 2020, `taoyds/test-suite-sql-eval`, `exec_eval.py`): both queries
  are normalised as the evaluator does by default (`> =` -> `>=`, `YEAR(CURDATE())` -> 2020, every
  DISTINCT keyword removed unless `--keep_distinct`); the matching itself is `rewards.compare`'s spider mode.

Where ours differs, deliberately (docs/METRICS.md): when every timing ratio is identical (standard deviation
0) the official outlier filter keeps nothing and the script scores 0 through a ZeroDivisionError; we keep
them all. Nothing else.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

VES_REPEATS = 100  # iterate_num of evaluation_ves.py (run_sqls_parallel's default)
VES_STEPS = ((2.0, 1.25), (1.0, 1.0), (0.5, 0.75), (0.25, 0.5))  # (ratio at least, reward); above 0: 0.25


# ---------------------------------------------------------------------------------------------- Soft-F1
def _row_match(predicted_row: tuple, ground_truth_row: tuple) -> tuple[float, float, float]:
    total = len(ground_truth_row)
    matches = sum(1 for v in predicted_row if v in ground_truth_row)
    pred_only = len(predicted_row) - matches
    truth_only = sum(1 for v in ground_truth_row if v not in predicted_row)
    return matches / total, pred_only / total, truth_only / total


def soft_f1(predicted: Sequence[tuple], ground_truth: Sequence[tuple]) -> float:
    """BIRD's Soft-F1 of one question.

    Example:
        >>> soft_f1([(1, "a")], [(1, "a")]), soft_f1([], []), soft_f1([], [(1,)])
        (1.0, 1.0, 0)
        >>> round(soft_f1([(1, "a"), (2, "b")], [(1, "x")]), 4)  # tp 0.5, fp 0.5 + 1, fn 0.5
        0.3333
    """
    if not predicted and not ground_truth:
        return 1.0
    predicted = list(dict.fromkeys(predicted))
    ground_truth = list(dict.fromkeys(ground_truth))
    match, pred_only, truth_only = [], [], []
    for i, gt_row in enumerate(ground_truth):
        if i >= len(predicted):
            match.append(0)
            truth_only.append(1)
            continue
        m, p, t = _row_match(predicted[i], gt_row)
        match.append(m)
        pred_only.append(p)
        truth_only.append(t)
    for _ in range(len(predicted) - len(ground_truth)):
        match.append(0)
        pred_only.append(1)
        truth_only.append(0)
    tp, fp, fn = sum(match), sum(pred_only), sum(truth_only)
    precision = tp / (tp + fp) if tp + fp > 0 else 0
    recall = tp / (tp + fn) if tp + fn > 0 else 0
    return 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0


# ---------------------------------------------------------------------------------------------- R-VES
def clean_abnormal(values: Sequence[float]) -> list[float]:
    """The values strictly within mean +- 3 population standard deviations (all of them when that std is 0).

    Example:
        >>> clean_abnormal([1.0] * 10 + [100.0])  # one outlier among eleven
        [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
        >>> clean_abnormal([2.0, 2.0])
        [2.0, 2.0]
    """
    values = [float(v) for v in values]
    if not values:
        return []
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
    if std == 0:  # the official filter keeps nothing here and the script then scores 0 (ZeroDivisionError)
        return values
    return [v for v in values if mean - 3 * std < v < mean + 3 * std]


def time_ratio(pred_times: Sequence[float], gold_times: Sequence[float]) -> float:
    """Mean gold/prediction time ratio over the repetitions, outliers removed.

    Example:
        >>> time_ratio([0.5, 0.5, 1.0], [1.0, 1.0, 1.0])  # twice as fast, twice as fast, as fast
        1.6666666666666667
    """
    if len(pred_times) != len(gold_times) or not pred_times:
        raise ValueError(f"need as many prediction as gold timings, and some: {len(pred_times)}, {len(gold_times)}")
    if min(pred_times) <= 0:
        raise ValueError("a prediction took no time at all: the clock is too coarse to compare timings")
    kept = clean_abnormal([g / p for p, g in zip(pred_times, gold_times)])
    return sum(kept) / len(kept)


def ves_reward(ratio: float) -> float:
    """The reward step of a time ratio (0 only for no ratio: a wrong or failed prediction).

    Example:
        >>> [ves_reward(r) for r in (0, 0.1, 0.25, 0.49, 0.5, 0.99, 1.0, 1.99, 2.0, 7.0)]
        [0, 0.25, 0.5, 0.5, 0.75, 0.75, 1.0, 1.0, 1.25, 1.25]
    """
    if ratio == 0:
        return 0
    for floor, reward in VES_STEPS:
        if ratio >= floor:
            return reward
    return 0.25


def r_ves(rewards: Sequence[float]) -> float:
    """R-VES of a set of questions from their rewards: 100 x mean sqrt(reward).

    Example:
        >>> round(r_ves([1.25, 1.0, 0, 0.25]), 4)
        65.4508
    """
    return 100 * sum(math.sqrt(r) for r in rewards) / len(rewards) if rewards else 0.0


def printed(mean: float) -> str:
    """A metric's mean as the official scripts print it and every report here shows it (`sirius evaluate` and
    `sirius benchmark` alike): `print_data`'s `{:.2f}` of the mean x 100, no `%` sign. R-VES is not a share (a
    fast right answer earns sqrt(1.25), up to 111.80), so it is never shown as a percentage; the reports' JSON
    keeps the mean itself (R-VES / 100).

    Example:
        >>> printed(0.6545084971874737), printed(414 / 541), printed(math.sqrt(1.25))
        ('65.45', '76.52', '111.80')
    """
    return f"{100 * mean:.2f}"


# ---------------------------------------------------------------------------------------------- test suites
_CUR_YEAR = re.compile(r"YEAR\s*\(\s*CURDATE\s*\(\s*\)\s*\)\s*", re.IGNORECASE)


def ts_normalize(sql: str, keep_distinct: bool = False) -> str:
    """A query as the test-suite evaluator runs it: its `postprocess`, `replace_cur_year` and (by default, as there)
    `remove_distinct`, which drops every DISTINCT keyword, COUNT(DISTINCT x) included, and keeps only the first
    statement (it rebuilds the text from `sqlparse.parse(s)[0]`: whatever follows the first `;` is gone).

    Example:
        >>> ts_normalize("SELECT DISTINCT a FROM t WHERE b > = 1 AND c = 'distinct'")
        "SELECT  a FROM t WHERE b >= 1 AND c = 'distinct'"
        >>> ts_normalize("SELECT count(DISTINCT a) FROM t", keep_distinct=True)
        'SELECT count(DISTINCT a) FROM t'
        >>> ts_normalize("SELECT a FROM t WHERE b = ';'; DROP TABLE t"), ts_normalize("SELECT 1; SELECT 2", True)
        ("SELECT a FROM t WHERE b = ';';", 'SELECT 1; SELECT 2')
    """
    sql = sql.replace("> =", ">=").replace("< =", "<=").replace("! =", "!=")
    sql = _CUR_YEAR.sub("2020", sql)
    return sql if keep_distinct else _without_distinct(sql)


def _without_distinct(sql: str) -> str:
    """The first statement with every DISTINCT keyword token removed (strings and quoted names that spell
    'distinct' stay, and so does a `;` inside them)."""
    from sqlglot.dialects.sqlite import SQLite
    from sqlglot.errors import SqlglotError
    from sqlglot.tokens import TokenType

    try:
        tokens = SQLite().tokenize(sql)
    except (SqlglotError, ValueError):
        return sql  # SQLite will judge it as it is
    out, at, end = [], 0, len(sql)
    for token in tokens:
        if token.token_type is TokenType.SEMICOLON:
            end = token.end + 1
            break
        if token.token_type is TokenType.DISTINCT:
            out.append(sql[at:token.start])
            at = token.end + 1
    return "".join(out) + sql[at:end]


def group_means(values: Sequence[float], groups: Sequence[str]) -> dict[str, float]:
    """The mean of `values` per group name.

    Example:
        >>> group_means([1.0, 0.0, 0.5], ["a", "b", "a"])
        {'a': 0.75, 'b': 0.0}
    """
    sums: dict[str, list[float]] = {}
    for value, group in zip(values, groups):
        sums.setdefault(group, []).append(value)
    return {g: sum(v) / len(v) for g, v in sums.items()}
