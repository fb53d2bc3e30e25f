"""Where a `db_id` lives: `DB_ROOT/<db_id>/<db_id>.sqlite`, and never outside `DB_ROOT`.

`db_id` arrives from datasets and over HTTP, so it is validated as a name, not trusted as a path.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

_DB_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}$")


class UnknownDatabase(LookupError):
    """`db_id` is not a valid name or has no SQLite file under the root."""


def resolve_db_path(db_root: str | Path, db_id: str) -> Path:
    """The SQLite file of `db_id` under `db_root`; raises UnknownDatabase with the reason.

    Example:
        >>> resolve_db_path("/data", "../../etc")
        Traceback (most recent call last):
        ...
        rewards.databases.UnknownDatabase: invalid db_id '../../etc': use letters, digits, '_', '-', '.' (no path separators)
    """
    if not isinstance(db_id, str) or not _DB_ID.match(db_id) or ".." in db_id:
        raise UnknownDatabase(f"invalid db_id {db_id!r}: use letters, digits, '_', '-', '.' (no path separators)")
    # The name check above is what keeps a db_id inside the root; symlinked database folders stay usable.
    path = Path(db_root) / db_id / f"{db_id}.sqlite"
    if not path.is_file():
        raise UnknownDatabase(f"unknown db_id {db_id!r}: no file {path}")
    return path


def list_db_ids(db_root: str | Path) -> list[str]:
    """All db_ids with a database file under `db_root`, sorted."""
    root = Path(db_root)
    return sorted(p.name for p in root.iterdir() if p.is_dir() and (p / f"{p.name}.sqlite").is_file())


def require_db_ids(db_root: str | Path, db_ids: Iterable[str], what: str = "item(s)",
                   fix: str = "check --db-root") -> None:
    """Raise UnknownDatabase naming each db_id with no database file under `db_root` (a wrong root scores every
    query as an error, an EX of 0 that looks like a result).

    Example:
        >>> require_db_ids("/nowhere", ["a", "b", "a"], "pair(s)")
        Traceback (most recent call last):
        ...
        rewards.databases.UnknownDatabase: 3 pair(s) use database(s) not found under /nowhere: ['a', 'b']; each needs /nowhere/<db_id>/<db_id>.sqlite (check --db-root)
    """
    root = Path(db_root)
    present = set(list_db_ids(root)) if root.is_dir() else set()
    missing = Counter(db for db in db_ids if db not in present)
    if missing:
        names = sorted(missing)
        raise UnknownDatabase(f"{sum(missing.values())} {what} use database(s) not found under {db_root}: "
                              f"{names[:5]}{' ...' if len(names) > 5 else ''}; each needs "
                              f"{db_root}/<db_id>/<db_id>.sqlite ({fix})")
