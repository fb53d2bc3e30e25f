"""Structural signatures: what a query computes, read off its syntax tree, without its literals.

Two candidates with the same signature read the same tables, project the same expressions, aggregate,
group and order the same way; they may differ in literals, join conditions, aliases, letter case and
layout. The selector's reranker counts how many *distinct generators* produced a signature: a shape
that independent generators converge on is evidence, even when a literal typo made one of their
results differ.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from sqlglot import exp

from sirius_train.inference.guard import Unanalysable, attempt
from sirius_train.inference.sql import DIALECT, SqlParseError, parse_sql


@dataclass(frozen=True)
class Signature:
    tables: frozenset[str]  # every table read, at any depth (lower-cased)
    projections: tuple[str, ...]  # the outermost SELECT list, normalised, in order
    aggregations: tuple[str, ...]  # the kinds of aggregate function used anywhere, sorted
    grouping: frozenset[str]  # GROUP BY expressions, normalised
    ordering: tuple[str, ...]  # ORDER BY expressions with direction, normalised, in order

    def describe(self) -> str:
        """One line for traces and reports."""
        parts = [f"tables={','.join(sorted(self.tables))}", f"select={', '.join(self.projections)}"]
        if self.aggregations:
            parts.append(f"agg={','.join(self.aggregations)}")
        if self.grouping:
            parts.append(f"group={','.join(sorted(self.grouping))}")
        if self.ordering:
            parts.append(f"order={', '.join(self.ordering)}")
        return "; ".join(parts)


@lru_cache(maxsize=16384)
def signature(sql: str) -> Signature | None:
    """The structural signature of `sql`; None when it does not parse or cannot be analysed.

    Aliases, table qualifiers, letter case and layout do not matter; literals are not part of it.

    Example:
        >>> a = signature("SELECT T1.name, count(*) FROM singer AS T1 JOIN concert AS T2 ON T1.id = T2.sid "
        ...               "WHERE T2.year = 2014 GROUP BY T1.id ORDER BY count(*) DESC")
        >>> b = signature("select singer.name, COUNT(*) from concert join singer on singer.id = concert.sid "
        ...               "where concert.year = 2015 group by singer.id order by count(*) desc")
        >>> a == b
        True
        >>> a.describe()
        'tables=concert,singer; select=name, count(*); agg=count; group=id; order=count(*) DESC'
        >>> signature("SELECT " + "(" * 5000 + "1" + ")" * 5000) is None  # too deep for the parser
        True
    """
    found = attempt(_signature, sql)
    return None if isinstance(found, Unanalysable) else found


def _signature(sql: str) -> Signature | None:
    try:
        tree = parse_sql(sql)
    except SqlParseError:
        return None
    select = _outermost_select(tree)
    projections = tuple(_normalise(e.unalias()) for e in select.expressions) if select is not None else ()
    group = select.args.get("group") if select is not None else None
    order = tree.args.get("order") or (select.args.get("order") if select is not None else None)
    return Signature(
        tables=frozenset(t.name.lower() for t in tree.find_all(exp.Table) if t.name),
        projections=projections,
        aggregations=tuple(sorted({a.key for a in tree.find_all(exp.AggFunc)})),
        grouping=frozenset(_normalise(e) for e in group.expressions) if group is not None else frozenset(),
        ordering=tuple(_normalise(e) for e in order.expressions) if order is not None else (),
    )


def _outermost_select(tree: exp.Expression) -> exp.Select | None:
    node = tree
    while isinstance(node, (exp.SetOperation, exp.Subquery)):
        node = node.left if isinstance(node, exp.SetOperation) else node.this
    return node if isinstance(node, exp.Select) else None


def _normalise(node: exp.Expression) -> str:
    """Expression text with table qualifiers and aliases dropped; literals kept only as placeholders."""
    node = node.copy()
    for column in node.find_all(exp.Column):
        column.set("table", None)
    for literal in node.find_all(exp.Literal):
        literal.replace(exp.Placeholder())
    text = node.sql(dialect=DIALECT)
    return text.lower() if not isinstance(node, exp.Ordered) else _lower_keep_direction(text)


def _lower_keep_direction(text: str) -> str:
    body, _, direction = text.rpartition(" ")
    if direction == "DESC":
        return f"{body.lower()} DESC"
    return body.lower() if direction == "ASC" else text.lower()  # ascending is the default
