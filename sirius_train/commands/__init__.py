"""One module per `sirius` command group; each exposes `register(app)`. Heavy imports stay inside commands.

Every command ends the same way on bad input or a failing endpoint: one line on stderr, exit code 2
(`one_line_errors`), never a traceback.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from enum import Enum

import typer

from rewards.databases import UnknownDatabase

# What a user can cause and fix: bad files, flags and values (ValueError: JsonlError, DatasetError, ConfigError,
# ...), missing or unwritable files and folders (OSError), an unknown database (UnknownDatabase). Not
# LookupError as a whole: an internal KeyError / IndexError is a bug, and `error: 'x'` would hide it.
USER_ERRORS = (ValueError, OSError, UnknownDatabase)


def choices(name: str, values: tuple[str, ...]) -> type[Enum]:
    """An option's fixed values as a str enum, so typer lists them in --help and refuses any other value before
    anything runs (and the docs test checks documented values against them); commands pass `.value` on.

    Example:
        >>> Rerank = choices("Rerank", ("auto", "never"))
        >>> Rerank("never").value, [m.value for m in Rerank]
        ('never', ['auto', 'never'])
    """
    return Enum(name, [(v, v) for v in values], type=str)


def fail(message: object) -> typer.Exit:
    """Print `error: message` as one line (newlines folded, not read as rich markup); return the exit to raise."""
    from rich.markup import escape

    from sirius_train.progress import stderr

    stderr.print(f"[red]error:[/] {escape(' '.join(str(message).split()))}", soft_wrap=True)
    return typer.Exit(2)


@contextmanager
def one_line_errors():
    """Turn a user's error (see USER_ERRORS), a missing extra or an endpoint's `EndpointError` into `fail`."""
    from data_synthesis.extras import MissingExtra

    try:
        yield
    except (*USER_ERRORS, MissingExtra) as e:
        raise fail(e) from None
    except RuntimeError as e:
        if _is_endpoint_error(e):
            raise fail(f"endpoint unreachable or failing: {e}") from None
        raise


def _is_endpoint_error(e: RuntimeError) -> bool:
    """An EndpointError can only come from a loaded chat client, so the light commands never import httpx for it."""
    chat = sys.modules.get("data_synthesis.chat_client")
    return chat is not None and isinstance(e, chat.EndpointError)
