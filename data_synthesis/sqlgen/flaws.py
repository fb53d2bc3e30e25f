"""Systematic mistakes in demonstrations: what a warm start imitates, and what execution feedback corrects.

Real corpora's gold SQL is imperfect (a share of Spider's and BIRD's is known to be wrong) and written in one
annotator's habits. `inject_flaws` reproduces that on purpose, for the nano demo: a share of the SFT
demonstrations gets one database-independent mistake in its SQL -- the ordering direction reversed, `>`
read as `<`, MAX for MIN, DISTINCT forgotten, the LIMIT dropped -- while the question stays as it was. A
policy that imitates them makes the same mistakes on any database, yet still samples the right form now and
then; an RL stage rewarded against the *correct* gold can move it there, and that transfers to databases it
never saw. RL pools and held-out sets are never flawed.

Each flawed example keeps its correct SQL in `meta["clean_sql"]` and its mistakes' names in `meta["flaw"]`.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import replace

from sqlglot import exp
from sqlglot.errors import SqlglotError

from data_synthesis.records import Example
from data_synthesis.sqlgen.mutations import flip_comparison, flip_order, swap_aggregate
from data_synthesis.sqlgen.trees import parse, render


def _mutated(operator) -> Callable[[exp.Expression], str | None]:
    """The SQL edit of a gap-filling mutation operator, with the question left as it was (that is the flaw)."""
    def edit(tree: exp.Expression) -> str | None:
        mutants = operator(tree, "", None, random.Random(0))
        return mutants[0].sql if mutants else None

    return edit


def drop_distinct(tree: exp.Expression) -> str | None:
    """`SELECT DISTINCT c` -> `SELECT c`, `COUNT(DISTINCT c)` -> `COUNT(c)` (the first DISTINCT in the query)."""
    copy = tree.copy()
    node = next(iter(copy.find_all(exp.Distinct)), None)
    if node is None:
        return None
    if isinstance(node.parent, exp.Count):
        node.replace(node.expressions[0])
    else:
        node.pop()
    return render(copy)


def drop_limit(tree: exp.Expression) -> str | None:
    """`... ORDER BY x DESC LIMIT 1` -> `... ORDER BY x DESC`: every row instead of the top ones."""
    copy = tree.copy()
    node = next(iter(copy.find_all(exp.Limit)), None)
    if node is None:
        return None
    node.pop()
    return render(copy)


# name -> edit of a parsed gold query (None when the query has no such construct); each is one habit
FLAWS: dict[str, Callable[[exp.Expression], str | None]] = {
    "order": _mutated(flip_order),  # ORDER BY direction reversed ("highest" written ASC)
    "comparison": _mutated(flip_comparison),  # `>` written `<` (single ordered comparison)
    "aggregate": _mutated(swap_aggregate),  # MAX <-> MIN, AVG <-> SUM
    "distinct": drop_distinct,
    "limit": drop_limit,
}


def flawed_variants(sql: str, kinds: Iterable[str] = FLAWS) -> dict[str, str]:
    """Each named flaw's version of `sql`, for the kinds that apply to it (unparsable SQL: none).

    Example:
        >>> flawed_variants("SELECT name FROM t ORDER BY age DESC LIMIT 1", ["order", "limit", "distinct"])
        {'order': 'SELECT name FROM t ORDER BY age ASC LIMIT 1', 'limit': 'SELECT name FROM t ORDER BY age DESC'}
    """
    try:
        tree = parse(sql)
    except SqlglotError:
        return {}
    out = {}
    for kind in kinds:
        edited = FLAWS[kind](tree)
        if edited is not None and edited != sql:
            out[kind] = edited
    return out


def check_kinds(kinds: Iterable[str]) -> list[str]:
    """The kinds, validated (an unknown name is a one-line error that lists the known ones)."""
    kinds = list(kinds)
    unknown = sorted(set(kinds) - set(FLAWS))
    if unknown:
        raise ValueError(f"unknown flaw kind(s) {unknown}; known: {list(FLAWS)}")
    return kinds


def inject_flaws(examples: list[Example], share: float, kinds: Iterable[str], seed: int = 0) -> list[Example]:
    """`examples` where each construct of `kinds` is written wrong in `share` of the demonstrations that have it.

    Kinds are drawn independently, so one example can carry several mistakes (`meta["flaw"]` lists them).
    Deterministic in (example id, seed). The question, id and everything else stay; only `gold_sql` changes.

    Example:
        >>> ex = Example("e1", "d", "Who is the oldest?", "SELECT name FROM t ORDER BY age DESC LIMIT 1")
        >>> [(e.gold_sql, e.meta["flaw"]) for e in inject_flaws([ex], 1.0, ["order", "limit"])]
        [('SELECT name FROM t ORDER BY age ASC', ['order', 'limit'])]
    """
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"flaw share must be in [0, 1], got {share}")
    kinds = check_kinds(kinds)
    out = []
    for e in examples:
        rng = random.Random(f"flaw:{e.id}:{seed}")
        sql, hits = e.gold_sql, []
        for kind in kinds:
            draw = rng.random()  # drawn for every kind, so one kind's rate never depends on the others
            edited = flawed_variants(sql, [kind]).get(kind)
            if edited is not None and draw < share:
                sql, hits = edited, [*hits, kind]
        out.append(replace(e, gold_sql=sql, meta={**e.meta, "flaw": hits, "clean_sql": e.gold_sql}) if hits else e)
    return out
