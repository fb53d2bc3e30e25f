"""Small constructors for sqlglot trees in one canonical SQLite style, and the way back from text.

Every synthesized or mutated query is a tree built here and rendered by `render`, so gold SQL has one
consistent surface form (upper-case keywords, `T1`/`T2` join aliases, identifiers quoted only when SQLite
needs it) -- the mapping a small model learns is then question -> structure, not formatting noise.
"""

from __future__ import annotations

import re

import sqlglot
from sqlglot import exp
from sqlglot.tokens import Tokenizer

# SQLite's keywords (sqlite.org/lang_keywords.html): a column named like one must be quoted.
SQLITE_KEYWORDS = frozenset("""
ABORT ACTION ADD AFTER ALL ALTER ALWAYS ANALYZE AND AS ASC ATTACH AUTOINCREMENT BEFORE BEGIN BETWEEN BY CASCADE
CASE CAST CHECK COLLATE COLUMN COMMIT CONFLICT CONSTRAINT CREATE CROSS CURRENT CURRENT_DATE CURRENT_TIME
CURRENT_TIMESTAMP DATABASE DEFAULT DEFERRABLE DEFERRED DELETE DESC DETACH DISTINCT DO DROP EACH ELSE END ESCAPE
EXCEPT EXCLUDE EXCLUSIVE EXISTS EXPLAIN FAIL FILTER FIRST FOLLOWING FOR FOREIGN FROM FULL GENERATED GLOB GROUP
GROUPS HAVING IF IGNORE IMMEDIATE IN INDEX INDEXED INITIALLY INNER INSERT INSTEAD INTERSECT INTO IS ISNULL JOIN
KEY LAST LEFT LIKE LIMIT MATCH MATERIALIZED NATURAL NO NOT NOTHING NOTNULL NULL NULLS OF OFFSET ON OR ORDER
OTHERS OUTER OVER PARTITION PLAN PRAGMA PRECEDING PRIMARY QUERY RAISE RANGE RECURSIVE REFERENCES REGEXP REINDEX
RELEASE RENAME REPLACE RESTRICT RETURNING RIGHT ROLLBACK ROW ROWS SAVEPOINT SELECT SET TABLE TEMP TEMPORARY THEN
TIES TO TRANSACTION TRIGGER UNBOUNDED UNION UNIQUE UPDATE USING VACUUM VALUES VIEW VIRTUAL WHEN WHERE WINDOW WITH
WITHOUT
""".split())
_PLAIN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def ident(name: str) -> exp.Identifier:
    """An identifier, quoted only when SQLite (or sqlglot, reading it back) would misread it bare.

    Example:
        >>> [ident(n).sql("sqlite") for n in ("name", "order", "Home Town", "date")]
        ['name', '"order"', '"Home Town"', '"date"']
    """
    upper = name.upper()
    quoted = not _PLAIN.match(name) or upper in SQLITE_KEYWORDS or upper in Tokenizer.KEYWORDS
    return exp.Identifier(this=name, quoted=quoted)


def column(name: str, table: str | None = None) -> exp.Column:
    return exp.Column(this=ident(name), table=exp.Identifier(this=table) if table else None)


def table(name: str, alias: str | None = None) -> exp.Expression:
    t = exp.Table(this=ident(name))
    return exp.alias_(t, alias, table=True) if alias else t


def literal(value) -> exp.Expression:
    """A SQL literal of a real cell value, keeping its storage type (text stays text, numbers stay numbers).

    Example:
        >>> [literal(v).sql("sqlite") for v in ("it's", 3, 2.5)]
        ["'it''s'", '3', '2.5']
    """
    if isinstance(value, str):
        return exp.Literal.string(value)
    if isinstance(value, bool):
        return exp.Literal.number(int(value))
    if isinstance(value, (int, float)):
        return exp.Literal.number(repr(value) if isinstance(value, float) else str(value))
    raise TypeError(f"no SQL literal for {type(value).__name__} value {value!r}")


def literal_value(node: exp.Expression):
    """The Python value of a literal node (`-3` included), or None when `node` is no literal."""
    if isinstance(node, exp.Neg) and isinstance(node.this, exp.Literal) and not node.this.is_string:
        value = literal_value(node.this)
        return None if value is None else -value
    if not isinstance(node, exp.Literal):
        return None
    if node.is_string:
        return node.this
    text = node.this
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return None


def render(tree: exp.Expression) -> str:
    """The canonical SQLite text of a tree.

    Example:
        >>> render(parse("select count(*) from orders as t1 where t1.status='shipped'"))
        "SELECT COUNT(*) FROM orders AS t1 WHERE t1.status = 'shipped'"
    """
    return tree.sql(dialect="sqlite")


def parse(sql: str) -> exp.Expression:
    """Parse SQLite text into a tree (raises sqlglot.errors.ParseError on bad SQL)."""
    tree = sqlglot.parse_one(sql, read="sqlite")
    if tree is None:
        raise sqlglot.errors.ParseError(f"no statement in {sql!r}")
    return tree
