"""The reward server's core, without HTTP: admission control, scoring and execution on an `Executor`.

The edge (`rewards.server`) only parses, calls one method here and maps the result; every refusal is
a `ServiceError` subclass raised from here and turned into an HTTP status in one place there.

Backpressure: the service admits a request only if its items fit in a bounded backlog
(`max_queue_items` items accepted and not yet answered). Otherwise it refuses at once with
`Overloaded` (HTTP 429) and a Retry-After estimated from the recent throughput -- a full server never
piles work up; the client backs off or tries another server.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from rewards.databases import UnknownDatabase, resolve_db_path
from rewards.executor import Executor
from rewards.metrics import ServerMetrics
from rewards.protocol import ExecuteRequest, ExecuteResponse, HealthResponse, ScoreRequest
from rewards.scoring import ScoreResult
from rewards.sandbox import Limits
from rewards.suites import Suite

RATE_WINDOW_S = 10.0
SHUTTING_DOWN = "the server is shutting down; send the request to another server"
RETRY_AFTER_CAP_S = 30
DB_CHECK_TTL_S = 5.0  # a database found on disk is not looked up again for this long


@dataclass(frozen=True)
class ServerConfig:
    """Everything `sirius reward-server` decides. Invariants are checked here, once."""

    db_root: Path
    workers: int = 2  # sandboxed worker processes; about one per core
    timeout_s: float = 5.0  # per statement, inside SQLite; the process backstop adds a grace
    max_queue_items: int = 16_384  # items admitted and not yet answered; beyond it: 429 + Retry-After
    max_batch_items: int = 4_096  # items in one /v1/score request; beyond it: 413
    max_body_bytes: int = 32 << 20  # request body; beyond it: 413
    token: str | None = field(default=None, repr=False)  # bearer token required on /v1/* when set
    chunk_size: int = 64  # items per worker message (see Executor)
    variants: int = 0  # a prediction must also match on K variants of its database (rewards.variants)
    variants_dir: str | None = None  # where variants are cached (None: rewards.variants.default_cache_dir())

    def __post_init__(self):
        object.__setattr__(self, "db_root", Path(self.db_root))
        if not self.db_root.is_dir():
            raise ValueError(f"--db-root {self.db_root} is not a directory; point it at the folder holding "
                             "<db_id>/<db_id>.sqlite")
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1 for a server (got {self.workers}): the process backstop "
                             "is what keeps a hung query from freezing every client")
        if self.max_batch_items < 1 or self.max_queue_items < self.max_batch_items:
            raise ValueError(f"need 1 <= max_batch_items <= max_queue_items, got {self.max_batch_items} and "
                             f"{self.max_queue_items}: a batch larger than the queue could never be admitted")
        if self.chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {self.chunk_size}")
        if self.variants < 0:
            raise ValueError(f"variants must be >= 0, got {self.variants}")
        if self.max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes must be >= 1024, got {self.max_body_bytes}")
        if self.token is not None and not self.token.strip():
            raise ValueError("token must be a non-empty string (or None for no authentication)")
        Limits(timeout_s=self.timeout_s)  # same validation as the sandbox's

    def settings(self) -> dict:
        """The resolved settings to print at start-up (the token is never shown)."""
        return {"db_root": str(self.db_root), "workers": self.workers, "timeout_s": self.timeout_s,
                "max_queue_items": self.max_queue_items, "max_batch_items": self.max_batch_items,
                "max_body_bytes": self.max_body_bytes, "auth": "bearer token" if self.token else "none",
                "chunk_size": self.chunk_size, "variants": self.variants}


class ServiceError(Exception):
    """A request the service refuses; `kind` is the machine-readable error type sent to the client."""

    kind = "service_error"


class Overloaded(ServiceError):
    kind = "overloaded"

    def __init__(self, message: str, retry_after_s: int):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class BatchTooLarge(ServiceError):
    kind = "too_large"


class DatabaseNotFound(ServiceError):
    kind = "unknown_db"


class ShuttingDown(ServiceError):
    kind = "shutting_down"


def retry_after_s(backlog_items: int, items_per_s: float, cap_s: int = RETRY_AFTER_CAP_S) -> int:
    """Whole seconds until the backlog has likely drained (HTTP Retry-After), between 1 and `cap_s`.

    Example:
        >>> retry_after_s(1000, 400.0), retry_after_s(10, 1e6), retry_after_s(10, 0.0)
        (3, 1, 30)
    """
    if items_per_s <= 0:
        return cap_s
    return max(1, min(cap_s, math.ceil(backlog_items / items_per_s)))


class RateMeter:
    """Items finished per second over a sliding window; `now` is passed in, so it is exact to test.

    Example:
        >>> meter = RateMeter(window_s=10.0)
        >>> meter.add(200, now=1.0); meter.add(300, now=5.0)
        >>> meter.rate(now=10.0), meter.rate(now=12.0)
        (50.0, 30.0)
    """

    def __init__(self, window_s: float = RATE_WINDOW_S):
        self.window_s = window_s
        self._events: deque[tuple[float, int]] = deque()
        self._lock = threading.Lock()

    def add(self, n: int, now: float) -> None:
        with self._lock:
            self._events.append((now, n))

    def rate(self, now: float) -> float:
        with self._lock:
            while self._events and self._events[0][0] <= now - self.window_s:
                self._events.popleft()
            return sum(n for _, n in self._events) / self.window_s


class RewardService:
    """Scores batches and runs single queries on an executor, admitting only what fits the backlog."""

    def __init__(self, executor: Executor, config: ServerConfig):
        self.executor = executor
        self.config = config
        self._meter = RateMeter()
        self._admitted = 0
        self._lock = threading.Lock()
        self._closing = False
        self._found_dbs: dict[str, float] = {}  # db_id -> when its file was last seen
        self.metrics = ServerMetrics(self.stats)

    @classmethod
    def start(cls, config: ServerConfig) -> "RewardService":
        """Start the worker processes the config asks for."""
        executor = Executor(config.db_root, workers=config.workers, limits=Limits(timeout_s=config.timeout_s),
                            chunk_size=config.chunk_size,
                            suite=Suite(variants=config.variants, cache_dir=config.variants_dir))
        return cls(executor, config)

    async def score(self, request: ScoreRequest) -> list[ScoreResult]:
        n = len(request.items)
        if n > self.config.max_batch_items:
            raise BatchTooLarge(f"{n} items in one request, over the limit of {self.config.max_batch_items}; "
                                "split the batch (RewardClient does) or raise --max-batch")
        items = request.score_items()
        self._check_databases([item.db_id for item in items])
        if self.config.variants:  # built off the event loop (a large database takes seconds); cached after
            await asyncio.to_thread(self.executor.prepare_suites, [item.db_id for item in items])
        with self._admit(n):
            results = await asyncio.wrap_future(self._submit(self.executor.submit_score, items))
        self._answered("score", n)
        return results

    async def execute(self, request: ExecuteRequest) -> ExecuteResponse:
        self._check_databases([request.db_id])
        with self._admit(1):
            (outcome,) = await asyncio.wrap_future(self._submit(self.executor.submit_execute_many,
                                                                [(request.db_id, request.sql)]))
        self._answered("execute", 1)
        return ExecuteResponse.from_outcome(outcome, request.max_rows)

    def health(self) -> HealthResponse:
        s = self.stats()
        return HealthResponse(db_root=str(self.config.db_root.resolve()),
                              status="shutting_down" if self._closing else "ok", workers=s["workers"],
                              queue_depth=s["admitted_items"], max_queue_items=s["max_queue_items"],
                              worker_restarts=s["restarts"], variants=self.config.variants)

    def stats(self) -> dict:
        with self._lock:
            admitted = self._admitted
        return {**self.executor.stats(), "admitted_items": admitted, "max_queue_items": self.config.max_queue_items}

    def close(self) -> None:
        """Refuse new work, finish what was admitted, stop the workers."""
        self._closing = True
        self.executor.close()

    # ------------------------------------------------------------------ internals
    def _check_databases(self, db_ids: list[str]) -> None:
        """Refuse the whole request, before any work, if a db_id is not a database under --db-root.

        A missing database is a deployment problem, not a wrong answer: scoring it as reward 0 would
        silently poison training, so the request fails loudly instead. A database found on disk is trusted
        for `DB_CHECK_TTL_S`; one removed within that window still fails, as typed per-item errors.
        """
        positions: dict[str, list[int]] = {}
        for position, db_id in enumerate(db_ids):
            positions.setdefault(db_id, []).append(position)
        problems = []
        now = time.monotonic()
        for db_id, at in positions.items():  # one file check per distinct database, not per item
            if now - self._found_dbs.get(db_id, -math.inf) < DB_CHECK_TTL_S:
                continue  # seen moments ago: a file stat per database per request is a visible share of the CPU
            try:
                resolve_db_path(self.config.db_root, db_id)
                self._found_dbs[db_id] = now
            except UnknownDatabase as e:
                problems.append((str(e), at))
        if problems:
            detail = "; ".join(f"{reason} (item{'s' if len(at) > 1 else ''} {', '.join(map(str, at[:5]))}"
                               f"{', ...' if len(at) > 5 else ''})" for reason, at in problems)
            raise DatabaseNotFound(f"{detail}. Every db_id must name <db_id>/<db_id>.sqlite under the server's "
                                   "--db-root; nothing in this request was run")

    @contextmanager
    def _admit(self, n: int):
        with self._lock:
            if self._closing:
                raise ShuttingDown(SHUTTING_DOWN)
            backlog = self._admitted
            if backlog and backlog + n > self.config.max_queue_items:
                wait = retry_after_s(backlog, self._items_per_s())
                raise Overloaded(f"queue full: {backlog} items waiting, {n} more would exceed --max-queue "
                                 f"{self.config.max_queue_items}; retry in {wait}s or use another server", wait)
            self._admitted += n
        try:
            yield
        finally:
            with self._lock:
                self._admitted -= n

    def _submit(self, submit, work):
        try:
            return submit(work)
        except RuntimeError:  # closed between admission and submission
            raise ShuttingDown(SHUTTING_DOWN) from None

    def _answered(self, endpoint: str, n: int) -> None:
        self._meter.add(n, time.monotonic())
        self.metrics.items.labels(endpoint).inc(n)

    def _items_per_s(self) -> float:
        """Recent throughput; with no history, the pessimistic floor (every item running to its timeout)."""
        rate = self._meter.rate(time.monotonic())
        return rate if rate > 0 else self.config.workers / self.config.timeout_s
