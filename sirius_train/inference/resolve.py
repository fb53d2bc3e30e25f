"""Which real table each column reference of a query reads from, checked against the database schema.

The pre-execution filter needs it (is `T2.nmae` a real column?), and so does literal re-binding
(which column's values should `'Dog'` be matched against?). Resolution follows SQLite's rules closely
enough to never reject a query SQLite accepts:

- `alias.col` looks `alias` up in the query's FROM scope, then in enclosing scopes (correlated
  subqueries); a derived table or CTE exposes the names its SELECT list produces;
- a bare `col` may be any column of a table in scope (or an enclosing one), or an output alias of the
  SELECT it sits in (SQLite allows aliases in WHERE, GROUP BY, HAVING and ORDER BY);
- a double-quoted name that resolves to nothing is a string literal: SQLite's documented fallback, and
  common in Spider and BIRD (`WHERE name = "Paris"`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from sqlglot import exp
from sqlglot.optimizer.scope import Scope, traverse_scope

from data_synthesis.schema import Schema

PSEUDO_COLUMNS = frozenset({"rowid", "oid", "_rowid_"})


class Resolution(str, Enum):
    TABLE = "table"  # a column of a real table (`tables` names which)
    DERIVED = "derived"  # an output of a derived table / CTE / subquery in scope
    OUTPUT_ALIAS = "output_alias"  # an alias defined in the SELECT list
    STRING = "string"  # a double-quoted name that SQLite will read as a string literal
    UNKNOWN_TABLE = "unknown_table"  # `x.col` where no table or alias `x` is in scope
    UNKNOWN_COLUMN = "unknown_column"  # nothing in scope has this column


@dataclass(frozen=True)
class ColumnRef:
    node: exp.Column
    resolution: Resolution
    tables: tuple[str, ...] = ()  # real tables (schema spelling) the column may come from

    @property
    def text(self) -> str:
        return self.node.sql(dialect="sqlite")


def resolve_columns(tree: exp.Expression, schema: Schema) -> list[ColumnRef]:
    """Every column reference of `tree`, resolved against `schema`.

    Example:
        >>> from data_synthesis.schema import Column, Table
        >>> schema = Schema("pets", (Table("pets", (Column("petid", "INTEGER"), Column("pettype", "TEXT"))),))
        >>> from sirius_train.inference.sql import parse_sql
        >>> refs = resolve_columns(parse_sql('SELECT p.pettype, wieght FROM pets AS p WHERE pettype = "dog"'), schema)
        >>> [(r.text, r.resolution.value, r.tables) for r in refs]
        [('p.pettype', 'table', ('pets',)), ('wieght', 'unknown_column', ()), ('pettype', 'table', ('pets',)), ('"dog"', 'string', ())]
    """
    refs: dict[int, ColumnRef] = {}
    order: list[int] = []
    for scope in traverse_scope(tree):
        aliases = _output_aliases(scope)
        for column in scope.columns:
            if id(column) in refs:
                continue
            refs[id(column)] = _resolve(column, scope, aliases, schema)
            order.append(id(column))
    # Columns outside any SELECT scope (rare: e.g. a bare VALUES) are left unresolved on purpose.
    return [refs[i] for i in order]


def unknown_tables(tree: exp.Expression, schema: Schema) -> list[str]:
    """Names in FROM/JOIN that are neither tables of `schema` nor CTEs of the query.

    Example:
        >>> from data_synthesis.schema import Column, Table
        >>> schema = Schema("s", (Table("singer", (Column("name", "TEXT"),)),))
        >>> from sirius_train.inference.sql import parse_sql
        >>> unknown_tables(parse_sql("WITH c AS (SELECT name FROM singer) SELECT * FROM c JOIN singers"), schema)
        ['singers']
    """
    ctes = {cte.alias_or_name.lower() for cte in tree.find_all(exp.CTE)}
    missing = []
    for table in tree.find_all(exp.Table):
        if not isinstance(table.this, exp.Identifier):
            continue  # table-valued functions and the like
        name = table.name
        lowered = name.lower()
        if lowered in ctes or lowered.startswith("sqlite_") or schema.table(name) is not None:
            continue
        if name not in missing:
            missing.append(name)
    return missing


def _output_aliases(scope: Scope) -> set[str]:
    """Names a bare column may refer to as an output: SELECT-list aliases; for UNION / INTERSECT /
    EXCEPT (whose ORDER BY names result columns), every branch's output names."""
    node = scope.expression
    if isinstance(node, exp.SetOperation):
        return {name.lower() for select in node.find_all(exp.Select) for name in select.named_selects}
    if not isinstance(node, exp.Select):
        return set()
    return {e.alias.lower() for e in node.expressions if isinstance(e, exp.Alias) and e.alias}


def _resolve(column: exp.Column, scope: Scope, aliases: set[str], schema: Schema) -> ColumnRef:
    name = column.name
    lowered = name.lower()
    if column.table:
        return _resolve_qualified(column, scope, schema)
    if isinstance(column.this, exp.Star):
        return ColumnRef(column, Resolution.DERIVED)
    current: Scope | None = scope
    while current is not None:
        tables, derived = _bare_matches(lowered, current, schema)
        if tables:
            return ColumnRef(column, Resolution.TABLE, tables)
        if derived:
            return ColumnRef(column, Resolution.DERIVED)
        if current is scope and lowered in aliases:
            return ColumnRef(column, Resolution.OUTPUT_ALIAS)
        current = current.parent
    if lowered in PSEUDO_COLUMNS:
        return ColumnRef(column, Resolution.DERIVED)
    if column.this.args.get("quoted"):
        return ColumnRef(column, Resolution.STRING)
    return ColumnRef(column, Resolution.UNKNOWN_COLUMN)


def _resolve_qualified(column: exp.Column, scope: Scope, schema: Schema) -> ColumnRef:
    qualifier = column.table.lower()
    lowered = column.name.lower()
    current: Scope | None = scope
    while current is not None:
        for alias, source in _sources(current):
            if alias.lower() != qualifier:
                continue
            if isinstance(source, exp.Table):
                table = schema.table(source.name)
                if table is None:  # an unknown table is reported by `unknown_tables`
                    return ColumnRef(column, Resolution.DERIVED)
                if table.column(lowered) is not None or lowered in PSEUDO_COLUMNS or isinstance(column.this, exp.Star):
                    return ColumnRef(column, Resolution.TABLE, (table.name,))
                return ColumnRef(column, Resolution.UNKNOWN_COLUMN)
            outputs = _derived_outputs(source)
            if outputs is None or lowered in outputs or isinstance(column.this, exp.Star):
                return ColumnRef(column, Resolution.DERIVED)
            return ColumnRef(column, Resolution.UNKNOWN_COLUMN)
        current = current.parent
    return ColumnRef(column, Resolution.UNKNOWN_TABLE)


def _sources(scope: Scope):
    """(alias, Table-or-Scope) pairs visible in `scope`'s FROM, selected ones first."""
    seen = set()
    for alias, (_node, source) in scope.selected_sources.items():
        seen.add(alias)
        yield alias, source
    for alias, source in scope.sources.items():
        if alias not in seen:
            yield alias, source


def _bare_matches(lowered: str, scope: Scope, schema: Schema) -> tuple[tuple[str, ...], bool]:
    tables: list[str] = []
    derived = False
    for _alias, (_node, source) in scope.selected_sources.items():
        if isinstance(source, exp.Table):
            table = schema.table(source.name)
            if table is None:
                derived = True  # unknown table: cannot tell, do not blame the column
            elif table.column(lowered) is not None and table.name not in tables:
                tables.append(table.name)
        else:
            outputs = _derived_outputs(source)
            derived = derived or outputs is None or lowered in outputs
    return tuple(tables), derived


def _derived_outputs(source) -> set[str] | None:
    """Lower-cased output names of a derived source; None when unknown (e.g. `SELECT *`)."""
    expression = source.expression if isinstance(source, Scope) else source
    if expression is None:
        return None
    owner = expression.parent
    while isinstance(owner, exp.SetOperation):  # a recursive CTE's anchor member stands for the whole CTE
        owner = owner.parent
    declared = owner.args.get("alias") if isinstance(owner, (exp.CTE, exp.Subquery)) else None
    if isinstance(declared, exp.TableAlias) and declared.columns:  # WITH c(x, y) AS ... / (...) AS d(x, y)
        return {c.name.lower() for c in declared.columns}
    while isinstance(expression, exp.SetOperation):
        expression = expression.left
    if isinstance(expression, exp.Subquery):
        expression = expression.this
    if not isinstance(expression, exp.Select):
        return None
    names = set()
    for projection in expression.expressions:
        if isinstance(projection, exp.Star) or (isinstance(projection, exp.Column)
                                                and isinstance(projection.this, exp.Star)):
            return None
        names.add(projection.alias_or_name.lower())
    return names
