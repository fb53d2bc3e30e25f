"""The training math, pure torch: DAPO loss and sampling (dapo), the entropy gate (entropy), log-probs (logprob).

Nothing here imports a trainer, Ray or verl; both backends call these functions.
"""

from sirius_train.algorithms.dapo import (
    LOSS_AGG_MODES,
    DynamicSamplingBuffer,
    agg_loss,
    dynamic_sampling_keep,
    group_advantages,
    group_metrics,
    overlong_penalties,
    overlong_penalty,
    policy_loss,
)
from sirius_train.algorithms.entropy import ENTROPY_MODES, EntropyGate, EntropyGateConfig
from sirius_train.algorithms.logprob import logprobs_and_entropy

__all__ = [
    "ENTROPY_MODES",
    "LOSS_AGG_MODES",
    "DynamicSamplingBuffer",
    "EntropyGate",
    "EntropyGateConfig",
    "agg_loss",
    "dynamic_sampling_keep",
    "group_advantages",
    "group_metrics",
    "logprobs_and_entropy",
    "overlong_penalties",
    "overlong_penalty",
    "policy_loss",
]
