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
- rows and bytes fetched are capped; text that is not valid UTF-8 decodes with replacement characters
  (`Limits.text_errors`: or, as the official evaluators do, fails the query or drops the bad bytes);
- one statement per call: a second statement is refused, not silently ignored.

The connection is reused across calls (opening costs more than most Spider/BIRD queries), and it keeps
its shared lock on the file between calls (`PRAGMA locking_mode = EXCLUSIVE`): without it SQLite takes and
drops the lock and re-checks the file for changes around every query, eight system calls that cost a
quarter of a typical Spider query. The file cannot change under an open sandbox; a process that wants
to write it gets "database is locked" until the sandbox is closed (replacing the file by a rename, as
`data_synthesis.demo_dbs` does, is never blocked).
"""

from __future__ import annotations

import math
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from time import monotonic

from rewards.outcome import Outcome, Status

FETCH_ROWS = 512  # rows per fetchmany: the caps are checked between chunks
_SIZED = (str, bytes)  # cells whose length counts toward max_result_bytes (text_factory always gives exact str)


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
    text_errors: str = "replace"  # text that is not UTF-8: "replace" (U+FFFD), "strict" (an error, as BIRD's
    # scripts: sqlite3's default), "ignore" (bad bytes dropped, as the test-suite evaluator)

    def __post_init__(self):
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")
        if self.max_rows < 1 or self.max_sql_chars < 1:
            raise ValueError("max_rows and max_sql_chars must be >= 1")
        if self.text_errors not in _TEXT_FACTORIES:
            raise ValueError(f"text_errors must be one of {sorted(_TEXT_FACTORIES)}, got {self.text_errors!r}")


class DatabaseNotFound(FileNotFoundError):
    """The SQLite file does not exist: a configuration problem, never the candidate's fault."""


# Authorizer action codes that only read. Everything else (writes, DDL, ATTACH, PRAGMA,
# transactions, ...) is denied at prepare time.
_READ_ACTIONS = frozenset(
    {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, getattr(sqlite3, "SQLITE_RECURSIVE", 33)}
)
_DENIED_FUNCTIONS = frozenset({"load_extension", "readfile", "writefile", "edit", "fts3_tokenizer"})
# The authorizer runs for every table, column and function a statement touches (about six times per
# Spider query), so it does one dict lookup; anything not listed is denied.
_VERDICTS = {action: sqlite3.SQLITE_OK for action in _READ_ACTIONS}
_FUNCTION, _DENY = sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_DENY


def _authorize(action, arg1, arg2, db_name, trigger):
    if action == _FUNCTION and arg2.lower() in _DENIED_FUNCTIONS:  # arg2: the function's name
        return _DENY
    return _VERDICTS.get(action, _DENY)


def _decode_text(b: bytes) -> str:
    return b.decode("utf-8", "replace")


def _drop_bad_bytes(b: bytes) -> str:
    return b.decode("utf-8", "ignore")


_TEXT_FACTORIES = {"replace": _decode_text, "strict": str, "ignore": _drop_bad_bytes}  # str: sqlite3's own, in C


def precheck(sql: str, limits: Limits) -> str | None:
    """Why `sql` is refused before it reaches SQLite, or None. Pure and cheap."""
    if not isinstance(sql, str):
        return f"SQL must be a string, got {type(sql).__name__}"
    if not sql or sql.isspace():  # `not sql.strip()` without copying the SQL
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
        self._deadline = math.inf
        self.conn = sqlite3.connect(
            self.path.resolve().as_uri() + "?mode=ro", uri=True, isolation_level=None, check_same_thread=False
        )
        conn = self.conn
        conn.text_factory = _TEXT_FACTORIES[limits.text_errors]
        # Set while PRAGMAs are still allowed; the authorizer below forbids them from here on.
        conn.execute("PRAGMA query_only = ON")
        conn.execute("PRAGMA locking_mode = EXCLUSIVE")  # read-only: holds the shared lock from the first query
        conn.execute("PRAGMA temp_store = MEMORY")
        conn.execute(f"PRAGMA hard_heap_limit = {int(limits.heap_limit_bytes)}")
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, limits.max_value_bytes)
        conn.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, max(limits.max_sql_chars * 4, 1000))
        conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
        conn.set_authorizer(_authorize)
        conn.set_progress_handler(self._past_deadline, limits.progress_every)

    def _past_deadline(self) -> int:
        return 1 if monotonic() > self._deadline else 0

    def interrupt(self) -> None:
        """Abort the running statement from another thread (it ends as TIMEOUT)."""
        self._deadline = 0.0
        self.conn.interrupt()

    def run(self, sql: str, timeout_s: float | None = None) -> Outcome:
        """Execute one read-only statement and type how it ended. Never raises for bad SQL."""
        return Outcome(*self.run_fields(sql, timeout_s))

    def run_fields(self, sql: str, timeout_s: float | None = None) -> tuple:
        """`run` as a plain `(status, rows, columns, error, elapsed_s)` tuple, in `Outcome`'s field order.

        The scorer's hot path reads a prediction's outcome once and drops it: a tuple spares it building
        a frozen dataclass per query."""
        limits = self.limits
        t0 = monotonic()
        reason = precheck(sql, limits)
        if reason is not None:
            return Status.REJECTED, (), (), reason, 0.0
        self._deadline = t0 + (limits.timeout_s if timeout_s is None else timeout_s)
        cur = None
        try:
            cur = self.conn.execute(sql)
            description = cur.description
            if description is None:
                return Status.REJECTED, (), (), "not a query: the statement returns no result columns", monotonic() - t0
            columns = tuple([d[0] for d in description])
            rows, too_large = self._fetch(cur)
        except (sqlite3.Warning, sqlite3.ProgrammingError, ValueError) as e:
            # "You can only execute one statement at a time." / NUL characters / bad parameters
            return Status.REJECTED, (), (), str(e), monotonic() - t0
        except sqlite3.DatabaseError as e:
            elapsed = monotonic() - t0
            msg = str(e)
            if monotonic() >= self._deadline and "interrupt" in msg:
                return Status.TIMEOUT, (), (), f"timed out after {elapsed:.2f}s", elapsed
            if "not authorized" in msg or "authorization denied" in msg:
                return Status.REJECTED, (), (), f"{msg}: only read-only SELECT statements may run", elapsed
            return Status.ERROR, (), (), msg, elapsed
        except (MemoryError, OverflowError) as e:
            return Status.ERROR, (), (), f"{type(e).__name__}: {e}", monotonic() - t0
        finally:
            self._deadline = math.inf
            if cur is not None:
                cur.close()
        elapsed = monotonic() - t0
        if too_large:
            return Status.ERROR, (), columns, too_large, elapsed
        return (Status.OK if rows else Status.EMPTY), rows, columns, None, elapsed

    def _fetch(self, cur: sqlite3.Cursor) -> tuple[tuple, str | None]:
        """Fetch under the row and byte caps; returns (rows, reason-if-too-large)."""
        max_rows, max_bytes = self.limits.max_rows, self.limits.max_result_bytes
        rows: list = []
        nbytes = 0
        while True:
            chunk = cur.fetchmany(FETCH_ROWS)
            rows += chunk
            if len(rows) > max_rows:
                return (), f"result too large: more than {max_rows} rows"
            # 8 bytes per number or NULL, the length of each string or blob (a list sums faster than a generator)
            nbytes += sum([len(v) if v.__class__ in _SIZED else 8 for row in chunk for v in row])
            if nbytes > max_bytes:
                return (), f"result too large: more than {max_bytes} bytes"
            if len(chunk) < FETCH_ROWS:  # a short chunk is the last: no extra call to learn that it was
                return tuple(rows), None

    def close(self) -> None:
        self.conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
