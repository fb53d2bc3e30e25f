"""JSON Lines in and out, with errors that name the file and line, and writes that never leave half a file."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path


class JsonlError(ValueError):
    pass


def read_jsonl(path: str | Path, required: Iterable[str] = ()) -> list[dict]:
    """All objects of a JSONL file; blank lines skipped; a bad line raises JsonlError naming it."""
    required = tuple(required)
    path = Path(path)
    if not path.is_file():
        raise JsonlError(f"{path}: no such file")
    rows = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise JsonlError(f"{path}:{lineno}: not valid JSON ({e.msg} at column {e.colno})") from None
            if not isinstance(row, dict):
                raise JsonlError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
            missing = [k for k in required if k not in row]
            if missing:
                raise JsonlError(f"{path}:{lineno}: missing field(s) {missing}; each line needs {list(required)}")
            rows.append(row)
    return rows


def write_jsonl(path: str | Path, rows: Iterable[dict]) -> int:
    """Write rows atomically (temp file + rename); returns the number written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    n = 0
    with tmp.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
            n += 1
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)
    return n


def iter_jsonl(path: str | Path) -> Iterator[dict]:
    """Stream a JSONL file that may end in a torn line (a crash mid-append): the torn tail is skipped."""
    path = Path(path)
    if not path.is_file():
        return
    with path.open(encoding="utf-8") as f:
        for line in f:
            if not line.endswith("\n"):
                return
            if line.strip():
                yield json.loads(line)
