"""The one boundary around every analysis of candidate SQL: an analyser's failure is a verdict, not a crash.

Candidate SQL comes from models and other people's systems. sqlglot's scope analysis refuses a table
joined to itself without aliases (`OptimizeError: Alias already used: t`), its parser recurses once per
nesting level (`RecursionError` on 10k-deep parentheses), and the next odd input will find something
else. None of that says the query is wrong -- only that our analysis cannot read it -- so the candidate
goes on to execution, where SQLite is the judge, and the trace says why it was not analysed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")
MESSAGE_CHARS = 200

UNANALYSABLE = "unanalysable"


@dataclass(frozen=True)
class Unanalysable:
    """An analysis that could not be carried out on this SQL, and why (one line)."""

    message: str
    kind: str = UNANALYSABLE


def attempt(analysis: Callable[..., T], *args) -> T | Unanalysable:
    """`analysis(*args)`, or an `Unanalysable` verdict when it raises anything at all.

    Example:
        >>> attempt(int, "12")
        12
        >>> attempt(int, "twelve")
        Unanalysable(message="ValueError: invalid literal for int() with base 10: 'twelve'", kind='unanalysable')
    """
    try:
        return analysis(*args)
    except Exception as e:  # noqa: BLE001 -- the point: no analyser failure may end a batch (RecursionError included)
        return Unanalysable(describe(e))


def describe(error: BaseException) -> str:
    """`Type: first line of the message`, cut to MESSAGE_CHARS: what a trace can show."""
    lines = str(error).strip().splitlines()
    text = f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__
    return text[:MESSAGE_CHARS]
