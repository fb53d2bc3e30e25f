"""What a verl run will put where: the pass-rate / evaluation engines and each phase's memory plan.

Shared by `sirius train --dry-run`, `sirius doctor` and the backend itself (which refuses a phase whose plan
does not fit). The arithmetic is `memory.py`; this module finds the model's shape (its config.json, or the
published shape of a model the folder is named after, or the nano model the run builds) and the GPU size.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sirius_train.config import ConfigError, RunConfig
from sirius_train.verl_backend.memory import (
    ModelShape,
    PhasePlan,
    estimation_plan,
    known_shape,
    stage_layout,
    stage_plans,
)

DEFAULT_GPU_GIB = 80.0  # A100/H100 80 GB: what the shipped cluster recipes are sized for
ENGINE_CALL_SEQUENCES = 512  # answers one vLLM call generates (examples per call = this / k)


@dataclass(frozen=True)
class EnginePlan:
    """Pass-rate estimation and evaluation on the verl backend: vLLM engines fanned out over Ray actors."""

    engine: str
    tensor_parallel: int
    actors: int
    gpu_memory_utilization: float

    def describe(self) -> str:
        return (f"{self.engine}, tensor parallel {self.tensor_parallel}, {self.actors} Ray actor(s) x "
                f"{self.tensor_parallel} GPU(s), gpu_memory_utilization {self.gpu_memory_utilization}")


def estimation_engine(cfg: RunConfig) -> EnginePlan:
    """vLLM at the rollout's tensor-parallel size on every GPU of the job (HF generate is the local backend's)."""
    v = cfg.verl
    return EnginePlan("vLLM", v.rollout_tp, v.nnodes * v.n_gpus_per_node // v.rollout_tp,
                      v.estimate_gpu_memory_utilization)


def model_shape(cfg: RunConfig, model_path: str | Path | None = None) -> tuple[str, ModelShape] | None:
    """(where the shape came from, the shape) of the model a phase uses; None when nothing says."""
    path = model_path or cfg.model.path
    if path is None:  # the nano model the run builds from the config
        m = cfg.model
        return "the nano model of this config", ModelShape(
            vocab=m.tokenizer_vocab, hidden=m.hidden_size, intermediate=m.intermediate_size,
            layers=m.num_hidden_layers, heads=m.num_attention_heads, kv_heads=m.num_attention_heads,
            tied_embeddings=True)
    config = _config(cfg, path)
    if config is not None:
        try:
            return str(path), ModelShape.from_hf_config(config)
        except (KeyError, TypeError, ValueError):
            return None
    if known := known_shape(str(path)):
        return f"published config of {known[0]} ({path} not readable here)", known[1]
    return None


def max_positions(cfg: RunConfig, model_path: str | Path | None = None) -> int | None:
    """The model's `max_position_embeddings`: its config.json, or the nano model's from the config; None if unknown."""
    path = model_path or cfg.model.path
    if path is None:
        return cfg.model.max_position_embeddings
    config = _config(cfg, path)
    try:
        return int(config["max_position_embeddings"]) if config is not None else None
    except (KeyError, TypeError, ValueError):
        return None


def _config(cfg: RunConfig, path: str | Path) -> dict | None:
    """The HF config of a model folder or GGUF checkpoint (`model.gguf_file` for the configured model), or None."""
    from data_synthesis.checkpoints import model_config

    gguf = cfg.model.gguf_file if cfg.model.path and str(path) == str(cfg.model.path) else None
    try:
        return model_config(path, gguf)
    except (OSError, ValueError):
        return None


def require_positions(cfg: RunConfig, model_path: str | Path | None = None) -> None:
    """Prompt plus the longest response must fit the model's positions: vLLM refuses a longer max_model_len (and
    verl's rollout asks for verl.max_prompt_length + data.max_response_length). The fix named is the knob that
    can make room: the prompt length while one is left, else the response's parts (multi-turn: its observations)."""
    from data_synthesis.episode import observation_tokens
    from sirius_train.verl_backend.translate import response_tokens

    limit = max_positions(cfg, model_path)
    longest = max(cfg.stages, key=lambda s: response_tokens(cfg, s))
    response = response_tokens(cfg, longest)
    need = cfg.verl.max_prompt_length + response
    if limit is None or need <= limit:
        return
    what = (f"verl.max_prompt_length ({cfg.verl.max_prompt_length}) + stage {longest.name!r}'s {response} response "
            f"tokens = {need} > the model's {limit} positions "
            f"({model_path or cfg.model.path or 'model.max_position_embeddings'}): vLLM would refuse to start")
    mt = cfg.rollout.multi_turn
    room = (f"stage {longest.name!r}'s response is max_new_tokens {longest.max_new_tokens} + rollout.multi_turn."
            f"max_turns {mt.max_turns} x {observation_tokens(mt)} observation tokens (rollout.multi_turn.max_chars "
            f"{mt.max_chars})") if mt.enabled else f"stage {longest.name!r}'s max_new_tokens is {longest.max_new_tokens}"
    if response < limit:
        raise ConfigError(f"{what}; lower verl.max_prompt_length to {limit - response} or less, or shorten the "
                          f"response ({room})")
    fix = ("lower rollout.multi_turn.max_turns or max_chars" if mt.enabled and longest.max_new_tokens < limit
           else f"lower stage {longest.name!r}'s max_new_tokens")
    raise ConfigError(f"{what}: the response alone takes every position ({room}); {fix}")


def stage_memory(cfg: RunConfig, shape: ModelShape, gpu_gib: float) -> list[tuple[str, list[PhasePlan]]]:
    """Per stage: pass rates + eval (vLLM), rollout (vLLM in verl), update (FSDP)."""
    return [(stage.name, [estimation_plan(cfg, shape, gpu_gib),
                          *stage_plans(shape, stage_layout(cfg, stage, gpu_gib))]) for stage in cfg.stages]


def require_fit(plans: list[PhasePlan], what: str) -> None:
    """Refuse to start `what` when a plan of it does not fit, with the fix."""
    bad = [p for p in plans if not p.fits]
    if bad:
        raise ConfigError(f"{what}: " + "; ".join(
            f"{p.phase} needs {p.total_gib:.1f} of {p.gpu_gib:.0f} GiB per GPU ({p.note})" for p in bad) +
            " -- lower verl.ppo_max_token_len_per_gpu or the lengths, raise verl.rollout_tp, set verl.param_offload/"
            "optimizer_offload, or change verl.gpu_memory_utilization (see `sirius doctor CONFIG`)")
