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
                    max_new_tokens: int = 96, batch_size: int = 64, return_predictions: bool = False,
                    k: int = 0, temperature: float = 1.0, seed: int = 0, multi_turn=None, progress=None) -> dict:
    """`eval_exec_acc` (and per-database accuracy) of greedy answers to `items` (TrainItem-like).

    With `k`: also k samples per item at `temperature` -> `eval_pass_at_k`, `eval_maj_at_k`,
    `eval_mean_sampled_ex`, `eval_headroom` (the figures of `sirius benchmark`), drawn from a forked RNG so
    evaluating never moves the training's random stream. With `multi_turn` = (ProbeLimits, probe(db_id, sql)):
    episodes instead of answers (`data_synthesis.multiturn`), plus `eval_turns_mean` and `eval_probe_share`.
    `progress(m)` hears of the answers generated (`len(items) * (1 + k)` in all).
    """
    if not items:
        raise ValueError("no evaluation items")
    roll = _answers(model, tokenizer, items, multi_turn, n=1, temperature=0.0, max_new_tokens=max_new_tokens,
                    batch_size=batch_size, progress=progress)
    out = score_answers(items, roll.texts, executor, compare=compare, return_predictions=return_predictions or k > 0,
                        preds=roll.answers)
    if roll.probes is not None:
        out.update({"eval_turns_mean": float(roll.probes.float().mean()),
                    "eval_probe_share": float((roll.probes > 0).float().mean())})
    if k:
        greedy = [p["match"] for p in (out["predictions"] if return_predictions else out.pop("predictions"))]
        out.update(_sampled_figures(model, tokenizer, items, executor, greedy, compare=compare, k=k,
                                    temperature=temperature, max_new_tokens=max_new_tokens, batch_size=batch_size,
                                    seed=seed, multi_turn=multi_turn, progress=progress))
    return out


def _answers(model, tokenizer, items, multi_turn, progress=None, **sampling):
    """The rollout of `items`: answers, or episodes when `multi_turn` = (limits, probe(db_id, sql)) is given."""
    prompts = [it.prompt for it in items]
    if multi_turn is None:
        return generate(model, tokenizer, prompts, progress=progress, **sampling)
    from data_synthesis.multiturn import generate_episodes

    limits, probe = multi_turn
    roll = generate_episodes(model, tokenizer, prompts, lambda i, sql: probe(items[i].db_id, sql), limits, **sampling)
    if progress is not None:  # episodes report once, when all are done
        progress(len(prompts) * sampling.get("n", 1))
    return roll


def score_answers(items, texts: list[str], executor: Executor, *, compare: str = "bird",
                  return_predictions: bool = False, preds: list[str | None] | None = None) -> dict:
    """The evaluation figures of one answer text per item, however the answers were generated (`preds`: their SQL
    when already read off, as for episodes, whose answer is their final turn's)."""
    preds = [extract_sql(t) for t in texts] if preds is None else preds
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


def _sampled_figures(model, tokenizer, items, executor: Executor, greedy, *, compare: str, k: int, temperature: float,
                     max_new_tokens: int, batch_size: int, seed: int, multi_turn=None, progress=None) -> dict:
    import torch

    from sirius_train.evaluation.figures import QuestionScore, figures, score_samples

    with torch.random.fork_rng():
        torch.manual_seed(seed)
        roll = _answers(model, tokenizer, items, multi_turn, progress, n=k, temperature=temperature,
                        max_new_tokens=max_new_tokens, batch_size=batch_size)
    answers = roll.answers if roll.answers is not None else [extract_sql(t) for t in roll.texts]
    sample_sql = [answers[i * k:(i + 1) * k] for i in range(len(items))]
    scored = score_samples(executor, [(it.db_id, it.gold_sql) for it in items], sample_sql, compare, k)
    f = figures([QuestionScore(i, it.db_id, "", g, tuple(m), maj)
                 for i, (it, g, (m, maj)) in enumerate(zip(items, greedy, scored))], k)
    return {"eval_k": k, "eval_temperature": temperature, "eval_mean_sampled_ex": f["mean_sampled_ex"],
            "eval_maj_at_k": f["maj_at_k"], "eval_pass_at_k": f["pass_at_k"], "eval_headroom": f["headroom"]}
