"""verl's custom reward function: `compute_score(data_source, solution_str, ground_truth, extra_info)`.

Configure verl with `reward.custom_reward_function.path=<this file>` and `.name=compute_score`.
Callers that hold a whole batch (verl's `BatchRewardManager`) can use `compute_score_batch`: one call,
one HTTP round trip per 256 answers.
The parquet rows written by `data_synthesis.export` carry what it needs: `ground_truth` is the gold
SQL, `extra_info` has `db_id` (and optionally `db_root`, `compare`). Keyword arguments come from
`reward.custom_reward_function.reward_kwargs`.

Where the scoring runs:
- on a reward server, when `reward_url` (kwarg) or `SIRIUS_REWARD_URL` (env) is set -- one URL or
  several, comma-separated. One `RewardClient` per process; `reward_token` / `SIRIUS_REWARD_TOKEN` for
  a server started with `--token`; `reward_timeout_s` bounds each HTTP request. The server's own
  `--timeout` bounds each query, and an unreachable server raises after bounded retries (it never hangs).
- otherwise in-process, one cached `Scorer` per thread (connections and gold results stay open across
  calls): needs `db_root` (kwarg, `extra_info.db_root` or `SIRIUS_DB_ROOT`); `timeout_s` bounds each query;
  `variants` (K, default 0) also requires a match on K variant databases (`rewards.variants`, cached under
  `variants_dir` or the default cache). A server applies its own `--variants`.
Both give the same numbers: the server runs the same `Scorer`.
"""

from __future__ import annotations

import os
import sys
import threading

from rewards.extract import extract_sql
from rewards.sandbox import Limits
from rewards.scoring import ScoreItem, ScoreResult, Scorer
from rewards.suites import Suite

_local = threading.local()
_clients: dict = {}
_clients_lock = threading.Lock()


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> dict:
    """Execution reward of one decoded answer. Returns `{"score": reward, "acc": 1.0 | 0.0}`.

    `acc` is correctness alone (not the shaped score): verl's dynamic sampling filters groups on it.
    """
    return compute_score_batch([data_source], [solution_str], [ground_truth], [extra_info], **kwargs)[0]


def compute_score_batch(data_sources, solution_strs, ground_truths, extra_infos=None, *, read_answer=extract_sql,
                        **kwargs) -> list[dict]:
    """`compute_score` for a whole batch (verl's `BatchRewardManager` calls it with these names). `read_answer(text)`:
    the SQL of one decoded response (`sirius_train/verl_backend/episode_reward.py` reads episodes)."""
    if extra_infos is None:
        extra_infos = [None] * len(solution_strs)
    if not len(solution_strs) == len(ground_truths) == len(extra_infos):
        raise ValueError(f"batch lengths differ: {len(solution_strs)} answers, {len(ground_truths)} gold SQL, "
                         f"{len(extra_infos)} extra_info")
    items = [_item(read_answer(answer), gold, extra, kwargs)
             for answer, gold, extra in zip(solution_strs, ground_truths, extra_infos)]
    url = kwargs.get("reward_url") or os.environ.get("SIRIUS_REWARD_URL")
    if url:
        _local.extra_infos = extra_infos  # for the in-process fallback, which runs in this thread (`_InProcess`)
        try:
            results = _client(str(url), kwargs).score(items)
        finally:
            _local.extra_infos = None
    else:
        results = _score_in_process(items, extra_infos, kwargs)
    return [_verl_score(r) for r in results]


def _item(pred_sql, ground_truth, extra_info, kwargs) -> ScoreItem:
    extra = dict(extra_info or {})
    if "db_id" not in extra:
        raise KeyError("extra_info must contain 'db_id' (write the parquet with data_synthesis.export)")
    return ScoreItem(db_id=extra["db_id"], gold_sql=str(ground_truth), pred_sql=pred_sql,
                     compare=extra.get("compare") or kwargs.get("compare") or "bird")


def _verl_score(result: ScoreResult) -> dict:
    return {"score": result.reward, "acc": float(result.match)}


def _score_in_process(items: list[ScoreItem], extra_infos, kwargs) -> list[ScoreResult]:
    results = []
    for item, extra in zip(items, extra_infos):
        db_root = kwargs.get("db_root") or (extra or {}).get("db_root") or os.environ.get("SIRIUS_DB_ROOT")
        if not db_root:
            raise ValueError("no database root: set reward_kwargs.db_root, extra_info.db_root or SIRIUS_DB_ROOT "
                             "(or reward_kwargs.reward_url / SIRIUS_REWARD_URL to score on a reward server)")
        suite = Suite(variants=int(kwargs.get("variants") or 0), cache_dir=kwargs.get("variants_dir"))
        results.append(_scorer(str(db_root), float(kwargs.get("timeout_s", Limits.timeout_s)), suite).score(item))
    return results


def _scorer(db_root: str, timeout_s: float, suite: Suite = Suite()) -> Scorer:
    cache = getattr(_local, "scorers", None)
    if cache is None:
        cache = _local.scorers = {}
    key = (db_root, timeout_s, suite)
    if key not in cache:
        cache[key] = Scorer(db_root, Limits(timeout_s=timeout_s), suite=suite)
    return cache[key]


def _client(urls: str, kwargs):
    """One scorer on the servers per process and settings (keyed by pid: a forked child must not share sockets),
    falling back to in-process scoring on `db_root` as the local trainer does (`reward_fallback`, default on)."""
    from rewards.client import FallbackScorer, RewardClient

    token = kwargs.get("reward_token") or os.environ.get("SIRIUS_REWARD_TOKEN")
    timeout_s = float(kwargs.get("reward_timeout_s", 120.0))
    fallback = str(kwargs.get("reward_fallback", True)).lower() not in ("false", "0")
    key = (os.getpid(), urls, token, timeout_s, fallback)
    with _clients_lock:
        if key not in _clients:
            _clients[key] = FallbackScorer(RewardClient(urls, token=token, timeout_s=timeout_s),
                                           lambda: _InProcess(kwargs), fallback=fallback,
                                           warn=lambda message: print(f"warning: {message}", file=sys.stderr))
        return _clients[key]


class _InProcess:
    """The fallback behind a reward server: the same sandboxed scoring `compute_score` does without one, with
    each item's `extra_info` (verl keeps `db_root` there) from the batch this thread is scoring."""

    def __init__(self, kwargs):
        self.kwargs = kwargs

    def score(self, items: list[ScoreItem]) -> list[ScoreResult]:
        extra_infos = getattr(_local, "extra_infos", None) or [None] * len(items)
        return _score_in_process(items, extra_infos, self.kwargs)
