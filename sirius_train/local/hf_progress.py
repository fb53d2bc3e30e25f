"""The Hugging Face Trainer's progress (`sirius_train.progress`: a rich bar on a terminal, plain lines in a log),
with the loss. Its own module because it subclasses `transformers.TrainerCallback`: importing it imports
transformers, which the light commands never do (`sirius_train.progress` stays free of it)."""

from __future__ import annotations

from contextlib import ExitStack

from transformers import TrainerCallback

from sirius_train.progress import progress_bar


class HFProgressCallback(TrainerCallback):
    """`progress_bar` for the Hugging Face Trainer (its own tqdm is turned off): steps, and the last logged loss."""

    def __init__(self, description: str):
        self.description = description
        self._stack: ExitStack | None = None
        self._advance = None
        self._step = 0

    def on_train_begin(self, args, state, control, **kwargs):
        self._stack = ExitStack()
        self._advance = self._stack.enter_context(progress_bar(self.description, state.max_steps))
        self._step = state.global_step
        if self._step:  # resumed from a checkpoint: those steps were done by an earlier process
            self._advance(self._step, earlier=True)

    def on_step_end(self, args, state, control, **kwargs):
        self._advance(state.global_step - self._step)
        self._step = state.global_step

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs and self._advance is not None:
            self._advance(0, loss=float(logs["loss"]))

    def on_train_end(self, args, state, control, **kwargs):
        if self._stack is not None:
            self._stack.close()
            self._stack = self._advance = None
