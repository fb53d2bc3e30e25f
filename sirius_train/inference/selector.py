"""Confidence-gated hybrid selection: which candidate's answer to return (SPEC section 4).

All of it is pure: executed candidates in, a `Selection` (with every score that decided it) out. The
optional LLM judge is passed in as a function, so the math never does I/O.

1. *Admission.* Candidates that returned rows vote. Empty results vote only when there is nothing
   else, or when they are a strict majority of the pool: an empty result is what a wrong literal, a
   wrong join and a wrong filter all produce, so a plurality of "no rows" is mostly a pile of
   unrelated failures, while a majority of generators agreeing on "no rows" is consensus. This is the
   one admission rule; it gains a question on each open pool and costs no database on either
   (docs/benchmarks/selector.md). Nothing else takes an executed candidate out of the vote: a rule
   that overrides an agreeing majority on a plausible story (the former grounding rule did) fails on
   the next pool.
2. *Stage 1, result level.* Admitted candidates form result-equivalence classes (the same
   `rewards.compare.results_match` as the reward, so selection and evaluation agree on "same answer").
   - S_maj, tuple-level consensus: a class's own votes plus partial credit from every other admitted
     candidate whose rows overlap (row Dice; rows compared as the compare mode compares them: column
     order counts under `bird`, not under `spider`), weighted by `partial_weight`, all divided by the
     pool size N. Shipped at weight 0 (votes alone): on the two open pools no positive weight gains on
     pool B and each one that gains on pool A in one equivalence loses in the other
     (docs/benchmarks/selector.md); the weight is an option, not a fitted constant.
   - S_rm, pairwise preference (optional): a judge compares representatives of the top classes, every
     pair in both orders to cancel position bias; S_rm is the fraction of comparisons a class won.
   - S_coarse = S_maj + judge_weight * S_rm.
3. *Stage 2, gate.* When the best two classes are within `margin` of each other, the LLM-free
   structural reranker decides among all classes within `margin` of the best: the class whose
   structural signature was produced by the most distinct provenance groups (sources) among the
   candidates that executed wins; ties fall back to S_coarse, then to input order. Off by default
   (`rerank="never"`): measured where provenance repeats (the open pools' systems grouped into model
   families) it lost questions on pool A and netted none on pool B. `rerank="auto"` opens it only when
   provenance groups are shared (some source gave several candidates); see `_reranks`.
4. The winner is the winning class's earliest member (input order is the caller's ranking of sources).

`majority_vote` is the baseline: executed candidates (rows or empty) grouped into the same classes,
the biggest class wins, a tie goes to the class holding the earliest candidate in input order.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from rewards.compare import CompareMode, parse_mode, results_match
from rewards.outcome import Status
from sirius_train.inference.structure import Signature, signature


@dataclass(frozen=True)
class Ballot:
    """One candidate as the selector sees it: where it came from, its SQL, how it ran."""

    source: str  # provenance group: the generator that produced it
    sql: str
    status: Status
    rows: tuple = ()

    @property
    def executed(self) -> bool:
        return Status(self.status).executed


RERANK_MODES = ("auto", "always", "never")


@dataclass(frozen=True)
class SelectorConfig:
    """Constants of the hybrid selector; the defaults are argued for in docs/INFERENCE.md."""

    compare: str = "bird"  # result equivalence used to form classes ("bird" | "spider")
    partial_weight: float = 0.0  # weight of partial (overlapping-rows) agreement in S_maj; 0: votes alone
    margin: float = 0.1  # gate: classes within this much of the best are near-tied
    rerank: str = "never"  # structural reranker: never | auto (only when some source gave >= 2 candidates) | always
    judge_weight: float = 0.25  # S_coarse = S_maj + judge_weight * S_rm
    judge_top_k: int = 3  # classes the judge compares (k*(k-1) calls, both orders)

    def __post_init__(self):
        parse_mode(self.compare)
        if not 0.0 <= self.partial_weight <= 1.0:
            raise ValueError(f"partial_weight must be in [0, 1], got {self.partial_weight}")
        if self.margin < 0:
            raise ValueError(f"margin must be >= 0 (0 turns the structural reranker off), got {self.margin}")
        if self.rerank not in RERANK_MODES:
            raise ValueError(f"rerank must be one of {RERANK_MODES}, got {self.rerank!r}")
        if self.judge_weight < 0 or self.judge_top_k < 2:
            raise ValueError(f"need judge_weight >= 0 and judge_top_k >= 2, got {self.judge_weight}, "
                             f"{self.judge_top_k}")


@dataclass
class ResultClass:
    """Candidates whose results are equivalent, with the scores the selector gave them."""

    members: list[int]  # indices into the ballots, input order
    rows: tuple
    s_maj: float = 0.0
    s_rm: float = 0.0  # already weighted: judge_weight * fraction of pairwise comparisons won
    support: int = 0  # distinct provenance groups behind the class's best-supported signature
    signature: Signature | None = None

    @property
    def s_coarse(self) -> float:
        return self.s_maj + self.s_rm

    def to_json(self, ballots: Sequence[Ballot]) -> dict:
        return {"members": self.members, "sources": [ballots[i].source for i in self.members],
                "row_count": len(self.rows), "s_maj": round(self.s_maj, 6), "s_rm": round(self.s_rm, 6),
                "s_coarse": round(self.s_coarse, 6), "support": self.support,
                "signature": self.signature.describe() if self.signature else None}


@dataclass
class Selection:
    """The winner and why: `decided_by` is consensus, structure, majority, only_one or no_executable."""

    index: int | None  # chosen ballot; None when the pool is empty
    score: float
    decided_by: str
    margin: float | None = None  # S_coarse lead of the best class over the second; None when there is no second
    classes: list[ResultClass] = field(default_factory=list)  # best first

    def to_json(self, ballots: Sequence[Ballot]) -> dict:
        return {"index": self.index, "score": round(self.score, 6), "decided_by": self.decided_by,
                "margin": None if self.margin is None else round(self.margin, 6),
                "classes": [c.to_json(ballots) for c in self.classes]}


# A judge answers which of two (sql, rows) answers is better: 0 for the first, 1 for the second, None if it
# cannot tell. `sirius_train.inference.judge.PairwiseJudge` asks an LLM.
Judge = Callable[[tuple[str, tuple], tuple[str, tuple]], int | None]


def result_classes(ballots: Sequence[Ballot], indices: Sequence[int], compare: str = "bird") -> list[ResultClass]:
    """Group `indices` into result-equivalence classes (first member's rows represent the class).

    Example:
        >>> b = [Ballot("a", "q1", Status.OK, ((1, "x"),)), Ballot("b", "q2", Status.OK, (("x", 1),)),
        ...      Ballot("c", "q3", Status.OK, ((1, "x"), (1, "x")))]
        >>> [c.members for c in result_classes(b, [0, 1, 2], "bird")]
        [[0, 2], [1]]
        >>> [c.members for c in result_classes(b, [0, 1, 2], "spider")]  # columns may permute; duplicates count
        [[0, 1], [2]]
    """
    buckets: dict[object, list[ResultClass]] = defaultdict(list)
    classes: list[ResultClass] = []
    for i in indices:
        rows = ballots[i].rows
        bucket = buckets[_invariant(rows)]
        for cls in bucket:
            if results_match(rows, cls.rows, compare):
                cls.members.append(i)
                break
        else:
            cls = ResultClass([i], rows)
            bucket.append(cls)
            classes.append(cls)
    return classes


def majority_vote(ballots: Sequence[Ballot], compare: str = "bird") -> Selection:
    """Baseline: the biggest class of executed results wins; ties go to the earliest candidate.

    Example:
        >>> b = [Ballot("a", "q1", Status.OK, ((1,),)), Ballot("b", "q2", Status.OK, ((2,),)),
        ...      Ballot("c", "q3", Status.OK, ((2,),)), Ballot("d", "q4", Status.ERROR)]
        >>> majority_vote(b).index
        1
    """
    executed = [i for i, b in enumerate(ballots) if b.executed]
    if not executed:
        return _unverified(ballots)
    classes = result_classes(ballots, executed, compare)
    n = len(ballots)
    for cls in classes:
        cls.s_maj = len(cls.members) / n
    classes.sort(key=lambda c: (-len(c.members), c.members[0]))
    return Selection(classes[0].members[0], classes[0].s_maj, "majority", _lead(classes), classes)


def admitted(ballots: Sequence[Ballot]) -> list[int]:
    """Indices that vote: every result with rows, plus the empty ones when they are all there is or a
    strict majority.

    Example:
        >>> ok, empty = Ballot("a", "q", Status.OK, ((1,),)), Ballot("b", "q", Status.EMPTY)
        >>> admitted([ok, empty, empty]), admitted([ok, ok, empty, empty]), admitted([empty, Ballot("c", "q", Status.ERROR)])
        ([0, 1, 2], [0, 1], [0])
    """
    rows = [i for i, b in enumerate(ballots) if b.status == Status.OK]
    empty = [i for i, b in enumerate(ballots) if b.status == Status.EMPTY]
    if not rows or len(empty) * 2 > len(ballots):
        return sorted(rows + empty)
    return rows


def consensus_scores(classes: Sequence[ResultClass], n: int, partial_weight: float,
                     compare: str = "bird") -> list[float]:
    """S_maj of each class: (own votes + partial_weight * sum of row-Dice overlaps with other votes) / n.
    Rows overlap when they are the same row under `compare`: under `bird` a row with its columns in
    another order is another answer, so it earns no partial credit; under `spider` it is the same one.

    Example:
        >>> a, b, c = ResultClass([0, 1], ((1,), (2,))), ResultClass([2], ((1,), (3,))), ResultClass([3], ((9,),))
        >>> consensus_scores([a, b, c], 4, 0.0)
        [0.5, 0.25, 0.25]
        >>> consensus_scores([a, b, c], 4, 1.0)
        [0.625, 0.5, 0.25]
        >>> swapped = ResultClass([0], ((1, "x"),)), ResultClass([1], (("x", 1),))
        >>> consensus_scores(swapped, 2, 1.0, "bird"), consensus_scores(swapped, 2, 1.0, "spider")
        ([0.5, 0.5], [1.0, 1.0])
    """
    keys = [_row_keys(cls.rows, compare) for cls in classes]
    scores = []
    for i, cls in enumerate(classes):
        partial = sum(len(other.members) * _dice(keys[i], keys[j])
                      for j, other in enumerate(classes) if j != i) if partial_weight else 0.0
        scores.append((len(cls.members) + partial_weight * partial) / n)
    return scores


def preference_scores(ballots: Sequence[Ballot], classes: Sequence[ResultClass], judge: Judge,
                      top_k: int) -> list[float]:
    """S_rm: for the `top_k` classes, the fraction of pairwise comparisons won, each pair asked both ways.

    A pair counts only when both orders gave a verdict: with one order missing, a judge that always
    names the first (or second) side would score its position, not the answers.

    Example:
        >>> b = [Ballot("a", "SELECT 1", Status.OK, ((1,),)), Ballot("b", "SELECT 2", Status.OK, ((2,),))]
        >>> cs = [ResultClass([0], ((1,),)), ResultClass([1], ((2,),))]
        >>> prefers_two = lambda x, y: 0 if x[1] == ((2,),) else 1
        >>> preference_scores(b, cs, prefers_two, top_k=2)
        [0.0, 1.0]
        >>> preference_scores(b, cs, lambda x, y: 0, top_k=2)  # always "the first one": position bias cancels
        [0.5, 0.5]
        >>> preference_scores(b, cs, lambda x, y: 0 if x[1] == ((1,),) else None, top_k=2)  # one order only
        [0.0, 0.0]
    """
    k = min(top_k, len(classes))
    wins = [0.0] * len(classes)
    asked = [0] * len(classes)
    reps = [(ballots[c.members[0]].sql, c.rows) for c in classes]
    for a in range(k):
        for b in range(a + 1, k):
            forward, backward = judge(reps[a], reps[b]), judge(reps[b], reps[a])
            if forward is None or backward is None:
                continue
            wins[a if forward == 0 else b] += 1
            wins[b if backward == 0 else a] += 1
            asked[a] += 2
            asked[b] += 2
    return [wins[i] / asked[i] if asked[i] else 0.0 for i in range(len(classes))]


def structural_support(ballots: Sequence[Ballot]) -> dict[Signature, set[str]]:
    """For each structural signature, the distinct provenance groups whose candidates with it executed
    (a shape that only ever failed to run is no evidence for a result).

    Example:
        >>> b = [Ballot("a", "SELECT x FROM t", Status.OK, ((1,),)), Ballot("b", "SELECT x FROM t", Status.ERROR),
        ...      Ballot("c", "SELECT x FROM t", Status.EMPTY)]
        >>> sorted(structural_support(b)[signature("SELECT x FROM t")])
        ['a', 'c']
    """
    support: dict[Signature, set[str]] = defaultdict(set)
    for ballot in ballots:
        if not ballot.executed:
            continue
        sig = signature(ballot.sql)
        if sig is not None:
            support[sig].add(ballot.source)
    return support


def select(ballots: Sequence[Ballot], config: SelectorConfig = SelectorConfig(), judge: Judge | None = None) -> Selection:
    """The hybrid selector (see the module docstring); deterministic when `judge` is None.

    Example:
        >>> b = [Ballot("spec", "SELECT a FROM t", Status.OK, ((1,),)),
        ...      Ballot("gen", "SELECT a FROM t WHERE x = 'Y' ORDER BY b", Status.OK, ((2,),)),
        ...      Ballot("spec", "SELECT a FROM t WHERE x = 'y' ORDER BY b", Status.OK, ((3,),))]
        >>> s = select(b, SelectorConfig(rerank="auto"))  # a three-way tie: the shape two generators agree on wins
        >>> s.index, s.decided_by
        (1, 'structure')
    """
    voters = admitted(ballots)
    if not voters:
        return _unverified(ballots)
    n = len(ballots)
    classes = result_classes(ballots, voters, config.compare)
    for cls, s in zip(classes, consensus_scores(classes, n, config.partial_weight, config.compare)):
        cls.s_maj = s
    classes.sort(key=lambda c: (-c.s_maj, c.members[0]))
    if judge is not None and len(classes) > 1 and config.judge_weight > 0:
        for cls, s in zip(classes, preference_scores(ballots, classes, judge, config.judge_top_k)):
            cls.s_rm = config.judge_weight * s
        classes.sort(key=lambda c: (-c.s_coarse, c.members[0]))
    support = structural_support(ballots)
    for cls in classes:
        cls.signature, cls.support = _best_signature(ballots, cls.members, support)
    if len(classes) == 1:
        return Selection(classes[0].members[0], classes[0].s_coarse, "only_one", None, classes)
    lead = _lead(classes)
    winner, decided_by = classes[0], "consensus"
    if lead < config.margin and _reranks(ballots, config.rerank):
        best = classes[0].s_coarse
        tied = [c for c in classes if best - c.s_coarse < config.margin]
        winner = max(tied, key=lambda c: (c.support, c.s_coarse, -c.members[0]))
        decided_by = "structure"
        classes.remove(winner)
        classes.insert(0, winner)
    return Selection(winner.members[0], winner.s_coarse, decided_by, lead, classes)


def explain(selection: Selection, ballots: Sequence[Ballot], config: SelectorConfig = SelectorConfig()) -> str:
    """One sentence on why the winner won, for traces and `sirius infer` output.

    Example:
        >>> b = [Ballot("spec", "SELECT 1", Status.OK, ((1,),)), Ballot("gen", "SELECT 1", Status.OK, ((1,),)),
        ...      Ballot("spec", "SELECT 2", Status.OK, ((2,),))]
        >>> explain(select(b), b)
        'consensus: 2 of 3 candidates (gen, spec) return this result; S_coarse 0.67 leads the next class by 0.33'
        >>> explain(select(b, SelectorConfig(rerank="auto")), b, SelectorConfig(rerank="auto")).endswith("(gate 0.1)")
        True
    """
    if selection.index is None or not selection.classes:
        return "no candidate executed; returning the first one with SQL, unverified" if selection.index is not None \
            else "empty pool"
    return _decision(selection, ballots, config)


def _decision(selection: Selection, ballots: Sequence[Ballot], config: SelectorConfig) -> str:
    winner = selection.classes[0]
    sources = ", ".join(sorted({ballots[i].source for i in winner.members}))
    head = f"{len(winner.members)} of {len(ballots)} candidates ({sources}) return this result"
    if selection.decided_by == "only_one":
        return f"only one answer: {head}"
    lead = f"S_coarse {winner.s_coarse:.2f}" + (f" (judge {winner.s_rm:.2f})" if winner.s_rm else "")
    if selection.decided_by == "structure":
        return (f"structure: near tie (lead {selection.margin:.2f} < gate {config.margin:g}); its shape "
                f"[{winner.signature.describe() if winner.signature else '?'}] is shared by {winner.support} "
                f"source(s); {head}")
    if selection.margin is None:
        return f"{selection.decided_by}: {head}; no other result"
    gate = f" (gate {config.margin:g})" if config.rerank != "never" else ""  # a shut gate decided nothing
    return f"{selection.decided_by}: {head}; {lead} leads the next class by {selection.margin:.2f}{gate}"


def _unverified(ballots: Sequence[Ballot]) -> Selection:
    """Nothing executed: the first candidate that has SQL at all (a guess beats no answer), score 0."""
    index = next((i for i, b in enumerate(ballots) if b.sql), 0 if ballots else None)
    return Selection(index, 0.0, "no_executable")


def _reranks(ballots: Sequence[Ballot], mode: str) -> bool:
    """`auto`: only when provenance groups are shared. When every candidate is its own source, "distinct
    groups behind a shape" is just a count of SQL shapes that ignores their results -- weaker evidence
    than the result vote the gate is trying to break."""
    if mode != "auto":
        return mode == "always"
    return len({b.source for b in ballots}) < len(ballots)


def _lead(classes: Sequence[ResultClass]) -> float | None:
    """S_coarse lead of the best class over the second; None when there is no second (JSON has no Infinity)."""
    if len(classes) < 2:
        return None
    return classes[0].s_coarse - classes[1].s_coarse


def _best_signature(ballots, members, support) -> tuple[Signature | None, int]:
    best: tuple[Signature | None, int] = (None, 0)
    for i in members:
        sig = signature(ballots[i].sql)
        if sig is not None and len(support[sig]) > best[1]:
            best = (sig, len(support[sig]))
    return best


def _invariant(rows: tuple) -> frozenset:
    """A key equal for results that are equivalent in either mode (same rows up to order, duplicates and
    column order), so only candidates in one bucket need the exact comparison."""
    return frozenset(frozenset(row) for row in rows)


def _row_keys(rows: tuple, compare: str) -> frozenset:
    """The rows as `compare` tells rows apart: as they are (`bird`), or as multisets of cells (`spider`,
    which accepts any column permutation)."""
    if parse_mode(compare) is CompareMode.BIRD:
        return frozenset(rows)
    return frozenset(_unordered_row(row) for row in rows)


def _unordered_row(row: tuple) -> tuple:
    return tuple(sorted(row, key=lambda v: (str(type(v)), str(v))))


def _dice(a: frozenset, b: frozenset) -> float:
    if not a and not b:
        return 1.0
    return 2 * len(a & b) / (len(a) + len(b))
