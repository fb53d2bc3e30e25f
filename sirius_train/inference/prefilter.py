"""The deterministic pre-execution filter: refuse what cannot be a right answer before running it.

A candidate is removed, with its reason kept for the trace, when its SQL is empty or not exactly one
read-only query (INSERT, PRAGMA, two statements...), names a table or column the schema does not
have, names a column two joined tables share without saying which, or aggregates inside WHERE.
Nothing here guesses: a reference the resolver cannot decide (a derived table's `*`, an unknown
table's columns) is left for the engine, and so is SQL the analysis cannot read at all (sqlglot does
not parse it, its scope analysis refuses it, it nests too deep): that is admitted with the verdict
`kind="unanalysable"` and the reason, and SQLite judges it. So the filter never refuses a query SQLite
would run -- the benchmark checks that on the real pools.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from data_synthesis.schema import Schema
from sirius_train.inference.guard import Unanalysable, attempt
from sirius_train.inference.resolve import Resolution, resolve_columns, unknown_tables
from sirius_train.inference.sql import QUERY_TYPES, SqlParseError, UnreadableSql, parse_sql


@dataclass(frozen=True)
class FilterVerdict:
    admitted: bool
    reason: str | None = None  # why not, e.g. "unknown column: T2.nmae"; for an unanalysable one, why not analysed
    # refused: unparsable (empty, several statements), not_select, unknown_table, unknown_column,
    # ambiguous_column, misused_aggregate; admitted unchecked: unanalysable
    kind: str | None = None


ADMITTED = FilterVerdict(True)


def prefilter(sql: str, schema: Schema) -> FilterVerdict:
    """Admit `sql`, or say why it is refused before execution.

    Example:
        >>> from data_synthesis.schema import Column, Table
        >>> schema = Schema("s", (Table("singer", (Column("name", "TEXT"), Column("age", "INTEGER"))),))
        >>> prefilter("SELECT name FROM singer WHERE age > 30", schema).admitted
        True
        >>> prefilter("SELECT nmae FROM singer", schema).reason
        'unknown column: nmae (not in singer)'
        >>> prefilter("DELETE FROM singer", schema).reason
        'not a read-only query: Delete statement'
        >>> prefilter("SELECT name FROM singers", schema).reason
        'unknown table: singers (tables: singer)'
        >>> prefilter("SELECT count(*) FROM singer JOIN singer ON singer.age = singer.age", schema)
        FilterVerdict(admitted=True, reason='OptimizeError: Alias already used: singer', kind='unanalysable')
    """
    verdict = attempt(_check, sql, schema)
    if isinstance(verdict, Unanalysable):
        return FilterVerdict(True, verdict.message, verdict.kind)
    return verdict


def _check(sql: str, schema: Schema) -> FilterVerdict:
    """The checks; raises when the analysis itself fails (sqlglot cannot read the SQL, scope errors...)."""
    try:
        tree = parse_sql(sql)
    except UnreadableSql:
        raise
    except SqlParseError as e:
        return FilterVerdict(False, str(e), "unparsable")
    if not isinstance(tree, QUERY_TYPES):
        return FilterVerdict(False, f"not a read-only query: {type(tree).__name__} statement", "not_select")
    missing = unknown_tables(tree, schema)
    if missing:
        known = ", ".join(t.name for t in schema.tables)
        return FilterVerdict(False, f"unknown table: {', '.join(missing)} (tables: {known})", "unknown_table")
    refs = resolve_columns(tree, schema)
    bad = [ref for ref in refs if ref.resolution in (Resolution.UNKNOWN_COLUMN, Resolution.UNKNOWN_TABLE)]
    if bad:
        return FilterVerdict(False, "unknown column: " + "; ".join(_describe(ref, tree) for ref in bad),
                             "unknown_column")
    if not any(isinstance(join.args.get("using"), list) or join.args.get("method") for join in tree.find_all(exp.Join)):
        ambiguous = [ref for ref in refs if ref.resolution is Resolution.TABLE and len(ref.tables) > 1]
        if ambiguous:  # SQLite refuses these too; USING / NATURAL joins merge the column, so they are skipped
            return FilterVerdict(False, "ambiguous column: " + "; ".join(
                f"{ref.text} (in {', '.join(ref.tables)})" for ref in ambiguous), "ambiguous_column")
    for where in tree.find_all(exp.Where):
        for agg in where.find_all(exp.AggFunc):
            if agg.find_ancestor(exp.Select) is where.find_ancestor(exp.Select):
                return FilterVerdict(False, f"aggregate in WHERE: {agg.sql(dialect='sqlite')} (use HAVING)",
                                     "misused_aggregate")
    return ADMITTED


def _describe(ref, tree: exp.Expression) -> str:
    if ref.resolution is Resolution.UNKNOWN_TABLE:
        return f"{ref.text} (no table or alias {ref.node.table!r} in scope)"
    in_scope = sorted({t.name for t in tree.find_all(exp.Table)})
    return f"{ref.text} (not in {', '.join(in_scope) or 'any table in scope'})"
