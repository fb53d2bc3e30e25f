"""The memory planner against figures it does not compute itself, and against verl's own settings that run.

Independent figures: the real models' tensors, built from their published config.json on torch's meta device
(every shape real, no memory), counted here part by part -- FSDP's sharded state, the decoder layers and the
embedding / LM head FSDP gathers, the saved activations and the logits -- with the byte sizes written out.

Settings known to fit on 80 GB GPUs, from verl's published scripts (quoted from the verl repository; verl 0.9.1's
wheel ships no recipe/ or examples/ folder):
- `recipe/dapo/test_dapo_7b_math.sh` (Qwen2.5-Math-7B): prompt 2k, answers 8k, Ulysses SP 4, rollout TP 4,
  gpu_memory_utilization 0.8, FSDP param + optimizer offload, gradient checkpointing, dynamic batches of
  (prompt + answer) x 2 tokens per GPU, 8 nodes x 8 GPUs sharded in FSDP groups of 32 (`fsdp_size=32`);
- `recipe/dapo/run_dapo_qwen2.5_32b.sh` (Qwen2.5-32B): prompt 2k, answers 20k, SP 8, TP 4, utilization 0.8,
  both offloads, (prompt + answer) x 1 tokens per GPU, 16 nodes x 8 GPUs, `fsdp_size=-1` (all 128);
- `examples/grpo_trainer/run_qwen2-7b_seq_balance.sh` (Qwen2-7B-Instruct, the 7B shape): one node of 8 GPUs,
  *no* offload, gradient checkpointing, 24000 tokens per GPU, prompt 512 + answer 1024, TP 2, utilization 0.6.
Those run, so the planner must say they fit; the shapes they avoid must not fit.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from sirius_train.config import load_config
from sirius_train.local.model import NanoModelConfig, build_nano_model, train_tokenizer
from sirius_train.verl_backend.memory import (
    CONTEXT_GIB,
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

DAPO_7B = Layout(gpus=32, gpu_gib=80, tokens_per_gpu=(2048 + 8192) * 2, max_model_len=2048 + 8192, rollout_tp=4,
                 gpu_memory_utilization=0.8, max_num_batched_tokens=2048 + 8192, param_offload=True,
                 optimizer_offload=True)
DAPO_32B = Layout(gpus=16 * 8, gpu_gib=80, tokens_per_gpu=2048 + 20480, max_model_len=2048 + 20480, rollout_tp=4,
                  gpu_memory_utilization=0.8, max_num_batched_tokens=2048 + 20480, param_offload=True,
                  optimizer_offload=True)
GRPO_7B_ONE_NODE = Layout(gpus=8, gpu_gib=80, tokens_per_gpu=24000, max_model_len=512 + 1024, rollout_tp=2,
                          gpu_memory_utilization=0.6)  # verl's default max_num_batched_tokens (8192)
PUBLISHED = {  # config.json of each model on the Hugging Face hub
    "7b": dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
               num_attention_heads=28, num_key_value_heads=4, tie_word_embeddings=False),
    "32b": dict(vocab_size=152064, hidden_size=5120, intermediate_size=27648, num_hidden_layers=64,
                num_attention_heads=40, num_key_value_heads=8, tie_word_embeddings=False),
    "0.5b": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                 num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True),
}
SHAPES = {"7b": QWEN25_7B, "32b": QWEN25_32B, "0.5b": QWEN25_05B}


@pytest.fixture(scope="module")
def meta_models():
    """Qwen2 models of the published shapes on the meta device: real tensor shapes, no memory."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    with torch.device("meta"):
        return {name: Qwen2ForCausalLM(Qwen2Config(**config)) for name, config in PUBLISHED.items()}


def _numel(module) -> int:
    return sum(p.numel() for p in module.parameters())


def test_parameter_counts_are_the_real_models_and_the_published_ones(meta_models):
    for name, shape in SHAPES.items():
        model = meta_models[name]
        assert shape.params == _numel(model), name
        assert shape.layer_params == _numel(model.model.layers[0]), name
        vocab = {id(p): p.numel() for p in (model.model.embed_tokens.weight, model.lm_head.weight)}
        assert shape.vocab_params == sum(vocab.values()), name  # tied: one matrix
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


def _expected_update(model, layout: Layout) -> dict[str, float]:
    """The update's parts in GiB, from the model's tensors: bf16 = 2 bytes, fp32 = 4."""
    layer = model.model.layers[0]
    hidden, vocab = model.config.hidden_size, model.lm_head.weight.shape[0]
    vocab_matrices = {id(p): p.numel() for p in (model.model.embed_tokens.weight, model.lm_head.weight)}
    t = layout.tokens_per_gpu
    attention, mlp = layer.self_attn, layer.mlp
    # the bf16 tensors one recomputed layer holds a token: the two norms' outputs, q, k, v, the attention output and
    # its projection; the MLP's gate and up projections, SiLU(gate), and SiLU(gate) * up (down_proj's input)
    per_token_recompute = 2 * (2 * hidden + attention.q_proj.out_features + attention.k_proj.out_features
                               + attention.v_proj.out_features + attention.o_proj.in_features
                               + attention.o_proj.out_features
                               + mlp.gate_proj.out_features + mlp.up_proj.out_features + 2 * mlp.down_proj.in_features)
    return {
        "FSDP state": _numel(model) * (4 + 4 + 4 + 4) / layout.gpus / GIB,  # fp32 params, grads, AdamW m, v
        # two decoder layers in bf16 (running, prefetched), one layer's bf16 gradient and its fp32 reduce copy;
        # the vocabulary matrices in bf16 with their bf16 gradients (embedding and LM head both, untied)
        "gathered layers": (_numel(layer) * (2 + 2 + 2 + 4) + sum(vocab_matrices.values()) * (2 + 2)) / GIB,
        "saved activations": model.config.num_hidden_layers * t * hidden * 2 / GIB,
        "recompute": t * per_token_recompute / GIB,
        "logits": t * vocab * (2 + 4 + 4) / GIB,  # bf16 logits, fp32 log-softmax and its gradient
        "context": CONTEXT_GIB,
    }


@pytest.mark.parametrize("name, layout", [("7b", DAPO_7B), ("32b", DAPO_32B), ("7b", GRPO_7B_ONE_NODE)],
                         ids=["DAPO 7B", "DAPO 32B", "GRPO 7B on one node"])
def test_the_update_plan_is_the_sum_of_the_real_tensors(meta_models, name, layout):
    plan = update_plan(SHAPES[name], layout)
    expected = _expected_update(meta_models[name], layout)
    assert dict(plan.parts) == pytest.approx(expected, rel=1e-12)
    assert plan.total_gib == pytest.approx(sum(expected.values()))


def test_untied_models_gather_the_embedding_and_the_lm_head_with_their_gradients(meta_models):
    """The 32B plan's gathered part: 8 GiB more than one bf16 vocabulary matrix, by hand from the shapes."""
    gathered = dict(update_plan(QWEN25_32B, DAPO_32B).parts)["gathered layers"]
    by_hand = (487_605_248 * 10 + 2 * 152_064 * 5_120 * 4) / GIB  # a 32B layer: 487.6 M parameters
    assert gathered == pytest.approx(by_hand) and gathered == pytest.approx(10.34, abs=0.01)
    tied = dict(update_plan(QWEN25_05B, DAPO_7B).parts)["gathered layers"]
    assert tied == pytest.approx((_numel(meta_models["0.5b"].model.layers[0]) * 10 + 151_936 * 896 * 4) / GIB)


@pytest.mark.parametrize("name, layout", [("7b", DAPO_7B), ("32b", DAPO_32B), ("7b", GRPO_7B_ONE_NODE)],
                         ids=["DAPO 7B", "DAPO 32B", "GRPO 7B on one node"])
def test_verls_published_settings_fit(name, layout):
    plans = stage_plans(SHAPES[name], layout)
    assert all(plan.fits for plan in plans), [(p.phase, p.total_gib, p.note) for p in plans]


def test_the_rollout_parts_by_hand():
    rollout = rollout_plan(QWEN25_32B, DAPO_32B)
    assert dict(rollout.parts)["weights / TP 4"] == pytest.approx(2 * 32_763_876_352 / 4 / GIB)
    assert "actor kept" not in dict(rollout.parts)  # both offloads: nothing stays
    assert QWEN25_32B.kv_bytes_per_token(4) == 2 * 64 * 2 * 128 * 2  # 8 KV heads over 4 ranks
    kept = dict(rollout_plan(QWEN25_7B, GRPO_7B_ONE_NODE).parts)["actor kept"]
    assert kept == pytest.approx(7_615_616_512 * (4 + 8) / 8 / GIB)  # fp32 params + AdamW stay beside vLLM


def test_shapes_the_recipes_avoid_do_not_fit():
    no_tp = rollout_plan(QWEN25_32B, replace(DAPO_32B, rollout_tp=1))  # 61 GiB of weights in a 64 GiB budget
    assert not no_tp.fits and "less than one" in no_tp.note
    no_recompute = update_plan(QWEN25_7B, replace(DAPO_7B, gradient_checkpointing=False))
    assert not no_recompute.fits
    crowded = rollout_plan(QWEN25_32B, replace(DAPO_32B, gpus=8, param_offload=False, optimizer_offload=False))
    assert not crowded.fits and "free beside what the actor keeps" in crowded.note  # 45.8 GiB of AdamW + params stay
    one_node_32b = update_plan(QWEN25_32B, replace(GRPO_7B_ONE_NODE, tokens_per_gpu=8192))
    assert not one_node_32b.fits  # 61 GiB of sharded state alone on 8 GPUs, without offload


def test_shipped_cluster_configs_fit_an_80_gb_gpu_at_every_phase():
    for name, shape in (("qwen7b_8gpu.yaml", QWEN25_7B), ("sirius32b.yaml", QWEN25_32B)):
        cfg = load_config(f"configs/{name}")
        for stage in cfg.stages:
            plans = [*stage_plans(shape, stage_layout(cfg, stage, 80)),
                     estimation_plan(cfg, shape, 80)]
            assert [p.fits for p in plans] == [True, True, True], [(p.phase, p.note) for p in plans]


def test_the_preflight_sizes_the_engines_at_the_context_the_backend_starts_them_with():
    """Multi-turn: observations count in the response, so the pass-rate engines start with a longer context than
    prompt + max_new_tokens; `sirius doctor` / --dry-run size them at that same length (one function), not shorter."""
    from sirius_train.verl_backend.plans import stage_memory
    from sirius_train.verl_backend.translate import engine_context_length

    cfg = load_config("configs/sirius32b.yaml", ["rollout.multi_turn.enabled=true"])
    length = engine_context_length(cfg)
    assert length > cfg.verl.max_prompt_length + max(s.max_new_tokens for s in cfg.stages)
    for _, plans in stage_memory(cfg, QWEN25_32B, 80):
        assert plans[0].phase == "pass rates + eval (vLLM)" and f"sequences of {length} tokens" in plans[0].note


def test_checkpoint_and_disk_plan():
    assert checkpoint_gib(QWEN25_7B) == pytest.approx(12 * 7_615_616_512 / GIB)  # 85 GiB
    assert 10 * checkpoint_gib(QWEN25_7B) * GIB / 1e12 == pytest.approx(0.91, abs=0.01)  # unbounded retention
    assert disk_plan_gib(QWEN25_7B, [2, 2]) == pytest.approx(2 * (2 * 12 + 2) * 7_615_616_512 / GIB)


def test_known_shapes_by_folder_name():
    assert known_shape("/shared/models/Qwen2.5-Coder-32B-Instruct/") == ("qwen2.5-coder-32b", QWEN25_32B)
    assert known_shape("/m/Qwen2.5-Coder-7B-Instruct")[1] is QWEN25_7B
    assert known_shape("/m/Llama-3-8B") is None


@pytest.mark.parametrize("targets", [(), ("q_proj", "v_proj")], ids=["all-linear", "q and v"])
def test_lora_adapter_counts_are_peft_s(targets):
    """The planner's adapter count against peft's own trainable parameters on a real Qwen2 (q/k/v biases, GQA)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from sirius_train.lora import LoraSpec, attach, trainable_parameters

    config = dict(vocab_size=300, hidden_size=64, intermediate_size=160, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=2, tie_word_embeddings=True)
    torch.manual_seed(0)
    adapted = attach(Qwen2ForCausalLM(Qwen2Config(**config)), LoraSpec(8, 16.0, targets))
    assert ModelShape.from_hf_config(config).adapter_params(8, targets) == trainable_parameters(adapted)[0]


def test_lora_keeps_no_optimizer_state_or_gradients_for_the_frozen_base():
    lora = replace(GRPO_7B_ONE_NODE, lora_rank=32)
    p, a = QWEN25_7B.params, QWEN25_7B.adapter_params(32)
    full, adapted = dict(update_plan(QWEN25_7B, GRPO_7B_ONE_NODE).parts), dict(update_plan(QWEN25_7B, lora).parts)
    assert adapted["FSDP state (frozen base + adapters)"] == pytest.approx((4 * p + 16 * a) / 8 / GIB)
    assert adapted["gathered layers"] == pytest.approx((QWEN25_7B.layer_params * 4 + QWEN25_7B.vocab_params * 2) / GIB)
    assert {k: v for k, v in adapted.items() if k not in ("FSDP state (frozen base + adapters)", "gathered layers")} \
        == {k: v for k, v in full.items() if k not in ("FSDP state", "gathered layers")}  # activations, logits
    kept = dict(rollout_plan(QWEN25_7B, lora).parts)["actor kept"]
    assert kept == pytest.approx((4 * p + 8 * a) / 8 / GIB)
    assert checkpoint_gib(QWEN25_7B, a) == pytest.approx(12 * a / GIB)
    assert disk_plan_gib(QWEN25_7B, [2], a) == pytest.approx((2 * 12 * a + 2 * p) / GIB)


def test_the_lora_32b_recipe_fits_one_node_where_the_full_fine_tune_does_not():
    cfg = load_config("configs/qwen32b_lora_1node.yaml")
    full = load_config("configs/qwen32b_lora_1node.yaml", ["model.lora_rank=0"])
    assert cfg.verl.nnodes * cfg.verl.n_gpus_per_node == 8 and not cfg.verl.param_offload
    for stage in cfg.stages:
        plans = [*stage_plans(QWEN25_32B, stage_layout(cfg, stage, 80)), estimation_plan(cfg, QWEN25_32B, 80)]
        assert all(p.fits for p in plans), [(p.phase, p.note) for p in plans]
    for stage in full.stages:
        assert not update_plan(QWEN25_32B, stage_layout(full, stage, 80)).fits
    adapters = QWEN25_32B.adapter_params(cfg.model.lora_rank)
    assert checkpoint_gib(QWEN25_32B, adapters) < checkpoint_gib(QWEN25_32B) / 100  # 3 GiB against 366
