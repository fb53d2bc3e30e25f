"""The training math, pure torch: DAPO loss and sampling (dapo), the entropy gate (entropy), log-probs (logprob).

Nothing here imports a trainer, Ray or verl; both backends call these functions.
"""

import importlib

_HOME = {"LOSS_AGG_MODES": "dapo", "DynamicSamplingBuffer": "dapo", "agg_loss": "dapo",
         "dynamic_sampling_keep": "dapo", "group_advantages": "dapo", "group_metrics": "dapo",
         "overlong_penalties": "dapo", "overlong_penalty": "dapo", "policy_loss": "dapo",
         "ENTROPY_MODES": "entropy", "EntropyGate": "entropy", "EntropyGateConfig": "entropy",
         "logprobs_and_entropy": "logprob"}


def __getattr__(name: str):
    """Imported on first use: `sirius_train.config` reads `algorithms.entropy`, which must not import torch."""
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)


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
