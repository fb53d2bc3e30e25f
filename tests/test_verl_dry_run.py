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
SHIPPED = [("nano.yaml", ["backend=verl"]), ("qwen7b_8gpu.yaml", []), ("sirius32b.yaml", []), ("smoke_1gpu.yaml", []),
           ("verl_cpu_smoke.yaml", [])]


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
        assert v.reward.reward_manager.name == "SiriusDAPORewardManager"
        assert v.reward.reward_kwargs.max_resp_len == v.data.max_response_length == stage.max_new_tokens
        assert v.reward.reward_kwargs.overlong_buffer_cfg.len == stage.overlong_cache
        assert v.trainer.nnodes == cfg.verl.nnodes and v.trainer.n_gpus_per_node == cfg.verl.n_gpus_per_node
        assert v.trainer.v1.trainer_mode == "sirius_dapo" and v.sirius.entropy.target == stage.entropy.target
        assert v.actor_rollout_ref.model.path == plan.paths.model
    # stage 2 starts from stage 1's merged weights
    assert plans[1].paths.model == str((cfg.run_dir / "stage1" / "model").resolve())


def test_the_cpu_platform_is_spelled_out_in_verls_own_keys(tmp_path):
    """`verl.device: cpu`: one logical Ray GPU, no vLLM sleep mode, the CPU platform's environment in every worker;
    verl's composition and start-up checks accept it all."""
    cfg = load_config(CONFIGS / "verl_cpu_smoke.yaml", [f"output_dir={tmp_path}"])
    v = compose_verl_config(plan_run(cfg)[0].overrides)
    assert v.trainer.device == "cpu" and v.ray_kwargs.ray_init.num_gpus == cfg.verl.n_gpus_per_node == 1
    rollout = v.actor_rollout_ref.rollout
    assert rollout.free_cache_engine is False and rollout.engine_kwargs.vllm.enable_sleep_mode is False
    env = v.ray_kwargs.ray_init.runtime_env.env_vars
    assert (env.VERL_PLATFORM, env.VERL_USE_EXTERNAL_MODULES, env.VERL_ENGINE_DEVICE, env.RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER) \
        == ("cpu", "sirius_train.verl_backend.cpu_platform", "cuda", "0")
    assert env.VLLM_CPU_KVCACHE_SPACE == "1"  # else vLLM reserves gpu_memory_utilization x all RAM for its cache
    # one agent-loop worker and no dataloader workers: each would be another process loading torch on 2 cores
    assert rollout.agent.num_workers == 1 and v.data.dataloader_num_workers == 0
    assert v.actor_rollout_ref.model.override_config.attn_implementation == "sdpa"
    gpu = compose_verl_config(plan_run(load_config(CONFIGS / "nano.yaml", ["backend=verl"]))[0].overrides)
    assert "VERL_PLATFORM" not in gpu.ray_kwargs.ray_init.runtime_env.env_vars and gpu.trainer.device == "cuda"


@pytest.mark.parametrize("override, match", [
    ("verl.nnodes=2", r"verl.nnodes=2: verl.device=cpu runs on this one machine"),
    ("verl.attn_implementation=flash_attention_2", r"flash-attn needs a GPU"),
    ("verl.use_remove_padding=true", r"verl.use_remove_padding=false"),
    ("verl.strategy=fsdp", r"FSDP1"),
    ("verl.rollout_engine=sglang", r"vLLM's CPU build"),
    ("verl.ray_address=auto", r"starts its own Ray on 127.0.0.1"),
    ("verl.device=tpu", r"use 'cuda' \(GPU nodes\) or 'cpu'"),
])
def test_what_the_cpu_platform_cannot_run_is_refused_when_the_config_loads(override, match):
    with pytest.raises(ConfigError, match=match):
        load_config(CONFIGS / "verl_cpu_smoke.yaml", [override])


def test_the_cpu_platform_needs_vllms_cpu_build(tmp_path):
    """Here (the project's venv) vLLM's CPU build is absent: the backend says where to get it, before anything runs."""
    from sirius_train.verl_backend import VerlBackend
    from sirius_train.verl_backend.cpu_platform import accelerator_visible, vllm_cpu_build

    if vllm_cpu_build() is not None:
        pytest.skip("vLLM's CPU build is installed here")
    if accelerator_visible():
        pytest.skip("an accelerator is visible: the CPU platform is refused before its vLLM build is looked for")
    cfg = load_config(CONFIGS / "verl_cpu_smoke.yaml", [f"output_dir={tmp_path}"])
    with pytest.raises(ConfigError, match=r"scripts/verl_cpu_venv.sh"):
        VerlBackend(cfg)


def test_the_cpu_platform_is_refused_on_a_machine_with_a_gpu(tmp_path, monkeypatch):
    """`verl.device: cpu` on a GPU node would train on the CPU beside idle GPUs (and patch verl's device layer in
    every worker): refused before anything starts. torch is made to report the GPU this machine lacks."""
    import torch

    from sirius_train.verl_backend import VerlBackend

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "NVIDIA H200")
    cfg = load_config(CONFIGS / "verl_cpu_smoke.yaml", [f"output_dir={tmp_path}"])
    with pytest.raises(ConfigError, match=r"verl.device=cpu, but this machine has a CUDA GPU \(NVIDIA H200\): .*"
                                          r"remove verl.device"):
        VerlBackend(cfg)
    assert not (tmp_path / cfg.name).exists()


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


def test_a_local_dry_run_states_the_cost_and_points_at_the_verl_plan():
    result = CliRunner().invoke(app, ["train", str(CONFIGS / "nano.yaml"), "--dry-run"], env={"COLUMNS": "300"})
    assert result.exit_code == 0 and "stage1: pass rates 690 x k=4" in result.output
    assert "with --backend verl a dry run also prints each stage's verl command" in " ".join(result.output.split())
    assert "-- command" not in result.output  # rich wraps at the width the console had when first imported


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


def test_prompt_and_answer_past_the_models_positions_are_refused_before_anything_runs(tmp_path):
    """scripts/gpu_smoke.sh once set verl.max_prompt_length=1024 on the nano model (1024 positions): vLLM refused
    its max_model_len only after the warm start. The dry run and the backend refuse it at once, with the length."""
    result = CliRunner().invoke(app, ["train", str(CONFIGS / "nano.yaml"), "--backend", "verl", "--dry-run",
                                      "verl.max_prompt_length=1024", f"output_dir={tmp_path}"])
    assert result.exit_code == 2
    assert "stage 'stage2''s 64 response tokens = 1088 > the model's 1024 positions" in " ".join(result.output.split())
    assert "lower verl.max_prompt_length to 960 or less" in " ".join(result.output.split())
    from sirius_train.verl_backend import VerlBackend

    with pytest.raises(ConfigError, match="1088 > the model's 1024 positions"):
        VerlBackend(load_config(CONFIGS / "nano.yaml", ["backend=verl", "verl.max_prompt_length=1024"]))


def test_observations_alone_past_the_positions_name_the_multi_turn_knobs():
    """verl's default 3 probes of 400 characters reserve more response tokens than nano's 1024 positions hold: no
    prompt length can help, so the message names the multi-turn knobs (it once said 'lower verl.max_prompt_length
    to -449')."""
    from sirius_train.verl_backend.plans import require_positions

    cfg = load_config(CONFIGS / "nano.yaml", ["backend=verl", "rollout.multi_turn.enabled=true"])
    with pytest.raises(ConfigError) as refused:
        require_positions(cfg)
    message = str(refused.value)
    assert "the response alone takes every position (stage 'stage2''s response is max_new_tokens 64 + " \
           "rollout.multi_turn.max_turns 3 x 459 observation tokens (rollout.multi_turn.max_chars 400)); lower " \
           "rollout.multi_turn.max_turns or max_chars" in message
    assert "lower verl.max_prompt_length to -" not in message
    # with room left for a prompt, the prompt length is the first fix, and the response's parts the other
    cfg = load_config(CONFIGS / "nano.yaml", ["backend=verl", "rollout.multi_turn.enabled=true",
                                              "rollout.multi_turn.max_turns=1"])
    with pytest.raises(ConfigError, match=r"lower verl.max_prompt_length to 501 or less, or shorten the response "
                                          r"\(stage 'stage2''s response is max_new_tokens 64 \+ rollout.multi_turn."
                                          r"max_turns 1 x 459"):
        require_positions(cfg)


def test_the_cost_preview_counts_the_zero_shot_evaluation():
    from sirius_train.cost import eval_generations

    cfg = load_config(CONFIGS / "nano.yaml")
    assert eval_generations(cfg, 10)[1] == 3  # after SFT and after each of the two stages
    assert eval_generations(load_config(CONFIGS / "nano.yaml", ["eval.base=true"]), 10)[1] == 4  # and the base


TWO_UNNAMED_STAGES = ("name: twostage\nbackend: verl\nverl:\n  checkpoint_dir: {}\n  max_prompt_length: 512\n"
                      "stages:\n  - steps: 3\n  - steps: 2\n")


def test_unnamed_stages_are_named_by_position_and_a_name_given_twice_is_refused(tmp_path):
    config = tmp_path / "two.yaml"
    config.write_text(TWO_UNNAMED_STAGES.format(tmp_path / "ckpts"))
    assert [s.name for s in load_config(config).stages] == ["stage1", "stage2"]
    for name in ("stage1", "sft"):
        with pytest.raises(ConfigError, match=f"stages.1.name='{name}': each stage needs its own name"):
            load_config(config, [f"stages.1.name={name}"])


def test_verl_checkpoints_are_the_runs_own_and_each_stages_own(tmp_path):
    """Under `verl.checkpoint_dir` (outside the run folder) verl resumes whatever it finds: each stage of each run
    folder's life has its own folder there -- a run of the same name in another output_dir, or started over with
    --fresh, never resumes another's checkpoint."""
    from sirius_train.run_folder import claim

    config = tmp_path / "two.yaml"
    config.write_text(TWO_UNNAMED_STAGES.format(tmp_path / "ckpts"))
    result = CliRunner().invoke(app, ["train", str(config), "--dry-run", f"output_dir={tmp_path / 'a'}"],
                                env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    shown = [line.split(": ", 1)[1] for line in result.output.splitlines()
             if line.strip().startswith("default_local_dir:")]
    assert shown == [str(tmp_path / "ckpts" / "twostage-new" / f"stage{i}") for i in (1, 2)], shown

    def checkpoints(output_dir: Path, fresh: bool = False) -> list[str]:
        cfg = load_config(config, [f"output_dir={output_dir}"])
        with claim(cfg, "fresh" if fresh else "refuse", print) as run_dir:
            (run_dir / "summary.json").write_text("{}")  # the run did something: --fresh has a folder to move
            return [plan.paths.checkpoints for plan in plan_run(cfg)]

    first = checkpoints(tmp_path / "a")
    assert len(set(first)) == 2 and checkpoints(tmp_path / "a") == first  # a rerun resumes its own
    elsewhere, fresh = checkpoints(tmp_path / "b"), checkpoints(tmp_path / "a", fresh=True)
    assert not {*first} & {*elsewhere} and not {*first} & {*fresh} and not {*elsewhere} & {*fresh}


def test_lora_reaches_verl_in_its_own_keys_with_adapter_only_checkpoints(tmp_path):
    """model.lora_* composed against verl 0.9.1's config: the FSDP LoRA keys, LoRA-only checkpoints; none without."""
    import importlib.util

    cfg = load_config(CONFIGS / "nano.yaml", ["backend=verl", f"output_dir={tmp_path}", "model.lora_rank=8",
                                              "model.lora_alpha=16", "model.lora_target_modules=[q_proj,v_proj]"])
    if importlib.util.find_spec("vllm") is None:  # verl validates the rank against vLLM's: refused, saying so
        with pytest.raises(ConfigError, match="a LoRA config composes only where vLLM is installed"):
            compose_verl_config(plan_run(cfg)[0].overrides)
        pytest.skip("no vLLM here: the LoRA keys compose in make test-verl-cpu's environment")
    v = compose_verl_config(plan_run(cfg)[0].overrides)
    model = v.actor_rollout_ref.model
    assert (model.lora_rank, model.lora_alpha, list(model.target_modules)) == (8, 16, ["q_proj", "v_proj"])
    assert v.actor_rollout_ref.actor.checkpoint.save_lora_only is True
    every = compose_verl_config(plan_run(load_config(CONFIGS / "nano.yaml", [
        "backend=verl", f"output_dir={tmp_path}", "model.lora_rank=8"]))[0].overrides)
    assert every.actor_rollout_ref.model.target_modules == "all-linear"
    plain = compose_verl_config(plan_run(load_config(CONFIGS / "nano.yaml", ["backend=verl",
                                                                             f"output_dir={tmp_path}"]))[0].overrides)
    assert plain.actor_rollout_ref.model.lora_rank == 0
    assert not plain.actor_rollout_ref.actor.checkpoint.get("save_lora_only", False)
