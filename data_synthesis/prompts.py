"""The prompt every stage shares: training rollouts, pass-rate estimation, inference candidates.

The answer contract matches `rewards.extract`: the final SQL goes in a ```sql fenced block.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

SYSTEM_PROMPT = (
    "You are an expert in SQLite. Given a database schema and a question, write one SQLite query that "
    "answers the question. Reason briefly if it helps, then give the final query in a ```sql code block."
)


def render_prompt(question: str, schema_text: str, evidence: str | None = None,
                  system: str = SYSTEM_PROMPT) -> list[dict]:
    """Chat messages for one question.

    Example:
        >>> msgs = render_prompt("How many items?", "CREATE TABLE item (id INTEGER);")
        >>> [m["role"] for m in msgs]
        ['system', 'user']
        >>> print(msgs[1]["content"])
        Database schema:
        CREATE TABLE item (id INTEGER);
        <BLANKLINE>
        Question: How many items?
    """
    parts = [f"Database schema:\n{schema_text.strip()}"]
    if evidence:
        parts.append(f"External knowledge: {evidence.strip()}")
    parts.append(f"Question: {question.strip()}")
    messages = [{"role": "system", "content": system}] if system else []
    return messages + [{"role": "user", "content": "\n\n".join(parts)}]


@dataclass(frozen=True)
class PromptFormat:
    """How a run renders prompts. One value per run, used by SFT, rollouts, pass-rate estimation, the verl
    parquet and inference, so the model is always asked the way it was trained.

    `schema_style`: "ddl" (CREATE TABLE) or "compact" (one line per table); `schema_samples`: real values
    shown per column; `system`: the system message ("" for none).
    """

    schema_style: str = "ddl"
    schema_samples: int = 3
    system: str = SYSTEM_PROMPT

    def render(self, question: str, db_path: str | Path, evidence: str | None = None,
               db_id: str | None = None) -> list[dict]:
        from data_synthesis.schema import read_schema

        schema = read_schema(db_path, n_samples=self.schema_samples, db_id=db_id)
        text = schema.to_text(samples=self.schema_samples > 0, style=self.schema_style)
        return render_prompt(question, text, evidence, self.system)


FALLBACK_TEMPLATE = "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}<|assistant|>\n"


def chat_text(tokenizer, messages: list[dict]) -> str:
    """The generation prompt text of `messages` under the tokenizer's chat template.

    Tokenizers without a template (a bare base model) get a plain role-tagged fallback, so every model
    sees the same structure.
    """
    template = getattr(tokenizer, "chat_template", None) or FALLBACK_TEMPLATE
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                         chat_template=template)
