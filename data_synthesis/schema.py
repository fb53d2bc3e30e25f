"""The schema of a SQLite database, read from the file itself, and its text form for prompts.

Training, synthesis and inference all show the model the same schema text (a model trained on one
rendering and prompted with another loses accuracy for nothing), so this is the one place it is made.
Sample values matter: they are how a model learns that `status` holds 'cancelled', not 'CANCELED'.
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path


class UnreadableDatabase(ValueError):
    """A database file SQLite cannot read (a git-LFS pointer, a truncated copy): the message names the file."""


@dataclass(frozen=True)
class Column:
    name: str
    type: str
    primary_key: bool = False
    samples: tuple = ()  # a few distinct real values, most frequent first


@dataclass(frozen=True)
class ForeignKey:
    table: str
    column: str
    ref_table: str
    ref_column: str
    composite: bool = False  # one column of a multi-column key: joining on it alone is not the relation


@dataclass(frozen=True)
class Table:
    name: str
    columns: tuple[Column, ...]
    row_count: int = 0

    def column(self, name: str) -> Column | None:
        lowered = name.lower()
        return next((c for c in self.columns if c.name.lower() == lowered), None)


@dataclass(frozen=True)
class Schema:
    db_id: str
    tables: tuple[Table, ...]
    foreign_keys: tuple[ForeignKey, ...] = field(default=())

    def table(self, name: str) -> Table | None:
        lowered = name.lower()
        return next((t for t in self.tables if t.name.lower() == lowered), None)

    def to_text(self, samples: bool = True, style: str = "ddl") -> str:
        """Schema text for prompts: `ddl` (one `CREATE TABLE` per table, samples as comments) or `compact`
        (one line per table, `column -> table.column` for foreign keys; for small models and short contexts).

        Example:
            >>> s = Schema("shop", (Table("item", (Column("id", "INTEGER", True), Column("name", "TEXT",
            ...     samples=("Lamp", "Desk")))),), ())
            >>> print(s.to_text())
            CREATE TABLE item (
              id INTEGER PRIMARY KEY,
              name TEXT -- e.g. 'Lamp', 'Desk'
            );
            >>> print(s.to_text(style="compact"))
            item(id, name ['Lamp', 'Desk'])
        """
        fks: dict[str, list[ForeignKey]] = {}
        for fk in self.foreign_keys:
            fks.setdefault(fk.table.lower(), []).append(fk)
        if style == "compact":
            return "\n".join(self._compact_line(t, fks.get(t.name.lower(), []), samples) for t in self.tables)
        if style != "ddl":
            raise ValueError(f"unknown schema style {style!r}; use 'ddl' or 'compact'")
        blocks = []
        for table in self.tables:
            lines = []
            for col in table.columns:
                line = f"  {_quote(col.name)} {col.type or 'TEXT'}".rstrip()
                if col.primary_key:
                    line += " PRIMARY KEY"
                lines.append([line, col])
            for fk in fks.get(table.name.lower(), []):
                lines.append([f"  FOREIGN KEY ({_quote(fk.column)}) REFERENCES {_quote(fk.ref_table)}"
                              f"({_quote(fk.ref_column)})", None])
            rendered = []
            for i, (line, col) in enumerate(lines):
                sep = "," if i < len(lines) - 1 else ""
                comment = ""
                if samples and col is not None and col.samples:
                    comment = " -- e.g. " + ", ".join(_literal(v) for v in col.samples)
                rendered.append(line + sep + comment)
            blocks.append(f"CREATE TABLE {_quote(table.name)} (\n" + "\n".join(rendered) + "\n);")
        return "\n".join(blocks)


    @staticmethod
    def _compact_line(table: Table, fks: list[ForeignKey], samples: bool) -> str:
        refs = {fk.column.lower(): f"{fk.ref_table}.{fk.ref_column}" for fk in fks}
        cols = []
        for col in table.columns:
            text = _quote(col.name)
            if col.name.lower() in refs:
                text += f" -> {refs[col.name.lower()]}"
            if samples and col.samples:
                text += " [" + ", ".join(_literal(v) for v in col.samples) + "]"
            cols.append(text)
        return f"{_quote(table.name)}({', '.join(cols)})"


def _quote(name: str) -> str:
    return name if name.replace("_", "").isalnum() and not name[:1].isdigit() else f'"{name}"'


def _literal(v) -> str:
    if isinstance(v, str):
        v = v if len(v) <= 40 else v[:37] + "..."
        return "'" + v.replace("'", "''") + "'"
    return repr(v)


def read_schema(db_path: str | Path, n_samples: int = 3, db_id: str | None = None) -> Schema:
    """Read tables, columns, keys, row counts and sample values from a SQLite file (read-only)."""
    path = Path(db_path)
    if not path.is_file():
        raise FileNotFoundError(f"database file not found: {path}")
    try:
        return _read_schema_cached(str(path.resolve()), path.stat().st_mtime_ns, n_samples, db_id or path.stem)
    except sqlite3.DatabaseError as e:
        raise UnreadableDatabase(f"{path}: not a readable SQLite database ({e}); a git-LFS pointer or a partial "
                                 "copy? replace the file with the real database") from None


@lru_cache(maxsize=256)
def _read_schema_cached(path: str, _mtime: int, n_samples: int, db_id: str) -> Schema:
    conn = sqlite3.connect(Path(path).as_uri() + "?mode=ro", uri=True)
    conn.text_factory = lambda b: b.decode("utf-8", "replace")
    try:
        names = [r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY rowid")]
        tables, fks = [], []
        for name in names:
            q = name.replace('"', '""')
            info = conn.execute(f'PRAGMA table_info("{q}")').fetchall()
            columns = []
            for _cid, col, col_type, _notnull, _default, pk in info:
                samples = ()
                if n_samples:
                    c = col.replace('"', '""')
                    samples = tuple(r[0] for r in conn.execute(
                        f'SELECT "{c}" FROM "{q}" WHERE "{c}" IS NOT NULL GROUP BY "{c}" '
                        f'ORDER BY count(*) DESC, "{c}" LIMIT ?', (n_samples,)))
                    samples = tuple(v for v in samples if not isinstance(v, bytes))
                columns.append(Column(col, (col_type or "").upper(), bool(pk), samples))
            count = conn.execute(f'SELECT count(*) FROM "{q}"').fetchone()[0]
            tables.append(Table(name, tuple(columns), count))
            rows = conn.execute(f'PRAGMA foreign_key_list("{q}")').fetchall()
            key_sizes = Counter(row[0] for row in rows)
            for row in rows:
                ref_table, from_col, to_col = row[2], row[3], row[4]
                if to_col is None:  # references the primary key implicitly
                    pk = [r[1] for r in conn.execute(f'PRAGMA table_info("{ref_table}")') if r[5]]
                    to_col = pk[0] if pk else "rowid"
                fks.append(ForeignKey(name, from_col, ref_table, to_col, key_sizes[row[0]] > 1))
        return Schema(db_id, tuple(tables), tuple(fks))
    finally:
        conn.close()
