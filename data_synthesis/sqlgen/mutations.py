"""SQL mutations for gap filling: small edits of an example's tree that make a new example *near* it.

Used when a difficulty bin is short of its share (SPEC 2.4): the parent's structure is kept, so the
mutant's difficulty tends to stay close to the parent's (it is then measured, not assumed). Each operator
edits one node and updates the question the same way, and only when the question says the edited thing
exactly once (a literal, "highest", "at least", "top 3"); otherwise the mutant's question is None and only
an LLM question writer can make it usable. Works on any parsable SQL (ours, Spider's, BIRD's).

Operators: re-bind a literal to another real value of its column; flip a comparison (> <-> <); flip an
ORDER BY direction; swap MAX<->MIN or AVG<->SUM; change a LIMIT.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass

from sqlglot import exp
from sqlglot.errors import SqlglotError

from data_synthesis.sqlgen.profile import ColumnProfile, DbProfile
from data_synthesis.sqlgen.templates import value_text
from data_synthesis.sqlgen.trees import literal, literal_value, parse, render

FLIPPED_COMPARISON = {exp.GT: exp.LT, exp.LT: exp.GT, exp.GTE: exp.LTE, exp.LTE: exp.GTE}


def _both_ways(*pairs: tuple[str, str]) -> dict[str, str]:
    return {**{a: b for a, b in pairs}, **{b: a for a, b in pairs}}


# word -> its opposite; a question is edited only when it holds exactly one of these words
COMPARISON_WORDS = _both_ways(("greater than", "less than"), ("more than", "fewer than"), ("higher than", "lower than"),
                              ("larger than", "smaller than"), ("above", "below"), ("after", "before"),
                              ("at least", "at most"), ("over", "under"))
ORDER_WORDS = {**_both_ways(("highest", "lowest"), ("largest", "smallest"), ("most", "least"),
                            ("descending", "ascending"), ("latest", "earliest")),
               "fewest": "most", "biggest": "smallest", "greatest": "least"}
_EXTREMES = _both_ways(("maximum", "minimum"), ("highest", "lowest"), ("largest", "smallest"))
AGGREGATE_SWAPS = {exp.Max: (exp.Min, _EXTREMES),
                   exp.Min: (exp.Max, _EXTREMES),
                   exp.Avg: (exp.Sum, {"average": "total", "mean": "total"}),
                   exp.Sum: (exp.Avg, {"total": "average", "sum": "average"})}


@dataclass(frozen=True)
class Mutant:
    sql: str
    question: str | None  # None: the edit could not be carried into the question
    kind: str


Operator = Callable[[exp.Expression, str, DbProfile, random.Random], list[Mutant]]


def mutate(sql: str, question: str, profile: DbProfile, rng: random.Random, limit: int = 12) -> list[Mutant]:
    """Up to `limit` distinct mutants of one example, in a seeded random order (none if the SQL does not parse).

    Example:
        >>> from data_synthesis.sqlgen.profile import TableProfile
        >>> col = ColumnProfile("t", "city", "text", False, 3, 0, ("Paris", "Rome", "Oslo"), (5, 3, 1))
        >>> db = DbProfile("d", None, (TableProfile("t", 9, (col,)),), ())
        >>> [(m.sql, m.question) for m in mutate("SELECT COUNT(*) FROM t WHERE city = 'Paris'",
        ...     "How many t have city 'Paris'?", db, random.Random(0), limit=1)]
        [("SELECT COUNT(*) FROM t WHERE city = 'Rome'", "How many t have city 'Rome'?")]
    """
    try:
        tree = parse(sql)
    except SqlglotError:
        return []
    out: dict[str, Mutant] = {}
    for operator in OPERATORS:
        for m in operator(tree, question, profile, rng):
            if m.sql != sql:
                out.setdefault(m.sql, m)
    mutants = list(out.values())
    rng.shuffle(mutants)
    return mutants[:limit]


def _edited(tree: exp.Expression, node: exp.Expression, build: Callable[[exp.Expression], exp.Expression]) -> str:
    """Render a copy of `tree` with `node` replaced by `build(copy of node)`; the input is never changed."""
    index = next(i for i, n in enumerate(tree.walk()) if n is node)
    copy = tree.copy()
    target = next(n for i, n in enumerate(copy.walk()) if i == index)
    replacement = build(target.copy())
    if target is copy:
        return render(replacement)
    target.replace(replacement)
    return render(copy)


def _swap_once(question: str, old: str, new: str) -> str | None:
    """`question` with the one whole-word occurrence of `old` replaced, or None if it is not there exactly once.

    Example:
        >>> _swap_once("the top 3 of 13", "3", "5"), _swap_once("at least 3 and 3", "3", "5")
        ('the top 5 of 13', None)
    """
    pattern = re.compile(rf"(?<![\w']){re.escape(old)}(?![\w'])" if old[:1].isalnum() else re.escape(old))
    hits = pattern.findall(question)
    if len(hits) != 1:
        return None
    return pattern.sub(lambda _: new, question)


def _swap_words(question: str, opposites: dict[str, str]) -> str | None:
    """Swap the one word of `opposites` the question holds (exactly once, and no other of them), else None.

    Example:
        >>> _swap_words("Which singer is the oldest with the highest age?", ORDER_WORDS)
        'Which singer is the oldest with the lowest age?'
        >>> _swap_words("The highest price at most 5", ORDER_WORDS) is None  # 'at most' too: ambiguous
        True
    """
    hits = [(m.start(), m.end(), word) for word in opposites
            for m in re.finditer(rf"(?<![\w']){re.escape(word)}(?![\w'])", question, re.IGNORECASE)]
    outer = [h for h in hits if not any(o != h and o[0] <= h[0] and h[1] <= o[1] for o in hits)]
    if len(outer) != 1:
        return None
    start, end, word = outer[0]
    new = opposites[word]
    if question[start].isupper():
        new = new[0].upper() + new[1:]
    return question[:start] + new + question[end:]


def _resolve(col: exp.Column, profile: DbProfile) -> ColumnProfile | None:
    """The profiled column a Column node reads, through the aliases of its own SELECT."""
    select = col.find_ancestor(exp.Select)
    if select is None:
        return None
    tables = {}
    for t in select.find_all(exp.Table):
        if t.find_ancestor(exp.Select) is select:
            tables[(t.alias or t.name).lower()] = t.name
    names = [tables[col.table.lower()]] if col.table else list(tables.values())
    hits = [c for name in names if (tp := profile.table(name)) and (c := tp.column(col.name))]
    return hits[0] if len(hits) == 1 else None


def rebind_literal(tree, question, profile, rng) -> list[Mutant]:
    """`city = 'Paris'` -> `city = 'Rome'`: another real value (or quantile) of the same column."""
    out = []
    for cmp in tree.find_all(exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE):
        col, lit = cmp.this, cmp.expression
        if not isinstance(col, exp.Column) or literal_value(lit) is None:
            continue
        profiled = _resolve(col, profile)
        if profiled is None:
            continue
        old = literal_value(lit)
        pool = profiled.values if isinstance(cmp, (exp.EQ, exp.NEQ)) else profiled.quantiles or profiled.values
        choices = [v for v in dict.fromkeys(pool) if v != old and isinstance(v, str) == isinstance(old, str)]
        for new in rng.sample(choices, min(2, len(choices))):
            sql = _edited(tree, lit, lambda _: literal(new))
            swapped = _swap_once(question, value_text(old), value_text(new))
            if swapped is None:
                old_text = old if isinstance(old, str) else lit.this
                swapped = _swap_once(question, str(old_text), new if isinstance(new, str) else value_text(new))
            out.append(Mutant(sql, swapped, "rebind_literal"))
    return out


def flip_comparison(tree, question, profile, rng) -> list[Mutant]:
    """`x > 10` <-> `x < 10` (only with a single ordered comparison in the query)."""
    cmps = list(tree.find_all(*FLIPPED_COMPARISON))
    if len(cmps) != 1:
        return []
    cmp = cmps[0]
    sql = _edited(tree, cmp, lambda n: FLIPPED_COMPARISON[type(n)](this=n.this, expression=n.expression))
    return [Mutant(sql, _swap_words(question, COMPARISON_WORDS), "flip_comparison")]


def flip_order(tree, question, profile, rng) -> list[Mutant]:
    """ORDER BY ... DESC <-> ASC (only with a single ordering key)."""
    keys = list(tree.find_all(exp.Ordered))
    if len(keys) != 1:
        return []
    desc = not keys[0].args.get("desc")
    sql = _edited(tree, keys[0], lambda n: exp.Ordered(this=n.this, desc=desc, nulls_first=not desc))
    return [Mutant(sql, _swap_words(question, ORDER_WORDS), "flip_order")]


def swap_aggregate(tree, question, profile, rng) -> list[Mutant]:
    """MAX <-> MIN, AVG <-> SUM (only with a single such aggregate)."""
    aggs = [n for n in tree.find_all(*AGGREGATE_SWAPS)]
    if len(aggs) != 1:
        return []
    other, words = AGGREGATE_SWAPS[type(aggs[0])]
    sql = _edited(tree, aggs[0], lambda n: other(this=n.this))
    return [Mutant(sql, _swap_words(question, words), "swap_aggregate")]


def change_limit(tree, question, profile, rng) -> list[Mutant]:
    """LIMIT 3 -> LIMIT 5 (a LIMIT 1 superlative is left alone: its question has no number)."""
    out = []
    for limit in tree.find_all(exp.Limit):
        k = literal_value(limit.expression)
        if not isinstance(k, int) or k <= 1:
            continue
        new = rng.choice([n for n in (2, 3, 4, 5, 10) if n != k])
        sql = _edited(tree, limit.expression, lambda _: literal(new))
        out.append(Mutant(sql, _swap_once(question, str(k), str(new)), "change_limit"))
    return out


OPERATORS: tuple[Operator, ...] = (rebind_literal, flip_comparison, flip_order, swap_aggregate, change_limit)
