"""`build_curriculum`: one stage's training examples, smoothed over difficulty, short bins filled by mutation.

The loop (SPEC 2.4):

    plan = smoothing.plan_curriculum(rates, budget)             # pure
    while a bin is short and rounds remain:
        parents = smoothing.pick_parents(...) per short bin     # pure, seeded
        new = filler(parents)        # mutate near them, validate by execution, estimate pass rates (I/O)
        rates |= new; plan = plan_curriculum(rates, budget)     # the new examples land wherever they land

`MutationFiller` is the filler the CLI uses; any callable with its signature works (a test passes a fake one
to exercise the loop alone). Mutants land in whatever bin their measured pass rate says, not the bin they
were made for: the report counts both.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from data_synthesis.difficulty import estimate_pass_rates
from data_synthesis.records import Example, check_unique_ids
from data_synthesis.smoothing import (SmoothingConfig, bin_members, bin_of, fill_requests, fraction, pick_parents,
                                      plan_curriculum)
from data_synthesis.sqlgen.mutations import mutate
from data_synthesis.sqlgen.profile import DbProfile, profile_database
from data_synthesis.sqlgen.synthesize import informative
from rewards.compare import results_match
from rewards.databases import resolve_db_path
from rewards.sandbox import Limits
from rewards.scoring import Scorer

# (parent example, the bin it was picked for) -> [(new example, its pass rate)]
Filler = Callable[[list[tuple[Example, int]]], list[tuple[Example, float]]]


@dataclass
class Curriculum:
    examples: list[Example]  # the stage in training order, repeats included
    pass_rates: dict[str, float]  # every example estimated so far (pool and new), by id
    new_examples: list[Example] = field(default_factory=list)  # mutants made to fill short bins
    report: dict = field(default_factory=dict)


EMPTY_GOLD = "empty gold result (any query returning nothing would match it)"


def without_empty_gold(examples: Sequence[Example]) -> tuple[list[Example], int]:
    """The examples whose gold result is known to have rows (validation's `meta.gold_rows`), and how many were not.

    An empty gold makes `[] == []` a full reward for any query that returns nothing: a policy learns to write
    impossible filters. Examples without the figure (never validated here) are kept.

    Example:
        >>> pool = [Example("a", "d", "q", "SELECT 1", meta={"gold_rows": 0}), Example("b", "d", "q", "SELECT 2")]
        >>> [e.id for e in without_empty_gold(pool)[0]], without_empty_gold(pool)[1]
        (['b'], 1)
    """
    kept = [e for e in examples if e.meta.get("gold_rows") != 0]
    return kept, len(examples) - len(kept)


def build_curriculum(examples: Sequence[Example], pass_rates: Mapping[str, float], budget: int, *,
                     config: SmoothingConfig = SmoothingConfig(), seed: int = 0, filler: Filler | None = None,
                     max_fill_rounds: int = 2, overgenerate: float = 2.0, drop_empty_gold: bool = True) -> Curriculum:
    """Select `budget` examples with a flat difficulty histogram (SPEC 2.4); fill short bins with `filler`.

    Args:
        examples: the validated pool.
        pass_rates: `{id: p}` under the current policy (`difficulty.estimate_pass_rates`); pool examples
            without a rate are dropped and counted.
        budget: the stage's number of training examples (repeats included).
        filler: makes and estimates new examples near given parents (`MutationFiller`); None: no filling.
        max_fill_rounds: filling rounds at most (each re-plans with what the previous one added).
        overgenerate: parents picked per missing example (mutants land in other bins too).
        drop_empty_gold: leave out examples whose gold result is empty (`without_empty_gold`), counted in
            the report's `dropped`.

    Example:
        >>> pool = [Example(str(i), "d", f"q{i}", "SELECT 1") for i in range(8)]
        >>> rates = {str(i): p for i, p in enumerate([0, .125, .25, .5, .5, .75, 1, 1])}
        >>> c = build_curriculum(pool, rates, 8)
        >>> len(c.examples), c.report["dropped"]
        (8, {'all correct (p = 1)': 2, 'all wrong (p = 0)': 1})
    """
    check_unique_ids(examples, "curriculum pool")
    n_pool = len(examples)
    examples, empty_gold = without_empty_gold(examples) if drop_empty_gold else (list(examples), 0)
    pool = {e.id: e for e in examples}
    rates = {i: float(p) for i, p in pass_rates.items() if i in pool}
    unrated = len(pool) - len(rates)
    rng = random.Random(f"fill:{seed}")
    new_examples: list[Example] = []
    rounds = []
    plan = plan_curriculum(rates, budget, config, seed)
    for round_index in range(max_fill_rounds if filler is not None else 0):
        requests = fill_requests(plan, config.max_repeats)
        if not requests:
            break
        members = bin_members(rates, config.n_bins)
        parents = [(pool[i], b) for b, n in requests.items()
                   for i in pick_parents(members, b, math.ceil(n * overgenerate), rng)]
        made = [(e, p) for e, p in filler(parents) if e.id not in pool]
        for e, p in made:
            pool[e.id] = e
            rates[e.id] = p
            new_examples.append(e)
        landed = Counter(_bin_name(p, config.n_bins) for _, p in made)
        on_target = sum(bin_of(p, config.n_bins) == e.meta.get("target_bin") for e, p in made)
        rounds.append({"round": round_index, "requested": {str(b): n for b, n in requests.items()},
                       "parents": len(parents), "made": len(made), "landed": dict(landed), "on_target": on_target})
        plan = plan_curriculum(rates, budget, config, seed)
        if not made:
            break
    if any(b.short for b in plan.bins):
        plan = replace(plan, notes=plan.notes + ("gap filling was off" if filler is None else
                       f"gap filling made {len(new_examples)} new examples in {len(rounds)} round(s)",))
    report = {"seed": seed, "config": asdict(config), "pool": n_pool,
              "estimated": len(rates) - len(new_examples), "new_examples": len(new_examples),
              "unique_selected": len(set(plan.selection)), **plan.to_json(), "fill_rounds": rounds}
    if unrated:
        report["dropped"]["no pass rate (not estimated, or gold failed)"] = unrated
    if empty_gold:
        report["dropped"][EMPTY_GOLD] = empty_gold
    chosen = [pool[i] for i in plan.selection]
    return Curriculum(chosen, rates, new_examples, report)


def report_lines(name: str, report: dict) -> list[str]:
    """A stage's curriculum in one line (selected / share per bin), then each note on why something is short.

    Example:
        >>> pool = [Example(str(i), "d", f"q{i}", "SELECT 1") for i in range(5)]
        >>> rates = {"0": .25, "1": .5, "2": .5, "3": .75, "4": .75}
        >>> c = build_curriculum(pool, rates, 12, config=SmoothingConfig(3, k=4))
        >>> for line in report_lines("s1", c.report):
        ...     print(line)
        s1 curriculum: 12 of budget 12 (5 distinct) in 3 bins over k=4 pass rates: 1/4 3 of 4, 2/4 5 of 4, 3/4 4 of 4
        bin [0.00, 0.33) is short by 1 of its share 4: its 1 example fills 3 at max_repeats=3
        1 slot went to the bins with room: [0.33, 0.67) +1
        gap filling was off
    """
    head = (f"{name} curriculum: {report['selected']} of budget {report['budget']} "
            f"({report['unique_selected']} distinct)")
    if "bins" not in report:
        return [f"{head}, drawn uniformly"]
    k = report["config"].get("k")
    bins = ", ".join((" ".join(fraction(p, k) for p in b["attainable"]) if k else
                      f"[{b['lo']:.2f}, {b['hi']:.2f})") + f" {b['selected']} of {b['target']}" for b in report["bins"])
    return [f"{head} in {len(report['bins'])} bins{f' over k={k} pass rates' if k else ''}: {bins}",
            *report.get("notes", [])]


def _bin_name(p: float, n_bins: int) -> str:
    b = bin_of(p, n_bins)
    return f"bin {b}" if b is not None else ("p = 0" if p == 0 else "p = 1")


class MutationFiller:
    """Mutants of the parents, validated by execution, then estimated with the same sampler and settings.

    A mutant is kept when it parses, its question could be updated (or the LLM `writer` wrote one), it is
    new, and its result is informative and differs from its parent's (same rows = same example).

    Args:
        db_root: folder with `<db_id>/<db_id>.sqlite`.
        sampler, k, estimate_options: exactly what estimated the pool (`difficulty.estimate_pass_rates`),
            so the new rates are comparable; pass the same `cache_path` to make filling resumable too.
    """

    def __init__(self, db_root: str | Path, sampler, k: int = 8, *, seed: int = 0, writer=None,
                 limits: Limits = Limits(timeout_s=2.0, max_rows=10_000), **estimate_options):
        self.db_root, self.sampler, self.k, self.writer = Path(db_root), sampler, k, writer
        self.rng = random.Random(f"mutate:{seed}")
        self.estimate_options = estimate_options
        self.scorer = Scorer(self.db_root, limits)
        self._profiles: dict[str, DbProfile] = {}
        self.rejected: Counter = Counter()

    def profile(self, db_id: str) -> DbProfile:
        if db_id not in self._profiles:
            self._profiles[db_id] = profile_database(resolve_db_path(self.db_root, db_id), db_id=db_id)
        return self._profiles[db_id]

    def __call__(self, parents: list[tuple[Example, int]]) -> list[tuple[Example, float]]:
        made: dict[str, Example] = {}
        for parent, target in parents:
            child = self._one(parent, target, taken=set(made))
            if child is not None:
                made[child.gold_sql] = child
        children = list(made.values())
        if self.writer is not None:
            children = self._write_questions(children)
        if not children:
            return []
        rates = estimate_pass_rates(children, self.sampler, self.db_root, self.k, **self.estimate_options)
        return [(c, rates[c.id]) for c in children if c.id in rates]

    def _one(self, parent: Example, target: int, taken: set[str]) -> Example | None:
        gold = self.scorer.gold(parent.db_id, parent.gold_sql)
        for m in mutate(parent.gold_sql, parent.question, self.profile(parent.db_id), self.rng):
            if m.sql in taken or (m.question is None and self.writer is None):
                self.rejected["question not updatable" if m.question is None else "duplicate"] += 1
                continue
            outcome = self.scorer.execute(parent.db_id, m.sql)
            why = informative(outcome) or (
                "same result as parent" if gold.executed and results_match(outcome.rows, gold.rows, "bird") else None)
            if why is not None:
                self.rejected[why] += 1
                continue
            sql_hash = hashlib.sha1(m.sql.encode()).hexdigest()[:8]
            return Example(id=f"{parent.id}~{sql_hash}", db_id=parent.db_id, question=m.question or parent.question,
                           gold_sql=m.sql, evidence=parent.evidence, source="mutation",
                           meta={"parent": parent.id, "mutation": m.kind, "target_bin": target,
                                 "question_from": "mutation", "question_edited": m.question is not None,
                                 "gold_time_s": round(outcome.elapsed_s, 6), "gold_rows": len(outcome.rows)})
        return None

    def _write_questions(self, children: list[Example]) -> list[Example]:
        """LLM questions for the mutants; one the LLM could not word is kept only if a text edit made its own."""
        by_db: dict[str, list[Example]] = {}
        for c in children:
            by_db.setdefault(c.db_id, []).append(c)
        out = []
        for db_id, group in by_db.items():
            for c in self.writer.rewrite(group, resolve_db_path(self.db_root, db_id)):
                if c.meta.get("question_from") == "llm" or c.meta.get("question_edited"):
                    out.append(c)
                else:
                    self.rejected["llm question rejected"] += 1
        return out


def uniform_curriculum(examples: Sequence[Example], pass_rates: Mapping[str, float], budget: int, *,
                       seed: int = 0, drop_empty_gold: bool = True) -> Curriculum:
    """The ablation baseline: `budget` examples drawn uniformly from the pool, whatever their difficulty.

    Example:
        >>> pool = [Example(str(i), "d", f"q{i}", "SELECT 1") for i in range(4)]
        >>> c = uniform_curriculum(pool, {str(i): 0.5 for i in range(4)}, 6)
        >>> len(c.examples), len({e.id for e in c.examples}), c.report["mode"]
        (6, 4, 'uniform')
    """
    check_unique_ids(examples, "curriculum pool")
    rng = random.Random(f"uniform:{seed}")
    n_pool = len(examples)
    pool, empty_gold = without_empty_gold(examples) if drop_empty_gold else (list(examples), 0)
    chosen: list[Example] = []
    while len(chosen) < budget and pool:
        chosen += rng.sample(pool, min(len(pool), budget - len(chosen)))
    rates = {e.id: float(pass_rates[e.id]) for e in pool if e.id in pass_rates}
    return Curriculum(chosen, rates, [], {"mode": "uniform", "seed": seed, "pool": n_pool, "budget": budget,
                                          "selected": len(chosen), "unique_selected": len({e.id for e in chosen}),
                                          "dropped": {EMPTY_GOLD: empty_gold} if empty_gold else {}})
