"""The memory planner's arithmetic: parameter counts against real models, and verl's own DAPO recipes.

verl's recipe scripts are not part of the installed wheel (verl 0.9.1 ships no recipe/ folder), so the
recipe figures below are those of verl's published DAPO scripts, `recipe/dapo/test_dapo_7b_math.sh`
(Qwen2.5-Math-7B) and `recipe/dapo/run_dapo_qwen2.5_32b.sh` (Qwen2.5-32B), as written in the verl
repository -- quoted from those scripts, not re-read here: prompt 2k, answers 8k / 20k, Ulysses SP 4 / 8,
rollout TP 4, gpu_memory_utilization 0.8, FSDP param + optimizer offload, gradient checkpointing, token
budget (prompt + answer) x 2 per GPU for the 7B actor and x 1 for the 32B, 4 / 16 nodes of 8 x 80 GB. Those
recipes run, so the planner must say they fit; and the shapes they would not run with must not fit.
The model shapes are the published config.json of each model.
"""

from __future__ import annotations

import pytest

from sirius_train.config import load_config
from sirius_train.local.model import NanoModelConfig, build_nano_model, train_tokenizer
from sirius_train.verl_backend.memory import (
    GIB,
    QWEN25_05B,
    QWEN25_7B,
    QWEN25_32B,
    Layout,
    ModelShape,
    checkpoint_gib,
    disk_plan_gib,
    estimation_plan,
    known_shape,
    rollout_plan,
    stage_layout,
    stage_plans,
    update_plan,
)

DAPO_7B = Layout(gpus=4 * 8, gpu_gib=80, tokens_per_gpu=(2048 + 8192) * 2, max_model_len=2048 + 8192, rollout_tp=4,
                 gpu_memory_utilization=0.8, max_num_batched_tokens=2048 + 8192, param_offload=True,
                 optimizer_offload=True)
DAPO_32B = Layout(gpus=16 * 8, gpu_gib=80, tokens_per_gpu=2048 + 20480, max_model_len=2048 + 20480, rollout_tp=4,
                  gpu_memory_utilization=0.8, max_num_batched_tokens=2048 + 20480, param_offload=True,
                  optimizer_offload=True)


def test_parameter_counts_are_the_published_ones():
    assert QWEN25_7B.params == 7_615_616_512  # Qwen2.5-7B: 7.62 B
    assert QWEN25_32B.params == 32_763_876_352  # Qwen2.5-32B: 32.76 B
    assert QWEN25_05B.params == 494_032_768  # Qwen2.5-0.5B: 0.49 B (tied embeddings)


def test_parameter_count_of_a_real_model_built_here():
    tokenizer = train_tokenizer(["SELECT name FROM singer", "how many singers"] * 10, 300)
    model = build_nano_model(NanoModelConfig(vocab_size=300, hidden_size=64, intermediate_size=160,
                                             num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2),
                             tokenizer)
    shape = ModelShape.from_hf_config(model.config.to_dict())
    assert shape.params == sum(p.numel() for p in model.parameters())


def test_the_recipes_fit_and_their_figures_are_the_arithmetic():
    for shape, layout in ((QWEN25_7B, DAPO_7B), (QWEN25_32B, DAPO_32B)):
        assert all(plan.fits for plan in stage_plans(shape, layout)), [(p.phase, p.note) for p in
                                                                        stage_plans(shape, layout)]
    update = dict(update_plan(QWEN25_32B, DAPO_32B).parts)
    assert update["FSDP state"] == pytest.approx(16 * 32_763_876_352 / 128 / GIB)
    assert update["logits"] == pytest.approx(22528 * 152064 * 10 / GIB)  # 31.9 GiB: the largest part
    assert update["saved activations"] == pytest.approx(64 * 22528 * 5120 * 2 / GIB)
    assert update_plan(QWEN25_32B, DAPO_32B).total_gib == pytest.approx(62.4, abs=0.1)
    rollout = rollout_plan(QWEN25_32B, DAPO_32B)
    assert dict(rollout.parts)["weights / TP 4"] == pytest.approx(2 * 32_763_876_352 / 4 / GIB)
    assert "actor kept" not in dict(rollout.parts)  # both offloads: nothing stays
    assert QWEN25_32B.kv_bytes_per_token(4) == 2 * 64 * 2 * 128 * 2  # 8 KV heads over 4 ranks


def test_shapes_the_recipes_avoid_do_not_fit():
    from dataclasses import replace

    no_tp = rollout_plan(QWEN25_32B, replace(DAPO_32B, rollout_tp=1))  # 61 GiB of weights in a 64 GiB budget
    assert not no_tp.fits and "less than one" in no_tp.note
    no_recompute = update_plan(QWEN25_7B, replace(DAPO_7B, gradient_checkpointing=False))
    assert not no_recompute.fits
    crowded = rollout_plan(QWEN25_32B, replace(DAPO_32B, gpus=8, param_offload=False, optimizer_offload=False))
    assert not crowded.fits and "free beside what the actor keeps" in crowded.note  # 45.8 GiB of AdamW + params stay


def test_shipped_cluster_configs_fit_an_80_gb_gpu_at_every_phase():
    for name, shape in (("qwen7b_8gpu.yaml", QWEN25_7B), ("sirius32b.yaml", QWEN25_32B)):
        cfg = load_config(f"configs/{name}")
        for stage in cfg.stages:
            plans = [*stage_plans(shape, stage_layout(cfg, stage, 80)),
                     estimation_plan(cfg, stage.max_new_tokens, shape, 80)]
            assert [p.fits for p in plans] == [True, True, True], [(p.phase, p.note) for p in plans]


def test_checkpoint_and_disk_plan():
    assert checkpoint_gib(QWEN25_7B) == pytest.approx(12 * 7_615_616_512 / GIB)  # 85 GiB
    assert 10 * checkpoint_gib(QWEN25_7B) * GIB / 1e12 == pytest.approx(0.91, abs=0.01)  # unbounded retention
    assert disk_plan_gib(QWEN25_7B, [2, 2]) == pytest.approx(2 * (2 * 12 + 2) * 7_615_616_512 / GIB)


def test_known_shapes_by_folder_name():
    assert known_shape("/shared/models/Qwen2.5-Coder-32B-Instruct/") == ("qwen2.5-coder-32b", QWEN25_32B)
    assert known_shape("/m/Qwen2.5-Coder-7B-Instruct")[1] is QWEN25_7B
    assert known_shape("/m/Llama-3-8B") is None
