"""S_rm: a pairwise LLM judge between two candidate answers, asked in both orders by the selector.

The judge sees the question, the schema, and for each side the SQL and a preview of its result; it
answers "A" or "B". Position bias (judges favour whichever comes first, or second) cancels because the
selector asks every pair both ways and counts a pair only when both orders gave a verdict
(`selector.preference_scores`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from data_synthesis.chat_client import ChatClient
from sirius_train.inference.candidates import Question

SYSTEM = ("You are a careful SQL reviewer. Given a question, a database schema and two candidate SQLite "
          "queries with their results, decide which query answers the question correctly.")
TEMPLATE = (
    "Database schema:\n{schema}\n\nQuestion: {question}\n\n"
    "Candidate A:\n```sql\n{sql_a}\n```\nResult A ({n_a} rows): {rows_a}\n\n"
    "Candidate B:\n```sql\n{sql_b}\n```\nResult B ({n_b} rows): {rows_b}\n\n"
    "Which candidate answers the question correctly? Reply with exactly one letter: A or B."
)
PREVIEW_ROWS = 5
_VERDICT = re.compile(r"\b([AB])\b")


@dataclass
class PairwiseJudge:
    """`PairwiseJudge(client).for_question(q)` is a `selector.Judge`: (a, b) -> 0 (A), 1 (B) or None."""

    client: ChatClient
    max_tokens: int = 8

    def for_question(self, question: Question):
        def judge(a: tuple[str, tuple], b: tuple[str, tuple]) -> int | None:
            return self.compare(question, a, b)
        return judge

    def compare(self, question: Question, a: tuple[str, tuple], b: tuple[str, tuple]) -> int | None:
        prompt = TEMPLATE.format(schema=question.schema_text, question=question.question,
                                 sql_a=a[0], n_a=len(a[1]), rows_a=_preview(a[1]),
                                 sql_b=b[0], n_b=len(b[1]), rows_b=_preview(b[1]))
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}]
        answer = self.client.complete(messages, n=1, temperature=0.0, max_tokens=self.max_tokens)[0]
        return parse_verdict(answer)


def parse_verdict(answer: str) -> int | None:
    """0 for A, 1 for B, None when the answer names neither (or both).

    Example:
        >>> parse_verdict("B"), parse_verdict("Answer: A."), parse_verdict("A or B?"), parse_verdict("neither")
        (1, 0, None, None)
    """
    found = set(_VERDICT.findall(answer.strip().upper()))
    return {"A": 0, "B": 1}[found.pop()] if len(found) == 1 else None


def _preview(rows: tuple) -> str:
    shown = [list(r) for r in rows[:PREVIEW_ROWS]]
    return repr(shown) + (" ..." if len(rows) > PREVIEW_ROWS else "")
