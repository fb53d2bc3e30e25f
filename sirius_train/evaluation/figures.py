"""The figures of `sirius benchmark` (and of training-time evaluation with `eval.k`), as pure functions, and
`score_samples`, which scores the samples they are computed from (the executor is passed in).

Per question a model gives one greedy answer and n >= k sampled ones, each scored by the reward's scorer:

- `greedy_ex`: share of questions whose greedy answer matches the gold result;
- `mean_sampled_ex`: mean share of correct samples (the expected EX of one sample);
- `maj_at_k`: the answer of the biggest class of executed results among the first k samples
  (`selector.majority_vote`, the selector's own baseline) is correct;
- `pass_at_k`: the unbiased estimate of "at least one of k samples is correct" from n samples
  (Chen et al. 2021): 1 - C(n - c, k) / C(n, k);
- `selected_ex` (with the lifecycle): the hybrid selector's pick among the samples is correct;
- `headroom = pass_at_k - greedy_ex`: what RL at that temperature could still turn into greedy accuracy.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from math import comb

FIGURES = ("greedy_ex", "mean_sampled_ex", "maj_at_k", "pass_at_k", "headroom", "selected_ex")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that k of the n samples, drawn without replacement, hold at least one of the c correct.

    Example:
        >>> pass_at_k(8, 0, 8), pass_at_k(8, 1, 8), pass_at_k(4, 2, 1), round(pass_at_k(5, 1, 2), 6)
        (0.0, 1.0, 0.5, 0.4)
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


@dataclass(frozen=True)
class QuestionScore:
    """How one model did on one question."""

    id: object
    db_id: str
    bucket: str
    greedy: bool  # the greedy answer is correct
    samples: tuple[bool, ...]  # each sampled answer is correct (n of them)
    majority: bool  # the majority-vote pick among the first k samples is correct
    selected: bool | None = None  # the lifecycle + hybrid selector's pick is correct (None: not run)


def figures(scores: Sequence[QuestionScore], k: int) -> dict:
    """The figures over `scores` (n and every figure; `selected_ex` only when every question has one).

    Example:
        >>> s = [QuestionScore(1, "a", "easy", True, (True, False), True),
        ...      QuestionScore(2, "a", "hard", False, (False, True), False)]
        >>> f = figures(s, 2)
        >>> f["greedy_ex"], f["mean_sampled_ex"], f["maj_at_k"], f["pass_at_k"], f["headroom"]
        (0.5, 0.5, 0.5, 1.0, 0.5)
    """
    n = len(scores)
    if n == 0:
        return {"n": 0}
    out = {"n": n,
           "greedy_ex": sum(s.greedy for s in scores) / n,
           "mean_sampled_ex": sum(sum(s.samples) / len(s.samples) for s in scores) / n,
           "maj_at_k": sum(s.majority for s in scores) / n,
           "pass_at_k": sum(pass_at_k(len(s.samples), sum(s.samples), k) for s in scores) / n}
    out["headroom"] = out["pass_at_k"] - out["greedy_ex"]
    if all(s.selected is not None for s in scores):
        out["selected_ex"] = sum(bool(s.selected) for s in scores) / n
    return out


def breakdown(scores: Sequence[QuestionScore], k: int, bucket_order: Iterable[str] = ()) -> dict:
    """`{"overall", "buckets", "databases"}`, each with `figures`."""
    order = list(bucket_order)
    buckets = sorted({s.bucket for s in scores}, key=lambda b: (order.index(b) if b in order else len(order), b))
    return {"overall": figures(scores, k),
            "buckets": {b: figures([s for s in scores if s.bucket == b], k) for b in buckets},
            "databases": {db: figures([s for s in scores if s.db_id == db], k)
                          for db in sorted({s.db_id for s in scores})}}


def score_samples(executor, golds: list[tuple[str, str]], sample_sql: list[list[str | None]], compare: str,
                  k: int) -> list[tuple[list[bool], bool]]:
    """Per question (db_id, gold SQL): each sample's match by the reward's scorer, and whether the
    selector's `majority_vote` over the execution results of the first k samples picks a correct one."""
    from rewards.outcome import Status
    from rewards.scoring import ScoreItem
    from sirius_train.inference.selector import Ballot, majority_vote

    matches = iter(r.match for r in executor.score([ScoreItem(db, gold, sql, compare)
                                                    for (db, gold), sqls in zip(golds, sample_sql) for sql in sqls]))
    outcomes = iter(executor.execute_many([(db, sql) for (db, _), sqls in zip(golds, sample_sql)
                                           for sql in sqls[:k] if sql is not None]))
    out = []
    for sqls in sample_sql:
        mine = [next(matches) for _ in sqls]
        ballots = []
        for sql in sqls[:k]:
            outcome = None if sql is None else next(outcomes)
            ballots.append(Ballot("sample", "", Status.REJECTED) if outcome is None else
                           Ballot("sample", sql, outcome.status, outcome.rows))
        pick = majority_vote(ballots, compare).index
        out.append((mine, pick is not None and mine[pick]))
    return out
