"""What the synthesizer knows about one database: per column, its kind and real values; joinable links.

Read once per database from the file itself through the read-only `rewards.sandbox.Sandbox` (our own
queries get the same deadline as a model's). Literals in synthesized SQL are only ever values seen here, so
filters match real rows; numeric thresholds are real quantiles, so comparisons split the data.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from sqlglot import exp

from data_synthesis.schema import read_schema
from data_synthesis.sqlgen.trees import column, render, table
from rewards.sandbox import Limits, Sandbox

NUMBER, TEXT, DATE = "number", "text", "date"
QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9)
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}")
_ID_NAME = re.compile(r"(^id$|_id$|[a-z]I[dD]$|^ID$|^[a-z]+id$)")
_NAME_LIKE = ("name", "title")


@dataclass(frozen=True)
class ColumnProfile:
    table: str
    name: str
    kind: str  # number | text | date
    is_key: bool  # primary key, foreign key or id-like: never a value a question asks about
    n_distinct: int
    n_null: int
    values: tuple = ()  # the most frequent real values, most frequent first (printable, short)
    counts: tuple = ()  # how often each of `values` occurs
    quantiles: tuple = ()  # numbers/dates: real values at QUANTILES of the non-null rows

    @property
    def categorical(self) -> bool:
        """Few distinct values that repeat: good for GROUP BY and equality filters."""
        return 2 <= self.n_distinct <= 40 and bool(self.counts) and max(self.counts) > 1

    @property
    def name_like(self) -> bool:
        return self.kind == TEXT and any(w in self.name.lower() for w in _NAME_LIKE)


@dataclass(frozen=True)
class TableProfile:
    name: str
    n_rows: int
    columns: tuple[ColumnProfile, ...]
    primary_key: str | None = None

    def column(self, name: str) -> ColumnProfile | None:
        lowered = name.lower()
        return next((c for c in self.columns if c.name.lower() == lowered), None)

    @property
    def label(self) -> ColumnProfile | None:
        """The column that names a row (`name`, `title`, ...), if the table has one."""
        usable = [c for c in self.columns if not c.is_key and c.kind == TEXT and c.n_distinct > 1]
        named = [c for c in usable if c.name_like]
        return (named or usable or [None])[0]


@dataclass(frozen=True)
class Link:
    """A foreign key that joins to rows: `child.child_column -> parent.parent_column`."""

    child: str
    child_column: str
    parent: str
    parent_column: str


@dataclass(frozen=True)
class DbProfile:
    db_id: str
    path: Path
    tables: tuple[TableProfile, ...]
    links: tuple[Link, ...]

    def table(self, name: str) -> TableProfile | None:
        lowered = name.lower()
        return next((t for t in self.tables if t.name.lower() == lowered), None)


def profile_database(db_path: str | Path, *, max_values: int = 30, timeout_s: float = 5.0,
                     db_id: str | None = None) -> DbProfile:
    """Profile every table and column of a SQLite file (read-only) and keep the foreign keys that join."""
    path = Path(db_path)
    schema = read_schema(path, n_samples=0, db_id=db_id)
    key_columns = {(fk.table.lower(), fk.column.lower()) for fk in schema.foreign_keys}
    key_columns |= {(fk.ref_table.lower(), fk.ref_column.lower()) for fk in schema.foreign_keys}
    with Sandbox(path, Limits(timeout_s=timeout_s)) as sandbox:
        tables = []
        for t in schema.tables:
            if t.row_count == 0:
                continue
            pk = next((c.name for c in t.columns if c.primary_key), None)
            columns = tuple(
                _profile_column(sandbox, t.name, c.name, c.type, t.row_count, max_values,
                                c.primary_key or (t.name.lower(), c.name.lower()) in key_columns)
                for c in t.columns)
            tables.append(TableProfile(t.name, t.row_count, tuple(c for c in columns if c is not None), pk))
        profile = DbProfile(schema.db_id, path, tuple(tables), ())
        links = tuple(link for link in _links(schema, profile) if _joins(sandbox, link))
    return DbProfile(schema.db_id, path, tuple(tables), links)


def _run(sandbox: Sandbox, tree: exp.Expression) -> tuple:
    outcome = sandbox.run(render(tree))
    return outcome.rows if outcome.executed else ()


def _profile_column(sandbox: Sandbox, table_name: str, name: str, declared: str, n_rows: int, max_values: int,
                    is_key: bool) -> ColumnProfile | None:
    col = column(name)
    stats = _run(sandbox, exp.select(exp.Count(this=exp.Distinct(expressions=[col.copy()])),
                                     exp.Count(this=col.copy())).from_(table(table_name)))
    if not stats or not stats[0][1]:
        return None  # all NULL (or unreadable): nothing to ask about
    n_distinct, n_nonnull = stats[0]
    top = _run(sandbox, exp.select(col.copy(), exp.Count(this=exp.Star()))
               .from_(table(table_name)).where(col.copy().is_(exp.null()).not_())
               .group_by(col.copy()).order_by(exp.Ordered(this=exp.Count(this=exp.Star()), desc=True), col.copy())
               .limit(max_values * 2))
    if any(isinstance(v, bytes) for v, _ in top):
        return None  # blobs are not something a question names
    kind = _kind(declared, [v for v, _ in top])
    kept = [(v, n) for v, n in top if _printable(v)][:max_values]
    quantiles = ()
    if kind in (NUMBER, DATE):
        offsets = [min(n_nonnull - 1, int(q * n_nonnull)) for q in QUANTILES]
        picks = [exp.Subquery(this=exp.select(col.copy()).from_(table(table_name))
                              .where(col.copy().is_(exp.null()).not_()).order_by(col.copy()).limit(1).offset(o))
                 for o in offsets]
        rows = _run(sandbox, exp.select(*picks))
        quantiles = tuple(v for v in rows[0] if v is not None) if rows else ()
        if kind == NUMBER and not all(isinstance(v, (int, float)) for v in quantiles):
            kind, quantiles = TEXT, ()
    is_key = is_key or bool(_ID_NAME.search(name))
    return ColumnProfile(table_name, name, kind, is_key, n_distinct, n_rows - n_nonnull,
                         tuple(v for v, _ in kept), tuple(n for _, n in kept), quantiles)


def _kind(declared: str, values: list) -> str:
    if values and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return NUMBER
    if values and all(isinstance(v, str) and _DATE.match(v) for v in values):
        return DATE
    if not values and any(t in declared for t in ("INT", "REAL", "FLOA", "DOUB", "NUM", "DEC")):
        return NUMBER
    return TEXT


def _printable(value) -> bool:
    if isinstance(value, str):
        return 0 < len(value) <= 40 and value == value.strip() and value.isprintable()
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _links(schema, profile: DbProfile) -> list[Link]:
    """Declared foreign keys that resolve; when a file declares none, keys inferred by name (`kid` -> kid)."""
    pairs = [(fk.table, fk.column, fk.ref_table, fk.ref_column) for fk in schema.foreign_keys if not fk.composite]
    if not schema.foreign_keys:
        pairs = [(child.name, c.name, parent.name, parent.primary_key)
                 for parent in profile.tables if parent.primary_key and _ID_NAME.search(parent.primary_key)
                 for child in profile.tables if child is not parent
                 for c in child.columns if c.name.lower() == parent.primary_key.lower()]
    out = []
    for child_name, child_column, parent_name, parent_column in pairs:
        child, parent = profile.table(child_name), profile.table(parent_name)
        if child is None or parent is None or child.name == parent.name:
            continue  # a dangling key, an empty table, or a self-reference
        child_col, parent_col = child.column(child_column), parent.column(parent_column)
        if child_col is None or parent_col is None:
            continue
        link = Link(child.name, child_col.name, parent.name, parent_col.name)
        if link not in out:
            out.append(link)
    return out


def _joins(sandbox: Sandbox, link: Link) -> bool:
    """Does the key join at least one pair of rows? (Spider has keys whose types never match.)"""
    on = column(link.child_column, "T2").eq(column(link.parent_column, "T1"))
    tree = (exp.select(exp.Literal.number(1)).from_(table(link.parent, "T1"))
            .join(table(link.child, "T2"), on=on).limit(1))
    return bool(_run(sandbox, tree))
