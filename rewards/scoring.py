"""Score one (prediction, gold) pair: execute both, compare, reward -- with the caches that make it fast.

`Scorer` is the state one process keeps: an LRU of open sandboxes (opening a database costs more than
most queries) and an LRU of gold results (a gold query is scored against many candidates -- 8 to 16
samples per prompt in RL, 18 systems per question in the real pools -- and is run once).
It is used in-process for small jobs and inside each executor worker process.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rewards.compare import parse_mode, results_match
from rewards.databases import UnknownDatabase, resolve_db_path
from rewards.outcome import Outcome, Status
from rewards.reward import RewardTable, execution_reward
from rewards.sandbox import Limits, Sandbox

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
                 max_connections: int = 32, gold_cache_size: int = 8192):
        self.db_root = Path(db_root)
        self.limits = limits
        self.table = table
        self._sandboxes = _LRU(max_connections, on_evict=lambda sb: sb.close())
        self._gold = _LRU(gold_cache_size)
        self.gold_hits = 0
        self.gold_misses = 0

    def execute(self, db_id: str, sql: str) -> Outcome:
        """Run `sql` on `db_id`'s database; an unknown database is a typed error, not an exception."""
        sandbox = self._sandboxes.get_fresh(db_id)
        if sandbox is None:
            try:
                sandbox = Sandbox(resolve_db_path(self.db_root, db_id), self.limits)
            except (UnknownDatabase, FileNotFoundError) as e:
                return Outcome(Status.ERROR, error=str(e), extra={"unknown_db": True})
            self._sandboxes.put(db_id, sandbox)
        return sandbox.run(sql)

    def gold(self, db_id: str, sql: str) -> Outcome:
        key = (db_id, sql)
        cached = self._gold.get_fresh(key)
        if cached is not None:
            self.gold_hits += 1
            return cached
        self.gold_misses += 1
        outcome = self.execute(db_id, sql)
        if outcome.status is not Status.TIMEOUT:  # a timeout may be load, not the query: retry next time
            self._gold.put(key, outcome)
        return outcome

    def has_gold(self, db_id: str, sql: str) -> bool:
        return (db_id, sql) in self._gold

    def score(self, item: ScoreItem) -> ScoreResult:
        mode = parse_mode(item.compare)
        gold = self.gold(item.db_id, item.gold_sql)
        if item.pred_sql is None:
            return ScoreResult(item.id, False, self.table.format_failure, Status.REJECTED.value, gold.status.value,
                               pred_error=NO_SQL, gold_error=gold.error, format_ok=False)
        pred = self.execute(item.db_id, item.pred_sql)
        match = gold.executed and pred.executed and results_match(pred.rows, gold.rows, mode, item.gold_sql)
        return ScoreResult(item.id, match, execution_reward(pred.status, match, self.table), pred.status.value,
                           gold.status.value, pred_error=pred.error, gold_error=gold.error,
                           pred_elapsed_s=round(pred.elapsed_s, 6))

    def close(self) -> None:
        for sandbox in self._sandboxes.values():
            sandbox.close()
        self._sandboxes.clear()
