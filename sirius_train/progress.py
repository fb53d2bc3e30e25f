"""Progress bars on stderr (rich), so stdout stays clean for piping."""

from __future__ import annotations

import time
from contextlib import contextmanager

from rich.console import Console

stderr = Console(stderr=True)


@contextmanager
def progress_bar(description: str, total: int, enabled: bool = True):
    """Yield `advance(n=1)`; thread-safe (rich serialises updates)."""
    if not enabled:
        yield lambda n=1: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TimeRemainingColumn(), console=stderr, transient=False) as progress:
        task = progress.add_task(description, total=total)
        yield lambda n=1: progress.advance(task, n)



@contextmanager
def heartbeat(description: str, total: int, every_s: float = 30.0):
    """`progress_bar` for --quiet: one line `description: done/total (seconds)` at most every `every_s` seconds
    and one at the end, so a long quiet run still says it is alive."""
    start = last = time.monotonic()
    done = 0

    def advance(n=1):
        nonlocal done, last
        done += n
        if time.monotonic() - last >= every_s:
            last = time.monotonic()
            stderr.print(f"{description}: {done}/{total} ({last - start:.0f} s)")

    yield advance
    stderr.print(f"{description}: {done}/{total} ({time.monotonic() - start:.0f} s)")
