"""A LoRA stage's verl checkpoint -> the stage's HF model: its adapters folded into the model the stage started from.

With `checkpoint.save_lora_only` (what keeps a LoRA stage's checkpoints adapter-sized) verl's FSDP shards hold the
adapters alone, and `verl.model_merger` cannot rebuild a model from them: it would write the base's weights
uninitialised. The base is the stage's starting model, which the run has, so: verl's own merger joins the shards
over ranks, peft puts the adapters on the base, and the merged model plus the adapter folder are written.

Runs in verl's Python (`python -m sirius_train.verl_backend.lora_merge ...`), as `verl.model_merger` does.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from sirius_train.lora import ADAPTER_DIR, LoraSpec


def adapter_state(actor_dir: Path) -> dict:
    """The adapters of an FSDP actor checkpoint, whole (verl's merger joins the ranks' DTensor shards, in bf16),
    keyed as peft's `get_peft_model_state_dict` keys them."""
    from verl.model_merger.base_model_merger import ModelMergerConfig
    from verl.model_merger.fsdp_model_merger import FSDPModelMerger

    merger = FSDPModelMerger(ModelMergerConfig(operation="merge", backend="fsdp", local_dir=str(actor_dir),
                                               hf_model_config_path=str(actor_dir / "huggingface")))
    world_size = merger._get_world_size()
    mesh, names = merger._extract_device_mesh_info(merger._load_rank_zero_state_dict(world_size), world_size)
    total, mesh_shape = merger._calculate_shard_configuration(mesh, names)
    state = merger._load_and_merge_state_dicts(world_size, total, mesh_shape, names)
    adapters = {key.replace(".default.", "."): value for key, value in state.items() if "lora_" in key}
    if not adapters:
        raise ValueError(f"{actor_dir} holds no LoRA adapter weights: was the stage trained with "
                         "actor_rollout_ref.model.lora_rank > 0?")
    return adapters


def merge_stage(actor_dir: Path, init: Path, target: Path, spec: LoraSpec) -> Path:
    """Write `target` (the merged model, tokenizer) and `target/../adapter` from a LoRA actor checkpoint."""
    import torch
    from peft import set_peft_model_state_dict
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sirius_train.lora import attach, merged

    base = AutoModelForCausalLM.from_pretrained(init, dtype=torch.float32, local_files_only=True)
    adapted = attach(base, spec)
    result = set_peft_model_state_dict(adapted, {k: v.float() for k, v in adapter_state(actor_dir).items()})
    missing = [k for k in result.missing_keys if "lora_" in k]
    if result.unexpected_keys or missing:
        raise ValueError(f"{actor_dir}: its adapters do not match model.lora_* on {init} (unexpected "
                         f"{result.unexpected_keys[:3]}, missing {missing[:3]})")
    model = merged(adapted, target.parent / ADAPTER_DIR)
    model.save_pretrained(target)
    AutoTokenizer.from_pretrained(init, local_files_only=True).save_pretrained(target)
    return target


def merge_argv(actor_dir: Path, init: Path, target: Path, spec: LoraSpec) -> list[str]:
    """This module's arguments for one merge (`launch.merge_command` puts the interpreter before them)."""
    return ["-m", __name__, "--actor", str(actor_dir), "--init", str(init), "--target", str(target),
            "--rank", str(spec.rank), "--alpha", repr(spec.alpha), "--targets", *spec.target_modules]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--actor", type=Path, required=True, help="the FSDP actor checkpoint (global_step_N/actor)")
    parser.add_argument("--init", type=Path, required=True, help="the HF model the stage started from")
    parser.add_argument("--target", type=Path, required=True, help="where the merged HF model goes")
    parser.add_argument("--rank", type=int, required=True, help="model.lora_rank")
    parser.add_argument("--alpha", type=float, required=True, help="model.lora_alpha")
    parser.add_argument("--targets", nargs="*", default=[], help="model.lora_target_modules (none: all-linear)")
    args = parser.parse_args(argv)
    merge_stage(args.actor, args.init, args.target, LoraSpec(args.rank, args.alpha, tuple(args.targets)))


if __name__ == "__main__":
    main()
