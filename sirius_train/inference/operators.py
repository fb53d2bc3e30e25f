"""Structural repair operators: local, model-free edits for a query whose literals miss the data.

An empty result very often means a string literal that does not occur in the column it is compared
with ('Dog' against 'dog', 'New York ' with a stray space, 'Jon' for 'John'). These operators find
such *ungrounded* literals -- by looking the column's real values up -- and propose rewrites, in
order of how little they change the query's intent:

1. `rebind_literals`: replace each ungrounded literal by the closest real value of its column
   (case, whitespace and punctuation first, then a close spelling, then a unique containing value);
2. `relax_case`: `col = 'x'` -> `col LIKE 'x'` (case-insensitive for ASCII in SQLite);
3. `relax_containment`: `col = 'x'` -> `col LIKE '%x%'`.

A literal's own `%` and `_` are escaped in these patterns (`ESCAPE '\'`), so '100%' matches only
itself; a predicate that already is the pattern an operator would write is left alone.

Everything here is pure: column values come from a `ValueLookup` the caller provides (the lifecycle
reads them through the sandboxed executor). The first rewrite that returns rows is re-admitted.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sqlglot import exp

from data_synthesis.schema import Schema
from sirius_train.inference.resolve import Resolution, resolve_columns
from sirius_train.inference.sql import SqlParseError, parse_sql, to_sql

# (table, column) -> the column's distinct values, or None when unknown (too many, unreadable).
ValueLookup = Callable[[str, str], Sequence | None]

FUZZY_CUTOFF = 0.8  # difflib ratio: about one edit in a five-letter word, two in a ten-letter one
MIN_CONTAINED_CHARS = 4  # shorter literals are codes ('WI', 'NY'): a substring match of a code is noise
LIKE_ESCAPE = "\\"  # escapes a literal's own % and _ in the patterns the relaxations build


@dataclass(frozen=True)
class LiteralUse:
    """A string literal compared with a real column, e.g. `T3.pettype = 'Dog'`."""

    literal: exp.Expression  # the node holding the literal (a string Literal or a double-quoted name)
    value: str
    column: str  # the column as written
    tables: tuple[str, ...]  # real tables it may come from
    comparison: exp.Expression  # the EQ / NEQ / IN / LIKE node
    grounded: bool | None  # True: occurs in the column; False: does not; None: values unknown (or none at all)
    closest: str | None = None  # the real value it should probably be


@dataclass(frozen=True)
class Rewrite:
    operator: str
    sql: str
    edits: tuple[str, ...]  # human-readable, e.g. "pets.pettype = 'Dog' -> 'dog'"


def literal_uses(sql: str, schema: Schema, values: ValueLookup) -> list[LiteralUse]:
    """Every string literal compared (=, !=, IN, NOT IN, LIKE without wildcards) with a real column.

    Example:
        >>> from data_synthesis.schema import Column, Table
        >>> schema = Schema("p", (Table("pets", (Column("pettype", "TEXT"),)),))
        >>> values = lambda table, column: ["cat", "dog"]
        >>> [(u.value, u.grounded, u.closest) for u in literal_uses(
        ...     "SELECT count(*) FROM pets WHERE pettype = 'Dog' OR pettype = 'cat'", schema, values)]
        [('Dog', False, 'dog'), ('cat', True, None)]
    """
    try:
        tree = parse_sql(sql)
    except SqlParseError:
        return []
    return _literal_uses(tree, schema, values)


def rebind_literals(sql: str, schema: Schema, values: ValueLookup) -> Rewrite | None:
    """Replace every ungrounded literal that has a close real value by that value.

    Example:
        >>> from data_synthesis.schema import Column, Table
        >>> schema = Schema("s", (Table("singer", (Column("country", "TEXT"),)),))
        >>> values = lambda table, column: ["United States", "France", "Netherlands"]
        >>> rewrite = rebind_literals("SELECT count(*) FROM singer WHERE country = 'united states '", schema, values)
        >>> rewrite.sql, rewrite.edits
        ("SELECT COUNT(*) FROM singer WHERE country = 'United States'", ("country: 'united states ' -> 'United States'",))
        >>> rebind_literals("SELECT count(*) FROM singer WHERE country = 'Peru'", schema, values) is None
        True
    """
    tree, uses = _parsed_uses(sql, schema, values)
    edits = []
    for use in uses:
        if use.grounded is False and use.closest is not None:
            use.literal.replace(exp.Literal.string(use.closest))
            edits.append(f"{use.column}: '{use.value}' -> '{use.closest}'")
    return Rewrite("rebind_literal", to_sql(tree), tuple(edits)) if edits else None


def relax_case(sql: str, schema: Schema, values: ValueLookup) -> Rewrite | None:
    """`col = 'x'` -> `col LIKE 'x'` for literals that are not known to occur in their column.

    Example:
        >>> from data_synthesis.schema import Column, Table
        >>> schema = Schema("s", (Table("t", (Column("name", "TEXT"),)),))
        >>> relax_case("SELECT * FROM t WHERE name = 'ANA'", schema, lambda t, c: None).sql
        "SELECT * FROM t WHERE name LIKE 'ANA'"
    """
    return _relax(sql, schema, values, "relax_case", lambda v: v)


def relax_containment(sql: str, schema: Schema, values: ValueLookup) -> Rewrite | None:
    """`col = 'x'` (or `LIKE 'x'`) -> `col LIKE '%x%'` for literals not known to occur in their column.

    Example:
        >>> from data_synthesis.schema import Column, Table
        >>> schema = Schema("s", (Table("t", (Column("name", "TEXT"),)),))
        >>> relax_containment("SELECT * FROM t WHERE name = 'House'", schema, lambda t, c: ["House, Bungalow", "Houseboat"]).sql
        "SELECT * FROM t WHERE name LIKE '%House%'"
    """
    return _relax(sql, schema, values, "relax_containment", lambda v: f"%{v}%")


# The operators in the order the lifecycle tries them: smallest change of intent first.
OPERATORS: tuple[Callable[[str, Schema, ValueLookup], Rewrite | None], ...] = (
    rebind_literals, relax_case, relax_containment)


def closest_value(literal: str, candidates: Sequence) -> str | None:
    """The real value `literal` most plausibly meant, or None when no value is close enough.

    Tried in order: the same text up to case / whitespace / punctuation; a close spelling
    (difflib ratio >= FUZZY_CUTOFF, case-insensitive); the one value containing it as a whole word.

    Example:
        >>> closest_value("Dog", ["cat", "dog"])
        'dog'
        >>> closest_value("Little lever Urban  District", ["Little Lever Urban District", "Bolton"])
        'Little Lever Urban District'
        >>> closest_value("Katherine", ["Catherine", "Kate"])
        'Catherine'
        >>> closest_value("House", ["House, Bungalow, etc.", "Apartment, Flat"])
        'House, Bungalow, etc.'
        >>> closest_value("French", ["France", "Germany"]) is None
        True
    """
    texts = [v for v in candidates if isinstance(v, str)]
    if not texts:
        return None
    key = _loose(literal)
    for value in texts:
        if _loose(value) == key:
            return value
    folded = {v.casefold().strip(): v for v in texts}
    close = difflib.get_close_matches(literal.casefold().strip(), list(folded), n=1, cutoff=FUZZY_CUTOFF)
    if close:
        return folded[close[0]]
    if len(literal.strip()) < MIN_CONTAINED_CHARS:
        return None
    pattern = re.compile(rf"(?<!\w){re.escape(literal.strip().casefold())}(?!\w)")
    containing = [v for v in texts if pattern.search(v.casefold())]
    return containing[0] if len(containing) == 1 else None


def occurs(literal: str, values: set) -> bool:
    """Whether the comparison `column = literal` can match one of the column's `values`.

    A numeric-looking literal also matches a number: SQLite converts `'2008'` to 2008 before comparing
    it with a column of numeric affinity, so `year = "2008"` is grounded when 2008 occurs.

    Example:
        >>> occurs("France", {"France", "Peru"}), occurs("French", {"France", "Peru"})
        (True, False)
        >>> occurs("2008", {2007, 2008}), occurs("0", {0.0}), occurs("2.5", {2}), occurs("1e3", {1000})
        (True, True, False, True)
    """
    if literal in values:
        return True
    try:
        number = float(literal)
    except ValueError:
        return False
    return any(number == v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool))


def _loose(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", text.casefold()).split())


def _parsed_uses(sql: str, schema: Schema, values: ValueLookup) -> tuple[exp.Expression | None, list[LiteralUse]]:
    try:
        tree = parse_sql(sql)
    except SqlParseError:
        return None, []
    return tree, _literal_uses(tree, schema, values)


def _literal_uses(tree: exp.Expression, schema: Schema, values: ValueLookup) -> list[LiteralUse]:
    refs = {id(r.node): r for r in resolve_columns(tree, schema)}
    uses = []
    for comparison in tree.find_all(exp.EQ, exp.NEQ, exp.In, exp.Like):
        column, literals = _column_and_literals(comparison, refs)
        if column is None:
            continue
        ref = refs[id(column)]
        known = _column_values(ref.tables, column.name, values)
        for node, value in literals:
            if isinstance(comparison, exp.Like) and ("%" in value or "_" in value):
                continue
            grounded = occurs(value, known) if known else None  # an empty column grounds nothing
            closest = closest_value(value, known) if grounded is False else None
            uses.append(LiteralUse(node, value, column.sql(dialect="sqlite"), ref.tables, comparison, grounded,
                                   closest))
    return uses


def _column_and_literals(comparison: exp.Expression, refs: dict) -> tuple[exp.Column | None, list]:
    if isinstance(comparison, exp.In):
        if comparison.args.get("query") is not None:
            return None, []
        column, others = comparison.this, comparison.expressions
    else:
        column, other = comparison.this, comparison.expression
        if not _is_table_column(column, refs) and _is_table_column(other, refs):
            column, other = other, column
        others = [other]
    if not _is_table_column(column, refs):
        return None, []
    literals = [(node, value) for node in others if (value := _string_value(node, refs)) is not None]
    return column, literals


def _is_table_column(node, refs) -> bool:
    ref = refs.get(id(node))
    return ref is not None and ref.resolution is Resolution.TABLE


def _string_value(node, refs) -> str | None:
    if isinstance(node, exp.Literal) and node.is_string:
        return node.this
    ref = refs.get(id(node))
    if ref is not None and ref.resolution is Resolution.STRING:  # "Paris": SQLite reads it as a string
        return node.name
    return None


def _column_values(tables: tuple[str, ...], column: str, values: ValueLookup) -> set | None:
    known: set = set()
    for table in tables:
        found = values(table, column)
        if found is None:
            return None
        known.update(found)
    return known if tables else None


def _relax(sql: str, schema: Schema, values: ValueLookup, name: str, pattern) -> Rewrite | None:
    tree, uses = _parsed_uses(sql, schema, values)
    edits = []
    done = set()
    for use in uses:
        comparison = use.comparison
        if (use.grounded or id(comparison) in done or not isinstance(comparison, (exp.EQ, exp.Like))
                or len(use.value.strip()) < MIN_CONTAINED_CHARS and name == "relax_containment"):
            continue
        escaped = like_escape(use.value)
        text = pattern(escaped)
        if isinstance(comparison, exp.Like) and text == use.value:
            continue  # already this very LIKE: rewriting it would run the same query again
        done.add(id(comparison))
        column = comparison.this if use.literal is comparison.expression else comparison.expression
        relaxed = exp.Like(this=column.copy(), expression=exp.Literal.string(text))
        if escaped != use.value:
            relaxed = exp.Escape(this=relaxed, expression=exp.Literal.string(LIKE_ESCAPE))
        comparison.replace(relaxed)
        edits.append(f"{use.column}: = '{use.value}' -> LIKE '{text}'"
                     + (f" ESCAPE '{LIKE_ESCAPE}'" if escaped != use.value else ""))
    return Rewrite(name, to_sql(tree), tuple(edits)) if edits else None


def like_escape(value: str) -> str:
    r"""`value` as a LIKE pattern that matches exactly it: `%`, `_` (and the escape itself) escaped with
    LIKE_ESCAPE, for use with `ESCAPE ''`; unchanged when there is nothing to escape.

    Example:
        >>> like_escape("100% cotton"), like_escape("a_b\\c"), like_escape("plain")
        ('100\\% cotton', 'a\\_b\\\\c', 'plain')
    """
    if "%" not in value and "_" not in value:
        return value
    return "".join(LIKE_ESCAPE + ch if ch in ("%", "_", LIKE_ESCAPE) else ch for ch in value)
