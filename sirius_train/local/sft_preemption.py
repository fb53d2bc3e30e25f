"""SFT's side of preemption: a signal the schedule caught ends the warm start at the next step, checkpointed.

Its own module because it subclasses `transformers.TrainerCallback` (as `hf_progress` does)."""

from __future__ import annotations

from transformers import TrainerCallback

from sirius_train.halts import Preempted, pending


class StopOnPreemption(TrainerCallback):
    """At the end of the step in progress: the Trainer writes its checkpoint, then `Preempted` is raised, so the
    rerun's `get_last_checkpoint` resumes SFT from that step. The last step is left to finish the phase."""

    def on_step_end(self, args, state, control, **kwargs):
        if pending() is not None and state.global_step < state.max_steps:
            control.should_save = True
            control.should_training_stop = True

    def on_save(self, args, state, control, **kwargs):
        if (name := pending()) is not None and state.global_step < state.max_steps:
            raise Preempted(f"{name}: SFT stopped after step {state.global_step} of {state.max_steps}, checkpoint "
                            f"{args.output_dir}/checkpoint-{state.global_step} written")
