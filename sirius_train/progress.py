"""Progress on stderr, so stdout stays clean for piping: a rich bar on a terminal, plain lines anywhere else.

A rich bar written to a file or a pipe (a cluster log under slurm or nohup) prints once, when it is finished:
for the whole of a 17-minute SFT the log says nothing, which reads as a hang. So when stderr is not a
terminal, a long phase prints one plain line at a steady pace instead (`heartbeat`): done / total, elapsed,
rate, ETA and the figures the phase reports (the loss, the reward). `SIRIUS_PROGRESS_EVERY_S` sets the pace
(30 s by default).
"""

from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager

from rich.console import Console

stderr = Console(stderr=True)


def every_s_default() -> float:
    """Seconds between two heartbeat lines: `SIRIUS_PROGRESS_EVERY_S`, else 30."""
    try:
        return max(0.01, float(os.environ.get("SIRIUS_PROGRESS_EVERY_S", "30")))
    except ValueError:
        return 30.0


def duration(seconds: float) -> str:
    """A short human duration.

    >>> duration(7), duration(125), duration(3 * 3600 + 61)
    ('7s', '2m05s', '3h01m')
    """
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def shown_text(shown: dict) -> str:
    """The figures a phase reports beside its count.

    >>> shown_text({"loss": 1.23456, "reward": 0.5, "note": "x"})
    'loss 1.235, reward 0.500, note x'
    """
    return ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in shown.items())


def progress_line(description: str, done: int, total: int, elapsed: float, fresh: int, earlier: int = 0,
                  shown: dict | None = None) -> str:
    """One heartbeat line. `fresh`: items done in this process (the rate and ETA count only them); `earlier`:
    items done before it (a resumed run, a cache).

    >>> progress_line("SFT", 120, 816, 60.0, 120, shown={"loss": 0.91})
    'SFT: 120/816 (14%), 1m00s elapsed, 2.00/s, ETA 5m48s, loss 0.910'
    >>> progress_line("pass rates", 40, 460, 200.0, 10, earlier=30)
    'pass rates: 40/460 (8%, 30 done earlier), 3m20s elapsed, 20.0s each, ETA 2h20m'
    >>> progress_line("DAPO stage1", 0, 40, 12.0, 0)
    'DAPO stage1: 0/40 (0%), 12s elapsed'
    """
    pct = f"{100 * done // total}%" if total else "?%"
    head = f"{description}: {done}/{total} ({pct}{f', {earlier} done earlier' if earlier else ''}), " \
           f"{duration(elapsed)} elapsed"
    parts = [head]
    if fresh and elapsed > 0:
        rate = fresh / elapsed
        parts.append(f"{rate:.2f}/s" if rate >= 1 else f"{1 / rate:.1f}s each")
        if total > done:
            parts.append(f"ETA {duration((total - done) / rate)}")
    if shown:
        parts.append(shown_text(shown))
    return ", ".join(parts)


class _Lines:
    """The state behind `heartbeat`: what is done, and a thread that prints it every `every_s` seconds."""

    def __init__(self, description: str, total: int, every_s: float):
        self.description, self.total, self.every_s = description, total, every_s
        self.start = time.monotonic()
        self.done = self.fresh = self.earlier = 0
        self.shown: dict = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._tick, name=f"heartbeat {description}", daemon=True)

    def __call__(self, n: int = 1, *, earlier: bool = False, **shown) -> None:
        self.done += n
        if earlier:
            self.earlier += n
        else:
            self.fresh += n
        self.shown.update(shown)

    def line(self) -> str:
        return progress_line(self.description, self.done, self.total, time.monotonic() - self.start, self.fresh,
                             self.earlier, self.shown)

    def _tick(self) -> None:
        while not self.stop.wait(self.every_s):
            stderr.print(self.line(), highlight=False, markup=False, soft_wrap=True)


@contextmanager
def heartbeat(description: str, total: int, every_s: float | None = None):
    """Yield `advance(n=1, *, earlier=False, **shown)`; print `progress_line` every `every_s` seconds (however
    slowly the work advances: a long step still shows it is alive) and once at the end. `earlier=True`: items
    done before this process (resumed, cached), left out of the rate; `shown`: figures such as `loss=0.8`."""
    lines = _Lines(description, total, every_s_default() if every_s is None else every_s)
    stderr.print(f"{description}: {total} to do", highlight=False, markup=False, soft_wrap=True)
    lines.thread.start()
    try:
        yield lines
    finally:
        lines.stop.set()
        lines.thread.join()
    stderr.print(lines.line(), highlight=False, markup=False, soft_wrap=True)


@contextmanager
def progress_bar(description: str, total: int, enabled: bool = True, every_s: float | None = None):
    """Yield `advance(n=1, *, earlier=False, **shown)`, thread-safe: a rich bar on a terminal (with `shown`,
    e.g. `loss=0.8`, beside it), `heartbeat`'s plain lines when stderr is a file or a pipe; nothing when not
    `enabled`."""
    if not enabled:
        yield lambda n=1, **_: None
        return
    if not stderr.is_terminal:
        with heartbeat(description, total, every_s) as advance:
            yield advance
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TimeRemainingColumn(), TextColumn("{task.fields[shown]}"), console=stderr,
                  transient=False) as progress:
        task = progress.add_task(description, total=total, shown="")
        figures: dict = {}

        def advance(n: int = 1, *, earlier: bool = False, **shown) -> None:
            figures.update(shown)
            progress.update(task, advance=n, shown=shown_text(figures))

        yield advance
