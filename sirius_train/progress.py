"""Progress bars on stderr (rich), so stdout stays clean for piping."""

from __future__ import annotations

from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

stderr = Console(stderr=True)


@contextmanager
def progress_bar(description: str, total: int, enabled: bool = True):
    """Yield `advance(n=1)`; thread-safe (rich serialises updates)."""
    if not enabled:
        yield lambda n=1: None
        return
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TimeRemainingColumn(), console=stderr, transient=False) as progress:
        task = progress.add_task(description, total=total)
        yield lambda n=1: progress.advance(task, n)


def _hf_callback_base():
    from transformers import TrainerCallback

    return TrainerCallback


class HFProgressCallback(_hf_callback_base()):
    """A rich progress bar for the Hugging Face Trainer (its own tqdm is turned off), with the loss."""

    def __init__(self, description: str):
        self.description = description
        self._progress = None
        self._task = None

    def on_train_begin(self, args, state, control, **kwargs):
        self._progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                  TimeElapsedColumn(), TimeRemainingColumn(), TextColumn("{task.fields[loss]}"),
                                  console=stderr)
        self._progress.start()
        self._task = self._progress.add_task(self.description, total=state.max_steps, completed=state.global_step,
                                             loss="")

    def on_step_end(self, args, state, control, **kwargs):
        self._progress.update(self._task, completed=state.global_step)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs and self._progress is not None:
            self._progress.update(self._task, loss=f"loss {float(logs['loss']):.3f}")

    def on_train_end(self, args, state, control, **kwargs):
        if self._progress is not None:
            self._progress.stop()
