"""The actor workers' half of the entropy gate: verl's `ppo_loss` with the coefficient that came with the batch.

Its own module, importing only verl's loss and tensordict helpers: the trainer pickles this function to every
actor worker (`set_loss_fn`), and unpickling imports the module it lives in -- so it must not drag verl's
trainer stack (or ours, `entropy.py`) into the workers.
"""

from __future__ import annotations

import dataclasses

from verl.utils import tensordict_utils as tu
from verl.workers.utils.losses import ppo_loss

ENTROPY_COEF_KEY = "sirius_entropy_coeff"  # non-tensor field of the update batch: this step's c_k·1[H_k < H_target]


def gated_ppo_loss(config, model_output, data, dp_group=None):
    """verl's `ppo_loss` with `entropy_coeff` = the gated coefficient sent with this batch (worker side)."""
    coef = float(tu.get(data, key=ENTROPY_COEF_KEY, default=config.entropy_coeff))
    if coef != config.entropy_coeff:
        config = dataclasses.replace(config, entropy_coeff=coef)  # verl's configs are frozen; the dict is shared
    return ppo_loss(config, model_output, data, dp_group)
