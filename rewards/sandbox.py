"""One hardened, read-only SQLite connection: `Sandbox(path).run(sql) -> Outcome`.

A model's SQL is untrusted input. Every layer below refuses a different way out, so that no single
mistake lets a query write, escape, hang or exhaust the machine:

- the file is opened with `mode=ro` and `PRAGMA query_only=ON`;
- an authorizer allows reading only (SELECT, READ, RECURSIVE, FUNCTION minus `load_extension`):
  ATTACH, writes, DDL, PRAGMA and transactions are refused while the statement is *prepared*;
- SQLite limits cap string/blob size (`zeroblob(1e9)` fails at once), SQL length and expression depth;
  `PRAGMA hard_heap_limit` caps the engine's memory in this process; temp storage stays in memory, so
  no temp file is ever written;
- a progress handler enforces a wall-clock deadline *inside* SQLite (the process-level backstop for a
  statement that stops calling it lives in `executor`);
- rows and bytes fetched are capped; text that is not valid UTF-8 decodes with replacement characters;
- one statement per call: a second statement is refused, not silently ignored.

The connection is reused across calls (opening costs more than most Spider/BIRD queries).
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from rewards.outcome import Outcome, Status


@dataclass(frozen=True)
class Limits:
    """Resource caps of one execution. Defaults suit Spider/BIRD-sized databases."""

    timeout_s: float = 5.0  # wall clock per statement, enforced inside SQLite
    max_rows: int = 100_000  # more rows than this -> error (a result this large is never a good answer)
    max_result_bytes: int = 64 << 20  # approximate bytes of fetched cells
    max_sql_chars: int = 100_000  # longer SQL is rejected before SQLite sees it
    max_value_bytes: int = 16 << 20  # SQLITE_LIMIT_LENGTH: largest string/blob a query may build
    heap_limit_bytes: int = 1 << 30  # PRAGMA hard_heap_limit (process-wide; it can only be lowered)
    progress_every: int = 2_000  # VM instructions between deadline checks

    def __post_init__(self):
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")
        if self.max_rows < 1 or self.max_sql_chars < 1:
            raise ValueError("max_rows and max_sql_chars must be >= 1")


class DatabaseNotFound(FileNotFoundError):
    """The SQLite file does not exist: a configuration problem, never the candidate's fault."""


# Authorizer action codes that only read. Everything else (writes, DDL, ATTACH, PRAGMA,
# transactions, ...) is denied at prepare time.
_READ_ACTIONS = frozenset(
    {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, getattr(sqlite3, "SQLITE_RECURSIVE", 33)}
)
_DENIED_FUNCTIONS = frozenset({"load_extension", "readfile", "writefile", "edit", "fts3_tokenizer"})


def _authorize(action, arg1, arg2, db_name, trigger):
    if action == sqlite3.SQLITE_FUNCTION and (arg2 or "").lower() in _DENIED_FUNCTIONS:
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK if action in _READ_ACTIONS else sqlite3.SQLITE_DENY


def _decode_text(b: bytes) -> str:
    return b.decode("utf-8", "replace")


def precheck(sql: str, limits: Limits) -> str | None:
    """Why `sql` is refused before it reaches SQLite, or None. Pure and cheap."""
    if not isinstance(sql, str):
        return f"SQL must be a string, got {type(sql).__name__}"
    if not sql.strip():
        return "empty SQL"
    if len(sql) > limits.max_sql_chars:
        return f"SQL is {len(sql)} characters, over the limit of {limits.max_sql_chars}"
    if "\x00" in sql:
        return "SQL contains a NUL byte"
    return None


class Sandbox:
    """A read-only, deadline-bounded connection to one SQLite file."""

    def __init__(self, path: str | Path, limits: Limits = Limits()):
        self.path = Path(path)
        self.limits = limits
        if not self.path.is_file():
            raise DatabaseNotFound(f"database file not found: {self.path}")
        self._deadline = float("inf")
        self.conn = sqlite3.connect(
            self.path.resolve().as_uri() + "?mode=ro", uri=True, isolation_level=None, check_same_thread=False
        )
        conn = self.conn
        conn.text_factory = _decode_text
        # Set while PRAGMAs are still allowed; the authorizer below forbids them from here on.
        conn.execute("PRAGMA query_only = ON")
        conn.execute("PRAGMA temp_store = MEMORY")
        conn.execute(f"PRAGMA hard_heap_limit = {int(limits.heap_limit_bytes)}")
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, limits.max_value_bytes)
        conn.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, max(limits.max_sql_chars * 4, 1000))
        conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
        conn.set_authorizer(_authorize)
        conn.set_progress_handler(self._past_deadline, limits.progress_every)

    def _past_deadline(self) -> int:
        return 1 if time.monotonic() > self._deadline else 0

    def interrupt(self) -> None:
        """Abort the running statement from another thread (it ends as TIMEOUT)."""
        self._deadline = 0.0
        self.conn.interrupt()

    def run(self, sql: str, timeout_s: float | None = None) -> Outcome:
        """Execute one read-only statement and type how it ended. Never raises for bad SQL."""
        limits = self.limits
        t0 = time.monotonic()
        reason = precheck(sql, limits)
        if reason is not None:
            return Outcome(Status.REJECTED, error=reason)
        self._deadline = t0 + (timeout_s if timeout_s is not None else limits.timeout_s)
        cur = None
        try:
            cur = self.conn.execute(sql)
            if cur.description is None:
                return Outcome(Status.REJECTED, error="not a query: the statement returns no result columns",
                               elapsed_s=time.monotonic() - t0)
            columns = tuple(d[0] for d in cur.description)
            rows, too_large = self._fetch(cur)
        except (sqlite3.Warning, sqlite3.ProgrammingError, ValueError) as e:
            # "You can only execute one statement at a time." / NUL characters / bad parameters
            return Outcome(Status.REJECTED, error=str(e), elapsed_s=time.monotonic() - t0)
        except sqlite3.DatabaseError as e:
            elapsed = time.monotonic() - t0
            msg = str(e)
            if time.monotonic() >= self._deadline and "interrupt" in msg:
                return Outcome(Status.TIMEOUT, error=f"timed out after {elapsed:.2f}s", elapsed_s=elapsed)
            if "not authorized" in msg or "authorization denied" in msg:
                return Outcome(Status.REJECTED, error=f"{msg}: only read-only SELECT statements may run",
                               elapsed_s=elapsed)
            return Outcome(Status.ERROR, error=msg, elapsed_s=elapsed)
        except (MemoryError, OverflowError) as e:
            return Outcome(Status.ERROR, error=f"{type(e).__name__}: {e}", elapsed_s=time.monotonic() - t0)
        finally:
            self._deadline = float("inf")
            if cur is not None:
                cur.close()
        elapsed = time.monotonic() - t0
        if too_large:
            return Outcome(Status.ERROR, error=too_large, columns=columns, elapsed_s=elapsed)
        return Outcome(Status.OK if rows else Status.EMPTY, rows=tuple(rows), columns=columns, elapsed_s=elapsed)

    def _fetch(self, cur: sqlite3.Cursor) -> tuple[list, str | None]:
        """Fetch under the row and byte caps; returns (rows, reason-if-too-large)."""
        max_rows, max_bytes = self.limits.max_rows, self.limits.max_result_bytes
        rows: list = []
        nbytes = 0
        while chunk := cur.fetchmany(512):
            rows.extend(chunk)
            if len(rows) > max_rows:
                return [], f"result too large: more than {max_rows} rows"
            nbytes += sum(len(v) if isinstance(v, (str, bytes)) else 8 for r in chunk for v in r)
            if nbytes > max_bytes:
                return [], f"result too large: more than {max_bytes} bytes"
        return rows, None

    def close(self) -> None:
        self.conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
