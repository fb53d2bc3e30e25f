"""Finding the reward worker that is running an item, to kill it under that item (test helper)."""

from __future__ import annotations

import time

from rewards._worker import STATE


def running_worker_pid(executor, min_elapsed_s: float, deadline_s: float = 10.0, exclude=()) -> int:
    """The pid of a worker (not one of `exclude`) that has run one item for at least `min_elapsed_s` (polls)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        for worker in list(executor._workers):
            try:
                index, elapsed = worker.running(STATE.unpack_from(worker.state, 0)[0])
            except ValueError:  # a worker being replaced: its state record is closed
                continue
            if index >= 0 and elapsed >= min_elapsed_s and worker.proc.pid not in exclude:
                return worker.proc.pid
        time.sleep(0.02)
    raise AssertionError("no worker ever ran the slow item")
