"""`synthesize(db_path, n, seed)`: n executable, non-empty, distinct (question, SQL) examples over any SQLite file.

Draw a rule from `rules.RULES` by weight, build its tree, render it canonically, and keep it only if its SQL
and its question are both new (one question never maps to two queries) and its result is informative when run in the read-only sandbox (it executes, returns rows, and is not a lone
NULL or zero). A database that cannot support `n` distinct such queries (empty tables, one column) yields
fewer, and `Synthesizer.stats` says why. Questions come from the rule's template; with a `QuestionWriter`
(an LLM behind an OpenAI-compatible endpoint) they are rewritten, keeping the template when the LLM's answer
is unusable.
"""

from __future__ import annotations

import hashlib
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from data_synthesis.records import Example
from data_synthesis.sqlgen.profile import DbProfile, profile_database
from data_synthesis.sqlgen.rules import RULES, Context, Rule
from data_synthesis.sqlgen.trees import render
from rewards.outcome import Outcome
from rewards.sandbox import Limits, Sandbox


@dataclass
class SynthesisStats:
    attempts: int = 0
    kept: int = 0
    rejected: Counter = field(default_factory=Counter)  # reason -> count
    by_rule: Counter = field(default_factory=Counter)  # rule -> kept


def informative(outcome: Outcome) -> str | None:
    """Why a gold result teaches nothing (None when it is fine): failed, empty, or a lone NULL/0.

    Example:
        >>> from rewards.outcome import Status
        >>> informative(Outcome(Status.OK, rows=((0,),))), informative(Outcome(Status.OK, rows=((3,),)))
        ('degenerate result (a single NULL or 0)', None)
    """
    if not outcome.executed:
        too_large = (outcome.error or "").startswith("result too large")
        return "result too large" if too_large else f"gold {outcome.status.value}"
    if not outcome.rows:
        return "empty result"
    if all(v is None for row in outcome.rows for v in row) or outcome.rows == ((0,),):
        return "degenerate result (a single NULL or 0)"
    return None


def example_id(prefix: str, db_id: str, sql: str) -> str:
    """A stable id from the database and the SQL (same query -> same id across runs).

    Example:
        >>> example_id("synth", "shop", "SELECT 1")
        'synth-shop-42364a017b'
    """
    return f"{prefix}-{db_id}-{hashlib.sha1(sql.encode()).hexdigest()[:10]}"


class Synthesizer:
    """Synthesizes examples over one database; keeps the profile and an open sandbox between calls.

    Args:
        db_path: the SQLite file.
        rules: the weighted rule table (default `RULES`).
        limits: sandbox limits for validating each candidate (a gold query slower than this is not kept).
        writer: optional `QuestionWriter` (e.g. `LLMQuestionWriter`) that rewrites template questions.
        joins: False keeps every query on one table (small models, first curricula).
        where_scale: scales the rules' chance of an optional WHERE filter (nested queries and set operations
            always filter); 0 gives questions without literals to copy (a model too small to copy values
            from the question still has schema linking and SQL constructs to learn).
    """

    def __init__(self, db_path: str | Path, *, db_id: str | None = None, rules: tuple[Rule, ...] = RULES,
                 limits: Limits = Limits(timeout_s=2.0, max_rows=10_000), writer=None, joins: bool = True,
                 where_scale: float = 1.0):
        if not 0.0 <= where_scale <= 1.0:
            raise ValueError(f"where_scale must be in [0, 1], got {where_scale}")
        self.path = Path(db_path)
        if not self.path.is_file():
            raise FileNotFoundError(f"database file not found: {self.path}")
        self.profile: DbProfile = profile_database(self.path, db_id=db_id)
        self.rules, self.limits, self.writer, self.joins, self.where_scale = rules, limits, writer, joins, where_scale
        self.stats = SynthesisStats()

    def run(self, n: int, seed: int = 0, *, avoid: set[str] = frozenset(), max_attempts: int | None = None
            ) -> list[Example]:
        """`n` new examples (fewer if the database cannot support them), never repeating a SQL in `avoid`."""
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        db_id = self.profile.db_id
        ctx = Context(self.profile, random.Random(f"{db_id}:{seed}"), joins=self.joins, where_scale=self.where_scale)
        weights = [r.weight for r in self.rules]
        seen, asked = set(avoid), set()
        out: list[Example] = []
        budget = max_attempts if max_attempts is not None else 40 * n + 50
        stats = self.stats
        with Sandbox(self.path, self.limits) as sandbox:
            for _ in range(budget):
                if len(out) >= n or not self.profile.tables:
                    break
                stats.attempts += 1
                rule = ctx.rng.choices(self.rules, weights=weights, k=1)[0]
                draft = rule.build(ctx)
                if draft is None:
                    stats.rejected[f"{rule.name}: not applicable"] += 1
                    continue
                sql = render(draft.tree)
                if sql in seen or draft.question in asked:  # one question, one SQL
                    stats.rejected["duplicate SQL" if sql in seen else "duplicate question"] += 1
                    continue
                seen.add(sql)
                outcome = sandbox.run(sql)
                reason = informative(outcome)
                if reason is not None:
                    stats.rejected[reason] += 1
                    continue
                asked.add(draft.question)
                stats.kept += 1
                stats.by_rule[rule.name] += 1
                out.append(Example(id=example_id("synth", db_id, sql), db_id=db_id, question=draft.question,
                                   gold_sql=sql, source="synth",
                                   meta={"rule": rule.name, "gold_time_s": round(outcome.elapsed_s, 6),
                                         "gold_rows": len(outcome.rows), "question_from": "template"}))
        if not self.profile.tables:
            stats.rejected["no table with rows"] += 1
        if self.writer is not None and out:
            out = self.writer.rewrite(out, self.path)
        return out


def synthesize(db_path: str | Path, n: int, seed: int = 0, *, db_id: str | None = None, writer=None,
               rules: tuple[Rule, ...] = RULES, limits: Limits = Limits(timeout_s=2.0, max_rows=10_000),
               joins: bool = True, avoid: set[str] = frozenset(), where_scale: float = 1.0) -> list[Example]:
    """`n` executable, non-empty, distinct examples over any SQLite database (fewer if it cannot hold `n`).

    Deterministic for a given database file and `seed`. `db_id` defaults to the file's stem. No example's SQL
    is one of `avoid` (a held-out set then shares no query with the training pools).

    Example:
        >>> import tempfile, pathlib
        >>> from data_synthesis.demo_dbs import build_demo_dbs
        >>> path = build_demo_dbs(tempfile.mkdtemp(), db_ids=["retail"])[0]
        >>> examples = synthesize(path, 5, seed=0)
        >>> len(examples), len({e.gold_sql for e in examples}), examples[0].db_id
        (5, 5, 'retail')
    """
    return Synthesizer(db_path, db_id=db_id, rules=rules, limits=limits, writer=writer, joins=joins,
                       where_scale=where_scale).run(n, seed, avoid=avoid)
