"""Spider's hardness buckets (easy / medium / hard / extra) computed over a sqlglot parse.

The rules are `Evaluator.eval_hardness` of the official Spider evaluator (taoyds/spider,
`evaluation.py`): three counts over the *outermost* query --

- component1: WHERE, GROUP BY, ORDER BY, LIMIT present (1 each), extra tables in FROM (n - 1), OR
  connectors and LIKE conditions in join / WHERE / HAVING conditions;
- component2: nested queries -- subqueries used as condition values, plus one for INTERSECT / UNION /
  EXCEPT;
- others: 1 if more than one "aggregation" is counted, 1 if more than one projection, 1 if more than
  one WHERE condition, 1 if more than one GROUP BY expression --

and the published thresholds. Two quirks of the published code are kept, because they decide buckets:
its aggregation count reads the first field of every WHERE condition and of every HAVING element, which
is the NOT flag for a condition and a non-zero character for an `and`/`or` connector; so a NOT IN
counts as an aggregation, and so does every connector in HAVING.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from sirius_train.inference.guard import Unanalysable, attempt
from sirius_train.inference.sql import QUERY_TYPES, SqlParseError, parse_sql

BUCKETS = ("easy", "medium", "hard", "extra")


@dataclass(frozen=True)
class HardnessCounts:
    component1: int
    component2: int
    others: int


def spider_hardness(sql: str) -> str:
    """Spider's bucket for `sql`; "extra" for SQL that is not a query the analysis can read (it cannot be counted).

    Example:
        >>> spider_hardness("SELECT count(*) FROM singer")
        'easy'
        >>> spider_hardness("SELECT name, country, age FROM singer ORDER BY age DESC")
        'medium'
        >>> spider_hardness("SELECT name FROM stadium WHERE stadium_id NOT IN (SELECT stadium_id FROM concert)")
        'hard'
        >>> spider_hardness("SELECT T2.name FROM singer_in_concert AS T1 JOIN singer AS T2 ON T1.singer_id = T2.singer_id "
        ...                 "JOIN concert AS T3 ON T1.concert_id = T3.concert_id WHERE T3.year = 2014 INTERSECT "
        ...                 "SELECT T2.name FROM singer_in_concert AS T1 JOIN singer AS T2 ON T1.singer_id = T2.singer_id "
        ...                 "JOIN concert AS T3 ON T1.concert_id = T3.concert_id WHERE T3.year = 2015")
        'extra'
        >>> spider_hardness("SELECT " + "(" * 5000 + "1" + ")" * 5000)  # too deep for the parser
        'extra'
    """
    counts = attempt(hardness_counts, sql)
    if isinstance(counts, Unanalysable):  # unparsable, not a query, or the analyser failed
        return "extra"
    c1, c2, others = counts.component1, counts.component2, counts.others
    if c1 <= 1 and others == 0 and c2 == 0:
        return "easy"
    if (others <= 2 and c1 <= 1 and c2 == 0) or (c1 <= 2 and others < 2 and c2 == 0):
        return "medium"
    if ((others > 2 and c1 <= 2 and c2 == 0) or (2 < c1 <= 3 and others <= 2 and c2 == 0)
            or (c1 <= 1 and others == 0 and c2 <= 1)):
        return "hard"
    return "extra"


def hardness_counts(sql: str) -> HardnessCounts:
    """The three counts `spider_hardness` thresholds (raises SqlParseError on unparsable SQL).

    Example:
        >>> hardness_counts("SELECT a, max(b) FROM t JOIN u ON t.id = u.id WHERE c LIKE '%x%' OR d = 1 GROUP BY a")
        HardnessCounts(component1=5, component2=0, others=2)
    """
    tree = parse_sql(sql)
    if not isinstance(tree, QUERY_TYPES):
        raise SqlParseError(f"not a query: {type(tree).__name__}")
    nested = 0
    while isinstance(tree, exp.Subquery):
        tree = tree.this
    if isinstance(tree, exp.SetOperation):
        nested += 1  # the evaluator stores the right side as the main query's union/intersect/except
        while isinstance(tree, exp.SetOperation):
            tree = tree.left
            while isinstance(tree, exp.Subquery):
                tree = tree.this
    if not isinstance(tree, exp.Select):
        return HardnessCounts(0, nested, 0)
    join_conds, join_links = [], []
    for join in tree.args.get("joins") or []:
        if join.args.get("on") is not None:
            _flatten(join.args["on"], join_conds, join_links)
    where_conds, where_links = _flattened(tree.args.get("where"))
    having_conds, having_links = _flattened(tree.args.get("having"))
    group = list(tree.args["group"].expressions) if tree.args.get("group") else []
    order = list(tree.args["order"].expressions) if tree.args.get("order") else []
    table_units = 1 + len(tree.args.get("joins") or []) if tree.args.get("from_") or tree.args.get("from") else 0

    conds = join_conds + where_conds + having_conds
    component1 = (bool(where_conds) + bool(group) + bool(order) + (tree.args.get("limit") is not None)
                  + max(table_units - 1, 0)
                  + sum(link == "or" for link in join_links + where_links + having_links)
                  + sum(isinstance(_strip_not(c), exp.Like) for c in conds))
    nested += sum(_subqueries(c) for c in conds)

    aggregations = sum(isinstance(e.unalias(), exp.AggFunc) for e in tree.expressions)
    aggregations += sum(isinstance(c, exp.Not) for c in where_conds)  # the NOT flag, read as an aggregation
    aggregations += sum(isinstance(e, exp.AggFunc) for e in group)
    aggregations += sum(min(len(list(o.find_all(exp.AggFunc))), 2) for o in order)
    aggregations += sum(isinstance(c, exp.Not) for c in having_conds) + len(having_links)
    others = ((aggregations > 1) + (len(tree.expressions) > 1) + (len(where_conds) > 1) + (len(group) > 1))
    return HardnessCounts(component1, nested, others)


def _flattened(clause) -> tuple[list, list]:
    conds: list = []
    links: list = []
    if clause is not None:
        _flatten(clause.this, conds, links)
    return conds, links


def _flatten(node: exp.Expression, conds: list, links: list) -> None:
    """Spider keeps conditions as a flat list `[cond, 'and', cond, 'or', cond]`; so do we."""
    while isinstance(node, exp.Paren):
        node = node.this
    if isinstance(node, (exp.And, exp.Or)):
        _flatten(node.this, conds, links)
        links.append("and" if isinstance(node, exp.And) else "or")
        _flatten(node.expression, conds, links)
    else:
        conds.append(node)


def _strip_not(node: exp.Expression) -> exp.Expression:
    return node.this if isinstance(node, exp.Not) else node


def _subqueries(cond: exp.Expression) -> int:
    """Condition values that are queries (the evaluator's val1 / val2 holding a nested SQL)."""
    cond = _strip_not(cond)
    if isinstance(cond, exp.In):
        values = [cond.args.get("query")]
    elif isinstance(cond, exp.Between):
        values = [cond.args.get("low"), cond.args.get("high")]
    elif isinstance(cond, exp.Exists):
        values = [cond.this]
    elif isinstance(cond, exp.Binary):
        values = [cond.expression]
    else:
        values = []
    return sum(isinstance(v, (exp.Subquery, exp.Select)) for v in values)
