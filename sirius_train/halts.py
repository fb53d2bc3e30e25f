"""How a run stops itself on purpose: the exceptions that say why, and the signals that ask it to.

Torch-free, so the verl launcher and the commands can catch and raise them without the local trainer."""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable
from contextlib import contextmanager


class TrainingHalted(RuntimeError):
    """The run stopped itself for a stated reason, before any update or checkpoint from the bad state."""


class Preempted(TrainingHalted):
    """A preemption signal (SIGTERM, or SIGUSR1 as Slurm's `--signal` sends it) or a first Ctrl-C (SIGINT) ended
    the run after a complete, checkpointed step: rerunning the same command resumes from it exactly."""

    @property
    def interrupted(self) -> bool:
        """The user pressed Ctrl-C (not the cluster): the command exits 130, as an interrupted command does."""
        return str(self).startswith("SIGINT:")


class NonFiniteGradients(TrainingHalted):
    """`max_nonfinite_steps` optimizer steps in a row had a non-finite gradient norm: the run has diverged."""


PREEMPTION_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
CAUGHT_SIGNALS = (*PREEMPTION_SIGNALS, signal.SIGINT)  # a first Ctrl-C stops the run as SIGTERM does
_open: list[list[str]] = []  # the `caught` lists of the preemption_signals contexts now open, innermost last


@contextmanager
def preemption_signals(forward: Callable[[signal.Signals], None] | None = None):
    """Within: SIGTERM / SIGUSR1 are noted (their names appended to the yielded list) instead of ending the
    process, so the loop can finish its step and checkpoint; `forward(sig)`, when given, is called with each
    one as it arrives (to pass it on to a child). A signal an enclosing context caught is already in the list:
    it asks this one to stop too. Signal handlers exist only in the main thread.

    A first Ctrl-C (SIGINT) is noted the same way -- and forwarded as SIGTERM, so a child stops as it would
    when preempted -- with a line on stderr saying so; a Ctrl-C while a signal is already pending raises
    `KeyboardInterrupt` at once (the steps since the last checkpoint are lost)."""
    caught: list[str] = [name] if (name := pending()) is not None else []
    if threading.current_thread() is not threading.main_thread():
        yield caught
        return

    def note(signum: int, frame) -> None:
        sig = signal.Signals(signum)
        if sig == signal.SIGINT:
            if pending() is not None:
                raise KeyboardInterrupt
            sys.stderr.write("\nCtrl-C: stopping at the next checkpoint (the rerun resumes there); Ctrl-C again "
                             "stops at once\n")
        caught.append(sig.name)
        if forward is not None:
            forward(signal.SIGTERM if sig == signal.SIGINT else sig)

    previous = {s: signal.signal(s, note) for s in CAUGHT_SIGNALS}
    _open.append(caught)
    try:
        yield caught
    finally:
        _close(caught)
        for s, handler in previous.items():
            signal.signal(s, handler)


def _close(caught: list[str]) -> None:
    """Take `caught` itself out of `_open`: `list.remove` would take the first *equal* list, and an enclosing
    context's list is as empty as an inner one's until a signal arrives."""
    del _open[next(i for i, c in enumerate(_open) if c is caught)]


def pending() -> str | None:
    """The name of a preemption signal an open `preemption_signals` context has caught, or None."""
    return next((caught[0] for caught in _open if caught), None)


def stop_if_preempted(what: str) -> None:
    """At a point where everything so far is on disk: `Preempted("<signal>: <what>")` if a signal is pending."""
    if (name := pending()) is not None:
        raise Preempted(f"{name}: {what}")


def preemptible(progress: Callable[[int], None], what: str) -> Callable[[int], None]:
    """`progress`, then `stop_if_preempted(what)`: for a loop that ticks only after its work is written
    (pass-rate estimation appends and fsyncs each chunk before it reports it)."""
    def tick(n: int) -> None:
        progress(n)
        stop_if_preempted(what)
    return tick
