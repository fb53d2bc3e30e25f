"""The execution-grounded lifecycle of a candidate pool (SPEC section 4), recorded step by step.

    filter -> execute -> typed repair -> re-execute -> re-admit -> (recovery when the pool collapses)

1. *Filter* (`prefilter`): no SQL in the answer, unparsable, not a read-only query, unknown tables or
   columns -> dropped before execution, with the reason.
2. *Execute* every admitted candidate in the sandboxed `rewards.executor.Executor` -> typed outcome.
3. *Repair by type*:
   - error   -> the engine's message, verbatim, to the LLM corrector;
   - timeout -> an intent-preserving rewrite by the LLM;
   - empty   -> the structural operators first (no model call: literal re-binding, then predicate
     relaxation), the LLM only if none of them returns rows, told what was tried;
   - rows, but a string literal that never occurs in its column (`citizenship != 'Frence'` filters
     nothing) -> literal re-binding, no model call, only with `rebind_rows` (off by default: it
     gains on one open pool only, and where the gold spells the literal as the question does it
     moves the agreeing candidates away from it).
4. *Re-execute* each repair; one that runs is *re-admitted* in place of the original (the trace keeps
   both). Repairs that fail again leave the candidate dropped.
5. *Recovery*: if a question has no candidate with rows left, its generators are asked again with
   condensed negative feedback (each failed SQL and how it failed); new candidates go through 1-4
   without further LLM repair.
6. *Ground*: every candidate still in the pool is checked for string literals that never occur in the
   column they are compared with (and that re-binding could not fix: 'French' for 'France'). This is
   a diagnosis for the trace (`Candidate.ungrounded`), not a vote: when most generators write the
   literal the question spells, the data's own spelling may be the odd one out, and the benchmark on
   two pools shows that taking them out of the vote is fitted (docs/benchmarks/selector.md).

Every step lands in `Candidate.events`, so `sirius infer --trace` can show why the winner won and why
the others lost. Work is batched across questions stage by stage, so one `execute_many` call serves
the whole batch.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from data_synthesis.chat_client import EndpointError
from data_synthesis.schema import Schema
from rewards.executor import Executor
from rewards.outcome import Outcome, Status
from sirius_train.inference.candidates import Candidate, Question
from sirius_train.inference.corrector import Corrector
from sirius_train.inference.guard import UNANALYSABLE, Unanalysable, attempt
from sirius_train.inference.operators import OPERATORS, literal_uses, rebind_literals
from sirius_train.inference.prefilter import prefilter
from sirius_train.inference.selector import Ballot

NO_SQL = "no SQL in the answer (format failure)"
PREVIEW_ROWS = 3
MAX_FEEDBACK_LINES = 6


@dataclass(frozen=True)
class LifecycleConfig:
    value_cap: int = 20_000  # distinct values read per column for literal grounding (more -> unknown)
    rebind_rows: bool = False  # also re-bind ungrounded literals in queries that returned rows (count(*) = 0, != ...)
    structural_repair: bool = True  # run the model-free operators on empty results
    recovery_samples: int = 2  # candidates asked for when a question's pool collapses
    llm_concurrency: int = 8  # corrector requests in flight at once


@dataclass
class Task:
    """One question's pool as it moves through the lifecycle."""

    question: Question
    schema: Schema
    candidates: list[Candidate]

    def clean(self) -> list[Candidate]:
        return [c for c in self.candidates if c.dropped is None and c.outcome is not None
                and c.outcome.status is Status.OK]

    def ballots(self) -> list[Ballot]:
        """Every candidate as the selector sees it; dropped ones stay in the pool as non-voters."""
        out = []
        for c in self.candidates:
            if c.dropped is None and c.outcome is not None:
                out.append(Ballot(c.source, c.sql, c.outcome.status, c.outcome.rows))
            else:
                status = c.outcome.status if c.outcome is not None and not c.outcome.executed else Status.REJECTED
                out.append(Ballot(c.source, c.sql or "", status))
        return out


# Recovery generation: (question, condensed feedback, how many) -> new candidates (not yet executed).
Recover = Callable[[Question, str, int], list[Candidate]]


class ColumnValues:
    """Distinct values of a column, read once through the sandboxed executor (the operators' `ValueLookup`)."""

    def __init__(self, executor: Executor, cap: int):
        self.executor, self.cap = executor, cap
        self._cache: dict[tuple[str, str, str], list | None] = {}

    def lookup(self, db_id: str):
        def values(table: str, column: str):
            key = (db_id, table.lower(), column.lower())
            if key not in self._cache:
                t, c = table.replace('"', '""'), column.replace('"', '""')
                outcome = self.executor.execute(db_id, f'SELECT DISTINCT "{c}" FROM "{t}" LIMIT {self.cap + 1}')
                too_many = not outcome.executed or len(outcome.rows) > self.cap
                self._cache[key] = None if too_many else [row[0] for row in outcome.rows]
            return self._cache[key]
        return values


class Lifecycle:
    """Runs the lifecycle over a batch of tasks, mutating their candidates (outcomes, drops, events)."""

    def __init__(self, executor: Executor, corrector: Corrector | None = None, recover: Recover | None = None,
                 config: LifecycleConfig = LifecycleConfig()):
        self.executor, self.corrector, self.recover, self.config = executor, corrector, recover, config
        self.values = ColumnValues(executor, config.value_cap)
        self.stats: Counter = Counter()  # what each step did, for the summary line and benchmarks

    def summary(self) -> str:
        """One line per step: e.g. `filtered 12 (unknown_column 9, ...); executed 96 (ok 80, empty 9, ...)`."""
        groups: dict[str, Counter] = {}
        for key, n in self.stats.items():
            step, _, what = key.partition(":")
            groups.setdefault(step, Counter())[what] += n
        return "; ".join(f"{step} {sum(c.values())} (" + ", ".join(f"{k} {v}" for k, v in c.most_common()) + ")"
                         for step, c in groups.items())

    def run(self, tasks: list[Task]) -> None:
        self._admit_and_execute([(t, c) for t in tasks for c in t.candidates])
        self._repair(tasks)
        if self.recover is not None:
            self._recovery(tasks)
        self._ground([(t, c) for t in tasks for c in t.candidates
                      if c.dropped is None and c.outcome is not None and c.outcome.executed])

    # ------------------------------------------------------------------ steps
    def _admit_and_execute(self, pairs: list[tuple[Task, Candidate]]) -> None:
        runnable = [(t, c) for t, c in pairs if self._filter(t, c)]
        self._execute(runnable, "execute")

    def _filter(self, task: Task, candidate: Candidate) -> bool:
        if candidate.sql is None:
            self.stats["filtered:no_sql"] += 1
            candidate.dropped = NO_SQL
            candidate.record("filter", admitted=False, kind="no_sql", reason=NO_SQL)
            return False
        verdict = prefilter(candidate.sql, task.schema)
        candidate.record("filter", admitted=verdict.admitted, **({"kind": verdict.kind, "reason": verdict.reason}
                                                                if verdict.kind else {}))
        if not verdict.admitted:
            self.stats[f"filtered:{verdict.kind}"] += 1
            candidate.dropped = f"filtered: {verdict.reason}"
        elif verdict.kind == UNANALYSABLE:
            self.stats["unanalysable:filter"] += 1
        return verdict.admitted

    def _execute(self, pairs: list[tuple[Task, Candidate]], step: str) -> None:
        outcomes = self.executor.execute_many([(t.question.db_id, c.sql) for t, c in pairs])
        for (_task, candidate), outcome in zip(pairs, outcomes):
            self.stats[f"executed:{outcome.status.value}"] += 1
            candidate.outcome = outcome
            candidate.record(step, sql=candidate.sql, **_outcome_summary(outcome))

    def _repair(self, tasks: list[Task]) -> None:
        live = [(t, c) for t in tasks for c in t.candidates if c.dropped is None and c.outcome is not None]
        if self.config.rebind_rows:
            self._rebind_rows([(t, c) for t, c in live if c.outcome.status is Status.OK])
        empty = [(t, c) for t, c in live if c.outcome.status is Status.EMPTY]
        if self.config.structural_repair:
            empty = self._structural(empty)
        failed = [(t, c) for t, c in live if not c.outcome.executed]
        if self.corrector is not None:
            self._llm_repair(failed + empty)
        self._settle(failed)

    def _rebind_rows(self, pairs: list[tuple[Task, Candidate]]) -> None:
        """Rows, but a literal that never occurs in its column: re-bind it and keep the result if it still has rows."""
        self._apply(rebind_literals, pairs, "ungrounded_literal")

    def _structural(self, pairs: list[tuple[Task, Candidate]]) -> list[tuple[Task, Candidate]]:
        """Operators in order on every still-empty candidate; returns those no operator could fix."""
        remaining = list(pairs)
        for operator in OPERATORS:
            fixed = self._apply(operator, remaining, "empty")
            remaining = [(t, c) for t, c in remaining if id(c) not in fixed]
        return remaining

    def _apply(self, operator, pairs: list[tuple[Task, Candidate]], kind: str) -> set[int]:
        """Run one operator's rewrites as a batch; a rewrite that returns rows replaces its candidate.
        Returns the ids of the candidates it replaced."""
        trials = []
        for task, candidate in pairs:
            rewrite = attempt(operator, candidate.sql, task.schema, self.values.lookup(task.question.db_id))
            if isinstance(rewrite, Unanalysable):
                self._unanalysable(candidate, "repair", rewrite, operator=operator.__name__)
            elif rewrite is not None:
                trials.append((task, candidate, rewrite))
        outcomes = self.executor.execute_many([(t.question.db_id, r.sql) for t, _, r in trials])
        fixed = set()
        for (_task, candidate, rewrite), outcome in zip(trials, outcomes):
            kept = outcome.status is Status.OK
            self.stats[f"repaired:{rewrite.operator} on {'rows' if kind == 'ungrounded_literal' else kind} "
                       f"{'readmitted' if kept else 'failed'}"] += 1
            candidate.record("repair", kind=kind, operator=rewrite.operator, edits=list(rewrite.edits),
                             sql=rewrite.sql, readmitted=kept, **_outcome_summary(outcome))
            if kept:
                candidate.sql, candidate.outcome = rewrite.sql, outcome
                fixed.add(id(candidate))
        return fixed

    def _llm_repair(self, pairs: list[tuple[Task, Candidate]]) -> None:
        """Typed LLM repair; a repair is re-admitted if it runs (and, for an empty result, returns rows)."""
        trials = []
        with ThreadPoolExecutor(self.config.llm_concurrency) as pool:  # HTTP-bound: ask in parallel
            answers = list(pool.map(lambda pair: self._ask_corrector(*pair), pairs))
        for (task, candidate), sql in zip(pairs, answers):
            if sql is None:
                continue
            verdict = prefilter(sql, task.schema)
            if not verdict.admitted:
                candidate.record("filter", admitted=False, sql=sql, kind=verdict.kind, reason=verdict.reason)
                continue
            trials.append((task, candidate, sql))
        outcomes = self.executor.execute_many([(t.question.db_id, sql) for t, _, sql in trials])
        for (_task, candidate, sql), outcome in zip(trials, outcomes):
            wanted = Status.OK if candidate.outcome.status is Status.EMPTY else None
            kept = outcome.status is wanted if wanted else outcome.executed
            self.stats[f"repaired:llm on {candidate.outcome.status.value} {'readmitted' if kept else 'failed'}"] += 1
            candidate.record("reexecute", sql=sql, readmitted=kept, **_outcome_summary(outcome))
            if kept:
                candidate.sql, candidate.outcome = sql, outcome

    def _settle(self, pairs: list[tuple[Task, Candidate]]) -> None:
        """Candidates whose latest execution still failed leave the pool, with the reason."""
        for _task, candidate in pairs:
            if candidate.dropped is None and not candidate.outcome.executed:
                outcome = candidate.outcome
                candidate.dropped = f"{outcome.status.value}: {outcome.error or 'unrepaired'}"
                self.stats[f"dropped:{outcome.status.value}"] += 1
                candidate.record("drop", reason=candidate.dropped)

    def _ground(self, pairs: list[tuple[Task, Candidate]]) -> None:
        """Mark the literals each final SQL compares with a column that never holds them."""
        for task, candidate in pairs:
            uses = self._literal_uses(task, candidate, "ground")
            candidate.ungrounded = tuple(f"{u.column}: '{u.value}'" for u in uses if u.grounded is False)
            if candidate.ungrounded:
                self.stats[f"ungrounded:{candidate.outcome.status.value}"] += 1
                candidate.record("ground", ungrounded=list(candidate.ungrounded))

    def _ask_corrector(self, task: Task, candidate: Candidate) -> str | None:
        outcome = candidate.outcome
        try:
            if outcome.status is Status.ERROR or outcome.status is Status.REJECTED:
                kind, sql = "error", self.corrector.fix_error(task.question, candidate.sql, outcome.error or "")
            elif outcome.status is Status.TIMEOUT:
                kind, sql = "timeout", self.corrector.rewrite_timeout(task.question, candidate.sql,
                                                                      self.executor.limits.timeout_s)
            else:
                kind, sql = "empty", self.corrector.repair_empty(task.question, candidate.sql,
                                                                 self._diagnose_empty(task, candidate))
        except EndpointError as e:
            candidate.record("repair", kind="llm", error=str(e))
            return None
        candidate.record("repair", kind=kind, operator="llm", sql=sql, **({"engine_error": outcome.error}
                                                                          if kind == "error" else {}))
        return sql

    def _diagnose_empty(self, task: Task, candidate: Candidate) -> str:
        uses = self._literal_uses(task, candidate, "diagnose")
        lines = [f"- {u.column} is compared with '{u.value}', which never occurs in that column"
                 + (f" (closest real value: '{u.closest}')" if u.closest else "") for u in uses if u.grounded is False]
        tried = [e["operator"] for e in candidate.events if e["step"] == "repair" and e.get("kind") == "empty"]
        if tried:
            lines.append(f"- model-free rewrites tried without rows: {', '.join(tried)}")
        return "\n".join(lines) or "- every literal occurs in its column; the joins or filters exclude all rows"

    def _literal_uses(self, task: Task, candidate: Candidate, step: str) -> list:
        """The candidate's literal comparisons; none (and a trace event) when its SQL cannot be analysed."""
        uses = attempt(literal_uses, candidate.sql, task.schema, self.values.lookup(task.question.db_id))
        if isinstance(uses, Unanalysable):
            self._unanalysable(candidate, step, uses)
            return []
        return uses

    def _unanalysable(self, candidate: Candidate, step: str, verdict: Unanalysable, **detail) -> None:
        self.stats[f"unanalysable:{step}"] += 1
        candidate.record(step, kind=verdict.kind, reason=verdict.message, **detail)

    def _recovery(self, tasks: list[Task]) -> None:
        collapsed = [t for t in tasks if not t.clean()]
        if not collapsed:
            return
        fresh: list[tuple[Task, Candidate]] = []
        for task in collapsed:
            feedback = condensed_feedback(task.candidates)
            try:
                new = self.recover(task.question, feedback, self.config.recovery_samples)
            except EndpointError as e:
                for c in task.candidates:
                    c.record("recovery", error=str(e))
                continue
            self.stats["recovery:questions"] += 1
            self.stats["recovery:candidates"] += len(new)
            for candidate in new:
                candidate.record("recovery", feedback=feedback)
                task.candidates.append(candidate)
                fresh.append((task, candidate))
        self._admit_and_execute(fresh)
        live = [(t, c) for t, c in fresh if c.dropped is None and c.outcome is not None]
        if self.config.structural_repair:
            self._structural([(t, c) for t, c in live if c.outcome.status is Status.EMPTY])
        self._settle(live)


def condensed_feedback(candidates: list[Candidate]) -> str:
    """What failed and how, one line per distinct failed SQL (at most MAX_FEEDBACK_LINES).

    Example:
        >>> a = Candidate("s", 0, "SELECT nmae FROM singer", dropped="filtered: unknown column: nmae (not in singer)")
        >>> b = Candidate("s", 1, "SELECT name FROM singer WHERE country = 'Frence'", outcome=Outcome(Status.EMPTY))
        >>> print(condensed_feedback([a, b]))
        - SELECT nmae FROM singer -> filtered: unknown column: nmae (not in singer)
        - SELECT name FROM singer WHERE country = 'Frence' -> returned no rows
    """
    lines, seen = [], set()
    for c in candidates:
        if c.sql is None or c.sql in seen:
            continue
        if c.dropped is not None:
            how = c.dropped
        elif c.outcome is not None and c.outcome.status is Status.EMPTY:
            how = "returned no rows"
        else:
            continue
        seen.add(c.sql)
        sql = " ".join(c.sql.split())
        lines.append(f"- {sql[:200]} -> {how[:200]}")
    return "\n".join(lines[:MAX_FEEDBACK_LINES])


def _outcome_summary(outcome: Outcome) -> dict:
    out = {"status": outcome.status.value, "row_count": len(outcome.rows), "elapsed_s": round(outcome.elapsed_s, 4)}
    if outcome.rows:
        out["preview"] = outcome.to_json(PREVIEW_ROWS)["rows"]
    if outcome.error:
        out["error"] = outcome.error
    return out
