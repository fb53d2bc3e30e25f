"""LoRA: low-rank adapters instead of full weights, the same recipe otherwise (`model.lora_rank > 0`).

Every phase that trains (SFT, each DAPO stage) puts fresh adapters on the model it starts from, trains only
them (the frozen base gets no gradient and no optimizer state), checkpoints only them, and at its end writes
the base with the adapters merged in as the phase's model: an ordinary HF folder that the next phase, vLLM,
`sirius benchmark` and `sirius infer` load as they load any other. Stage 2 therefore starts from stage 1's
merged model with new adapters (as ReViSQL and verl's own LoRA recipes chain stages).

The adapters come from `peft` (the Hugging Face ecosystem's library; verl trains its LoRA with it too), so
an adapter folder written here loads with `PeftModel.from_pretrained` anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

ADAPTER_DIR = "adapter"  # a phase's final adapter, beside its merged `model/`
ADAPTER_WEIGHTS = "adapter_model.safetensors"  # what peft's save_pretrained writes
ALL_LINEAR = "all-linear"  # peft's (and verl's) name for every linear projection but the output head


@dataclass(frozen=True)
class LoraSpec:
    """What adapters a phase trains: rank r, scale alpha / r, and the block modules they sit on."""

    rank: int
    alpha: float
    target_modules: tuple[str, ...] = ()  # empty: every linear projection of the blocks

    @classmethod
    def of(cls, model_cfg) -> LoraSpec | None:
        """The run's spec from its `model` section; None when LoRA is off (`lora_rank: 0`)."""
        if not model_cfg.lora_rank:
            return None
        return cls(model_cfg.lora_rank, float(model_cfg.lora_alpha), tuple(model_cfg.lora_target_modules))

    def peft_targets(self):
        return list(self.target_modules) if self.target_modules else ALL_LINEAR

    def record(self, base: str | Path) -> dict:
        """What `sirius.json` says of a LoRA phase: the base it adapted and the adapters' shape."""
        return {"base": str(base), "rank": self.rank, "alpha": self.alpha,
                "target_modules": list(self.target_modules) or ALL_LINEAR}


def linear_module_names(model) -> list[str]:
    """The distinct leaf names of the linear projections inside the model's blocks (what `lora_target_modules`
    may name): every `nn.Linear` but the output head, which "all-linear" leaves out too."""
    import torch

    output = model.get_output_embeddings()
    names = {name.rsplit(".", 1)[-1] for name, module in model.named_modules()
             if isinstance(module, torch.nn.Linear) and module is not output}
    return sorted(names)


def check_targets(names: list[str], spec: LoraSpec) -> None:
    """A clear error when `model.lora_target_modules` names a module the model does not have."""
    from sirius_train.config import ConfigError

    missing = [t for t in spec.target_modules if t not in names]
    if missing:
        raise ConfigError(f"model.lora_target_modules={list(spec.target_modules)!r}: the model has no linear "
                          f"module {missing}; its block projections are {names} (leave the key empty for all "
                          "of them)")


def skeleton(cfg):
    """The run's model without weights (meta device): enough to list its modules before anything loads."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig

    m = cfg.model
    if m.path is None:  # the nano Llama (local/model.py builds it with these fields)
        config = LlamaConfig(vocab_size=m.tokenizer_vocab, hidden_size=m.hidden_size,
                             intermediate_size=m.intermediate_size, num_hidden_layers=m.num_hidden_layers,
                             num_attention_heads=m.num_attention_heads, tie_word_embeddings=True)
    else:
        from data_synthesis.checkpoints import locate

        folder, gguf = locate(m.path, m.gguf_file)
        config = AutoConfig.from_pretrained(folder, gguf_file=gguf, local_files_only=True)
    with init_empty_weights():
        return AutoModelForCausalLM.from_config(config)


def check_run(cfg) -> None:
    """`model.lora_*` against the model itself, right after the config loads (`sirius train` / `sirius sft`)."""
    spec = LoraSpec.of(cfg.model)
    if spec is not None:
        import importlib.util

        from sirius_train.config import ConfigError

        if importlib.util.find_spec("peft") is None:
            raise ConfigError(f"model.lora_rank={spec.rank} trains peft adapters, and peft is not installed: "
                              "pip install 'sirius-sql[lora]' (or model.lora_rank=0 for full weights)")
    if spec is not None and spec.target_modules:
        check_targets(linear_module_names(skeleton(cfg)), spec)


def attach(model, spec: LoraSpec):
    """`model` with fresh adapters (B = 0, so the adapted model starts exactly at `model`); only they train."""
    from peft import LoraConfig, get_peft_model

    check_targets(linear_module_names(model), spec)
    config = LoraConfig(r=spec.rank, lora_alpha=spec.alpha, target_modules=spec.peft_targets(), lora_dropout=0.0,
                        bias="none", task_type="CAUSAL_LM")
    return get_peft_model(model, config)


def is_adapted(model) -> bool:
    try:
        from peft import PeftModel
    except ImportError:  # without peft no model is adapted (LoRA runs need it: check_run)
        return False
    return isinstance(model, PeftModel)


def spec_of(model) -> LoraSpec | None:
    """The spec of an adapted model's adapters (None for a plain model); peft has resolved "all-linear" to the
    module names by then."""
    if not is_adapted(model):
        return None
    config = model.peft_config["default"]
    targets = config.target_modules
    return LoraSpec(config.r, float(config.lora_alpha), () if isinstance(targets, str) else tuple(sorted(targets)))


def load_weights(model, checkpoint: Path, device: str) -> None:
    """Restore a checkpoint's trained weights into `model`: the adapters of a LoRA run, else the whole model.
    A checkpoint of the other kind is refused (a config changed between launches), not half-loaded."""
    from safetensors.torch import load_file

    adapter, full = checkpoint / ADAPTER_WEIGHTS, checkpoint / "model.safetensors"
    if is_adapted(model):
        if not adapter.is_file():
            raise ValueError(f"{checkpoint} holds full weights, not LoRA adapters: this stage was started with "
                             "model.lora_rank=0; resume it without LoRA, or start it afresh (--fresh)")
        from peft import set_peft_model_state_dict

        result = set_peft_model_state_dict(model, load_file(str(adapter), device=device))
        if result.unexpected_keys:
            raise ValueError(f"{checkpoint}: adapter weights this model has no place for "
                             f"({result.unexpected_keys[:3]}...): model.lora_* changed since it was written")
        return
    if not full.is_file():
        raise ValueError(f"{checkpoint} holds LoRA adapters, not full weights: this stage was started with "
                         "model.lora_rank > 0; resume it with the same model.lora_* keys, or afresh (--fresh)")
    model.load_state_dict(load_file(str(full), device=device), strict=False)  # tied embeddings are stored once


def merged(model, adapter_dir: Path | None = None):
    """The base model with the adapters folded into its weights (peft's `merge_and_unload`); the adapters are
    saved to `adapter_dir` first when given (what `sirius.json` points to)."""
    if adapter_dir is not None:
        model.save_pretrained(adapter_dir)
    return model.merge_and_unload()


def trainable_parameters(model) -> tuple[int, int]:
    """(trained, total) parameter counts."""
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return trained, sum(p.numel() for p in model.parameters())
