"""Parse one candidate's SQL with sqlglot (SQLite dialect): the one entry point the inference modules share.

Every later step -- the pre-execution filter, the structural repair operators, the structural
signatures of the reranker -- reads the same tree, so a query they disagree about cannot exist.
"""

from __future__ import annotations

from functools import lru_cache

import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError

DIALECT = "sqlite"
# Root node types that only read: SELECT, UNION/INTERSECT/EXCEPT, a parenthesised query.
QUERY_TYPES = (exp.Select, exp.SetOperation, exp.Subquery)
# Deeper trees are not analysed: sqlglot's recursive passes overflow Python's stack or go quadratic in the
# depth (its scope analysis walks up from every column), and SQLite's own limit on expression depth is 1000.
MAX_DEPTH = 500


class SqlParseError(ValueError):
    """The SQL is not exactly one statement sqlglot can parse; the message says which."""


class UnreadableSql(SqlParseError):
    """sqlglot cannot read the SQL. That is a limit of the analyser, not proof of an error: SQLite may run it."""


def parse_sql(sql: str) -> exp.Expression:
    """The syntax tree of `sql` (a fresh copy: callers may edit it).

    Example:
        >>> parse_sql("SELECT name FROM singer;").sql()
        'SELECT name FROM singer'
        >>> parse_sql("SELECT 1; SELECT 2")
        Traceback (most recent call last):
        ...
        sirius_train.inference.sql.SqlParseError: 2 statements; exactly one is allowed
        >>> parse_sql("SELECT " + "(" * 600 + "1" + ")" * 600)
        Traceback (most recent call last):
        ...
        sirius_train.inference.sql.UnreadableSql: nested deeper than 500 levels; left to the engine
    """
    tree = _parse_cached(sql)
    if isinstance(tree, SqlParseError):
        raise type(tree)(str(tree))  # a fresh exception: the cached one would pile up tracebacks
    return tree.copy()


@lru_cache(maxsize=4096)
def _parse_cached(sql: str) -> exp.Expression | SqlParseError:
    """The tree, or the reason there is none (cached too: every analysis of a bad candidate asks again)."""
    if not isinstance(sql, str) or not sql.strip():
        return SqlParseError("empty SQL")
    try:
        trees = [t for t in sqlglot.parse(sql, read=DIALECT) if t is not None]
    except SqlglotError as e:
        first = str(e).splitlines()[0]
        return UnreadableSql(f"unparsable: {first}")
    except RecursionError:
        return UnreadableSql(f"nested deeper than {MAX_DEPTH} levels; left to the engine")
    if len(trees) != 1:
        return SqlParseError(f"{len(trees)} statements; exactly one is allowed")
    if _depth(trees[0]) > MAX_DEPTH:
        return UnreadableSql(f"nested deeper than {MAX_DEPTH} levels; left to the engine")
    return trees[0]


def _depth(tree: exp.Expression) -> int:
    """Levels of the tree, counted without recursion (the tree may be deeper than Python's stack)."""
    deepest, stack = 0, [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in node.iter_expressions())
    return deepest


def to_sql(tree: exp.Expression) -> str:
    """SQLite text of a (possibly edited) tree.

    Example:
        >>> to_sql(parse_sql("select a from t where b = 'x'"))
        "SELECT a FROM t WHERE b = 'x'"
    """
    return tree.sql(dialect=DIALECT)
