"""Executing and timing for the official metrics (`sirius_train.evaluation.official_metrics` holds the arithmetic).

Every query runs in the reward's sandbox (`rewards.sandbox`): the official scripts run untrusted SQL with plain
`sqlite3`; we keep their semantics, not their exposure. One exception, on purpose: R-VES *times* a pair on a plain
read-only connection, as the official code does, since timing the sandbox's Python fetch path, authorizer and
progress handler would move the ratio against the side with the larger result; only pairs that already ran (and
matched) in the sandbox are timed, the connection is opened `mode=ro` with `query_only`, no attached databases and
the sandbox's length and heap limits, and the pair's time budget is enforced from another thread.

- `soft_f1_scores`: both results of each pair through the executor, then `official_metrics.soft_f1`.
- `ves_rewards`: for pairs that match (BIRD's set equality), `repeats` alternating timings of the prediction
  and the gold, each on a freshly opened read-only connection and closed inside the timing, as
  evaluation_ves.py times `cursor(); execute; fetchall(); close()` after connecting; the pair may take
  `timeout_s x repeats` in all (its `meta_time_out x iterate_num`), else it scores 0, as a run that fails does
  (text that is not UTF-8 included: sqlite3's default decoding, as there). Serial on purpose: timings taken side
  by side on busy cores measure the neighbours. The clock is a parameter, so tests drive it by hand.
- `ts_matches`: the normalised pair (official_metrics.ts_normalize) must match, in the spider mode,
  on every database of the official test-suite folder (`rewards.suites.Suite(folder=True)`).
- `variant_matches`: EX that must also hold on K variants of each database (`rewards.variants`), as the
  reward with `reward.variants: K` asks.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from rewards.databases import UnknownDatabase, resolve_db_path
from rewards.sandbox import Limits
from rewards.scoring import ScoreItem
from rewards.suites import Suite
from sirius_train.evaluation.official_metrics import VES_REPEATS, soft_f1, time_ratio, ts_normalize, ves_reward

Pair = tuple[str, str, str | None]  # (db_id, gold SQL, predicted SQL or None)
OFFICIAL_MAX_ROWS = 10 ** 12  # the official scripts fetch every row
OFFICIAL_MAX_BYTES = 1 << 30  # ... and cap nothing: a result over 1 GiB of cells would take several GiB in Python
OFFICIAL_TEXT = {"bird": "strict", "spider": "ignore"}  # text that is not UTF-8: BIRD's sqlite3 default fails the
# query; the test-suite evaluator decodes with errors="ignore"


def official_limits(layout: str, timeout_s: float) -> Limits:
    """The sandbox's limits for a file in an official layout (`bird`, `spider`): no row cap, a 1 GiB result cap,
    the official decoding of bad text; any other layout (ours): the reward's limits. The time limit stays per
    statement (docs/METRICS.md says how that differs)."""
    if layout not in OFFICIAL_TEXT:
        return Limits(timeout_s=timeout_s)
    return Limits(timeout_s=timeout_s, max_rows=OFFICIAL_MAX_ROWS, max_result_bytes=OFFICIAL_MAX_BYTES,
                  text_errors=OFFICIAL_TEXT[layout])


def soft_f1_scores(executor, pairs: Sequence[Pair]) -> list[float]:
    """BIRD's Soft-F1 of each pair; a missing, failing or timed-out prediction (or gold) scores 0."""
    queries = [(db, sql) for db, gold, pred in pairs for sql in (gold, pred) if pred is not None]
    outcomes = iter(executor.execute_many(queries))
    scores = []
    for _, _, pred in pairs:
        if pred is None:
            scores.append(0.0)
            continue
        gold_outcome, pred_outcome = next(outcomes), next(outcomes)
        both_ran = gold_outcome.executed and pred_outcome.executed
        scores.append(float(soft_f1(pred_outcome.rows, gold_outcome.rows)) if both_ran else 0.0)
    return scores


def time_pair(db_path: Path, pred_sql: str, gold_sql: str, repeats: int = VES_REPEATS, *, limits: Limits = Limits(),
              clock: Callable[[], float] = time.perf_counter) -> tuple[list[float], list[float]] | None:
    """`repeats` (prediction, gold) timings, alternating as evaluation_ves.py does; None if a run fails or the pair
    runs past `limits.timeout_s x repeats`. Call it for pairs that ran in the sandbox (see the module docstring)."""
    pred_times, gold_times = [], []
    running: list[sqlite3.Connection] = []
    budget = threading.Timer(limits.timeout_s * repeats, lambda: [c.interrupt() for c in running])
    budget.daemon = True
    budget.start()
    try:
        for _ in range(repeats):
            for sql, times in ((pred_sql, pred_times), (gold_sql, gold_times)):
                conn = _timing_connection(db_path, limits)  # connecting is outside the timing, as there
                running[:] = [conn]
                start = clock()
                try:
                    cursor = conn.cursor()
                    cursor.execute(sql)
                    cursor.fetchall()
                    conn.close()
                except (sqlite3.Error, ValueError, MemoryError, OverflowError):
                    conn.close()
                    return None
                times.append(clock() - start)
                if not budget.is_alive():
                    return None
    finally:
        budget.cancel()
    return pred_times, gold_times


def _timing_connection(db_path: Path, limits: Limits) -> sqlite3.Connection:
    """A plain read-only connection with the sandbox's C-level guards and none of its Python callbacks."""
    conn = sqlite3.connect(Path(db_path).resolve().as_uri() + "?mode=ro", uri=True, check_same_thread=False)
    conn.execute("PRAGMA query_only = ON")
    conn.execute(f"PRAGMA hard_heap_limit = {int(limits.heap_limit_bytes)}")
    conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, limits.max_value_bytes)
    conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
    return conn


def ves_reward_of(db_path: Path, pred_sql: str | None, gold_sql: str, matched: bool, repeats: int = VES_REPEATS, *,
                  limits: Limits = Limits(), clock: Callable[[], float] = time.perf_counter) -> float:
    """The R-VES reward of one pair: 0 unless it matched; else the step of its time ratio."""
    if not matched or pred_sql is None:
        return 0
    timings = time_pair(db_path, pred_sql, gold_sql, repeats, limits=limits, clock=clock)
    return 0 if timings is None else ves_reward(time_ratio(*timings))


def ves_rewards(db_root: Path, pairs: Sequence[Pair], matches: Sequence[bool], repeats: int = VES_REPEATS, *,
                limits: Limits = Limits(), clock: Callable[[], float] = time.perf_counter,
                advance: Callable[[], None] = lambda: None) -> list[float]:
    """The R-VES reward of each pair (`matches`: BIRD set equality, from the reward's scorer)."""
    rewards = []
    for (db_id, gold, pred), matched in zip(pairs, matches):
        try:
            path = resolve_db_path(db_root, db_id)
        except UnknownDatabase:
            path = None
        rewards.append(0 if path is None else ves_reward_of(path, pred, gold, matched, repeats, limits=limits,
                                                            clock=clock))
        advance()
    return rewards


def ts_matches(suite_root: Path, pairs: Sequence[Pair], *, keep_distinct: bool = False, workers: int = 2,
                       timeout_s: float = 30.0, on_result=None) -> list[bool]:
    """Test-suite accuracy per pair: `suite_root` in the official layout (`<db_id>/*.sqlite`, the shipped database
    as `<db_id>/<db_id>.sqlite`)."""
    from rewards.executor import Executor

    items = [ScoreItem(db, ts_normalize(gold, keep_distinct), None if pred is None else ts_normalize(pred, keep_distinct),
                       "spider", id=k) for k, (db, gold, pred) in enumerate(pairs)]
    with Executor(suite_root, workers=workers, limits=official_limits("spider", timeout_s),
                  suite=Suite(folder=True)) as executor:
        return [r.match for r in executor.score(items, on_result=on_result)]


def variant_matches(db_root: Path, pairs: Sequence[Pair], matches: Sequence[bool], compare: str, variants: int, *,
                    variants_dir: str | None = None, workers: int = 2, timeout_s: float = 30.0) -> list[bool]:
    """EX on the shipped database and K variants: only pairs that matched on the shipped one are run again."""
    from rewards.executor import Executor

    todo = [k for k, matched in enumerate(matches) if matched]
    items = [ScoreItem(*pairs[k], compare, id=k) for k in todo]
    out = [False] * len(pairs)
    with Executor(db_root, workers=workers, limits=Limits(timeout_s=timeout_s),
                  suite=Suite(variants=variants, cache_dir=variants_dir)) as executor:
        for k, result in zip(todo, executor.score(items)):
            out[k] = result.match
    return out
