"""Questions written by an LLM through any OpenAI-compatible endpoint (`--llm-url`, `--llm-model`).

The SQL is always ours (built as a tree, validated by execution); the LLM only phrases the question, seeing
the schema, the SQL and our template question as a draft. An answer is used only if it is one plain
question that mentions every literal of the SQL (so it cannot silently drop a filter value); otherwise the
template question stays and `meta["llm_rejected"]` says why. An unreachable endpoint is an error
(`chat_client.EndpointError`), never a silent fallback.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

from sqlglot import exp
from sqlglot.errors import SqlglotError

from data_synthesis.chat_client import ChatClient
from data_synthesis.records import Example
from data_synthesis.schema import read_schema
from data_synthesis.sqlgen.trees import literal_value, parse

SYSTEM = ("You write questions for a text-to-SQL dataset. Given a database schema and a SQLite query, write "
          "the one natural English question that the query answers exactly. Mention every literal value of "
          "the query exactly as written (quote text values in single quotes). Reply with the question only.")


def required_literals(sql: str) -> list[str]:
    """The literal texts a question for `sql` must mention (LIKE patterns without their `%`; not LIMIT counts).

    Example:
        >>> required_literals("SELECT name FROM t WHERE city = 'Paris' AND name LIKE '%an%' ORDER BY x LIMIT 3")
        ['Paris', 'an']
    """
    try:
        tree = parse(sql)
    except SqlglotError:
        return []
    out = []
    for node in tree.find_all(exp.Literal):
        if node.find_ancestor(exp.Limit) is not None or literal_value(node) is None:
            continue
        text = node.this.strip("%") if node.is_string else node.this
        if text and text not in out:
            out.append(text)
    return out


def usable(answer: str, sql: str) -> tuple[str | None, str | None]:
    """(the cleaned question, None) or (None, why it was rejected).

    Example:
        >>> sql = "SELECT COUNT(*) FROM o WHERE status = 'shipped'"
        >>> usable('Question: "How many orders have status \\'shipped\\'?"', sql)
        ("How many orders have status 'shipped'?", None)
        >>> usable("How many orders are there?", sql)
        (None, "does not mention the value 'shipped'")
    """
    lines = [line.strip() for line in (answer or "").strip().splitlines() if line.strip()]
    if not lines:
        return None, "empty answer"
    question = lines[0]
    if question.lower().startswith("question:"):
        question = question[len("question:"):].strip()
    question = question.strip('"').strip()
    if not question:
        return None, "empty answer"
    if len(question) > 400:
        return None, "longer than 400 characters"
    if "select " in question.lower() and " from " in question.lower():
        return None, "looks like SQL, not a question"
    lowered = question.lower()
    for text in required_literals(sql):
        if text.lower() not in lowered:
            return None, f"does not mention the value {text!r}"
    return question, None


class LLMQuestionWriter:
    """Rewrites examples' questions with a chat model; `rewrite(examples, db_path)` -> new examples.

    Args:
        client: a `ChatClient` for the endpoint (`ChatClient(url, model)`).
        concurrency: requests in flight at once.
    """

    def __init__(self, client: ChatClient, *, concurrency: int = 8, temperature: float = 0.0,
                 max_tokens: int = 128):
        self.client, self.concurrency = client, concurrency
        self.temperature, self.max_tokens = temperature, max_tokens

    def messages(self, example: Example, schema_text: str) -> list[dict]:
        user = (f"Database schema:\n{schema_text}\n\nSQL:\n{example.gold_sql}\n\n"
                f"Draft question (may be awkward or out of date): {example.question}\n\nQuestion:")
        return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]

    def rewrite(self, examples: list[Example], db_path: str | Path) -> list[Example]:
        schema_text = read_schema(db_path).to_text()

        def one(example: Example) -> Example:
            answer = self.client.complete(self.messages(example, schema_text), n=1, temperature=self.temperature,
                                          max_tokens=self.max_tokens)[0]
            question, why = usable(answer, example.gold_sql)
            if question is None:
                return replace(example, meta={**example.meta, "question_from": "template", "llm_rejected": why})
            return replace(example, question=question, meta={**example.meta, "question_from": "llm"})

        with ThreadPoolExecutor(self.concurrency) as pool:
            return list(pool.map(one, examples))
