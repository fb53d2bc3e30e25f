"""`--threads` of the commands that run a local model: by default as many torch threads as the machine has idle
cores. PyTorch's default (every core) spins its OpenMP threads against other processes on a busy machine:
`sirius benchmark` on 2 shared cores ran at 0.5 questions/s with 2 threads against 4.3 on an idle one
(docs/benchmarks/smollm2.md: 113.8 s against 38.7 s with 1 thread)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import typer

THREADS = typer.Option(0, "--threads", min=0, help="torch CPU threads for a local model (0: the cores other "
                                                    "processes leave idle, at least 1)")


def idle_cores(cores: int, load: float) -> int:
    """Cores the 1-minute load average leaves idle, at least 1.

    >>> idle_cores(2, 0.1), idle_cores(2, 0.9), idle_cores(2, 3.5), idle_cores(16, 4.2)
    (2, 1, 1, 12)
    """
    return max(1, min(cores, int(cores - load + 0.5)))


@contextmanager
def torch_threads(requested: int) -> Iterator[int]:
    """Torch's CPU threads set to `requested` (0: `idle_cores`) inside, as before after (a command run in a
    test's process leaves the next test as it found it); yields the number set."""
    import torch

    before = torch.get_num_threads()
    threads = requested or idle_cores(os.cpu_count() or 1, os.getloadavg()[0])
    torch.set_num_threads(threads)
    try:
        yield threads
    finally:
        torch.set_num_threads(before)
