"""JSON Lines in and out (and the JSON and text inputs beside them): every fault of an input file is one line
naming the file and line, and a write never leaves half a file behind.

It sits on the data floor so that `data_synthesis` (pool files) and `sirius_train` (every command's inputs
and outputs) share it without an import climbing up. Lines are parsed from bytes by orjson (the CLI reads
and writes whole score files, so this is its hot path); `json` takes over only for what orjson refuses
(escaped lone surrogates) and to describe a bad line.
"""

from __future__ import annotations

import codecs
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path

import orjson

Types = type | tuple[type, ...]
NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true or false", list: "a list",
         dict: "an object", type(None): "null"}


class JsonlError(ValueError):
    """A JSONL file that cannot be read as asked; the message starts with `file:line:`."""


def read_jsonl(path: str | Path, required: Iterable[str] | Mapping[str, Types] = (),
               parse: Callable[[dict], object] | None = None) -> list:
    """Every object of a JSONL file (blank lines skipped), checked line by line.

    `required` names the fields each line needs, or maps each to the JSON type(s) it must have
    (`float` accepts integers too). `parse(row)` may turn a row into something else; a ValueError it
    raises is reported for that line. Any fault raises JsonlError: `file:line: what is wrong`.

    Example:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "pairs.jsonl"
        >>> _ = p.write_bytes(b'{"id": 1, "sql": "SELECT 1"}\\n{"id": 2, "sql": 5}\\n')
        >>> read_jsonl(p, {"id": int, "sql": str})
        Traceback (most recent call last):
        ...
        data_synthesis.jsonl.JsonlError: ...pairs.jsonl:2: field 'sql' must be a string, got 5 (an integer)
    """
    types = dict(required) if isinstance(required, Mapping) else dict.fromkeys(required)
    path = Path(path)
    if not path.is_file():
        raise JsonlError(f"{path}: no such file")
    rows = []
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, 1):
            if lineno == 1 and raw.startswith(codecs.BOM_UTF8):
                raw = raw[len(codecs.BOM_UTF8):]
            if not raw.strip():
                continue
            row = _parse_line(raw, f"{path}:{lineno}", last=not raw.endswith(b"\n"))
            where = f"{path}:{lineno}"
            if not isinstance(row, dict):
                raise JsonlError(f"{where}: expected a JSON object, got {_name(row)}")
            _check_fields(row, types, where)
            if parse is not None:
                try:
                    row = parse(row)
                except ValueError as e:
                    raise JsonlError(f"{where}: {e}") from None
            rows.append(row)
    return rows


def iter_jsonl(path: str | Path) -> Iterator[dict]:
    """Stream a JSONL file this project appends to (metrics): a torn last line (a crash mid-append) is skipped;
    a missing file is empty."""
    path = Path(path)
    if not path.is_file():
        return
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, 1):
            if not raw.endswith(b"\n"):
                return
            if raw.strip():
                yield _parse_line(raw, f"{path}:{lineno}", last=False)


def read_json(path: str | Path):
    """A whole JSON document (Spider/BIRD files); a list comes back as a `JsonList`, whose items can be named
    by line. Bad UTF-8 or bad JSON raise JsonlError: `file:line: what is wrong`."""
    path = Path(path)
    text = read_text(path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        if not text[e.pos:].strip():
            raise JsonlError(f"{path}:{e.lineno}: truncated: the file ends before the JSON does ({e.msg})") from None
        raise JsonlError(f"{path}:{e.lineno}: not valid JSON ({e.msg} at column {e.colno})") from None
    return JsonList(data, path, text) if isinstance(data, list) else data


class JsonList(list):
    """The items of a JSON list read from a file; `where(i)` names item i as `file:line: item i` (the line is found
    only when asked, for an error message)."""

    def __init__(self, items: list, path: Path, text: str):
        super().__init__(items)
        self.path, self._text = path, text

    def where(self, index: int) -> str:
        decoder, text = json.JSONDecoder(), self._text
        pos = text.index("[") + 1
        for _ in range(index + 1):
            while text[pos] in " \t\r\n,":
                pos += 1
            start = pos
            _, pos = decoder.raw_decode(text, pos)
        return f"{self.path}:{text.count(chr(10), 0, start) + 1}: item {index}"


def read_text(path: str | Path) -> str:
    """A UTF-8 text file (a BOM is dropped); a missing file or a bad byte raises JsonlError naming file and line."""
    path = Path(path)
    if not path.is_file():
        raise JsonlError(f"{path}: no such file")
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        column = e.start - raw.rfind(b"\n", 0, e.start)
        raise JsonlError(f"{path}:{line}: not valid UTF-8 (byte 0x{raw[e.start]:02x} at column {column}); "
                         "save the file as UTF-8") from None


def write_jsonl(path: str | Path, rows: Iterable[dict]) -> int:
    """Write rows atomically (a temp file beside `path`, renamed at the end; removed if anything fails, rows
    included); returns the number written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            lines = [_dumps(row) for row in rows]
            f.writelines(lines)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return len(lines)


def _dumps(row: dict) -> bytes:
    try:
        return orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE)
    except orjson.JSONEncodeError:  # lone surrogates, non-string keys, huge integers: `json` writes them escaped
        return json.dumps(row).encode() + b"\n"


def _parse_line(raw: bytes, where: str, last: bool):
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        pass
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise JsonlError(f"{where}: not valid UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1}); "
                         "save the file as UTF-8") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        if last:
            raise JsonlError(f"{where}: truncated last line (no newline at the end and not valid JSON: {e.msg} at "
                             f"column {e.colno}); was the file cut off while being written?") from None
        raise JsonlError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None


def _check_fields(row: dict, types: dict, where: str) -> None:
    missing = [k for k in types if k not in row]
    if missing:
        raise JsonlError(f"{where}: missing field(s) {missing}; each line needs {list(types)}")
    for key, allowed in types.items():
        if allowed is not None and not _is(row[key], allowed):
            allowed = allowed if isinstance(allowed, tuple) else (allowed,)
            raise JsonlError(f"{where}: field {key!r} must be {' or '.join(NAMES.get(t, t.__name__) for t in allowed)}"
                             f", got {_show(row[key])} ({_name(row[key])})")


def _is(value, allowed: Types) -> bool:
    allowed = allowed if isinstance(allowed, tuple) else (allowed,)
    if isinstance(value, bool):
        return bool in allowed
    return isinstance(value, allowed) or (float in allowed and isinstance(value, int))


def _name(value) -> str:
    return NAMES.get(type(value), type(value).__name__)


def _show(value) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 40 else text[:37] + "..."
