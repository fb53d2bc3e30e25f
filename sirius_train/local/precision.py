"""Mixed precision on the local backend: float32 master weights, matrix multiplies in `model.dtype`.

Weights held in bfloat16 lose the updates RL makes. bfloat16 keeps 8 significant bits, so a weight of 0.02
moves only in steps of 1.2e-4, and an AdamW step of lr = 1e-5 (about lr per weight) rounds back to the same
value: a pure-bf16 model barely trains at the learning rates RL uses (tests/test_precision.py measures it).
So the local backend keeps its weights and optimizer state in float32 and runs the forward passes under
`torch.autocast` in the compute dtype, as verl's FSDP mixed precision and HF Trainer's `bf16=True` do; the
bf16 matmuls keep most of the speed (this CPU, AMX: forward + backward of 8 x 320 tokens on SmolLM2-135M
5-7 s under autocast, 5-9 s with bf16 weights, 11-14 s in float32). Phase folders are saved in float32 too:
rounding them to bf16 would undo a stage whose total change per weight is below bf16's step.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

MASTER_DTYPE = torch.float32


def compute_dtype(setting: str, device: str) -> torch.dtype:
    """`model.dtype` as the dtype the matmuls run in: `auto` is bfloat16 on a GPU that has it, float32 elsewhere.

    >>> compute_dtype("bfloat16", "cpu"), compute_dtype("auto", "cpu")
    (torch.bfloat16, torch.float32)
    """
    if setting == "auto":
        on_gpu = device.startswith("cuda")
        return torch.bfloat16 if on_gpu and torch.cuda.is_bf16_supported() else torch.float32
    return getattr(torch, setting)


def autocast(device: torch.device | str, dtype: torch.dtype):
    """The forward-pass context for `dtype` on `device` (nothing to do in float32)."""
    if dtype == MASTER_DTYPE:
        return nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=dtype)
