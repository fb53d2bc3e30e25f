"""SFT's durable stops: each Trainer checkpoint gets its completeness record, and a signal the schedule caught ends
the warm start at the next step, checkpointed.

Its own module because it subclasses `transformers.TrainerCallback` (as `hf_progress` does)."""

from __future__ import annotations

from pathlib import Path

from transformers import TrainerCallback

from sirius_train.halts import Preempted, pending
from sirius_train.local.checkpoint import list_checkpoints, prune_checkpoints, write_manifest

SFT_CHECKPOINTS = "checkpoint-*"  # the Trainer's folder names
TRAINER_WRITES_LAST = "trainer_state.json"  # Trainer._save_checkpoint's last file: with it, a save predating
# MANIFEST.json (an older version, a plain Trainer run) is complete
KEEP_SFT_CHECKPOINTS = 1


class RecordCheckpoints(TrainerCallback):
    """After the Trainer saved `checkpoint-N` (every rank's files: a barrier first), rank 0 writes its
    `MANIFEST.json` last, then deletes older checkpoints, counting complete ones only (`local.checkpoint`).
    The Trainer's own rotation (`save_total_limit`) stays off: it deletes before the new one is complete."""

    def on_save(self, args, state, control, **kwargs):
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.barrier()
        if state.is_world_process_zero:
            output_dir = Path(args.output_dir)
            write_manifest(output_dir / f"checkpoint-{state.global_step}", state.global_step, hashes=False)
            prune_checkpoints(list_checkpoints(output_dir, SFT_CHECKPOINTS), KEEP_SFT_CHECKPOINTS,
                              TRAINER_WRITES_LAST)


class StopOnPreemption(TrainerCallback):
    """At the end of the step in progress: the Trainer writes its checkpoint, then `Preempted` is raised, so the
    rerun resumes SFT from that step. The last step is left to finish the phase. Runs after `RecordCheckpoints`."""

    def on_step_end(self, args, state, control, **kwargs):
        if pending() is not None and state.global_step < state.max_steps:
            control.should_save = True
            control.should_training_stop = True

    def on_save(self, args, state, control, **kwargs):
        if (name := pending()) is not None and state.global_step < state.max_steps:
            raise Preempted(f"{name}: SFT stopped after step {state.global_step} of {state.max_steps}, checkpoint "
                            f"{args.output_dir}/checkpoint-{state.global_step} written")
