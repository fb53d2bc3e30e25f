"""The typed result of running one SQL statement: the vocabulary every later stage speaks.

Training turns it into a reward, the repair lifecycle routes on it (error -> corrector, timeout ->
rewrite, empty -> structural operators), the server sends it over HTTP. Keeping it one small frozen
record means all of them agree on what "the query failed" means.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

Row = tuple  # one result row: a tuple of int | float | str | bytes | None


class Status(str, Enum):
    """How an execution ended. A `str` enum so it compares equal to the plain strings in JSON/YAML."""

    OK = "ok"  # ran, returned at least one row
    EMPTY = "empty"  # ran, returned no rows
    ERROR = "error"  # the engine raised (message kept verbatim), or the result broke a size cap
    TIMEOUT = "timeout"  # stopped at the deadline (in SQLite or by the process backstop)
    REJECTED = "rejected"  # refused before running: not one read-only statement, too large, bad bytes

    @property
    def executed(self) -> bool:
        """True when the statement ran to completion (the candidate is executable)."""
        return self in (Status.OK, Status.EMPTY)


@dataclass(frozen=True)
class Outcome:
    status: Status
    rows: tuple[Row, ...] = ()
    columns: tuple[str, ...] = ()
    error: str | None = None
    elapsed_s: float = 0.0
    extra: dict = field(default_factory=dict, compare=False)

    @property
    def executed(self) -> bool:
        return self.status.executed

    def to_json(self, max_rows: int | None = None) -> dict:
        """A JSON-safe view; `max_rows` caps the preview (bytes become hex, floats stay floats)."""
        rows = self.rows if max_rows is None else self.rows[:max_rows]
        out = {
            "status": self.status.value,
            "columns": list(self.columns),
            "rows": [[_json_cell(v) for v in r] for r in rows],
            "row_count": len(self.rows),
            "elapsed_s": round(self.elapsed_s, 6),
        }
        if self.error is not None:
            out["error"] = self.error
        return out


def _json_cell(v):
    if isinstance(v, bytes):
        return v.hex()
    if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
        return str(v)
    return v
