"""Score one (prediction, gold) pair: execute both, compare, reward -- with the caches that make it fast.

`Scorer` is the state one process keeps: an LRU of open sandboxes (opening a database costs more than
most queries) and an LRU of gold results (a gold query is scored against many candidates -- 8 to 16
samples per prompt in RL, 18 systems per question in the real pools -- and is run once).
It is used in-process for small jobs and inside each executor worker process.

With a `Suite` (`rewards.suites`: K built variants, or an official test-suite folder), a prediction that
matches on its database must also match on every database of the suite; gold results there are cached
the same way, and only a prediction that matched so far runs on the next database.
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rewards.compare import parse_mode, results_match
from rewards.databases import UnknownDatabase, resolve_db_path
from rewards.outcome import Outcome, Status
from rewards.reward import RewardTable, execution_reward
from rewards.sandbox import Limits, Sandbox
from rewards.suites import Suite
from rewards.variants import VariantError

NO_SQL = "no SQL found in the answer"


@dataclass(frozen=True)
class ScoreItem:
    """One pair to score. `pred_sql=None` means no SQL could be extracted (a format failure)."""

    db_id: str
    gold_sql: str
    pred_sql: str | None
    compare: str = "bird"
    id: Any = None


@dataclass(frozen=True)
class ScoreResult:
    id: Any
    match: bool
    reward: float
    pred_status: str
    gold_status: str
    pred_error: str | None = None
    gold_error: str | None = None
    format_ok: bool = True
    pred_elapsed_s: float = field(default=0.0, compare=False)  # timing is not part of the answer

    def to_json(self) -> dict:
        """The `sirius score` line: id, match, statuses, and errors only when present."""
        d = asdict(self)
        return {k: v for k, v in d.items() if v is not None}


class _LRU(OrderedDict):
    def __init__(self, capacity: int, on_evict=None):
        super().__init__()
        self.capacity = capacity
        self.on_evict = on_evict

    def get_fresh(self, key):
        value = self.get(key)
        if value is not None:
            self.move_to_end(key)
        return value

    def put(self, key, value):
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.capacity:
            _, old = self.popitem(last=False)
            if self.on_evict is not None:
                self.on_evict(old)


class Scorer:
    """Executes and scores SQL against databases under `db_root`, caching connections and gold results."""

    def __init__(self, db_root: str | Path, limits: Limits = Limits(), table: RewardTable = RewardTable(),
                 max_connections: int = 32, gold_cache_size: int = 8192, suite: Suite = Suite()):
        self.db_root = Path(db_root)
        self.limits = limits
        self.table = table
        self.suite = suite
        self._suites: dict[str, list[tuple[Path, bool]]] = {}  # db_id -> [(path, is one of our variants)]
        self._sandboxes = _LRU(max_connections, on_evict=lambda sb: sb.close())
        self._gold = _LRU(gold_cache_size)
        self._rewards = {(s, m): execution_reward(s, m, table) for s in Status for m in (False, True)}
        self.gold_hits = 0
        self.gold_misses = 0

    def execute(self, db_id: str, sql: str) -> Outcome:
        """Run `sql` on `db_id`'s database; an unknown database is a typed error, not an exception."""
        return self._sandbox(db_id).run(sql)

    def _sandbox(self, db_id: str) -> Sandbox | _Unavailable:
        sandbox = self._sandboxes.get_fresh(db_id)
        if sandbox is None:
            try:
                sandbox = Sandbox(resolve_db_path(self.db_root, db_id), self.limits)
            except (UnknownDatabase, FileNotFoundError) as e:
                return _Unavailable(str(e))  # not cached: the database may be deployed later
            self._sandboxes.put(db_id, sandbox)
        return sandbox

    def _sandbox_at(self, path: Path) -> Sandbox | _Unavailable:
        """The sandbox of a suite database (keyed by its path: a db_id never contains a '/')."""
        key = str(path)
        sandbox = self._sandboxes.get_fresh(key)
        if sandbox is None:
            try:
                sandbox = Sandbox(path, self.limits)
            except FileNotFoundError as e:
                return _Unavailable(str(e))
            self._sandboxes.put(key, sandbox)
        return sandbox

    def suite_paths(self, db_id: str) -> list[Path]:
        """The suite's databases for `db_id` (none without a suite, or when they cannot be built: a warning)."""
        return [path for path, _ in self._suite(db_id)]

    def _suite(self, db_id: str) -> list[tuple[Path, bool]]:
        paths = self._suites.get(db_id)
        if paths is None:
            paths = []
            if self.suite:
                try:
                    db_path = resolve_db_path(self.db_root, db_id)
                    paths = [(p, False) for p in self.suite.folder_paths(db_path)]
                    paths += [(p, True) for p in self.suite.variant_paths(db_path)]
                except UnknownDatabase:
                    return []  # the database itself is missing: scoring reports that
                except (VariantError, OSError) as e:
                    print(f"warning: {db_id}: scored on its own database only: {e}", file=sys.stderr)
                    paths = []
            self._suites[db_id] = paths
        return paths

    def gold(self, db_id: str, sql: str, path: Path | None = None) -> Outcome:
        """The gold's outcome on `db_id`'s database (or on the suite database at `path`), cached."""
        key = (db_id if path is None else str(path), sql)
        cached = self._gold.get_fresh(key)
        if cached is not None:
            self.gold_hits += 1
            return cached
        self.gold_misses += 1
        outcome = self.execute(db_id, sql) if path is None else self._sandbox_at(path).run(sql)
        if outcome.status is not Status.TIMEOUT:  # a timeout may be load, not the query: retry next time
            self._gold.put(key, outcome)
        return outcome

    def has_gold(self, db_id: str, sql: str) -> bool:
        return (db_id, sql) in self._gold

    def score(self, item: ScoreItem) -> ScoreResult:
        return ScoreResult(item.id, *self.score_fields(item.db_id, item.gold_sql, item.pred_sql, item.compare))

    def score_fields(self, db_id: str, gold_sql: str, pred_sql: str | None, compare: str = "bird") -> tuple:
        """`score` as a plain tuple of `ScoreResult`'s fields after `id`: what a worker process sends back
        (a tenth of the pickling cost of the dataclass), and no dataclass built per pair."""
        mode = parse_mode(compare)
        gold = self.gold(db_id, gold_sql)
        gold_status = _TEXT[gold.status]
        if pred_sql is None:
            return False, self.table.format_failure, _TEXT[Status.REJECTED], gold_status, NO_SQL, gold.error, False, 0.0
        status, rows, _, error, elapsed = self._sandbox(db_id).run_fields(pred_sql)
        match = gold.status in _EXECUTED and status in _EXECUTED and results_match(rows, gold.rows, mode, gold_sql)
        if match and self.suite:
            match = self._matches_suite(db_id, gold_sql, pred_sql, mode)
        return (match, self._rewards[status, match], _TEXT[status], gold_status, error, gold.error, True,
                round(elapsed, 6))

    def _matches_suite(self, db_id: str, gold_sql: str, pred_sql: str, mode) -> bool:
        """Whether the prediction also matches the gold on every suite database that decides the gold: one where
        the gold runs (a timeout or a size cap there is no fault of the answer) and, on our variants, where its
        answer does not hang on a tie (`rewards.ties`; an official test suite is matched as its evaluator does).
        On a variant that lost the question's premise (the gold answered on the shipped database, answers nothing
        here: no rows, or only NULLs and zeros -- `max()` of no vote from 'CA'), a prediction that answers nothing
        too agrees with it (`ORDER BY ... LIMIT 1` of no vote: no row)."""
        for path, variant in self._suite(db_id):
            gold = self.gold(db_id, gold_sql, path)
            if gold.status not in _EXECUTED or (variant and not self._decides(path, gold_sql)):
                continue
            status, rows, *_ = self._sandbox_at(path).run_fields(pred_sql)
            if status not in _EXECUTED:
                return False
            if not results_match(rows, gold.rows, mode, gold_sql) and not (
                    variant and _answers_nothing(rows) and _answers_nothing(gold.rows)
                    and not _answers_nothing(self.gold(db_id, gold_sql).rows)):
                return False
        return True

    def _decides(self, path: Path, gold_sql: str) -> bool:
        """True when the gold's answer on the database at `path` is decided by its meaning, not by a tie (cached)."""
        key = (str(path), gold_sql, "decides")
        decided = self._gold.get_fresh(key)
        if decided is None:
            from rewards.ties import UNDETERMINED, tie_probes, tied

            probes = tie_probes(gold_sql)
            sandbox = self._sandbox_at(path)
            decided = probes != UNDETERMINED and not any(
                tied(probe, outcome.rows) for probe in probes
                for outcome in [sandbox.run(probe.sql)] if outcome.status in _EXECUTED)
            self._gold.put(key, decided)
        return decided

    def close(self) -> None:
        for sandbox in self._sandboxes.values():
            sandbox.close()
        self._sandboxes.clear()


class _Unavailable:
    """Stands in for the sandbox of a database that cannot be opened: every query on it is that ERROR."""

    def __init__(self, error: str):
        self.error = error

    def run(self, sql: str) -> Outcome:
        return Outcome(*self.run_fields(sql), extra={"unknown_db": True})

    def run_fields(self, sql: str) -> tuple:
        return Status.ERROR, (), (), self.error, 0.0


def _answers_nothing(rows) -> bool:
    """No rows, or rows of NULLs and zeros only: what an aggregate or a lookup gives where nothing qualifies."""
    return all(v is None or v == 0 for row in rows for v in row)


# Per-pair lookups: an Enum property (`.value`, `.executed`) costs ten times a dict lookup.
_TEXT = {s: s.value for s in Status}
_EXECUTED = frozenset(s for s in Status if s.executed)
