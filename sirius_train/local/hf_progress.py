"""The Hugging Face Trainer's progress bar (rich, on stderr, with the loss). Its own module because it
subclasses `transformers.TrainerCallback`: importing it imports transformers, which the light commands
never do (`sirius_train.progress` stays free of it)."""

from __future__ import annotations

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from transformers import TrainerCallback

from sirius_train.progress import stderr


class HFProgressCallback(TrainerCallback):
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
