"""Validate overrides against the installed verl: compose its Hydra config as `main_ppo` does, then run verl's checks.

Hydra rejects a key verl does not have; `translate.check_overrides` rejects the stale keys Hydra would
still accept; verl's `validate_config` and its config dataclasses reject shapes that cannot run (batch
sizes that do not divide over the GPUs, an unregistered reward manager, ...). Model and data paths are
not opened, so a dry run works before any model is downloaded.
"""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

from sirius_train.config import ConfigError
from sirius_train.verl_backend.translate import check_overrides


def compose_verl_config(overrides: list[str], tool_config: dict | None = None):
    """verl's resolved `DictConfig` for these overrides, or a `ConfigError` naming the bad key and the fix.
    `tool_config`: a multi-turn stage's tool config (`translate.tool_config`), built as verl's workers build it."""
    check_overrides(overrides)
    import verl
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    config_dir = Path(verl.__file__).parent / "trainer" / "config"
    try:
        with initialize_config_dir(config_dir=str(config_dir), version_base=None):
            cfg = compose(config_name="ppo_trainer", overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(_explain(e, verl.__version__)) from None
    _check_with_verl(cfg)
    OmegaConf.resolve(cfg)
    if tool_config is not None:
        _check_tools(cfg, tool_config)
    return cfg


def _check_tools(cfg, tool_config: dict) -> None:
    """The tools as `AgentLoopWorker` loads them (verl's schema, tool type and class import; our tool's own
    checks), and the parser and agent loop the rollout names, registered when the tool module is imported."""
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
    from verl.experimental.agent_loop.tool_parser import ToolParser
    from verl.tools.base_tool import BaseTool
    from verl.tools.schemas import OpenAIFunctionToolSchema
    from verl.tools.tool_registry import ToolType, get_tool_class

    rollout = cfg.actor_rollout_ref.rollout
    try:
        for tool in tool_config["tools"]:
            ToolType(tool["config"]["type"])
            cls = get_tool_class(tool["class_name"])
            if not issubclass(cls, BaseTool):
                raise TypeError(f"{tool['class_name']} is not a verl BaseTool")
            schema = OpenAIFunctionToolSchema.model_validate(tool["tool_schema"])
            with contextlib.redirect_stdout(io.StringIO()):  # BaseTool prints its schema
                cls(config=dict(tool["config"]), tool_schema=schema)
    except (ImportError, AttributeError, KeyError, TypeError, ValueError) as e:  # pydantic errors are ValueErrors
        raise ConfigError(f"verl cannot load the multi-turn tool config: {str(e).strip()}".replace("\n", " ")) from None
    if rollout.multi_turn.format not in ToolParser._registry:
        raise ConfigError(f"rollout.multi_turn.format={rollout.multi_turn.format!r} is no registered verl tool parser")
    if rollout.agent.default_agent_loop not in _agent_loop_registry:
        raise ConfigError(f"rollout.agent.default_agent_loop={rollout.agent.default_agent_loop!r} is no registered "
                          "verl agent loop")


def _check_with_verl(cfg) -> None:
    """verl's own start-up checks (main_ppo runs the first; the workers build the dataclasses)."""
    from hydra.errors import HydraException
    from verl.trainer.ppo.reward import resolve_reward_manager_cls
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    try:
        with contextlib.redirect_stdout(io.StringIO()):  # it prints a success line
            validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
        for section in (cfg.algorithm, cfg.actor_rollout_ref.rollout):
            omega_conf_to_dataclass(section)
        resolve_reward_manager_cls(cfg)  # the reward loop's lookup (verl's RewardManagerConfig cannot be built alone)
    except (AssertionError, ValueError, TypeError, KeyError, HydraException) as e:  # hydra wraps dataclass errors
        hint = ("; verl checks a LoRA rank against the installed vLLM's, so a LoRA config composes only where vLLM is "
                "installed (the [vllm] extra; `make test-verl-cpu`'s environment on a CPU machine)"
                if "vllm version None" in str(e) and cfg.actor_rollout_ref.model.get("lora_rank", 0) else "")
        raise ConfigError(f"verl rejects this configuration: {str(e).strip()}".replace("\n", " ") + hint) from None


def _explain(error: Exception, version: str) -> str:
    message = str(error)
    if match := re.search(r"Could not override '([^']+)'", message):
        return (f"unknown verl key {match.group(1)!r}: verl {version} has no such setting "
                "(see verl/trainer/config/_generated_ppo_trainer.yaml for the current names)")
    if match := re.search(r"Could not append to config\. An item is already at '([^']+)'", message):
        return f"verl key {match.group(1)!r} already exists: set it without the leading '+'"
    return f"verl cannot compose this configuration: {message}".replace("\n", " ")
