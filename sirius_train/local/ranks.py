"""Multi-process launches of `sirius sft` (`torchrun`, `deepspeed`, `accelerate launch`): rank 0 leads, the others
follow into the SFT.

The schedule (data, base model, SFT, evaluation, files marking each phase done) is one process's work;
only the SFT itself is data-parallel. So under a launcher rank 0 runs `sirius sft` as it would alone, and the
other ranks wait in `wait_for_leader` until rank 0's `train_sft` publishes what to train (`Handoff.publish`);
then every rank trains in the same `Trainer`, and the followers exit. A rank-0 run that has nothing to train
(the SFT phase is already done) releases the followers with `None`. The wait uses a gloo group with a long
timeout (data synthesis and loading a 32B model come first); if rank 0 dies, the launcher ends the others.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

LEADER_TIMEOUT_S = 6 * 3600  # how long followers wait for rank 0 to reach the SFT

_handoff: Handoff | None = None


def launch_world_size() -> int:
    """Processes in this launch (1 when not launched)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def launch_rank() -> int:
    return int(os.environ.get("RANK", "0"))


class Handoff:
    """Rank 0's side of the wait: publishes the SFT spec (a picklable dict) to every other rank, once."""

    def __init__(self, group):
        self._group = group
        self.published = False

    def publish(self, spec: dict | None) -> None:
        if self.published:
            raise RuntimeError("the SFT handoff was already published: one warm start per launch")
        import torch.distributed as dist

        dist.broadcast_object_list([spec], src=0, group=self._group)
        self.published = True


@contextmanager
def leading(timeout_s: float = LEADER_TIMEOUT_S) -> Iterator[Handoff | None]:
    """Rank 0 of a launch: `train_sft` publishes through the handoff; on exit, waiting ranks are released."""
    global _handoff
    if launch_world_size() == 1:
        yield None
        return
    _handoff = Handoff(_handoff_group(timeout_s))
    try:
        yield _handoff
    finally:
        if not _handoff.published:
            _handoff.publish(None)
        _handoff = None


def current_handoff() -> Handoff | None:
    """The handoff `train_sft` must publish to, when this process leads a launch."""
    return _handoff


def wait_for_leader(timeout_s: float = LEADER_TIMEOUT_S) -> dict | None:
    """Ranks > 0: block until rank 0 publishes the SFT spec (None: nothing to train)."""
    import torch.distributed as dist

    received = [None]
    dist.broadcast_object_list(received, src=0, group=_handoff_group(timeout_s))
    return received[0]


def finish() -> None:
    """Tear the process group down at the end of a launched command."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _handoff_group(timeout_s: float):
    """The launch's process group (NCCL on GPUs, gloo on CPUs; DeepSpeed and accelerate reuse it) and a gloo
    group for the handoff, whose timeout covers rank 0's work before the SFT."""
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
    return dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
