"""Complementary candidates with provenance: a specialist and a generalist answer the same question.

Sampling one model more mostly repeats its mistakes (SPEC L1); a second, differently trained model
fails differently. Each `Generator` is a named source -- the trained specialist (a local HF model via
`HFSampler`, or vLLM / any OpenAI-compatible server via `OpenAISampler`) or a generalist chat model
prompted with worked examples -- and every `Candidate` keeps its provenance (source, sample index,
origin) so the selector can count how many *independent* sources support an answer and a user can see
where the winner came from.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from data_synthesis.prompts import PromptFormat, render_prompt
from data_synthesis.samplers import Sampler
from rewards.extract import extract_sql
from rewards.outcome import Outcome


RAW_CHARS = 2000  # of a model's answer kept in traces (enough to see why no SQL was found)


@dataclass(frozen=True)
class Example:
    """A worked example for a few-shot prompt."""

    question: str
    schema_text: str
    sql: str


# Generic worked examples for the generalist (a join with a filter, a grouped aggregate with ordering)
# over a schema unrelated to any benchmark, so they teach the answer format without leaking answers.
DEFAULT_FEW_SHOT = (
    Example("Which customers from Lisbon placed an order in 2023? Give their names.",
            "CREATE TABLE customers (\n  id INTEGER PRIMARY KEY,\n  name TEXT,\n  city TEXT -- e.g. 'Lisbon', 'Paris'\n);\n"
            "CREATE TABLE orders (\n  id INTEGER PRIMARY KEY,\n  customer_id INTEGER,\n  order_date TEXT,\n"
            "  FOREIGN KEY (customer_id) REFERENCES customers(id)\n);",
            "SELECT DISTINCT c.name FROM customers AS c JOIN orders AS o ON o.customer_id = c.id "
            "WHERE c.city = 'Lisbon' AND o.order_date LIKE '2023-%'"),
    Example("How many books does each genre have? List the genres with the most books first.",
            "CREATE TABLE books (\n  id INTEGER PRIMARY KEY,\n  title TEXT,\n  genre TEXT -- e.g. 'novel', 'poetry'\n);",
            "SELECT genre, COUNT(*) FROM books GROUP BY genre ORDER BY COUNT(*) DESC"),
)


@dataclass
class Question:
    """One question to answer, with the schema text every prompt shows."""

    id: object
    db_id: str
    question: str
    schema_text: str
    evidence: str | None = None
    db_path: str | None = None  # lets a generator with its own `PromptFormat` render the schema its way


@dataclass
class Candidate:
    """One SQL answer and everything that happened to it (`events` is the trace)."""

    source: str  # provenance group: the generator's name
    sample: int  # index among that source's samples for this question
    sql: str | None  # None: the answer held no SQL (a format failure)
    origin: str = "generated"  # generated | given | recovery
    raw: str | None = None  # the model's full answer, when there was one
    outcome: Outcome | None = None  # the latest execution
    dropped: str | None = None  # why it left the pool (filter reason, unrepaired failure...)
    ungrounded: tuple[str, ...] = ()  # literals its SQL compares with a column that never holds them
    events: list[dict] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.source}#{self.sample}" + ("" if self.origin in ("generated", "given") else f"({self.origin})")

    def record(self, step: str, **detail) -> None:
        self.events.append({"step": step, **detail})

    def to_json(self) -> dict:
        out = {"name": self.name, "source": self.source, "sample": self.sample, "origin": self.origin,
               "sql": self.sql, "status": self.outcome.status.value if self.outcome else None,
               "dropped": self.dropped, "events": self.events}
        if self.outcome is not None:
            out["row_count"] = len(self.outcome.rows)
        if self.ungrounded:
            out["ungrounded"] = list(self.ungrounded)
        if self.raw is not None:
            out["raw"] = self.raw[:RAW_CHARS]
        return out


@dataclass(frozen=True)
class Generator:
    """A named candidate source: a sampler, how many samples, and (for a generalist) worked examples."""

    name: str
    sampler: Sampler
    n: int = 4
    temperature: float = 0.7
    top_p: float = 0.95
    max_new_tokens: int = 512
    few_shot: tuple[Example, ...] = ()
    prompt_format: PromptFormat | None = None  # the specialist's training format (None: the shared default prompt)

    def __post_init__(self):
        if self.n < 1:
            raise ValueError(f"generator {self.name!r}: n must be >= 1, got {self.n}")


def build_prompt(question: Question, few_shot: tuple[Example, ...] = (), feedback: str | None = None,
                 prompt_format: PromptFormat | None = None) -> list[dict]:
    """The chat for one question: the shared prompt (or `prompt_format`'s, the one a specialist was trained
    on), preceded by worked examples, followed by feedback.

    Example:
        >>> q = Question(1, "shop", "How many items?", "CREATE TABLE item (id INTEGER);")
        >>> [m["role"] for m in build_prompt(q, DEFAULT_FEW_SHOT[:1])]
        ['system', 'user', 'assistant', 'user']
        >>> build_prompt(q, feedback="SELECT n FROM item failed: no such column: n")[-1]["content"].splitlines()[-1]
        'SELECT n FROM item failed: no such column: n'
    """
    if prompt_format is not None and question.db_path is not None:
        messages = prompt_format.render(question.question, question.db_path, question.evidence, question.db_id)
    else:
        messages = render_prompt(question.question, question.schema_text, question.evidence)
    system, user = messages[:-1], messages[-1]
    shots: list[dict] = []
    for example in few_shot:
        shots.append(render_prompt(example.question, example.schema_text, system="")[0])
        shots.append({"role": "assistant", "content": f"```sql\n{example.sql}\n```"})
    if feedback:
        user = {"role": "user", "content": f"{user['content']}\n\nEarlier attempts failed:\n{feedback}"}
    return system + shots + [user]


def generate(generators: list[Generator], questions: list[Question], seed: int | None = None,
             feedback: dict[int, str] | None = None, origin: str = "generated") -> list[list[Candidate]]:
    """Candidates for every question from every generator, in generator order.

    `feedback` maps a question's position to condensed negative feedback (recovery generation).
    """
    pools: list[list[Candidate]] = [[] for _ in questions]
    for g, generator in enumerate(generators):
        prompts = [build_prompt(q, generator.few_shot, (feedback or {}).get(i), generator.prompt_format)
                   for i, q in enumerate(questions)]
        multi_turn = getattr(generator.sampler, "multi_turn", False)  # its episodes probe each question's database
        episodes = {"db_ids": [q.db_id for q in questions]} if multi_turn else {}
        answers = generator.sampler.sample(prompts, generator.n, temperature=generator.temperature,
                                           top_p=generator.top_p, max_new_tokens=generator.max_new_tokens,
                                           seed=None if seed is None else seed + 1000 * g, **episodes)
        for pool, texts in zip(pools, answers):
            start = sum(1 for c in pool if c.source == generator.name)
            for k, text in enumerate(texts):
                candidate = Candidate(generator.name, start + k, extract_sql(text), origin, raw=text)
                candidate.record("generate", source=generator.name, origin=origin,
                                 sql_found=candidate.sql is not None)
                pool.append(candidate)
    return pools


def given(pool: list[dict]) -> list[Candidate]:
    """Candidates from a pool file's `candidates: [{"source", "sql"}]`, numbered per source."""
    seen: dict[str, int] = {}
    out = []
    for entry in pool:
        source = str(entry["source"])
        seen[source] = seen.get(source, -1) + 1
        out.append(Candidate(source, seen[source], entry["sql"], "given"))
    return out
