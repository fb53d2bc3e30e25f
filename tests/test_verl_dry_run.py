"""`sirius train CONFIG --dry-run`: every shipped config composes with the installed verl's own Hydra config.

Nothing is mocked: the overrides go through verl's `ppo_trainer.yaml` composition and its start-up checks
(`validate_config`, the config dataclasses, the reward-manager registry). Model and data paths in the
shipped configs do not exist here, which is the point: a dry run needs none of them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import import_verl
from typer.testing import CliRunner

import_verl("verl")
import_verl("hydra")

from sirius_train.cli import app  # noqa: E402
from sirius_train.config import ConfigError, load_config  # noqa: E402
from sirius_train.verl_backend import plan_run  # noqa: E402
from sirius_train.verl_backend.compose import compose_verl_config  # noqa: E402

pytestmark = pytest.mark.verl
CONFIGS = Path(__file__).resolve().parents[1] / "configs"
SHIPPED = [("nano.yaml", ["backend=verl"]), ("qwen7b_8gpu.yaml", []), ("sirius32b.yaml", []), ("smoke_1gpu.yaml", [])]


@pytest.mark.parametrize("name, extra", SHIPPED)
def test_every_shipped_config_composes(name, extra, tmp_path):
    cfg = load_config(CONFIGS / name, [*extra, f"output_dir={tmp_path}"])
    plans = plan_run(cfg)
    assert [p.name for p in plans] == [s.name for s in cfg.stages] == ["stage1", "stage2"]
    for stage, plan in zip(cfg.stages, plans):
        v = compose_verl_config(plan.overrides)
        actor = v.actor_rollout_ref.actor
        assert (actor.clip_ratio_low, actor.clip_ratio_high, actor.clip_ratio_c) == (0.2, 0.28, 10.0)
        assert actor.loss_agg_mode == "token-mean" and actor.use_kl_loss is False
        assert v.algorithm.adv_estimator == "grpo" and v.algorithm.filter_groups.metric == "acc"
        assert v.reward.reward_manager.name == "dapo"
        assert v.reward.reward_kwargs.max_resp_len == v.data.max_response_length == stage.max_new_tokens
        assert v.reward.reward_kwargs.overlong_buffer_cfg.len == stage.overlong_cache
        assert v.trainer.nnodes == cfg.verl.nnodes and v.trainer.n_gpus_per_node == cfg.verl.n_gpus_per_node
        assert v.trainer.v1.trainer_mode == "sirius_dapo" and v.sirius.entropy.target == stage.entropy.target
        assert v.actor_rollout_ref.model.path == plan.paths.model
    # stage 2 starts from stage 1's merged weights
    assert plans[1].paths.model == str((cfg.run_dir / "stage1" / "model").resolve())


def test_cluster_recipes_are_what_they_say():
    big = compose_verl_config(plan_run(load_config(CONFIGS / "sirius32b.yaml"))[0].overrides)
    assert big.trainer.nnodes * big.trainer.n_gpus_per_node == 32
    assert big.actor_rollout_ref.rollout.tensor_model_parallel_size == 4
    assert big.actor_rollout_ref.actor.strategy == "fsdp2"
    fsdp = big.actor_rollout_ref.actor.fsdp_config
    assert fsdp.param_offload and fsdp.optimizer_offload
    small = compose_verl_config(plan_run(load_config(CONFIGS / "qwen7b_8gpu.yaml"))[0].overrides)
    assert (small.trainer.nnodes, small.trainer.n_gpus_per_node) == (1, 8)
    assert small.reward.custom_reward_function.reward_kwargs.reward_url == "http://127.0.0.1:8000"


def test_cli_prints_each_stage_command_and_resolved_config(tmp_path):
    result = CliRunner().invoke(app, ["train", str(CONFIGS / "nano.yaml"), "--backend", "verl", "--dry-run",
                                      f"output_dir={tmp_path}"])
    assert result.exit_code == 0, result.output
    out = result.output
    for index, stage in ((1, "stage1"), (2, "stage2")):
        assert f"# ---- stage {index}: {stage} -- command" in out
        assert f"# ---- stage {index}: {stage} -- resolved verl config" in out
    assert "-m sirius_train.verl_backend.main_ppo \\\n    data.train_files=" in out
    assert "clip_ratio_c: 10.0" in out and "trainer_mode: sirius_dapo" in out
    assert not (tmp_path / "nano").exists()  # a dry run writes nothing


@pytest.mark.parametrize("override, message", [
    ("verl.overrides=[reward_model.reward_manager=dapo]", "stale verl key 'reward_model.reward_manager'"),
    ("verl.overrides=[actor_rollout_ref.actor.grad_clip=0.5]", "use actor_rollout_ref.actor.optim.clip_grad"),
    ("verl.overrides=[actor_rollout_ref.actor.clip_ratio_hgih=0.3]",
     "unknown verl key 'actor_rollout_ref.actor.clip_ratio_hgih'"),
    ("verl.overrides=[+reward.reward_kwargs.max_resp_len=10]",
     "verl key 'reward.reward_kwargs.max_resp_len' already exists: set it without the leading '+'"),
    ("verl.overrides=[+trainer.nnodes=2]", "new verl key '+trainer.nnodes'"),
])
def test_cli_stale_or_unknown_key_is_an_error_naming_it(override, message, tmp_path):
    result = CliRunner().invoke(app, ["train", str(CONFIGS / "nano.yaml"), "--backend", "verl", "--dry-run",
                                      override, f"output_dir={tmp_path}"])
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())


def test_shapes_verl_cannot_run_are_refused_by_verl_itself():
    cfg = load_config(CONFIGS / "nano.yaml", ["backend=verl", "verl.use_dynamic_bsz=false", "verl.overrides=["
                                              "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=null]"])
    with pytest.raises(ConfigError, match="verl rejects this configuration"):
        compose_verl_config(plan_run(cfg)[0].overrides)


def test_dry_run_needs_the_verl_backend():
    result = CliRunner().invoke(app, ["train", str(CONFIGS / "nano.yaml"), "--dry-run"])
    assert result.exit_code == 2 and "--backend verl" in result.output


def test_quoted_values_reach_verl_unchanged(tmp_path):
    cfg = load_config(CONFIGS / "nano.yaml", ["backend=verl", "reward.url=http://10.0.0.1:8000,http://10.0.0.2:8000"])
    cfg.output_dir = str(tmp_path / "a dir, with: odd 'chars' $HOME")
    plan = plan_run(cfg)[0]
    v = compose_verl_config(plan.overrides)
    assert v.data.train_files == plan.paths.train_files and "odd 'chars'" in v.data.train_files
    assert v.reward.custom_reward_function.reward_kwargs.reward_url == "http://10.0.0.1:8000,http://10.0.0.2:8000"


@pytest.mark.parametrize("attn", ["sdpa", "flash_attention_2"])
def test_verl_loads_the_actor_with_the_attention_the_config_names(attn, tmp_path):
    from verl.utils.config import omega_conf_to_dataclass

    from sirius_train.local.model import NanoModelConfig, build_nano_model, train_tokenizer

    tokenizer = train_tokenizer(["SELECT name FROM singer", "how many singers"] * 10, 300)
    build_nano_model(NanoModelConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=2), tokenizer).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    cfg = load_config(CONFIGS / "nano.yaml", ["backend=verl", f"model.path={tmp_path}",
                                              f"verl.attn_implementation={attn}"])
    resolved = compose_verl_config(plan_run(cfg)[0].overrides)
    model = omega_conf_to_dataclass(resolved.actor_rollout_ref.model)  # verl's HFModelConfig, as its workers build it
    assert model.hf_config._attn_implementation == attn
