"""Held-out execution accuracy of a policy: greedy answers, executed and compared like the reward.

Training-time evaluation uses the very scorer the reward uses, so "accuracy went up" means the same
thing in the metrics log as in `sirius evaluate`.
"""

from __future__ import annotations

from collections import Counter

from rewards.executor import Executor
from rewards.extract import extract_sql
from rewards.scoring import ScoreItem
from data_synthesis.generation import generate


def evaluate_policy(model, tokenizer, items, executor: Executor, *, compare: str = "bird",
                    max_new_tokens: int = 96, batch_size: int = 64, return_predictions: bool = False) -> dict:
    """`eval_exec_acc` (and per-database accuracy) of greedy answers to `items` (TrainItem-like)."""
    if not items:
        raise ValueError("no evaluation items")
    roll = generate(model, tokenizer, [it.prompt for it in items], n=1, temperature=0.0,
                    max_new_tokens=max_new_tokens, batch_size=batch_size)
    return score_answers(items, roll.texts, executor, compare=compare, return_predictions=return_predictions)


def score_answers(items, texts: list[str], executor: Executor, *, compare: str = "bird",
                  return_predictions: bool = False) -> dict:
    """The evaluation figures of one answer text per item, however the answers were generated."""
    preds = [extract_sql(t) for t in texts]
    results = executor.score([ScoreItem(it.db_id, it.gold_sql, p, compare) for it, p in zip(items, preds)])
    per_db: dict[str, list[bool]] = {}
    for it, r in zip(items, results):
        per_db.setdefault(it.db_id, []).append(r.match)
    out = {
        "eval_exec_acc": sum(r.match for r in results) / len(results),
        "eval_n": len(results),
        "eval_format_ok": sum(p is not None for p in preds) / len(preds),
        "eval_status": dict(Counter(r.pred_status for r in results)),
        "eval_per_db": {db: sum(v) / len(v) for db, v in sorted(per_db.items())},
    }
    if return_predictions:
        out["predictions"] = [{"db_id": it.db_id, "gold_sql": it.gold_sql, "pred_sql": p, "match": r.match}
                              for it, p, r in zip(items, preds, results)]
    return out
