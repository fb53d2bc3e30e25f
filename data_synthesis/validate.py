"""Pool validation (SPEC 2.2): run every gold SQL once; drop what cannot be a training target, say why.

Dropped: gold that errors, times out, is refused, or returns a result over the size cap; exact duplicates
(same database, question and SQL). Kept examples carry their gold time and row count in `meta`.
A database missing from the root is a configuration error raised before anything runs (a wrong
`--db-root` must not quietly empty the pool).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from data_synthesis.records import Example
from rewards.databases import list_db_ids, require_db_ids
from rewards.executor import Executor
from rewards.outcome import Outcome
from rewards.sandbox import Limits


def missing_databases(examples: Sequence[Example], db_root: str | Path) -> dict[str, int]:
    """`{db_id: examples using it}` for every db_id with no `<db_root>/<db_id>/<db_id>.sqlite`."""
    root = Path(db_root)
    present = set(list_db_ids(root)) if root.is_dir() else set()
    return dict(Counter(e.db_id for e in examples if e.db_id not in present))


def require_databases(examples: Sequence[Example], db_root: str | Path) -> None:
    """Raise UnknownDatabase naming the missing db_ids and the fix."""
    require_db_ids(db_root, [e.db_id for e in examples], "example(s)",
                   "check --db-root, or pass --skip-missing-dbs to drop those examples")


def drop_reason(outcome: Outcome, drop_empty: bool = False) -> str | None:
    """Why a gold outcome disqualifies its example, or None.

    Example:
        >>> from rewards.outcome import Status
        >>> drop_reason(Outcome(Status.ERROR, error="no such column: x")), drop_reason(Outcome(Status.EMPTY))
        ('gold error: no such column: x', None)
    """
    if outcome.executed:
        return "gold empty" if drop_empty and not outcome.rows else None
    if outcome.error and outcome.error.startswith("result too large"):
        return "gold result too large"
    return f"gold {outcome.status.value}" + (f": {outcome.error}" if outcome.error else "")


def validate_examples(examples: Sequence[Example], db_root: str | Path, *, timeout_s: float = 5.0,
                      max_rows: int = 100_000, drop_empty: bool = False, workers: int = 0,
                      progress: Callable[[int], None] | None = None) -> tuple[list[Example], list[tuple[Example, str]]]:
    """(kept examples with `meta.gold_time_s` / `meta.gold_rows`, [(dropped example, reason)]), input order kept.

    A reason reads `kind: detail` (`duplicate: ...`, `gold error: no such column ...`); reports count the kinds.
    """
    require_databases(examples, db_root)
    seen: dict[tuple, str] = {}
    unique, dropped = [], []
    for e in examples:
        signature = (e.db_id, e.question.strip(), e.gold_sql.strip())
        if signature in seen:
            dropped.append((e, f"duplicate: same database, question and gold SQL as {seen[signature]}"))
        else:
            seen[signature] = e.id
            unique.append(e)
    advance = progress or (lambda n: None)
    with Executor(db_root, workers=workers, limits=Limits(timeout_s=timeout_s, max_rows=max_rows)) as executor:
        outcomes = executor.execute_many([(e.db_id, e.gold_sql) for e in unique], on_result=lambda i, r: advance(1))
    kept = []
    for e, outcome in zip(unique, outcomes):
        reason = drop_reason(outcome, drop_empty)
        if reason is not None:
            dropped.append((e, reason))
        else:
            kept.append(replace(e, meta={**e.meta, "gold_time_s": round(outcome.elapsed_s, 6),
                                         "gold_rows": len(outcome.rows)}))
    return kept, dropped
