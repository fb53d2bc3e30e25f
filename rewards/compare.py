"""Result equivalence: when does a predicted result count as the gold one?

Two modes, each the rule of a published evaluator, so that our reward and our EX numbers are the
numbers people report:

- ``bird``   -- BIRD's evaluator: ``set(pred_rows) == set(gold_rows)``. Row order and duplicate rows
  are ignored, column order matters, values compare with plain Python equality (``1 == 1.0``).
- ``spider`` -- the Spider test-suite evaluator's ``result_eq`` on one database: rows as multisets,
  any permutation of the columns accepted, row order significant only when the gold SQL text
  contains ``order by`` (exactly ``'order by' in gold_sql.lower()``). Its DISTINCT stripping of the
  SQL text is *not* applied.

The Spider search is exact but cheap: a column permutation can only work if every predicted column
has the same multiset of values as the gold column it maps to, so candidates are pruned by column
fingerprints before any row comparison.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from enum import Enum


class CompareMode(str, Enum):
    BIRD = "bird"
    SPIDER = "spider"


def parse_mode(mode: str | CompareMode) -> CompareMode:
    """The mode named by `mode` (its value or the member itself); a clear error for anything else.

    Example:
        >>> parse_mode("spider") is parse_mode(CompareMode.SPIDER) is CompareMode.SPIDER
        True
    """
    try:
        return _MODES[mode]  # a dict lookup: this runs once per scored pair, and an Enum call costs ten times more
    except (KeyError, TypeError):
        raise ValueError(f"unknown compare mode {mode!r}; expected one of {[m.value for m in CompareMode]}") from None


_MODES = {m.value: m for m in CompareMode}  # a member hashes and compares as its value, so it finds itself


def results_match(pred_rows: Sequence[tuple], gold_rows: Sequence[tuple], mode: str | CompareMode,
                  gold_sql: str = "") -> bool:
    """True when `pred_rows` is equivalent to `gold_rows` under `mode`.

    Example:
        >>> results_match([(1, "a"), (1, "a")], [(1, "a")], "bird")
        True
        >>> results_match([("a", 1)], [(1, "a")], "bird")
        False
        >>> results_match([("a", 1)], [(1, "a")], "spider")
        True
        >>> results_match([(2,), (1,)], [(1,), (2,)], "spider", gold_sql="SELECT x FROM t ORDER BY x")
        False
    """
    if parse_mode(mode) is CompareMode.BIRD:
        return set(pred_rows) == set(gold_rows)
    return spider_result_eq(gold_rows, pred_rows, order_matters="order by" in gold_sql.lower())


def spider_result_eq(result1: Sequence[tuple], result2: Sequence[tuple], order_matters: bool) -> bool:
    """The test-suite evaluator's rule: is there a column permutation making the results equal?"""
    if len(result1) == 0 and len(result2) == 0:
        return True
    if len(result1) != len(result2):
        return False
    num_cols = len(result1[0])
    if len(result2[0]) != num_cols:
        return False
    if not _quick_reject_passes(result1, result2, order_matters):
        return False
    for perm in _column_permutations(result1, result2, num_cols):
        permuted = list(result2) if perm is None else [tuple(row[j] for j in perm) for row in result2]
        if order_matters:
            if list(result1) == permuted:
                return True
        elif Counter(result1) == Counter(permuted):
            return True
    return False


def _unorder_row(row: tuple) -> tuple:
    # The evaluator sorts each row's cells by text and type before its quick reject; kept verbatim
    # because that key decides a few mixed-type rows.
    return tuple(sorted(row, key=lambda x: str(x) + str(type(x))))


def _quick_reject_passes(result1, result2, order_matters: bool) -> bool:
    s1 = [_unorder_row(r) for r in result1]
    s2 = [_unorder_row(r) for r in result2]
    return s1 == s2 if order_matters else set(s1) == set(s2)


def _column_permutations(result1, result2, num_cols: int):
    """Yield `perm` with result2 column perm[i] placed at position i (None = identity first).

    Only permutations where each mapped column pair has equal value multisets are generated:
    any permutation that makes the row multisets equal must satisfy that, so nothing is lost.
    """
    if num_cols == 1:
        yield None
        return
    cols1 = [Counter(row[i] for row in result1) for i in range(num_cols)]
    cols2 = [Counter(row[j] for row in result2) for j in range(num_cols)]
    candidates = [[j for j in range(num_cols) if cols2[j] == cols1[i]] for i in range(num_cols)]
    if any(not c for c in candidates):
        return
    # Most columns have exactly one candidate; backtrack over the rest, identity-first.
    order = sorted(range(num_cols), key=lambda i: len(candidates[i]))
    perm = [-1] * num_cols
    used = [False] * num_cols

    def backtrack(k: int):
        if k == num_cols:
            yield tuple(perm)
            return
        i = order[k]
        for j in sorted(candidates[i], key=lambda j: j != i):
            if not used[j]:
                used[j] = True
                perm[i] = j
                yield from backtrack(k + 1)
                used[j] = False

    yield from backtrack(0)
