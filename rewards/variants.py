"""Test-suite style variants of a SQLite database, so that a wrong query is not rewarded for a lucky database.

Spider's databases are tiny: a query with a missing filter or a wrong join often returns the gold rows by
chance. Zhong et al. (2020) therefore compare on a distilled suite of random databases. We build such
databases ourselves, for any SQLite file and without knowing the queries: copies whose rows are
resampled from, perturbed around and extended beyond the original's own values.

What a variant keeps, so that queries equal in meaning stay equal in result:
- the schema (tables, indexes, views, triggers), verbatim;
- keys: declared PRIMARY KEY / UNIQUE sets stay unique, and so does a column whose values are all distinct
  in the original (a name, a measure): no duplicate name and no tie appears where the original had none;
  a column that almost names its rows (80% distinct values: a name column with a few namesakes) keeps its
  values' counts: a clone gets a new name, so "the student named Kyle" still means one student;
- foreign keys (declared, a same-named column whose values all occur in another table's unique column, or an
  integer column whose values all fall among another table's sparse integer keys, which chance would not give:
  an advisor's faculty id): every non-NULL value refers to a row of the variant's parent table;
- what the rows imply: a dependency the data holds between two columns of a table (a room lies in one
  building, a range in one country), unless chance explains it, holds in the variant too (the dependent
  column follows its determinant); a table without duplicate rows gets none, and a pair of references that
  never repeats (a teacher teaches a course once) does not repeat;
- each column's domain: values are the column's own values (strings verbatim: no new spelling or casing),
  numbers nudged by one step inside the column's range; a column without NULLs gets none.
What it changes, so that queries different in meaning differ in result:
- rows dropped, and rows added as clones of original rows with fresh keys (non-unique values repeat:
  a missing DISTINCT or GROUP BY shows);
- cells resampled from their column (correlations broken: a missing or wrong filter shows), numbers
  nudged (a `>` for a `>=` shows), foreign keys re-pointed (a wrong join path shows).

The core (`variant_rows`) is a pure function of the tables' rows and a seed; reading the original
(`read_tables`), writing a variant (`write_variant`) and the on-disk cache (`VariantCache`: keyed by the
original's path, size and mtime, built under a file lock, written to a temp file and renamed, so several
rollout workers may ask at once) are the edges. The user's database is only ever opened read-only.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import hashlib
import math
import os
import random
import re
import sqlite3
import uuid
from collections import Counter, defaultdict
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

BUILDER_VERSION = 2  # part of the cache key: a changed builder never reuses old variants
MAX_TABLE_ROWS = 5_000  # a larger table is read as a sample of this many rows (its variant is that small)
KEEP = 0.7  # chance that an original row stays
CLONES = (0.5, 1.5)  # clones added, as a share of the original row count (uniform in this range)
KEPT_CELL = 0.2  # chance that a cell of a kept row is resampled
CLONE_CELL = 0.7  # chance that a cell of a clone is resampled (else it keeps its base row's value)
NUDGE = 0.3  # chance that a resampled number is moved one step
REPOINT_KEPT, REPOINT_CLONE = 0.3, 0.7  # chance that a foreign key is re-pointed to a random parent row
MIN_NUDGE_DISTINCT = 3  # numbers with fewer distinct values are codes or flags: never nudged
IDENTIFYING = 0.8  # a column with at least this share of distinct values names its rows (a name, a title)
CHANCE = 1e-3  # a dependency (or an undeclared reference) is kept when chance alone would give it less often
_DATE_FORMATS = ("%Y-%m-%d %H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%d", "%Y/%m/%d", "%d/%m/%Y", "%m/%d/%Y")


class VariantError(RuntimeError):
    """A database whose variants cannot be built (an unsupported schema, an unreadable file)."""


@dataclass(frozen=True)
class ForeignKey:
    columns: tuple[int, ...]  # in the child table
    parent: str
    parent_columns: tuple[int, ...]


@dataclass(frozen=True)
class TableData:
    """One table as the builder sees it: its rows and the constraints a variant must keep."""

    name: str
    columns: tuple[str, ...]
    rows: tuple[tuple, ...]
    unique: tuple[tuple[int, ...], ...] = ()  # column sets whose non-NULL tuples are distinct
    foreign_keys: tuple[ForeignKey, ...] = ()
    keys: frozenset[int] = frozenset()  # declared key columns: fresh integers for clones are max + 1
    depends: tuple[tuple[int, int], ...] = ()  # (determinant, dependent): the dependent's value follows


# ------------------------------------------------------------------------------------------------ the pure core
def variant_rows(tables: Sequence[TableData], seed: str | int) -> dict[str, list[tuple]]:
    """The rows of one variant, table by table: a pure function of the tables and `seed`.

    Example:
        >>> t = TableData("t", ("id", "name", "age"), ((1, "a", 30), (2, "b", 40), (3, "c", 50), (4, "d", 60)),
        ...               unique=((0,), (1,)), keys=frozenset({0}))
        >>> rows = variant_rows([t], seed=1)["t"]
        >>> len({r[0] for r in rows}) == len({r[1] for r in rows}) == len(rows), rows == variant_rows([t], seed=1)["t"]
        (True, True)
    """
    rng = random.Random(f"sirius-variant/{seed}")
    built: dict[str, list[tuple]] = {}
    for table in _parents_first(tables):
        built[table.name] = _table_rows(table, built, rng)
    return built


def _parents_first(tables: Sequence[TableData]) -> list[TableData]:
    """Tables ordered so that a parent comes before its children (self-references and cycles tolerated)."""
    by_name = {t.name: t for t in tables}
    done: dict[str, TableData] = {}
    visiting: set[str] = set()

    def visit(table: TableData) -> None:
        if table.name in done or table.name in visiting:
            return
        visiting.add(table.name)
        for fk in table.foreign_keys:
            if fk.parent in by_name and fk.parent != table.name:
                visit(by_name[fk.parent])
        visiting.discard(table.name)
        done[table.name] = table

    for table in tables:
        visit(table)
    return list(done.values())


class _Column:
    """What the builder knows of one column: its values, and how a new value may be made."""

    def __init__(self, values: list, key: bool):
        self.values, self.key = values, key
        present = [v for v in values if v is not None]
        numbers = [v for v in present if isinstance(v, (int, float)) and not isinstance(v, bool)]
        self.numeric = bool(present) and len(numbers) == len(present)
        self.integer = self.numeric and all(isinstance(v, int) for v in present)
        self.nudgeable = self.numeric and len(set(present)) >= MIN_NUDGE_DISTINCT
        if self.numeric:
            self.low, self.high = min(numbers), max(numbers)
            self.step, self.digits = (1, 0) if self.integer else _float_step(numbers)

    def draw(self, rng: random.Random):
        """A value of this column: one of its cells, sometimes nudged one step (numbers only)."""
        value = rng.choice(self.values)
        if value is not None and self.nudgeable and rng.random() < NUDGE:
            value = self._nudged(value, rng.choice((-1, 1)))
        return value

    def _nudged(self, value, direction: int, steps: int = 1):
        moved = value + direction * steps * self.step
        if not self.low <= moved <= self.high:
            moved = value - direction * steps * self.step
        return moved if self.integer else round(moved, self.digits)

    def fresh(self, base, used: set, rng: random.Random):
        """A value not in `used`, as close to `base` as the column's kind allows."""
        if base is None:
            return None
        if self.numeric:
            if self.key and self.integer:
                return max([v for v in used if isinstance(v, int)] + [int(self.high)]) + 1
            for steps in range(1, 10_000):
                for direction in (1, -1) if rng.random() < 0.5 else (-1, 1):
                    moved = base + direction * steps * self.step
                    moved = moved if self.integer else round(moved, self.digits)
                    if moved not in used:
                        return moved
        if isinstance(base, str):
            return _fresh_text(base, used)
        if isinstance(base, bytes):
            return _fresh_bytes(base, used)
        return None


def _identifying(values: list) -> bool:
    """A column of mostly distinct values (names, titles): its values pick out rows, so clones need new ones."""
    present = [v for v in values if v is not None]
    return len(present) >= 2 and len(set(present)) >= IDENTIFYING * len(present)


def _float_step(numbers: list) -> tuple[float, int]:
    """(step, decimals to round to) of a float column: its finest decimal place, 4 at most (0.1 + 0.2 has 17), 1 at
    least; finer for a column of tiny numbers (1e-05), coarser where a float cannot tell x + 1 from x (1e+16).

    Example:
        >>> _float_step([12.5, 3.25]), _float_step([1e-05, 2e-05]), _float_step([1e+16, 3.0]), _float_step([0.1 + 0.2])
        ((0.01, 2), (1e-05, 5), (10.0, 0), (0.0001, 4))
    """
    finite = [float(v) for v in numbers if math.isfinite(v)]
    exponent = min([0] + [Decimal(repr(v)).normalize().as_tuple().exponent for v in finite if v])
    exponent = max(exponent, -4)
    tiny = [v for v in finite if v]
    if tiny and max(abs(v) for v in tiny) < 10.0 ** exponent:  # every value below the step: step by their scale
        exponent = math.floor(math.log10(min(abs(v) for v in tiny)))
    if finite:
        exponent = max(exponent, math.ceil(math.log10(2 * math.ulp(max(abs(v) for v in finite)))))
    return 10.0 ** exponent, max(0, -exponent)


def _fresh_text(base: str, used: set) -> str:
    """A new string in the form of `base`: a date shifted by days, a number in it counted up, or `base 2`."""
    for fmt in _DATE_FORMATS:
        try:
            when = dt.datetime.strptime(base, fmt)
        except ValueError:
            continue
        for days in range(1, 10_000):
            for sign in (1, -1):
                candidate = (when + dt.timedelta(days=sign * days)).strftime(fmt)
                if candidate not in used:
                    return candidate
    digits = list(re.finditer(r"\d+", base))
    if digits:
        last = digits[-1]
        for k in range(1, 10_000):
            number = str(int(last.group()) + k).zfill(len(last.group()))
            candidate = base[:last.start()] + number + base[last.end():]
            if candidate not in used:
                return candidate
    k = 2
    while f"{base} {k}" in used:
        k += 1
    return f"{base} {k}"


def _fresh_bytes(base: bytes, used: set) -> bytes:
    k = 1
    while base + bytes([k % 256]) * (1 + k // 256) in used:
        k += 1
    return base + bytes([k % 256]) * (1 + k // 256)


def _table_rows(table: TableData, built: dict[str, list[tuple]], rng: random.Random) -> list[tuple]:
    """One table of a variant: kept rows (a few cells resampled), clones (fresh keys and names, many cells
    resampled), foreign keys pointed at `built` parents, rows repeating a unique set dropped."""
    original = table.rows
    if not original:
        return []
    width = len(table.columns)
    single = {u[0] for u in table.unique if len(u) == 1}
    columns = [_Column([r[i] for r in original], i in table.keys) for i in range(width)]
    fk_columns = {i for fk in table.foreign_keys for i in fk.columns}
    naming = single | {i for i, c in enumerate(columns) if _identifying(c.values)}
    followers = {b for _, b in table.depends}
    free = [i for i in range(width) if i not in fk_columns and i not in naming and i not in followers]

    rows: list[list] = []
    repoint: list[float] = []  # per row: the chance that its foreign keys are re-pointed
    for row in original:
        if rng.random() < KEEP:
            row = list(row)
            for i in free:
                if rng.random() < KEPT_CELL:
                    row[i] = columns[i].draw(rng)
            rows.append(row)
            repoint.append(REPOINT_KEPT)
    if not rows:  # never empty a table that had rows: an empty table makes most queries agree on nothing
        rows.append(list(rng.choice(original)))
        repoint.append(REPOINT_KEPT)
    used = {i: {row[i] for row in rows} for i in naming}
    for _ in range(round(len(original) * rng.uniform(*CLONES))):
        base = rng.choice(original)
        row = list(base)
        changed = {i for i in free if rng.random() < CLONE_CELL}
        for i in range(width):
            if i in naming and i not in fk_columns:
                row[i] = columns[i].fresh(base[i], used[i], rng)
                used[i].add(row[i])
            elif i in changed:
                row[i] = columns[i].draw(rng)
        rows.append(row)
        repoint.append(REPOINT_CLONE)

    for fk in table.foreign_keys:
        parent_rows = rows if fk.parent == table.name else built.get(fk.parent)
        if parent_rows is None:
            continue
        _point(rows, repoint, fk, parent_rows, rng, exclusive=any(set(u) <= set(fk.columns) for u in table.unique))
    if table.depends:
        _follow(rows, original, table.depends)
        for fk in table.foreign_keys:  # a reference that followed its determinant may name a parent row dropped here
            parent_rows = rows if fk.parent == table.name else built.get(fk.parent)
            if parent_rows is not None and followers & set(fk.columns):
                _drop_unreferenced(rows, fk, parent_rows)
    return _distinct_keys([tuple(r) for r in rows if r is not None], table.unique)


def _follow(rows: list, original: Sequence[tuple], depends: Sequence[tuple[int, int]]) -> None:
    """Give each dependent column the value the original pairs with its determinant's value; a determinant value
    the original does not have (a clone's fresh name) keeps the first dependent value it comes with, so the
    dependency holds in the variant too. `depends` is in order: a determinant is final before its dependents."""
    for a, b in depends:
        pairs: dict = {}
        for row in original:
            if row[a] is not None:
                pairs.setdefault(row[a], row[b])
        for row in rows:
            if row is not None and row[a] is not None:
                row[b] = pairs.setdefault(row[a], row[b])


def _drop_unreferenced(rows: list, fk: ForeignKey, parent_rows: list) -> None:
    targets = {tuple(p[j] for j in fk.parent_columns) for p in parent_rows if p is not None}
    for k, row in enumerate(rows):
        if row is not None:
            current = tuple(row[i] for i in fk.columns)
            if None not in current and current not in targets:
                rows[k] = None


def _point(rows: list, repoint: list[float], fk: ForeignKey, parent_rows: list, rng: random.Random,
           exclusive: bool) -> None:
    """Make every non-NULL reference of `fk` name a parent row: keep it, or re-point it (with the row's chance, or
    when its parent is gone). A row that cannot be pointed anywhere is dropped (set to None); with `exclusive`
    (the reference is unique in its table) no two rows point at the same parent."""
    targets = list(dict.fromkeys(tuple(p[j] for j in fk.parent_columns) for p in parent_rows))
    targets = [t for t in targets if None not in t]
    existing = set(targets)
    taken: set = set()
    for k, row in enumerate(rows):
        if row is None:
            continue
        current = tuple(row[i] for i in fk.columns)
        if all(v is None for v in current):
            continue
        if current in existing and current not in taken and rng.random() >= repoint[k]:
            choice = current
        else:
            options = [t for t in targets if t not in taken] if exclusive else targets
            if not options:
                rows[k] = None
                continue
            choice = rng.choice(options)
        if exclusive:
            taken.add(choice)
        for i, v in zip(fk.columns, choice):
            row[i] = v


def _distinct_keys(rows: list[tuple], unique: tuple[tuple[int, ...], ...]) -> list[tuple]:
    """Drop rows that would repeat a unique column set (NULLs never clash, as in SQL)."""
    seen: list[set] = [set() for _ in unique]
    out = []
    for row in rows:
        keys = [tuple(row[i] for i in u) for u in unique]
        if any(None not in key and key in s for key, s in zip(keys, seen)):
            continue
        for key, s in zip(keys, seen):
            s.add(key)
        out.append(row)
    return out


# ------------------------------------------------------------------------------------------------ reading
def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def read_tables(conn: sqlite3.Connection, max_rows: int = MAX_TABLE_ROWS, seed: str | int = 0) -> list[TableData]:
    """Every user table of an open database with the constraints a variant keeps (a table over `max_rows`
    rows is read as a seeded sample)."""
    names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE "
                                        "'sqlite\\_%' ESCAPE '\\' ORDER BY rowid")]
    info = {name: conn.execute(f"PRAGMA table_info({_quote(name)})").fetchall() for name in names}
    tables = {}
    for name in names:
        columns = tuple(c[1] for c in info[name])
        rows, complete = _read_rows(conn, name, max_rows, seed)
        pk = tuple(c[0] for c in sorted(info[name], key=lambda c: c[5]) if c[5] > 0)
        unique = {pk} if pk else set()
        for index in conn.execute(f"PRAGMA index_list({_quote(name)})").fetchall():
            if index[2]:  # unique
                cols = tuple(r[1] for r in conn.execute(f"PRAGMA index_info({_quote(index[1])})").fetchall())
                if cols and all(c >= 0 for c in cols):
                    unique.add(cols)
        for i in range(len(columns)):
            if (i,) not in unique and _distinct_column(conn, name, columns[i], rows, i, complete):
                unique.add((i,))
        if not unique and _distinct_rows(conn, name, rows, complete):  # no key, yet no row repeats: none will
            unique.add(tuple(range(len(columns))))
        tables[name] = (columns, tuple(rows), tuple(sorted(unique)), frozenset(pk))
    lower = {n.lower(): n for n in names}
    out = []
    for name in names:
        columns, rows, unique, keys = tables[name]
        fks = tuple(dict.fromkeys(_declared_foreign_keys(conn, name, columns, tables, lower)))
        fks += tuple(fk for fk in _implied_foreign_keys(name, tables, list(fks)) if fk not in fks)
        unique = tuple(sorted(set(unique) | _unrepeated_pairs(rows, unique, fks)))
        references = {i for fk in fks for i in fk.columns}
        out.append(TableData(name, columns, rows, unique, fks, keys,
                             measured_dependencies(rows, unique, keys, references)))
    return out


def measured_dependencies(rows: Sequence[tuple], unique: Sequence[tuple[int, ...]] = (), keys=frozenset(),
                          references=frozenset()) -> tuple[tuple[int, int], ...]:
    """(determinant, dependent) column pairs of a table where every value of the determinant comes with one value of
    the dependent (a room lies in one building) and chance alone would give that less often than `CHANCE`: for
    each group of rows sharing a determinant value, the chance that its dependent values all agree is the sum of
    p^size over the dependent's value shares p. A unique column determines everything and says nothing; a column
    that names rows, a key, or a unique one never follows. Each dependent follows the determinant with the most
    values (a reference first on a tie), in an order where determinants come first. Pure.

    Example:
        >>> rooms = [(r, "Barton" if r < 200 else "NEB") for r in (101, 102, 103, 104, 205, 206, 207, 208)] * 3
        >>> measured_dependencies(rooms)  # 8 rooms in 2 buildings, each seen 3 times
        ((0, 1),)
        >>> measured_dependencies([("a", 1), ("a", 1), ("b", 2)])  # one repeated pair: chance explains it
        ()
    """
    if len(rows) < 3:
        return ()
    width = len(rows[0])
    single = {u[0] for u in unique if len(u) == 1}
    columns = [[r[i] for r in rows] for i in range(width)]
    naming = single | set(keys) | {i for i in range(width) if _identifying(columns[i])}
    distinct = [len(set(c) - {None}) for c in columns]
    order = {i: (distinct[i], i in references, -i) for i in range(width)}
    determinants: dict[int, list[int]] = defaultdict(list)
    for a in range(width):
        present = [k for k, v in enumerate(columns[a]) if v is not None]
        if a in single or distinct[a] >= len(present):
            continue
        for b in range(width):
            if b != a and b not in naming and order[a] > order[b] and _determines(columns[a], columns[b], present):
                determinants[b].append(a)
    chosen = {b: max(found, key=order.get) for b, found in determinants.items()}
    return tuple((chosen[b], b) for b in sorted(chosen, key=order.get, reverse=True))


def _determines(a_values: list, b_values: list, present: list[int]) -> bool:
    groups: dict = {}
    for k in present:
        first = groups.setdefault(a_values[k], [b_values[k], 0])
        if first[0] != b_values[k]:
            return False
        first[1] += 1
    shares = Counter(b_values[k] for k in present)
    if len(shares) < 2:
        return False
    n = len(present)
    log_chance = sum(math.log(max(sum((c / n) ** size for c in shares.values()), 1e-300))
                     for _, size in groups.values() if size > 1)
    return log_chance < math.log(CHANCE)


def _distinct_rows(conn, name: str, rows: list[tuple], complete: bool) -> bool:
    if complete:
        return len(rows) >= 2 and len(set(rows)) == len(rows)
    (n, distinct) = conn.execute(f"SELECT (SELECT count(*) FROM {_quote(name)}), "
                                 f"(SELECT count(*) FROM (SELECT DISTINCT * FROM {_quote(name)}))").fetchone()
    return n >= 2 and n == distinct


def _unrepeated_pairs(rows: Sequence[tuple], unique, fks: Sequence[ForeignKey]) -> set[tuple[int, ...]]:
    """In a table that relates rows of others (no unique column of its own), pairs of single-column references
    whose value pairs never repeat in the original (a teacher teaches a course once): kept unrepeated."""
    if any(len(u) == 1 for u in unique):
        return set()
    singles = sorted({fk.columns[0] for fk in fks if len(fk.columns) == 1})
    out = set()
    for x, i in enumerate(singles):
        for j in singles[x + 1:]:
            if any(set(u) <= {i, j} for u in unique):
                continue
            pairs = [(r[i], r[j]) for r in rows if r[i] is not None and r[j] is not None]
            if len(pairs) >= 2 and len(set(pairs)) == len(pairs):
                out.add((i, j))
    return out


def _read_rows(conn, name: str, max_rows: int, seed) -> tuple[list[tuple], bool]:
    (count,) = conn.execute(f"SELECT count(*) FROM {_quote(name)}").fetchone()
    if count <= max_rows:
        return conn.execute(f"SELECT * FROM {_quote(name)}").fetchall(), True
    try:
        rowids = [r[0] for r in conn.execute(f"SELECT rowid FROM {_quote(name)}")]
    except sqlite3.OperationalError:  # WITHOUT ROWID: the first rows
        return conn.execute(f"SELECT * FROM {_quote(name)} LIMIT {int(max_rows)}").fetchall(), False
    chosen = sorted(random.Random(f"sirius-sample/{seed}/{name}").sample(rowids, max_rows))
    rows = []
    for start in range(0, len(chosen), 500):
        part = chosen[start:start + 500]
        rows += conn.execute(f"SELECT * FROM {_quote(name)} WHERE rowid IN ({','.join('?' * len(part))}) "
                             "ORDER BY rowid", part).fetchall()
    return rows, False


def _distinct_column(conn, table: str, column: str, rows: list[tuple], i: int, complete: bool) -> bool:
    """True when the column's non-NULL values are all distinct (over the whole table), with at least two."""
    if complete:
        present = [r[i] for r in rows if r[i] is not None]
        return len(present) >= 2 and len(set(present)) == len(present)
    (n, distinct) = conn.execute(f"SELECT count({_quote(column)}), count(DISTINCT {_quote(column)}) "
                                 f"FROM {_quote(table)}").fetchone()
    return n >= 2 and n == distinct


def _declared_foreign_keys(conn, name: str, columns: tuple[str, ...], tables: dict, lower: dict) -> list[ForeignKey]:
    groups: dict[int, list] = {}
    for fk in conn.execute(f"PRAGMA foreign_key_list({_quote(name)})").fetchall():
        groups.setdefault(fk[0], []).append(fk)
    out = []
    for parts in groups.values():
        parent = lower.get(parts[0][2].lower())
        if parent is None:
            continue
        p_columns, _, _, p_keys = tables[parent]
        targets = [p[4] for p in parts]
        if any(t is None for t in targets):  # REFERENCES parent without columns: its primary key
            targets = [p_columns[i] for i in sorted(p_keys)]
        child = [_index(columns, p[3]) for p in parts]
        target = [_index(p_columns, t) for t in targets]
        if None in child or None in target or len(child) != len(target):
            continue
        out.append(ForeignKey(tuple(child), parent, tuple(target)))
    return out


def _implied_foreign_keys(name: str, tables: dict, declared: list[ForeignKey]) -> list[ForeignKey]:
    """Foreign keys the schema did not declare (common in hand-made databases): a column named like another table's
    unique column, whose values all occur there; else an integer column whose values all fall among another
    table's integer keys where those are too sparse for chance to explain it (`_sparse_reference`)."""
    columns, rows, unique, keys = tables[name]
    taken = {i for fk in declared for i in fk.columns} | (set(keys) if len(keys) == 1 else set())
    out = []
    for i, column in enumerate(columns):
        values = {r[i] for r in rows if r[i] is not None}
        if i in taken or not values:
            continue
        for parent, (p_columns, p_rows, p_unique, _) in tables.items():
            j = _index(p_columns, column)
            if parent == name or j is None or (j,) not in p_unique:
                continue
            if values <= {r[j] for r in p_rows}:
                out.append(ForeignKey((i,), parent, (j,)))
                break
        else:
            found = _sparse_reference(name, values, tables)
            if found is not None:
                out.append(ForeignKey((i,), *found))
    return out


def _sparse_reference(name: str, values: set, tables: dict) -> tuple[str, tuple[int]] | None:
    """(parent, (column,)) of the unique integer column of another table that holds all of `values` (two or more
    integers), when chance would put them all among its keys less often than `CHANCE`: each value lands on a key
    with the keys' density over the values' range. A student's advisor among faculty ids 1082..9922 (58 of
    them) is a reference; ages 20..40 among ids 1..100 are not."""
    if len(values) < 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return None
    low, high = min(values), max(values)
    best = None
    for parent, (p_columns, p_rows, p_unique, _) in tables.items():
        if parent == name:
            continue
        for (j,) in (u for u in p_unique if len(u) == 1):
            keys = {r[j] for r in p_rows}
            if not values <= keys:
                continue
            log_chance = len(values) * math.log(sum(low <= k <= high for k in keys) / (high - low + 1))
            if log_chance < math.log(CHANCE) and (best is None or log_chance < best[0]):
                best = (log_chance, parent, (j,))
    return None if best is None else best[1:]


def _index(columns: tuple[str, ...], name: str) -> int | None:
    wanted = name.lower()
    return next((i for i, c in enumerate(columns) if c.lower() == wanted), None)


# ------------------------------------------------------------------------------------------------ writing
def write_variant(source: Path, target: Path, tables: Sequence[TableData], rows: dict[str, list[tuple]]) -> None:
    """Write `rows` into a new database at `target` with `source`'s schema, atomically (temp file + rename)."""
    with sqlite3.connect(Path(source).resolve().as_uri() + "?mode=ro", uri=True) as src:
        schema = src.execute("SELECT type, name, sql FROM sqlite_master WHERE sql IS NOT NULL AND name NOT LIKE "
                             "'sqlite\\_%' ESCAPE '\\' ORDER BY rowid").fetchall()
    if any(sql.lstrip().upper().startswith("CREATE VIRTUAL") for _, _, sql in schema):
        raise VariantError(f"{source}: virtual tables are not supported by the variant builder")
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        conn = sqlite3.connect(tmp, isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode = OFF")
            conn.execute("PRAGMA synchronous = OFF")
            conn.execute("BEGIN")
            for kind, _, sql in schema:
                if kind == "table":
                    conn.execute(sql)
            for table in tables:
                marks = ",".join("?" * len(table.columns))
                conn.executemany(f"INSERT OR IGNORE INTO {_quote(table.name)} VALUES ({marks})", rows[table.name])
            _drop_dangling(conn, tables)
            for kind, _, sql in schema:
                if kind != "table":
                    conn.execute(sql)
            conn.execute("COMMIT")
        finally:
            conn.close()
        os.replace(tmp, target)
    except sqlite3.DatabaseError as e:
        raise VariantError(f"{source}: building a variant failed: {e}") from None
    finally:
        tmp.unlink(missing_ok=True)


def _drop_dangling(conn: sqlite3.Connection, tables: Sequence[TableData]) -> None:
    """Delete rows whose foreign key names no parent row (a parent row a CHECK constraint refused), until none."""
    changed = True
    while changed:
        changed = False
        for table in tables:
            columns = table.columns
            for fk in table.foreign_keys:
                parent = next(t for t in tables if t.name == fk.parent)
                child_cols = [f"{_quote(table.name)}.{_quote(columns[i])}" for i in fk.columns]
                match = " AND ".join(f"p.{_quote(parent.columns[j])} = {c}" for j, c in zip(fk.parent_columns,
                                                                                           child_cols))
                cur = conn.execute(f"DELETE FROM {_quote(table.name)} WHERE "
                                   f"{' AND '.join(f'{c} IS NOT NULL' for c in child_cols)} AND NOT EXISTS "
                                   f"(SELECT 1 FROM {_quote(parent.name)} AS p WHERE {match})")
                changed |= cur.rowcount > 0


# ------------------------------------------------------------------------------------------------ the cache
def default_cache_dir() -> Path:
    """`$SIRIUS_VARIANTS_DIR`, else `$XDG_CACHE_HOME/sirius-sql/variants` (`~/.cache/...`)."""
    if os.environ.get("SIRIUS_VARIANTS_DIR"):
        return Path(os.environ["SIRIUS_VARIANTS_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sirius-sql" / "variants"


@contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class VariantCache:
    """Variants on disk: `<root>/<name>-<fingerprint>/<name>.v<j>.sqlite`, built once, shared by every process.

    The fingerprint covers the original's resolved path, inode, size, modification and change times, the seed and
    the builder's version: a changed database or builder gets new variants, never stale ones. The change time
    (set by the kernel on every write, copy or unpack onto the file) is what a copy with kept times (`cp -p`,
    `rsync -a`, another release unpacked) cannot keep; size and mtime alone it keeps.
    """

    def __init__(self, root: str | Path | None = None, seed: int = 0):
        self.root = Path(root) if root is not None else default_cache_dir()
        self.seed = seed

    def folder(self, db_path: Path) -> Path:
        db_path = Path(db_path).resolve()
        stat = db_path.stat()
        key = (f"{db_path}\0{stat.st_ino}\0{stat.st_size}\0{stat.st_mtime_ns}\0{stat.st_ctime_ns}\0{self.seed}"
               f"\0{BUILDER_VERSION}")
        return self.root / f"{db_path.stem}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"

    def paths(self, db_path: str | Path, k: int) -> list[Path]:
        """The first `k` variants of `db_path`, built now if missing (under a lock; another process's build is
        waited for, not repeated)."""
        if k <= 0:
            return []
        folder = self.folder(db_path)
        wanted = [folder / f"{Path(db_path).stem}.v{j}.sqlite" for j in range(1, k + 1)]
        if all(p.is_file() for p in wanted):
            return wanted
        with _locked(folder / ".lock"):
            missing = [(j, p) for j, p in enumerate(wanted, 1) if not p.is_file()]
            if missing:
                try:
                    with sqlite3.connect(Path(db_path).resolve().as_uri() + "?mode=ro", uri=True) as conn:
                        tables = read_tables(conn, seed=self.seed)
                except sqlite3.DatabaseError as e:
                    raise VariantError(f"{db_path}: cannot read the database: {e}") from None
                for j, path in missing:
                    try:
                        rows = variant_rows(tables, f"{self.seed}/{j}")
                    except (ArithmeticError, LookupError, TypeError, ValueError) as e:  # data the builder cannot take
                        raise VariantError(f"{db_path}: building variant {j} failed: {type(e).__name__}: {e}") from e
                    write_variant(db_path, path, tables, rows)
        return wanted
