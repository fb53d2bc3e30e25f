"""The LLM side of typed repair: one prompt per failure type, so the model gets the signal that failed.

- runtime error: the engine's message goes to the corrector *verbatim* (it names the bad column, the
  ambiguous name, the misused aggregate -- paraphrasing it loses exactly that);
- timeout: an intent-preserving rewrite (join order, subquery shape), never a different question;
- empty result: the diagnosis of the structural operators (which literals miss the data, which real
  values are close, which rewrites were tried) so the model does not repeat what already failed;
- recovery: when no clean candidate is left, condensed negative feedback on every failed attempt.

All calls go through `data_synthesis.chat_client.ChatClient` (any OpenAI-compatible endpoint).
"""

from __future__ import annotations

from dataclasses import dataclass

from data_synthesis.chat_client import ChatClient
from rewards.extract import extract_sql
from sirius_train.inference.candidates import Question, build_prompt

ERROR_TEMPLATE = (
    "This SQLite query failed.\n\nQuery:\n```sql\n{sql}\n```\n\nSQLite error (verbatim):\n{error}\n\n"
    "Fix the query so that it runs and still answers the question. Give only the corrected query in a "
    "```sql code block."
)
TIMEOUT_TEMPLATE = (
    "This SQLite query is correct in intent but did not finish within {timeout} seconds.\n\nQuery:\n"
    "```sql\n{sql}\n```\n\nRewrite it to return exactly the same result faster: reorder joins, turn "
    "correlated subqueries into joins or pre-aggregated subqueries, filter before joining. Do not change "
    "what it computes. Give only the rewritten query in a ```sql code block."
)
EMPTY_TEMPLATE = (
    "This SQLite query ran but returned no rows.\n\nQuery:\n```sql\n{sql}\n```\n\nDiagnosis:\n{diagnosis}\n\n"
    "If the question expects rows, fix the query (check literal values against the schema's sample values, "
    "join paths and filters); if no rows is truly the answer, repeat the query unchanged. Give only the "
    "query in a ```sql code block."
)


@dataclass
class Corrector:
    """Typed repair with an LLM. Each method returns the repaired SQL, or None if the model gave none."""

    client: ChatClient
    temperature: float = 0.0
    max_tokens: int = 512

    def fix_error(self, question: Question, sql: str, error: str) -> str | None:
        return self._ask(question, sql, ERROR_TEMPLATE.format(sql=sql, error=error))

    def rewrite_timeout(self, question: Question, sql: str, timeout_s: float) -> str | None:
        return self._ask(question, sql, TIMEOUT_TEMPLATE.format(sql=sql, timeout=f"{timeout_s:g}"))

    def repair_empty(self, question: Question, sql: str, diagnosis: str) -> str | None:
        return self._ask(question, sql, EMPTY_TEMPLATE.format(sql=sql, diagnosis=diagnosis))

    def recover(self, question: Question, feedback: str, n: int = 2) -> list[str]:
        """Fresh attempts at the question, told what failed before and how."""
        answers = self.client.complete(build_prompt(question, feedback=feedback), n=n, temperature=0.7,
                                       max_tokens=self.max_tokens)
        return [sql for sql in map(extract_sql, answers) if sql]

    def _ask(self, question: Question, sql: str, instruction: str) -> str | None:
        """The original prompt, the failed answer as the model's turn, then the typed instruction."""
        messages = build_prompt(question) + [{"role": "assistant", "content": f"```sql\n{sql}\n```"},
                                             {"role": "user", "content": instruction}]
        answer = self.client.complete(messages, n=1, temperature=self.temperature, max_tokens=self.max_tokens)[0]
        return extract_sql(answer)
