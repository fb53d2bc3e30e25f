"""Run config -> verl overrides for one DAPO stage, in verl 0.9's current keys (pure: no I/O, no verl import).

What each part of SPEC section 3 becomes in `python -m verl.trainer.main_ppo`:

    group advantages, no KL       algorithm.adv_estimator=grpo, use_kl_in_reward=false, actor.use_kl_loss=false
    clip-higher + dual clip       actor.clip_ratio_low / clip_ratio_high / clip_ratio_c (verl defaults 0.2/3.0!)
    token-mean over the batch     actor.loss_agg_mode=token-mean, policy_loss.loss_mode=vanilla
    dynamic sampling on accuracy  algorithm.filter_groups.{enable, metric=acc, max_inflight_gen_batches}
    overlong shaping              reward_manager.py: verl's DAPO manager over the model's own tokens + overlong_buffer_cfg
    execution reward              reward.custom_reward_function -> rewards/verl_reward.py::compute_score
    entropy gate                  fixed/off: actor.entropy_coeff; adaptive: our trainer (see `entropy.py`)
    LoRA (model.lora_*)           actor_rollout_ref.model.lora_rank / lora_alpha / target_modules, LoRA-only
                                  checkpoints (actor.checkpoint.save_lora_only), merged by `lora_merge.py`
    multi-turn probes             rollout.multi_turn.* + agent.default_agent_loop=sirius_sql, the tool config
                                  of `tool_config` (our SQL tool, parser and agent loop: `sql_tool.py`)

Old spellings (`custom_reward_function.*`, `reward_model.reward_manager`, `actor.grad_clip`,
`filter_groups.max_num_gen_batches`, ...) still parse in verl 0.9 but are migrated or ignored; they are
never emitted here, and `check_overrides` rejects them in user overrides with the current name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePath

from data_synthesis.episode import max_observation_chars, observation_tokens
from rewards.reward import RewardTable
from sirius_train.config import ConfigError, RunConfig, StageConfig

# verl's main_ppo with a TaskRunner that registers the gated trainer in that one process (main_ppo.py).
VERL_ENTRY = "sirius_train.verl_backend.main_ppo"
GATED_TRAINER = "sirius_dapo"  # registered in verl's trainer registry by `entropy.py`
# Multi-turn: registered by `sql_tool.py` when verl's agent-loop workers import it for the tool config.
AGENT_LOOP = "sirius_sql"  # rollout.agent.default_agent_loop
TOOL_PARSER = "sirius_sql"  # rollout.multi_turn.format
TOOL_NAME = "sql"
TOOL_CLASS = "sirius_train.verl_backend.sql_tool.SqlProbeTool"

# Keys verl 0.9.1 still accepts but no longer reads (or reads only through a legacy migration), with the
# key to use instead. Matched as a prefix of the override's key.
STALE_KEYS: dict[str, str] = {
    "custom_reward_function": "reward.custom_reward_function",
    "reward_model": "the reward.* section (reward.reward_manager.name, reward.reward_model, reward.reward_kwargs)",
    "sandbox_fusion": "reward.sandbox_fusion",
    "actor_rollout_ref.actor.grad_clip": "actor_rollout_ref.actor.optim.clip_grad (the FSDP engine reads only that)",
    "actor_rollout_ref.actor.optim.warmup_style": "actor_rollout_ref.actor.optim.lr_scheduler_type",
    "actor_rollout_ref.actor.ppo_micro_batch_size": "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size":
        "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size":
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
    "actor_rollout_ref.ref.log_prob_micro_batch_size": "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
    "algorithm.filter_groups.max_num_gen_batches":
        "algorithm.filter_groups.max_inflight_gen_batches (the V1 trainer ignores max_num_gen_batches)",
    "data.gen_batch_size": "nothing: with filter_groups on, the V1 trainer forces it to 1",
    "data.val_batch_size": "nothing: validation is sent to the rollout engine as one batch",
    "trainer.use_v1": "nothing: main_ppo's V1 trainer is the current one (the legacy trainer is deprecated)",
}

# New keys (`+key=value`) are only allowed where a reader is known; their leaves are checked too, because
# Hydra accepts any `+key` silently and a misspelt one would simply be ignored.
OPEN_MAPS: dict[str, tuple[str, ...] | None] = {
    # read by verl's DAPORewardManager
    "reward.reward_kwargs": ("overlong_buffer_cfg.enable", "overlong_buffer_cfg.len",
                             "overlong_buffer_cfg.penalty_factor", "overlong_buffer_cfg.log", "max_resp_len"),
    # passed to rewards.verl_reward.compute_score
    "reward.custom_reward_function.reward_kwargs": ("reward_url", "reward_token", "reward_timeout_s", "db_root",
                                                    "timeout_s", "compare", "reward_fallback", "variants"),
    # read by our gated trainer (entropy.py)
    "sirius.entropy": ("target", "delta", "coef_max", "coef"),
    # environment of every Ray worker (any variable)
    "ray_kwargs.ray_init.runtime_env.env_vars": None,
    # Ray's own start-up arguments that verl passes through (logical GPUs on a machine without one: `verl.device`)
    "ray_kwargs.ray_init": ("num_gpus",),
    # FSDP wrapping by layer class (verl's recipes set it this way)
    "actor_rollout_ref.actor.fsdp_config.wrap_policy": ("transformer_layer_cls_to_wrap",),
    # HF config attributes the actor's model is loaded with (verl reads attn_implementation from here)
    "actor_rollout_ref.model.override_config": None,
    # verl's CheckpointConfig fields its generated YAML does not list (read by the FSDP checkpoint manager)
    "actor_rollout_ref.actor.checkpoint": ("save_lora_only",),
    # engine arguments passed through to vLLM / SGLang as they are
    "actor_rollout_ref.rollout.engine_kwargs.vllm": None,
    "actor_rollout_ref.rollout.engine_kwargs.sglang": None,
}


@dataclass(frozen=True)
class StagePaths:
    """Where one stage's inputs and outputs live (absolute, and the same on every node)."""

    train_files: str  # the stage's curriculum parquet
    val_files: str  # held-out questions as verl parquet
    model: str  # HF checkpoint folder the stage starts from
    checkpoints: str  # trainer.default_local_dir: verl's sharded checkpoints
    reward_fn: str  # rewards/verl_reward.py
    db_root: str  # databases, for in-process scoring
    pythonpath: str  # the project root first, then the caller's PYTHONPATH: Ray workers import rewards/, sirius_train/
    metrics: str  # verl's file logger writes the step metrics here (JSONL)
    tool_config: str = ""  # multi-turn: the SQL tool's config YAML (`tool_config`), written by the backend


def stage_overrides(cfg: RunConfig, index: int, stage: StageConfig, paths: StagePaths) -> list[str]:
    """The `key=value` overrides that make `python -m verl.trainer.main_ppo` train stage `index` (1-based).

    The user's `verl.overrides` come last, so they win; `check_overrides` has vetted them.
    """
    _check_reward_table(cfg)
    v = cfg.verl
    items: list[tuple[str, object]] = [
        # data: the curriculum and the held-out set, verl layout (data_synthesis.export)
        ("data.train_files", paths.train_files),
        ("data.val_files", paths.val_files),
        ("data.train_batch_size", stage.prompts_per_step),
        ("data.max_prompt_length", v.max_prompt_length),
        ("data.max_response_length", response_tokens(cfg, stage)),
        ("data.filter_overlong_prompts", True),
        ("data.seed", cfg.seed + index),
        # model and FSDP training engine
        ("actor_rollout_ref.model.path", paths.model),
        ("actor_rollout_ref.model.use_remove_padding", v.use_remove_padding),
        ("actor_rollout_ref.model.enable_gradient_checkpointing", v.gradient_checkpointing),
        # verl loads the actor with flash_attention_2 unless told otherwise; say which, always
        ("+actor_rollout_ref.model.override_config.attn_implementation", v.attn_implementation),
        *_lora(cfg),
        ("actor_rollout_ref.actor.strategy", v.strategy),
        ("actor_rollout_ref.actor.fsdp_config.param_offload", v.param_offload),
        ("actor_rollout_ref.actor.fsdp_config.optimizer_offload", v.optimizer_offload),
        ("actor_rollout_ref.actor.optim.lr", stage.lr),
        # warmup in training steps, step t at lr * min(1, t / warmup_steps) as the local trainer does: verl's
        # "constant" schedule gives t-1 / warmup (step 1 at lr 0), its cosine one with 1-based steps and a
        # floor of 1.0 is exactly the linear warmup then constant (advanced once per training step)
        ("actor_rollout_ref.actor.optim.lr_warmup_steps", stage.warmup_steps),
        ("actor_rollout_ref.actor.optim.lr_scheduler_type", "cosine"),
        ("actor_rollout_ref.actor.optim.min_lr_ratio", 1.0),
        ("actor_rollout_ref.actor.optim.zero_indexed_step", False),
        ("actor_rollout_ref.actor.optim.weight_decay", stage.weight_decay),
        ("actor_rollout_ref.actor.optim.clip_grad", stage.grad_clip),
        ("actor_rollout_ref.actor.ppo_mini_batch_size", stage.prompts_per_step // stage.mini_batches),
        ("actor_rollout_ref.actor.ppo_epochs", stage.ppo_epochs),
        ("actor_rollout_ref.actor.use_dynamic_bsz", v.use_dynamic_bsz),
        ("actor_rollout_ref.actor.ppo_max_token_len_per_gpu", v.ppo_max_token_len_per_gpu),
        *_micro_batches(v),
        # DAPO loss: clip-higher, dual clip, token-mean, no KL (verl's defaults differ: set every one)
        ("actor_rollout_ref.actor.policy_loss.loss_mode", "vanilla"),
        ("actor_rollout_ref.actor.clip_ratio_low", stage.clip_low),
        ("actor_rollout_ref.actor.clip_ratio_high", stage.clip_high),
        ("actor_rollout_ref.actor.clip_ratio_c", stage.clip_c),
        ("actor_rollout_ref.actor.loss_agg_mode", "token-mean"),
        ("actor_rollout_ref.actor.use_kl_loss", False),
        ("actor_rollout_ref.actor.kl_loss_coef", 0.0),
        *_entropy(stage),
        # rollouts
        ("actor_rollout_ref.rollout.name", v.rollout_engine),
        ("actor_rollout_ref.rollout.n", stage.n_samples),
        ("actor_rollout_ref.rollout.temperature", stage.temperature),
        ("actor_rollout_ref.rollout.top_p", stage.top_p),
        ("actor_rollout_ref.rollout.tensor_model_parallel_size", v.rollout_tp),
        ("actor_rollout_ref.rollout.gpu_memory_utilization", v.gpu_memory_utilization),
        ("actor_rollout_ref.rollout.max_num_batched_tokens", v.max_num_batched_tokens),
        ("actor_rollout_ref.rollout.enforce_eager", v.enforce_eager),
        *(multi_turn_overrides(cfg.rollout.multi_turn, paths.tool_config) if cfg.rollout.multi_turn.enabled else []),
        # advantages and dynamic sampling
        ("algorithm.adv_estimator", "grpo"),
        ("algorithm.norm_adv_by_std_in_grpo", True),
        ("algorithm.use_kl_in_reward", False),
        ("algorithm.filter_groups.enable", True),
        ("algorithm.filter_groups.metric", "acc"),
        ("algorithm.filter_groups.max_inflight_gen_batches", stage.max_gen_rounds),
        ("critic.enable", False),  # GRPO-style advantages: no value model
        # reward: our execution reward through verl's DAPO reward manager (overlong buffer)
        ("reward.num_workers", v.reward_workers),
        *_reward_manager(),
        ("reward.custom_reward_function.path", paths.reward_fn),
        ("reward.custom_reward_function.name", "compute_score"),
        *_reward_kwargs(cfg, paths),
        *_overlong(stage),
        # trainer: cluster shape, length, checkpoints, logging
        ("trainer.nnodes", v.nnodes),
        ("trainer.n_gpus_per_node", v.n_gpus_per_node),
        ("trainer.total_training_steps", stage.steps),
        ("trainer.total_epochs", stage.steps),  # an upper bound only: steps end the run (steps_per_epoch >= 1)
        ("trainer.save_freq", stage.checkpoint_every or stage.steps),
        ("trainer.test_freq", stage.eval_every or -1),
        ("trainer.val_before_train", v.val_before_train),
        ("trainer.max_actor_ckpt_to_keep", v.keep_checkpoints or None),  # no critic (critic.enable=false)
        ("trainer.resume_mode", "auto"),
        ("trainer.default_local_dir", paths.checkpoints),
        ("trainer.project_name", cfg.logging.project),
        ("trainer.experiment_name", f"{cfg.name}-{stage.name}"),
        ("trainer.logger", ["console", "file", *cfg.logging.backends]),
        ("trainer.v1.trainer_mode", GATED_TRAINER if stage.entropy.mode == "adaptive" else "sync"),
        # every Ray worker imports our code (the reward function, the gated loss); the user's path follows ours
        ("+ray_kwargs.ray_init.runtime_env.env_vars.PYTHONPATH", paths.pythonpath),
        ("+ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH", paths.metrics),
        *([("+ray_kwargs.ray_init.runtime_env.env_vars.TENSORBOARD_DIR",
             str(PurePath(paths.metrics).parent / "tensorboard"))] if "tensorboard" in cfg.logging.backends else []),
        *([("ray_kwargs.ray_init.runtime_env.py_executable", v.python)] if v.python else []),
        *(cpu_overrides(cfg) if v.device == "cpu" else []),
    ]
    return [f"{key}={hydra_value(value)}" for key, value in items] + list(v.overrides)


CPU_RAY_CPUS = 16  # logical CPUs Ray schedules verl's helper actors on (the OS shares the real cores among them)


def cpu_overrides(cfg: RunConfig) -> list[tuple[str, object]]:
    """verl's trainer on this machine's CPU: one logical Ray GPU per worker, vLLM's CPU build without sleep mode
    (it has none), one process where verl would start several helpers, and `cpu_platform.cpu_env` in every worker."""
    from sirius_train.verl_backend.cpu_platform import cpu_env

    env = cpu_env()
    return [("trainer.device", "cpu"),
            ("+ray_kwargs.ray_init.num_gpus", cfg.verl.n_gpus_per_node),
            ("ray_kwargs.ray_init.num_cpus", CPU_RAY_CPUS),
            ("actor_rollout_ref.rollout.free_cache_engine", False),
            ("+actor_rollout_ref.rollout.engine_kwargs.vllm.enable_sleep_mode", False),
            ("data.dataloader_num_workers", 0),
            ("actor_rollout_ref.rollout.agent.num_workers", 1),
            ("transfer_queue.backend.SimpleStorage.num_data_storage_units", 1),
            *((f"+ray_kwargs.ray_init.runtime_env.env_vars.{key}", env[key]) for key in sorted(env))]


def check_overrides(overrides: list[str]) -> None:
    """Reject stale keys and unknown `+` keys with the key, the rule and the fix (Hydra rejects other unknowns).

    >>> check_overrides(["actor_rollout_ref.actor.clip_ratio_c=10.0", "+reward.reward_kwargs.max_resp_len=96"])
    >>> check_overrides(["reward_model.reward_manager=dapo"])
    Traceback (most recent call last):
    ...
    sirius_train.config.ConfigError: stale verl key 'reward_model.reward_manager': verl 0.9 no longer reads it; ...
    """
    for override in overrides:
        key = override.split("=", 1)[0]
        bare = key.lstrip("+~")
        for stale, instead in STALE_KEYS.items():
            if bare == stale or bare.startswith(stale + "."):
                raise ConfigError(f"stale verl key {bare!r}: verl 0.9 no longer reads it; use {instead}")
        if key.startswith("+"):
            _check_new_key(bare)


def hydra_value(value: object) -> str:
    """A Python value as a Hydra override value: strings quoted when Hydra's grammar would misread them.

    >>> [hydra_value(v) for v in (True, None, 3, 0.28, "vllm", "/data/run 1/x.parquet", ["console", "wandb"])]
    ['true', 'null', '3', '0.28', 'vllm', "'/data/run 1/x.parquet'", '[console,wandb]']
    >>> hydra_value("http://a:8000,http://b:8000")
    "'http://a:8000,http://b:8000'"
    """
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    text = str(value)
    if re.fullmatch(r"[A-Za-z_/.][\w./-]*", text) and text.lower() not in ("true", "false", "null", "none"):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def response_tokens(cfg: RunConfig, stage: StageConfig) -> int:
    """verl's response budget: the model's `max_new_tokens`, plus `observation_tokens` for every observation when
    the rollout probes (verl counts observation tokens in the response; our agent loop keeps the model's own tokens
    to `max_new_tokens`, as the local rollout does, and each observation to `observation_tokens`)."""
    mt = cfg.rollout.multi_turn
    return stage.max_new_tokens + (mt.max_turns * observation_tokens(mt) if mt.enabled else 0)


def engine_context_length(cfg: RunConfig) -> int:
    """The context the pass-rate / evaluation engines start with: the prompt and the longest stage's response
    (observations included). One value for the backend that starts them and the preflight that sizes them."""
    return cfg.verl.max_prompt_length + max(response_tokens(cfg, s) for s in cfg.stages)


def tool_config(limits, db_root: str, max_new_tokens: int, reward_url: str | None = None) -> dict:
    """verl's tool config (`rollout.multi_turn.tool_config_path`): our SQL tool, where its probes run and
    how far they go (`limits`: `rollout.multi_turn`, or an `interaction.ProbeLimits`), and the model's own
    token budget per episode (the agent loop reads it from the tool)."""
    config = {"type": "native", "db_root": db_root, "max_turns": limits.max_turns, "max_rows": limits.max_rows,
              "max_chars": limits.max_chars, "turn_timeout_s": limits.turn_timeout_s,
              "max_new_tokens": max_new_tokens}
    if reward_url:  # the reward's servers run the probes too (token: SIRIUS_REWARD_TOKEN, never in the file)
        config["reward_url"] = reward_url
    return {"tools": [{"class_name": TOOL_CLASS, "config": config, "tool_schema": tool_schema()}]}


def tool_schema() -> dict:
    """The SQL tool in OpenAI function form. verl needs one; the model never sees it (no tool block in the
    prompt): it writes `<sql>...</sql>` and the `sirius_sql` parser turns that into this call."""
    return {"type": "function", "function": {
        "name": TOOL_NAME, "description": "Run one read-only SQLite query on the question's database and read "
                                          "its typed result (status, engine error, or the first rows).",
        "parameters": {"type": "object", "required": ["query"],
                       "properties": {"query": {"type": "string", "description": "one SQLite statement"}}}}}


def multi_turn_overrides(limits, tool_config_path: str) -> list[tuple[str, object]]:
    """The rollout as SIRIUS episodes in our agent loop: `limits.max_turns` probes, each one tool turn, and one
    generation after each (the answer), so verl's `max_assistant_turns` is one more than its `max_user_turns`."""
    prefix = "actor_rollout_ref.rollout.multi_turn"
    return [(f"{prefix}.enable", True), (f"{prefix}.tool_config_path", tool_config_path),
            (f"{prefix}.format", TOOL_PARSER), (f"{prefix}.max_parallel_calls", 1),
            (f"{prefix}.max_user_turns", limits.max_turns), (f"{prefix}.max_assistant_turns", limits.max_turns + 1),
            # verl cuts tool text at 256 characters by default; ours is already capped, so verl never cuts it
            (f"{prefix}.max_tool_response_length", max_observation_chars(limits)),
            (f"{prefix}.tool_response_truncate_side", "right"),
            ("actor_rollout_ref.rollout.agent.default_agent_loop", AGENT_LOOP),
            # the dataset would count the tool schemas into its prompt-length filter; our prompt shows none
            ("data.tool_config_path", None)]


def _micro_batches(v) -> list[tuple[str, object]]:
    if v.use_dynamic_bsz:  # the rollout's log-prob pass follows actor.use_dynamic_bsz by verl's interpolation
        return [("actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu", v.ppo_max_token_len_per_gpu)]
    return [("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", v.ppo_micro_batch_size_per_gpu),
            ("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", v.log_prob_micro_batch_size_per_gpu)]


def _entropy(stage: StageConfig) -> list[tuple[str, object]]:
    """fixed/off map onto verl's constant `entropy_coeff`; adaptive needs a per-step coefficient (entropy.py)."""
    e = stage.entropy
    if e.mode == "off":
        return [("actor_rollout_ref.actor.entropy_coeff", 0.0)]
    if e.mode == "fixed":
        return [("actor_rollout_ref.actor.entropy_coeff", e.coef)]
    return [("actor_rollout_ref.actor.entropy_coeff", 0.0),  # verl's own term stays off; the gate adds c_k·H
            ("actor_rollout_ref.actor.calculate_entropy", True),
            ("+sirius.entropy.target", e.target), ("+sirius.entropy.delta", e.delta),
            ("+sirius.entropy.coef_max", e.coef_max), ("+sirius.entropy.coef", e.coef)]


def _reward_kwargs(cfg: RunConfig, paths: StagePaths) -> list[tuple[str, object]]:
    """Server when `reward.url` is set (token via SIRIUS_REWARD_TOKEN, never on the command line); else in-process."""
    prefix = "+reward.custom_reward_function.reward_kwargs"
    # K variant databases: in-process scoring (and a server's fallback) reads the kwarg; a server its --variants
    variants = [(f"{prefix}.variants", cfg.reward.variants)] if cfg.reward.variants else []
    if cfg.reward.url:
        # Each HTTP request is bounded; the server's own --timeout bounds each query.
        return [(f"{prefix}.reward_url", cfg.reward.url),
                (f"{prefix}.reward_timeout_s", max(60.0, 10 * cfg.reward.timeout_s)),
                # servers down past the client's retries: score in-process on the same databases, or stop
                (f"{prefix}.reward_fallback", cfg.reward.fallback), (f"{prefix}.db_root", paths.db_root),
                (f"{prefix}.timeout_s", cfg.reward.timeout_s)] + variants
    return [(f"{prefix}.db_root", paths.db_root), (f"{prefix}.timeout_s", cfg.reward.timeout_s)] + variants


def _lora(cfg: RunConfig) -> list[tuple[str, object]]:
    """LoRA in verl's FSDP keys: peft adapters on the actor (its reference is the base, adapters off), vLLM given the
    adapters at every weight sync, and checkpoints of the adapters alone (`lora_merge` folds them into the stage's
    starting model at the end)."""
    m = cfg.model
    if not m.lora_rank:
        return []
    return [("actor_rollout_ref.model.lora_rank", m.lora_rank),
            ("actor_rollout_ref.model.lora_alpha", m.lora_alpha),
            ("actor_rollout_ref.model.target_modules", list(m.lora_target_modules) or "all-linear"),
            ("+actor_rollout_ref.actor.checkpoint.save_lora_only", True)]


def _reward_manager() -> list[tuple[str, object]]:
    """verl's DAPO manager, its overlong length the model's own tokens (`reward_manager.SiriusDAPORewardManager`)."""
    return [("reward.reward_manager.source", "importlib"),
            ("reward.reward_manager.name", "SiriusDAPORewardManager"),
            ("reward.reward_manager.module.path", str(PurePath(__file__).with_name("reward_manager.py")))]


def _overlong(stage: StageConfig) -> list[tuple[str, object]]:
    """The overlong buffer over the model's own `max_new_tokens`, as locally (observations are not counted)."""
    prefix = "+reward.reward_kwargs"
    enabled = stage.overlong_cache > 0
    return [(f"{prefix}.overlong_buffer_cfg.enable", enabled),
            (f"{prefix}.overlong_buffer_cfg.len", stage.overlong_cache if enabled else 1),
            (f"{prefix}.overlong_buffer_cfg.penalty_factor", 1.0),
            (f"{prefix}.overlong_buffer_cfg.log", True),
            (f"{prefix}.max_resp_len", stage.max_new_tokens)]


def _check_reward_table(cfg: RunConfig) -> None:
    r = cfg.reward
    ours = RewardTable(correct=r.correct, wrong=r.wrong, error=r.error, timeout=r.timeout, rejected=r.rejected,
                       format_failure=r.format_failure, empty_match=r.empty_match)
    if ours != RewardTable():
        raise ConfigError(f"reward table {ours.to_dict()}: the verl backend scores with "
                          f"rewards.verl_reward.compute_score, which uses the default table {RewardTable().to_dict()}; "
                          "set reward.correct/wrong/error/timeout/rejected/format_failure/empty_match back to "
                          "the defaults")


def _check_new_key(key: str) -> None:
    for prefix, leaves in OPEN_MAPS.items():
        if key.startswith(prefix + "."):
            leaf = key[len(prefix) + 1:]
            if leaves is not None and leaf not in leaves:
                raise ConfigError(f"unknown verl key '+{key}': nothing reads {prefix}.{leaf}; "
                                  f"known: {', '.join(leaves)}")
            return
    raise ConfigError(f"new verl key '+{key}': a '+' key is never checked by verl, so a typo would be silently "
                      f"ignored; only these open maps take new keys: {', '.join(OPEN_MAPS)}")

