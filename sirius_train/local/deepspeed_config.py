"""DeepSpeed configs for the SFT warm start, checked when the run config loads -- not at step 1 on 64 GPUs.

The check runs the config through the two parsers that will read it at launch: transformers' DeepSpeed
integration (`HfTrainerDeepSpeedConfig.trainer_config_process`, which fills every `"auto"` from the
`TrainingArguments` and records each value that contradicts them) and DeepSpeed's own config model (unknown
keys, wrong types, batch arithmetic). Their findings come back as one `DeepSpeedConfigError` that names the
key, the value, the rule and the fix. Shipped configs: `configs/deepspeed/zero2.json` and `zero3.json`.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

from data_synthesis.extras import MissingExtra, require
from sirius_train.config import ConfigError

ZERO_STAGES = (0, 1, 2, 3)
BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


class DeepSpeedConfigError(ConfigError):
    """A DeepSpeed config that cannot run with these training arguments."""


def load_deepspeed_config(source: str | Path | dict) -> dict:
    """The config as a dict (a copy when given one), from a JSON file path or a dict."""
    if isinstance(source, dict):
        return copy.deepcopy(source)
    path = Path(source)
    if not path.is_file():
        raise DeepSpeedConfigError(f"sft.deepspeed={str(source)!r}: no such file (ship-ready configs: "
                                   "configs/deepspeed/zero2.json, configs/deepspeed/zero3.json)")
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise DeepSpeedConfigError(f"sft.deepspeed={str(path)!r}: not valid JSON ({e})") from None
    if not isinstance(config, dict):
        raise DeepSpeedConfigError(f"sft.deepspeed={str(path)!r}: a DeepSpeed config is a JSON object")
    return config


def check_zero_section(config: dict) -> None:
    """The ZeRO stage and the offloads it allows.

    Example:
        >>> check_zero_section({"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}})
        >>> check_zero_section({"zero_optimization": {"stage": 4}})
        Traceback (most recent call last):
        ...
        sirius_train.local.deepspeed_config.DeepSpeedConfigError: zero_optimization.stage=4: DeepSpeed ZeRO has stages 0, 1, 2, 3; use 2 (optimizer states and gradients sharded: configs/deepspeed/zero2.json) or 3 (parameters sharded too, for models that do not fit one GPU: configs/deepspeed/zero3.json)
    """
    zero = config.get("zero_optimization", {})
    if not isinstance(zero, dict):
        raise DeepSpeedConfigError(f"zero_optimization={zero!r}: expected an object like {{\"stage\": 2}}")
    stage = zero.get("stage", 0)
    if stage not in ZERO_STAGES or isinstance(stage, bool):
        raise DeepSpeedConfigError(
            f"zero_optimization.stage={stage!r}: DeepSpeed ZeRO has stages {', '.join(map(str, ZERO_STAGES))}; use 2 "
            "(optimizer states and gradients sharded: configs/deepspeed/zero2.json) or 3 (parameters sharded too, "
            "for models that do not fit one GPU: configs/deepspeed/zero3.json)")
    offload_param = zero.get("offload_param") or {}
    if stage != 3 and offload_param.get("device", "none") != "none":
        raise DeepSpeedConfigError(
            f"zero_optimization.offload_param with stage={stage}: parameter offload needs ZeRO-3 (the parameters must "
            "be sharded to be offloaded); set stage 3, or keep only offload_optimizer with stage 2")


def check_deepspeed_config(source: str | Path | dict, args, world_size: int | None = None) -> dict:
    """The config with every `"auto"` filled from `args`, or `DeepSpeedConfigError` saying what to change.

    Args:
        source: a DeepSpeed JSON path or dict (not modified).
        args: the `TrainingArguments` the SFT will run with (any object with their attribute names).
        world_size: the launch's number of processes, when it differs from this process's view of it
            (validating a 32-GPU launch from a login node); default `args.world_size`.
    """
    config = load_deepspeed_config(source)
    try:
        return _check(config, args, world_size or args.world_size)
    except DeepSpeedConfigError as e:
        where = "" if isinstance(source, dict) else f"sft.deepspeed={str(source)!r}: "
        raise DeepSpeedConfigError(f"{where}{e}") from None


def _check(config: dict, args, world: int) -> dict:
    check_zero_section(config)
    try:
        from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

        require("deepspeed", "deepspeed", "sft.deepspeed", "leave sft.deepspeed unset to train without DeepSpeed")
    except MissingExtra as e:
        raise DeepSpeedConfigError(str(e)) from None
    hf_config = HfTrainerDeepSpeedConfig(config)
    hf_config.trainer_config_process(_AtWorldSize(args, world))
    if hf_config.mismatches:
        raise DeepSpeedConfigError(_explain(hf_config.mismatches, config, args, world))
    filled = hf_config.config
    _check_with_deepspeed(filled, world)
    return filled


class _AtWorldSize:
    """`args` as seen by a launch of `world_size` processes (HF reads `args.world_size` for the batch arithmetic)."""

    def __init__(self, args, world_size: int):
        self._args = args
        self.world_size = world_size

    def __getattr__(self, name):
        return getattr(self._args, name)


def _explain(mismatches: list[str], config: dict, args, world: int) -> str:
    lines = []
    if any(k in m for m in mismatches for k in BATCH_KEYS):
        micro, accum = args.per_device_train_batch_size, args.gradient_accumulation_steps
        given = {k: config[k] for k in BATCH_KEYS if k in config and config[k] != "auto"}
        lines.append(f"batch arithmetic: DeepSpeed needs train_batch_size = train_micro_batch_size_per_gpu x "
                     f"gradient_accumulation_steps x world_size, and the run has sft.batch_size={micro} per GPU x "
                     f"sft.gradient_accumulation_steps={accum} x {world} processes = {micro * accum * world}, "
                     f"but the DeepSpeed config says {given}; set these keys to \"auto\" (filled from the run "
                     "config) or change sft.batch_size / sft.gradient_accumulation_steps to match")
    others = [m.strip("- ") for m in mismatches if not any(k in m for k in BATCH_KEYS)]
    if others:
        lines.append("values that contradict the run config (set them to \"auto\" to take the run's): "
                     + "; ".join(others))
    return "DeepSpeed config does not match the SFT settings: " + " | ".join(lines)


def _check_with_deepspeed(filled: dict, world: int) -> None:
    """DeepSpeed's own parser (unknown keys, types, batch sizes), at world size 1: it cannot see the launch's."""
    from deepspeed.runtime.config import DeepSpeedConfig

    single = _settle_autos(copy.deepcopy(filled))
    if isinstance(single.get("train_batch_size"), int):
        single["train_batch_size"] //= world
    try:
        DeepSpeedConfig(single)
    except (AssertionError, ValueError) as e:  # pydantic's ValidationError is a ValueError
        message = " ".join(str(e).split())
        raise DeepSpeedConfigError(f"DeepSpeed rejects the config: {message}") from None


def _settle_autos(node):
    """The `"auto"`s left after the HF fill depend on the model (bucket sizes from its hidden size) or the step
    count; they are filled at launch, so any valid number stands in for them here."""
    if isinstance(node, dict):
        return {k: _settle_autos(v) for k, v in node.items()}
    return 1 if node == "auto" else node
