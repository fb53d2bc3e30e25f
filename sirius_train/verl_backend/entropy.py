"""The threshold-gated entropy bonus inside verl 0.9: a registered trainer plus a loss installed on the actor workers.

Why this extension point. verl's entropy term is `actor.entropy_coeff`, one constant for the whole run,
read on the workers inside `ppo_loss`; the gate needs a coefficient that changes every step from the
batch's entropy, which only the driver knows (`_compute_old_log_prob` logs `actor/entropy`, H_k under
π_old). A registered policy loss (`core_algos.register_policy_loss`) never sees the entropy, and there is
no actor class to configure by name in the V1 trainer. What verl does offer:

- `verl.trainer.ppo.v1.register_trainer`: trainer classes selected by `trainer.v1.trainer_mode`. Ours,
  `sirius_dapo`, is verl's sync trainer with one change in `_update_actor`: it reads H_k, asks
  `EntropyGate.active_coefficient(H_k)` for c_k·1[H_k < H_target], sends it with the batch (extra_info
  becomes non-tensor data of every micro-batch), and after the update calls `EntropyGate.update(H_k)`.
- `set_loss_fn` on the actor worker group (verl installs the critic's loss the same way): `gated_ppo_loss`
  is verl's own `ppo_loss` with `entropy_coeff` replaced by the coefficient that came with the batch, so
  the term verl subtracts is exactly c_k·1[H_k < H_target]·H (H: token-mean entropy under π_θ).

Only verl's TaskRunner imports this module (our entry point, `main_ppo.py`), which registers the trainer
before verl looks it up there; the actor workers get the loss from `gated_loss.py`, which imports no trainer.
The gate's c_k is saved beside each verl checkpoint (`sirius_entropy_gate.json`) *before* verl records the
checkpoint as the latest, so a resumed stage always finds the coefficient it had -- and a checkpoint
without it is an error, never a silent restart of the gate at c_0.
"""

from __future__ import annotations

import json
import os
from functools import partial
from pathlib import Path

from omegaconf import open_dict
from verl.trainer.ppo.v1 import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

from sirius_train.algorithms.entropy import EntropyGate, EntropyGateConfig
from sirius_train.verl_backend.gated_loss import ENTROPY_COEF_KEY, gated_ppo_loss
from sirius_train.verl_backend.translate import GATED_TRAINER

GATE_STATE_FILE = "sirius_entropy_gate.json"


@register_trainer(GATED_TRAINER)
class GatedEntropyTrainer(PPOTrainerSync):
    """verl's synchronous trainer with the threshold-gated adaptive entropy bonus (SPEC section 3)."""

    def __init__(self, config):
        e = config.sirius.entropy
        self.gate = EntropyGate(EntropyGateConfig(mode="adaptive", target=e.target, delta=e.delta,
                                                  coef_max=e.coef_max, coef=e.coef))
        with open_dict(config):  # verl compares the mode with the literal "sync" in several places
            config.trainer.v1.trainer_mode = "sync"
        super().__init__(config)

    def _setup(self):
        super()._setup()
        if self.config.get("distillation", {}).get("enabled", False):
            raise ValueError("the sirius_dapo trainer replaces the actor loss and cannot run with distillation; "
                             "set distillation.enabled=false")
        from verl.utils.config import omega_conf_to_dataclass

        actor_config = omega_conf_to_dataclass(self.config.actor_rollout_ref.actor)
        self.actor_rollout_wg.set_loss_fn(partial(gated_ppo_loss, config=actor_config))

    def _update_actor(self, batch, metrics):
        if "actor/entropy" not in metrics:
            raise RuntimeError("the entropy gate needs H_k from the old-log-prob pass, which "
                               "algorithm.rollout_correction.bypass_mode=true skips; set it to false")
        entropy = metrics["actor/entropy"]
        batch.extra_info[ENTROPY_COEF_KEY] = self.gate.active_coefficient(entropy)
        batch = super()._update_actor(batch, metrics)
        metrics.update(self.gate.update(entropy))
        return batch

    def _save_checkpoint(self):
        # first: verl writes latest_checkpointed_iteration.txt last, so a crash in between leaves the previous
        # checkpoint the latest, and the step verl resumes from always has its gate state
        save_gate_state(self.gate, self._step_dir())
        super()._save_checkpoint()

    def _load_checkpoint(self):
        super()._load_checkpoint()
        if self.global_steps and not load_gate_state(self.gate, self._step_dir()):
            raise RuntimeError(f"verl resumed from {self._step_dir()}, which has no {GATE_STATE_FILE}: the entropy "
                               "gate would silently restart at c_0; delete that global_step folder (and fix "
                               "latest_checkpointed_iteration.txt) to resume from the one before")

    def _step_dir(self) -> Path:
        return Path(self.config.trainer.default_local_dir) / f"global_step_{self.global_steps}"


def save_gate_state(gate: EntropyGate, step_dir: Path) -> None:
    """c_k and the step count beside verl's checkpoint of the same step (atomically)."""
    path = Path(step_dir) / GATE_STATE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(gate.state_dict()))
    os.replace(tmp, path)


def load_gate_state(gate: EntropyGate, step_dir: Path) -> bool:
    """Restore the gate saved with a verl checkpoint; False when that checkpoint has none (gate starts at c_0)."""
    path = Path(step_dir) / GATE_STATE_FILE
    if not path.is_file():
        return False
    gate.load_state_dict(json.loads(path.read_text()))
    return True
