"""How a run stops itself on purpose: the exceptions that say why, and the signals that ask it to.

Torch-free, so the verl launcher and the commands can catch and raise them without the local trainer."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from contextlib import contextmanager


class TrainingHalted(RuntimeError):
    """The run stopped itself for a stated reason, before any update or checkpoint from the bad state."""


class Preempted(TrainingHalted):
    """A preemption signal (SIGTERM, or SIGUSR1 as Slurm's `--signal` sends it) ended the run after a complete,
    checkpointed step: rerunning the same command resumes from it exactly."""


class NonFiniteGradients(TrainingHalted):
    """`max_nonfinite_steps` optimizer steps in a row had a non-finite gradient norm: the run has diverged."""


PREEMPTION_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


@contextmanager
def preemption_signals(forward: Callable[[signal.Signals], None] | None = None):
    """Within: SIGTERM / SIGUSR1 are noted (their names appended to the yielded list) instead of ending the
    process, so the loop can finish its step and checkpoint; `forward(sig)`, when given, is called with each
    one as it arrives (to pass it on to a child). Signal handlers exist only in the main thread."""
    caught: list[str] = []
    if threading.current_thread() is not threading.main_thread():
        yield caught
        return

    def note(signum: int, frame) -> None:
        caught.append(signal.Signals(signum).name)
        if forward is not None:
            forward(signal.Signals(signum))

    previous = {s: signal.signal(s, note) for s in PREEMPTION_SIGNALS}
    try:
        yield caught
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
