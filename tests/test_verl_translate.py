"""Run config -> verl overrides: every DAPO knob under its current verl 0.9 key, and the rules that guard them."""

from __future__ import annotations

from pathlib import Path

import pytest

from sirius_train.config import ConfigError, load_config
from sirius_train.verl_backend.translate import (
    GATED_TRAINER,
    STALE_KEYS,
    StagePaths,
    check_overrides,
    stage_overrides,
)

NANO = Path(__file__).resolve().parents[1] / "configs" / "nano.yaml"
PATHS = StagePaths(train_files="/r/stage1/curriculum.parquet", val_files="/r/data/eval.parquet", model="/r/sft/model",
                   checkpoints="/r/stage1/verl_checkpoints", reward_fn="/code/rewards/verl_reward.py",
                   db_root="/data/dbs", pythonpath="/code", metrics="/r/stage1/verl_metrics.jsonl")


def _overrides(*extra: str, index: int = 0) -> dict[str, str]:
    cfg = load_config(NANO, ["backend=verl", *extra])
    items = stage_overrides(cfg, index + 1, cfg.stages[index], PATHS)
    keys = [o.split("=", 1)[0] for o in items]
    assert len(keys) == len(set(keys)), "no key is set twice"
    return dict(o.split("=", 1) for o in items)


def test_dapo_is_spelled_out_in_current_keys():
    o = _overrides()
    expected = {
        "algorithm.adv_estimator": "grpo",
        "algorithm.use_kl_in_reward": "false",
        "actor_rollout_ref.actor.use_kl_loss": "false",
        "actor_rollout_ref.actor.policy_loss.loss_mode": "vanilla",
        "actor_rollout_ref.actor.clip_ratio_low": "0.2",
        "actor_rollout_ref.actor.clip_ratio_high": "0.28",  # verl's default is 0.2
        "actor_rollout_ref.actor.clip_ratio_c": "10.0",  # verl's default is 3.0
        "actor_rollout_ref.actor.loss_agg_mode": "token-mean",
        "algorithm.filter_groups.enable": "true",
        "algorithm.filter_groups.metric": "acc",
        "algorithm.filter_groups.max_inflight_gen_batches": "3",
        "reward.reward_manager.source": "importlib",
        "reward.reward_manager.name": "SiriusDAPORewardManager",  # verl's DAPO manager over the model's own tokens
        "reward.custom_reward_function.path": "/code/rewards/verl_reward.py",
        "reward.custom_reward_function.name": "compute_score",
        "+reward.reward_kwargs.overlong_buffer_cfg.enable": "true",
        "+reward.reward_kwargs.overlong_buffer_cfg.len": "8",  # nano stage 1: overlong_cache
        "+reward.reward_kwargs.overlong_buffer_cfg.penalty_factor": "1.0",
        "+reward.reward_kwargs.max_resp_len": "48",  # nano stage 1: max_new_tokens
        "data.max_response_length": "48",
        "data.train_batch_size": "8",
        "actor_rollout_ref.rollout.n": "8",
        "actor_rollout_ref.actor.ppo_mini_batch_size": "4",  # 8 prompts / 2 mini-batches
        "actor_rollout_ref.actor.optim.lr": str(load_config(NANO).stages[0].lr),
        "actor_rollout_ref.actor.optim.clip_grad": "1.0",
        "actor_rollout_ref.model.path": "/r/sft/model",
        "trainer.total_training_steps": str(load_config(NANO).stages[0].steps),
        "trainer.save_freq": "4",
        "trainer.default_local_dir": "/r/stage1/verl_checkpoints",
    }
    assert {k: o.get(k) for k in expected} == expected


def test_stage_two_gets_its_own_lengths():
    o = _overrides(index=1)
    assert o["data.max_response_length"] == o["+reward.reward_kwargs.max_resp_len"] == "64"
    assert o["actor_rollout_ref.actor.optim.lr"] == str(load_config(NANO).stages[1].lr)
    assert o["+sirius.entropy.target"] == str(load_config(NANO).stages[1].entropy.target)


def test_no_stale_key_is_ever_emitted():
    for extra in ([], ["reward.url=http://127.0.0.1:8000"],
                  ["stages.0.entropy.mode=fixed", "stages.0.entropy.coef=0.001"],
                  ["verl.use_dynamic_bsz=false", "logging.backends=[tensorboard]", "verl.python=/opt/py/bin/python"]):
        items = [f"{k}={v}" for k, v in _overrides(*extra).items()]
        check_overrides(items)
        assert not [k for k in (i.split("=")[0].lstrip("+") for i in items)
                    for stale in STALE_KEYS if k == stale or k.startswith(stale + ".")]


@pytest.mark.parametrize("mode, coeff, trainer, gated", [
    ("off", "0.0", "sync", False),
    ("fixed", "0.002", "sync", False),
    ("adaptive", "0.0", GATED_TRAINER, True),
])
def test_entropy_modes(mode, coeff, trainer, gated):
    o = _overrides(f"stages.0.entropy.mode={mode}", "stages.0.entropy.coef=0.002",
                   "stages.0.entropy.coef_max=0.004")
    assert o["actor_rollout_ref.actor.entropy_coeff"] == coeff  # adaptive: verl's constant term stays off
    assert o["trainer.v1.trainer_mode"] == trainer
    assert not [k for k in o if "VERL_USE_EXTERNAL_MODULES" in k]  # it would import our module in every process
    if gated:
        assert o["actor_rollout_ref.actor.calculate_entropy"] == "true"
        assert {k: o[f"+sirius.entropy.{k}"] for k in ("target", "delta", "coef_max", "coef")} == {
            "target": str(load_config(NANO).stages[0].entropy.target), "delta": "0.001", "coef_max": "0.004",
            "coef": "0.002"}
    else:
        assert not [k for k in o if k.startswith("+sirius.")]


def test_reward_in_process_or_on_the_server():
    local = _overrides()
    assert local["+reward.custom_reward_function.reward_kwargs.db_root"] == "/data/dbs"
    assert local["+reward.custom_reward_function.reward_kwargs.timeout_s"] == "2.0"
    assert not [k for k in local if k.endswith("reward_url")]
    served = _overrides("reward.url=http://a:8000,http://b:8000")
    assert served["+reward.custom_reward_function.reward_kwargs.reward_url"] == "'http://a:8000,http://b:8000'"
    assert float(served["+reward.custom_reward_function.reward_kwargs.reward_timeout_s"]) >= 60
    # the same databases for the in-process fallback when the servers stay down (reward.fallback)
    assert served["+reward.custom_reward_function.reward_kwargs.db_root"] == "/data/dbs"
    assert served["+reward.custom_reward_function.reward_kwargs.reward_fallback"] == "true"
    off = _overrides("reward.url=http://a:8000", "reward.fallback=false")
    assert off["+reward.custom_reward_function.reward_kwargs.reward_fallback"] == "false"


def test_cluster_shape_and_user_overrides_come_last():
    cfg = load_config(NANO, ["backend=verl", "verl.nnodes=2", "verl.rollout_tp=4", "verl.param_offload=true",
                             "verl.overrides=[actor_rollout_ref.rollout.gpu_memory_utilization=0.4]"])
    items = stage_overrides(cfg, 1, cfg.stages[0], PATHS)
    assert items[-1] == "actor_rollout_ref.rollout.gpu_memory_utilization=0.4"
    o = dict(i.split("=", 1) for i in items[:-1])
    assert o["trainer.nnodes"] == "2" and o["actor_rollout_ref.rollout.tensor_model_parallel_size"] == "4"
    assert o["actor_rollout_ref.actor.fsdp_config.param_offload"] == "true"


def test_a_custom_reward_table_is_refused_with_the_fix():
    cfg = load_config(NANO, ["backend=verl", "reward.format_failure=-0.5"])
    with pytest.raises(ConfigError, match=r"format_failure.*back to the defaults"):
        stage_overrides(cfg, 1, cfg.stages[0], PATHS)


@pytest.mark.parametrize("override, match", [
    ("custom_reward_function.path=/x.py", r"stale verl key 'custom_reward_function.path'.*reward.custom_reward_"),
    ("reward_model.reward_manager=dapo", r"stale verl key 'reward_model.reward_manager'.*reward.reward_manager.name"),
    ("actor_rollout_ref.actor.grad_clip=0.5", r"stale.*optim.clip_grad"),
    ("algorithm.filter_groups.max_num_gen_batches=10", r"stale.*max_inflight_gen_batches"),
    ("+algorithm.filter_groups.max_num_gen_batches=10", r"stale.*max_inflight_gen_batches"),
    ("+reward.reward_kwargs.overlong_bufer_cfg.len=4", r"unknown verl key.*overlong_bufer_cfg.len.*known: "),
    ("+reward.custom_reward_function.reward_kwargs.reward_ulr=http://x", r"unknown verl key.*reward_ulr"),
    ("+actor_rollout_ref.actor.clip_ratio_hgh=0.3", r"new verl key.*silently ignored"),
])
def test_check_overrides_rejects_with_the_key_and_the_fix(override, match):
    with pytest.raises(ConfigError, match=match):
        check_overrides([override])


def test_check_overrides_accepts_open_maps():
    check_overrides(["+ray_kwargs.ray_init.runtime_env.env_vars.NCCL_DEBUG=INFO",
                     "+actor_rollout_ref.actor.fsdp_config.wrap_policy.transformer_layer_cls_to_wrap=[Qwen2Layer]",
                     "+reward.custom_reward_function.reward_kwargs.reward_token=abc"])


@pytest.mark.parametrize("override, match", [
    ("verl.strategy=deepspeed", r"verl.strategy='deepspeed'.*fsdp2"),
    ("verl.rollout_engine=hf", r"verl.rollout_engine='hf'.*vllm"),
    ("verl.rollout_tp=3", r"verl.rollout_tp=3.*divide the 8 GPUs"),
    ("verl.gpu_memory_utilization=1.5", r"gpu_memory_utilization"),
    ("verl.overrides=[no_equals_sign]", r"verl.overrides.*key=value"),
    ("stages.0.mini_batches=3", r"stages.0.mini_batches=3.*divisor of prompts_per_step"),
    ("verl.n_gpus_per_node=3", r"prompts_per_step \* n_samples \(64\) divisible by the 3 GPUs"),
])
def test_verl_section_is_validated_when_the_config_loads(override, match):
    with pytest.raises(ConfigError, match=match):
        load_config(NANO, ["backend=verl", override])


def test_local_backend_ignores_verl_only_stage_shapes():
    cfg = load_config(NANO, ["stages.0.mini_batches=3"])  # the local trainer splits any way it likes
    assert cfg.backend == "local" and cfg.verl.nnodes == 1


def test_attention_and_checkpoint_retention_are_always_spelled_out():
    o = _overrides()
    assert o["+actor_rollout_ref.model.override_config.attn_implementation"] == "flash_attention_2"  # verl's default
    assert o["trainer.max_actor_ckpt_to_keep"] == "2"  # verl's default is null: every checkpoint kept
    o = _overrides("verl.attn_implementation=sdpa", "verl.keep_checkpoints=0")
    assert o["+actor_rollout_ref.model.override_config.attn_implementation"] == "sdpa"
    assert o["trainer.max_actor_ckpt_to_keep"] == "null"  # 0 keeps all, as verl's null does
    with pytest.raises(ConfigError, match=r"verl.attn_implementation='flash_attn'.*sdpa"):
        load_config(NANO, ["backend=verl", "verl.attn_implementation=flash_attn"])


def test_reward_urls_are_split_in_one_place_and_checked_when_the_config_loads():
    """`reward.url` is split by the reward client's own `parse_urls` for every reader (preflight's checks, the
    verl backend's server check); a URL the client would refuse fails when the config loads, not mid-run."""
    cfg = load_config(NANO, ["reward.url=http://a:8000/, http://b:8000"])
    assert cfg.reward.urls() == ["http://a:8000", "http://b:8000"]
    assert load_config(NANO).reward.urls() == []
    with pytest.raises(ConfigError, match=r"reward.url='a:8000'.*must look like http://host:port"):
        load_config(NANO, ["reward.url=a:8000"])
