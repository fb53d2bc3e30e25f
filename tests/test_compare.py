import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rewards.compare import parse_mode, results_match

ORDERED = "SELECT a FROM t ORDER BY a"


@pytest.mark.parametrize("pred, gold, mode, gold_sql, expected", [
    ([], [], "bird", "", True),
    ([], [], "spider", "", True),
    ([(1,)], [], "bird", "", False),
    ([(1,), (1,)], [(1,)], "bird", "", True),  # duplicates ignored by BIRD
    ([(1,), (1,)], [(1,)], "spider", "", False),  # ... but not by Spider (multisets)
    ([(2,), (1,)], [(1,), (2,)], "bird", ORDERED, True),  # BIRD never looks at order
    ([(2,), (1,)], [(1,), (2,)], "spider", ORDERED, False),
    ([(2,), (1,)], [(1,), (2,)], "spider", "SELECT a FROM t", True),
    ([(1, "x")], [("x", 1)], "bird", "", False),  # BIRD: column order matters
    ([(1, "x")], [("x", 1)], "spider", "", True),
    ([(1.0,)], [(1,)], "bird", "", True),  # plain Python equality
    ([(1.0,)], [(1,)], "spider", "", True),
    ([("1",)], [(1,)], "bird", "", False),
    ([(None,)], [(None,)], "spider", "", True),
    ([(1, 2)], [(1,)], "spider", "", False),  # column count differs
    # a column permutation must be the same for every row
    ([(1, 2), (3, 4)], [(1, 2), (4, 3)], "spider", "", False),
    ([(2, 1), (4, 3)], [(1, 2), (3, 4)], "spider", "", True),
    # ORDER BY in a subquery of gold still makes order matter (the evaluator's plain text test) ...
    ([(2,), (1,)], [(1,), (2,)], "spider", "SELECT a FROM (SELECT a FROM t ORDER BY a)", False),
    ([(1,), (2,)], [(1,), (2,)], "spider", "SELECT a FROM (SELECT a FROM t ORDER BY a)", True),
    # ... and, being plain text, it does not see an ORDER BY spelt with two spaces
    ([(2,), (1,)], [(1,), (2,)], "spider", "SELECT a FROM t ORDER  BY a", True),
    ([(2,), (1,)], [(1,), (2,)], "spider", "select a from t order by a", False),
])
def test_results_match_cases(pred, gold, mode, gold_sql, expected):
    assert results_match(pred, gold, mode, gold_sql) is expected


def test_unknown_mode_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown compare mode 'exact'"):
        parse_mode("exact")


cells = st.one_of(st.integers(-3, 3), st.sampled_from(["a", "b", ""]), st.none(), st.sampled_from([0.5, 1.0]))


@st.composite
def tables(draw):
    ncols = draw(st.integers(1, 5))
    rows = draw(st.lists(st.tuples(*[cells] * ncols), min_size=1, max_size=8))
    return rows


@settings(max_examples=150, deadline=None)
@given(tables(), st.randoms(use_true_random=False))
def test_spider_accepts_any_column_and_row_permutation(rows, rnd):
    ncols = len(rows[0])
    perm = list(range(ncols))
    rnd.shuffle(perm)
    shuffled = [tuple(r[j] for j in perm) for r in rows]
    rnd.shuffle(shuffled)
    assert results_match(shuffled, rows, "spider")
    # gold ordered: columns may still move, rows may not
    columns_moved = [tuple(r[j] for j in perm) for r in rows]
    assert results_match(columns_moved, rows, "spider", ORDERED)
    def cells(row):  # a row's values as a multiset, numbers compared as Python does (1 == 1.0)
        return sorted(repr(float(c)) if isinstance(c, (int, float)) else repr(c) for c in row)

    if [cells(r) for r in shuffled] != [cells(r) for r in rows]:  # no column permutation can undo the row shuffle
        assert not results_match(shuffled, rows, "spider", ORDERED)
    rows_moved = list(rows)
    rnd.shuffle(rows_moved)
    assert results_match(rows_moved + rows_moved[:1], rows, "bird")  # BIRD: row order and duplicates ignored


@settings(max_examples=150, deadline=None)
@given(tables())
def test_spider_detects_a_changed_cell(rows):
    changed = list(rows)
    first = list(changed[0])
    first[0] = "sentinel-not-in-data"
    changed[0] = tuple(first)
    assert not results_match(changed, rows, "spider")
    assert not results_match(changed, rows, "bird")


def test_spider_wide_results_are_fast():
    rng = random.Random(0)
    gold = [tuple(rng.randint(0, 3) for _ in range(12)) for _ in range(2000)]
    pred = [tuple(r[::-1]) for r in gold]
    rng.shuffle(pred)
    assert results_match(pred, gold, "spider")
