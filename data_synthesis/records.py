"""The Example record every stage passes around: pool -> validation -> estimation -> curriculum -> parquet.

One flat record for every source (Spider, BIRD, our own JSONL, synthesized, mutated), so later stages never
branch on where an example came from. Its JSON form is the pool file format (`sirius synth pool` writes it,
`estimate` and `curriculum` read it):

    {"id": "spider-dev-0", "db_id": "concert_singer", "question": "...", "gold_sql": "...",
     "evidence": "", "source": "spider", "level": null, "meta": {}}

`level` is the dataset's own difficulty label (BIRD's simple/moderate/challenging), not the pass rate under a
policy: pass rates change with every policy and live beside the pool (`difficulty.estimate_pass_rates`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from data_synthesis.jsonl import JsonlError, read_jsonl, write_jsonl

REQUIRED = ("id", "db_id", "question", "gold_sql")


class RecordError(ValueError):
    """A pool line that is not a valid Example (names the field and what was expected)."""


@dataclass(frozen=True)
class Example:
    id: str
    db_id: str
    question: str
    gold_sql: str
    evidence: str = ""
    source: str = ""  # spider | bird | jsonl | synth | mutation | ...
    level: str | None = None  # the dataset's difficulty label, if it has one
    meta: dict = field(default_factory=dict, compare=False)  # provenance: rule, parent id, gold time, ...

    def to_json(self) -> dict:
        """The pool-file form.

        Example:
            >>> Example("a1", "shop", "How many items?", "SELECT COUNT(*) FROM item").to_json()["gold_sql"]
            'SELECT COUNT(*) FROM item'
        """
        return asdict(self)

    @classmethod
    def from_json(cls, row: dict, where: str = "") -> Example:
        """Parse one pool line; raises RecordError naming the bad field.

        Example:
            >>> Example.from_json({"id": 7, "db_id": "shop", "question": "Q?", "gold_sql": "SELECT 1"}).id
            '7'
            >>> Example.from_json({"id": 7, "db_id": "shop", "question": "Q?"}, where="pool.jsonl:3")
            Traceback (most recent call last):
            ...
            data_synthesis.records.RecordError: pool.jsonl:3: missing field(s) ['gold_sql']; an example needs ...
        """
        prefix = f"{where}: " if where else ""
        missing = [k for k in REQUIRED if row.get(k) is None]
        if missing:
            raise RecordError(f"{prefix}missing field(s) {missing}; an example needs {list(REQUIRED)}")
        if not isinstance(row["id"], (str, int)) or isinstance(row["id"], bool):
            raise RecordError(f"{prefix}field 'id' must be a string or an integer, got {row['id']!r}")
        for key in ("db_id", "question", "gold_sql"):
            if not isinstance(row[key], str) or not row[key].strip():
                raise RecordError(f"{prefix}field {key!r} must be a non-empty string, got {row[key]!r}")
        for key in ("evidence", "source"):
            if row.get(key) is not None and not isinstance(row[key], str):
                raise RecordError(f"{prefix}field {key!r} must be a string, got {row[key]!r}")
        meta = row.get("meta") or {}
        if not isinstance(meta, dict):
            raise RecordError(f"{prefix}field 'meta' must be an object, got {type(meta).__name__}")
        level = row.get("level")
        return cls(id=str(row["id"]), db_id=row["db_id"], question=row["question"], gold_sql=row["gold_sql"],
                   evidence=row.get("evidence") or "", source=row.get("source") or "",
                   level=None if level is None else str(level), meta=dict(meta))


def read_examples(path: str | Path) -> list[Example]:
    """All examples of a pool JSONL file; duplicate ids are an error (ids key the pass-rate cache)."""
    try:
        examples = read_jsonl(path, parse=Example.from_json)
    except JsonlError as e:
        raise RecordError(str(e)) from None
    check_unique_ids(examples, str(path))
    return examples


def write_examples(path: str | Path, examples: Iterable[Example]) -> int:
    """Write a pool JSONL file atomically; returns the number written."""
    return write_jsonl(path, (e.to_json() for e in examples))


def check_unique_ids(examples: Iterable[Example], where: str = "pool") -> None:
    """Raise RecordError when two examples share an id.

    Example:
        >>> check_unique_ids([Example("1", "d", "q", "s"), Example("1", "d", "q2", "s2")], "demo")
        Traceback (most recent call last):
        ...
        data_synthesis.records.RecordError: demo: duplicate example id(s) ['1']: ids must be unique ...
    """
    seen: set[str] = set()
    dupes: list[str] = []
    for e in examples:
        if e.id in seen and e.id not in dupes:
            dupes.append(e.id)
        seen.add(e.id)
    if dupes:
        raise RecordError(f"{where}: duplicate example id(s) {dupes[:5]}: ids must be unique "
                          "(they key pass rates and caches)")
