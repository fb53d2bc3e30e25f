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


class SqlParseError(ValueError):
    """The SQL is not exactly one statement sqlglot can parse; the message says which."""


def parse_sql(sql: str) -> exp.Expression:
    """The syntax tree of `sql` (a fresh copy: callers may edit it).

    Example:
        >>> parse_sql("SELECT name FROM singer;").sql()
        'SELECT name FROM singer'
        >>> parse_sql("SELECT 1; SELECT 2")
        Traceback (most recent call last):
        ...
        sirius_train.inference.sql.SqlParseError: 2 statements; exactly one is allowed
    """
    return _parse_cached(sql).copy()


@lru_cache(maxsize=4096)
def _parse_cached(sql: str) -> exp.Expression:
    if not isinstance(sql, str) or not sql.strip():
        raise SqlParseError("empty SQL")
    try:
        trees = [t for t in sqlglot.parse(sql, read=DIALECT) if t is not None]
    except SqlglotError as e:
        first = str(e).splitlines()[0]
        raise SqlParseError(f"unparsable: {first}") from None
    if len(trees) != 1:
        raise SqlParseError(f"{len(trees)} statements; exactly one is allowed")
    return trees[0]


def to_sql(tree: exp.Expression) -> str:
    """SQLite text of a (possibly edited) tree.

    Example:
        >>> to_sql(parse_sql("select a from t where b = 'x'"))
        "SELECT a FROM t WHERE b = 'x'"
    """
    return tree.sql(dialect=DIALECT)
