"""verl's custom reward function: `compute_score(data_source, solution_str, ground_truth, extra_info)`.

Configure verl with `reward.custom_reward_function.path=<this file>` and `.name=compute_score`.
The parquet rows written by `data_synthesis.export` carry what it needs: `ground_truth` is the gold
SQL, `extra_info` has `db_id` (and optionally `db_root`, `compare`). Keyword arguments come from
`reward.custom_reward_function.reward_kwargs` (`db_root`, `compare`, `timeout_s`).

Scoring runs in-process, one cached `Scorer` per thread (connections and gold results stay open
across calls).
"""

from __future__ import annotations

import os
import threading

from rewards.extract import extract_sql
from rewards.sandbox import Limits
from rewards.scoring import ScoreItem, Scorer

_local = threading.local()


def _scorer(db_root: str, timeout_s: float) -> Scorer:
    cache = getattr(_local, "scorers", None)
    if cache is None:
        cache = _local.scorers = {}
    key = (db_root, timeout_s)
    if key not in cache:
        cache[key] = Scorer(db_root, Limits(timeout_s=timeout_s))
    return cache[key]


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> dict:
    """Execution reward of one decoded answer. Returns `{"score": reward, "acc": 1.0 | 0.0}`.

    `acc` is correctness alone (not the shaped score): verl's dynamic sampling filters groups on it.
    """
    extra = dict(extra_info or {})
    if "db_id" not in extra:
        raise KeyError("extra_info must contain 'db_id' (write the parquet with data_synthesis.export)")
    db_root = kwargs.get("db_root") or extra.get("db_root") or os.environ.get("SIRIUS_DB_ROOT")
    if not db_root:
        raise ValueError("no database root: set reward_kwargs.db_root, extra_info.db_root or SIRIUS_DB_ROOT")
    item = ScoreItem(db_id=extra["db_id"], gold_sql=str(ground_truth), pred_sql=extract_sql(solution_str),
                     compare=extra.get("compare") or kwargs.get("compare") or "bird")
    result = _scorer(str(db_root), float(kwargs.get("timeout_s", Limits.timeout_s))).score(item)
    return {"score": result.reward, "acc": float(result.match)}
