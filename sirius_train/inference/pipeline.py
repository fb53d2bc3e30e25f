"""Wire the stages for a batch of questions: tasks -> lifecycle -> selection -> output records.

`sirius select` enters with given candidate pools, `sirius infer` with generated ones; both leave
through `answer`, so a pick means the same thing whichever command produced it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from data_synthesis.chat_client import EndpointError
from data_synthesis.schema import read_schema
from rewards.databases import resolve_db_path
from sirius_train.inference.candidates import Candidate, Question
from sirius_train.inference.judge import PairwiseJudge
from sirius_train.inference.lifecycle import Task
from sirius_train.inference.selector import (Ballot, Selection, SelectorConfig, explain, majority_vote,
                                             select)

METHODS = ("hybrid", "majority")
JUDGE_CONCURRENCY = 8  # questions judged at once


def make_task(db_root: Path, id, db_id: str, question: str, candidates: list[Candidate],
              evidence: str | None = None) -> Task:
    """A task with the database's schema read once (raises UnknownDatabase for a bad db_id)."""
    path = resolve_db_path(db_root, db_id)
    schema = read_schema(path, db_id=db_id)
    return Task(Question(id, db_id, question, schema.to_text(), evidence, str(path)), schema, candidates)


@dataclass
class Answer:
    task: Task
    ballots: list[Ballot]
    selection: Selection
    why: str
    judge_error: str | None = None  # the judge failed on this question: selected with S_rm = 0

    @property
    def winner(self) -> Candidate | None:
        return None if self.selection.index is None else self.task.candidates[self.selection.index]

    def pick(self) -> dict:
        """The `sirius select` contract: {"id", "sql", "source", "score"}."""
        winner = self.winner
        return {"id": self.task.question.id, "sql": winner.sql if winner else None,
                "source": winner.source if winner else None, "score": round(self.selection.score, 6)}

    def result(self) -> dict:
        """The pick plus what `sirius infer` users want to see at a glance; every field on every line (null
        where no candidate ran)."""
        winner = self.winner
        outcome = winner.outcome if winner else None
        return {**self.pick(), "db_id": self.task.question.db_id, "question": self.task.question.question,
                "decided_by": self.selection.decided_by, "why": self.why,
                "status": outcome.status.value if outcome else None,
                "row_count": len(outcome.rows) if outcome else None,
                "preview": outcome.to_json(5)["rows"] if outcome else None}

    def trace(self) -> dict:
        """Everything: each candidate's lifecycle events and the selector's scores per result class."""
        out = {"id": self.task.question.id, "db_id": self.task.question.db_id, "question": self.task.question.question,
               "winner": self.selection.index, "why": self.why, "selection": self.selection.to_json(self.ballots),
               "candidates": [c.to_json() for c in self.task.candidates]}
        if self.judge_error is not None:
            out["judge_error"] = self.judge_error
        return out


def answer(tasks: list[Task], config: SelectorConfig = SelectorConfig(), method: str = "hybrid",
           judge: PairwiseJudge | None = None, on_answer: Callable[[], None] | None = None) -> list[Answer]:
    """Select one candidate per task (tasks must have been through the lifecycle).

    A judge that fails on some questions (an endpoint going bad midway) leaves them with S_rm = 0 and a
    `judge_error`; one that never gave a verdict raises its EndpointError (a wrong URL is not a lapse)."""
    if method not in METHODS:
        raise ValueError(f"unknown selection method {method!r}; use one of {METHODS}")

    answered = threading.Event()  # the judge gave at least one verdict: it is reachable and configured right

    def verdicts(question):
        ask = judge.for_question(question)

        def counted(a, b):
            verdict = ask(a, b)
            answered.set()
            return verdict
        return counted

    def one(task: Task) -> Answer:
        ballots, judge_error = task.ballots(), None
        if method == "majority":
            selection = majority_vote(ballots, config.compare)
        else:
            try:
                selection = select(ballots, config, verdicts(task.question) if judge else None)
            except EndpointError as e:  # S_rm is optional (SPEC 4): without the judge it is 0, the batch goes on
                judge_error = str(e)
                selection = select(ballots, config)
        if on_answer is not None:
            on_answer()
        picked = None if selection.index is None else task.candidates[selection.index]
        why = explain(selection, ballots, config) if picked is None or picked.sql is not None else \
            f"no candidate has SQL: none of the {len(task.candidates)} answers held any (format failures)"
        if judge_error is not None:
            why += "; the judge failed on this question, so S_rm is 0"
        return Answer(task, ballots, selection, why, judge_error)

    if judge is None:
        return [one(task) for task in tasks]
    with ThreadPoolExecutor(JUDGE_CONCURRENCY) as pool:  # the judge is HTTP-bound: questions in parallel
        answers = list(pool.map(one, tasks))
    failed = [a.judge_error for a in answers if a.judge_error is not None]
    if failed and not answered.is_set():  # it never answered: a wrong URL or a dead server, not a lapse midway
        raise EndpointError(failed[0])
    return answers
