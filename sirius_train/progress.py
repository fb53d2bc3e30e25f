"""Progress bars on stderr (rich), so stdout stays clean for piping."""

from __future__ import annotations

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

