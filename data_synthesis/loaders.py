"""Spider-format, BIRD-format and our own JSONL datasets -> `Example` records.

- Spider (`dev.json`, `train_spider.json`): a JSON list of `{"db_id", "question", "query", ...}`.
- BIRD (`dev.json`, `train.json`): a JSON list of `{"question_id", "db_id", "question", "evidence", "SQL",
  "difficulty"}`; `evidence` becomes the prompt's external knowledge, `difficulty` the example's `level`.
- JSONL (`*.jsonl`): one Example per line (the pool format of `data_synthesis.records`; Spider's
  `dev.jsonl` with `id, db_id, question, gold_sql` is already in it).

`tables.json` (Spider's or BIRD's `dev_tables.json`), when given, is checked against the dataset: an example
whose database the schema file does not describe is a broken dataset, reported before anything runs.
The schema the model sees is always read from the SQLite file itself (`schema.read_schema`).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from data_synthesis.jsonl import JsonlError, JsonList, read_json
from data_synthesis.records import Example, RecordError, check_unique_ids, read_examples


class DatasetError(ValueError):
    """A dataset file that cannot be read as Spider, BIRD or pool JSONL (names the file and the item)."""


def load_dataset(path: str | Path, *, tables: str | Path | None = None, source: str | None = None) -> list[Example]:
    """Examples of one dataset file, its format recognised from its content.

    Args:
        path: a Spider/BIRD `.json` list, or a `.jsonl` pool file.
        tables: optional `tables.json`; every example's `db_id` must appear in it.
        source: the examples' `source` tag and id prefix (default: `spider`/`bird`/`jsonl` + the file stem).
    """
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"{path}: no such dataset file")
    if path.suffix == ".jsonl":
        try:
            examples = read_examples(path)
        except RecordError as e:
            raise DatasetError(str(e)) from None
        if source:
            examples = [replace(e, source=source) for e in examples]
    else:
        items = _read_json_list(path)
        kind = _detect(items, path)
        tag = source or f"{kind}-{path.stem}"
        parse = _parse_bird if kind == "bird" else _parse_spider
        examples = []
        for i, item in enumerate(items):
            try:
                examples.append(parse(item, i, tag))
            except DatasetError as e:
                raise DatasetError(f"{items.where(i)}: {e}") from None
        try:
            check_unique_ids(examples, str(path))
        except RecordError as e:
            raise DatasetError(str(e)) from None
    if tables is not None:
        _check_tables(examples, load_tables(tables), path)
    return examples


def load_tables(path: str | Path) -> dict[str, dict]:
    """Spider/BIRD `tables.json` as `{db_id: entry}`.

    Example:
        >>> import tempfile, os
        >>> f = os.path.join(tempfile.mkdtemp(), "tables.json")
        >>> _ = open(f, "w").write('[{"db_id": "shop", "table_names_original": ["item"]}]')
        >>> list(load_tables(f))
        ['shop']
    """
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"{path}: no such tables file")
    entries = _read_json_list(path)
    out = {}
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or not isinstance(entry.get("db_id"), str):
            raise DatasetError(f"{entries.where(i)}: no string 'db_id'; is this a Spider/BIRD tables.json?")
        out[entry["db_id"]] = entry
    return out


def _read_json_list(path: Path) -> JsonList:
    try:
        data = read_json(path)
    except JsonlError as e:
        raise DatasetError(f"{e}; Spider/BIRD files are one JSON list, pool files end in .jsonl") from None
    if not isinstance(data, list):
        raise DatasetError(f"{path}: expected a JSON list of examples, got {type(data).__name__}")
    return data


def _detect(items: list, path: Path) -> str:
    first = next((x for x in items if isinstance(x, dict)), None)
    if first is None:
        raise DatasetError(f"{path}: no example objects in the list")
    if "SQL" in first:
        return "bird"
    if "query" in first:
        return "spider"
    raise DatasetError(f"{path}: cannot tell the format from item keys {sorted(first)[:8]}: Spider items have "
                       "'query', BIRD items have 'SQL' (pool JSONL files must end in .jsonl)")


def _field(item, key: str) -> str:
    if not isinstance(item, dict):
        raise DatasetError(f"expected an object, got {type(item).__name__}")
    value = item.get(key)
    if not isinstance(value, str) or not value.strip():
        raise DatasetError(f"field {key!r} must be a non-empty string, got {value!r}")
    return value


def _parse_spider(item, index: int, tag: str) -> Example:
    return Example(id=f"{tag}-{index}", db_id=_field(item, "db_id"), question=_field(item, "question"),
                   gold_sql=_field(item, "query"), source=tag.split("-")[0])


def _parse_bird(item, index: int, tag: str) -> Example:
    db_id, question, sql = _field(item, "db_id"), _field(item, "question"), _field(item, "SQL")
    level = item.get("difficulty")
    return Example(id=f"{tag}-{item.get('question_id', index)}", db_id=db_id, question=question, gold_sql=sql,
                   evidence=str(item.get("evidence") or ""), source=tag.split("-")[0],
                   level=None if level is None else str(level))


def _check_tables(examples: list[Example], tables: dict[str, dict], path: Path) -> None:
    unknown = sorted({e.db_id for e in examples} - set(tables))
    if unknown:
        n = sum(e.db_id in unknown for e in examples)
        raise DatasetError(f"{path}: {n} example(s) use database(s) not in the tables file: {unknown[:5]}"
                           f"{' ...' if len(unknown) > 5 else ''}; pass the tables.json that belongs to this dataset")
