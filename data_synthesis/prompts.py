"""The prompt every stage shares: training rollouts, pass-rate estimation, inference candidates.

The answer contract matches `rewards.extract`: the final SQL goes in a ```sql fenced block.
"""

from __future__ import annotations

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


FALLBACK_TEMPLATE = "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}<|assistant|>\n"


def chat_text(tokenizer, messages: list[dict]) -> str:
    """The generation prompt text of `messages` under the tokenizer's chat template.

    Tokenizers without a template (a bare base model) get a plain role-tagged fallback, so every model
    sees the same structure.
    """
    template = getattr(tokenizer, "chat_template", None) or FALLBACK_TEMPLATE
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                         chat_template=template)
