"""LoRA on the local backend (sirius_train/lora.py): the DAPO update is the same loss with gradients only in the
adapters, a stage checkpoints only them, resumes them, and hands over the base with them merged in."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tiny_run import NANO, tiny_overrides

from sirius_train.config import ConfigError, load_config

LORA = ["model.lora_rank=8", "model.lora_alpha=16", "sft.lora=false"]  # nano: a full warm start, LoRA stages


def _tiny_llama(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                                        tie_word_embeddings=True))


def test_the_lora_update_is_the_dapo_loss_with_gradients_only_in_the_adapters():
    """peft's adapted forward (through the trainer's shared-prompt path) against W + (alpha / r) B A written out:
    the same token log-probs, the same clipped token-mean loss, the same gradients of A and B; the base gets none."""
    import copy

    from data_synthesis.generation import Rollout, left_pad_positions
    from sirius_train.algorithms import logprobs_and_entropy, policy_loss
    from sirius_train.local.trainer import response_logprobs
    from sirius_train.lora import LoraSpec, attach

    base = _tiny_llama()
    spec = LoraSpec(rank=4, alpha=8.0)
    adapted = attach(copy.deepcopy(base), spec)
    g = torch.Generator().manual_seed(1)
    for name, p in adapted.named_parameters():
        if "lora_B" in name:  # B starts at 0 (the adapted model starts at the base); give A a gradient too
            p.data = torch.randn(p.shape, generator=g) * 0.1
    N, P, R = 4, 5, 6
    prompt = torch.randint(1, 64, (2, P), generator=g).repeat_interleave(2, dim=0)  # shared prompts, as in a group
    prompt_mask = torch.ones(N, P, dtype=torch.long)
    prompt_mask[2:, :2] = 0  # left padding
    response = torch.randint(1, 64, (N, R), generator=g)
    response_mask = torch.ones(N, R, dtype=torch.long)
    response_mask[1, 4:] = 0
    roll = Rollout(prompt, prompt_mask, response, response_mask, [""] * N, response_mask.sum(1),
                   torch.zeros(N, dtype=torch.bool))
    mask = response_mask.float()
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])[:, None] * mask
    old = None

    def loss_of(log_prob):
        nonlocal old
        if old is None:
            old = (log_prob.detach() + 0.1 * torch.randn(log_prob.shape, generator=g)) * mask
        return policy_loss(log_prob, old, advantages, mask)[0]

    log_prob, _ = response_logprobs(adapted, roll, temperature=1.0)
    loss = loss_of(log_prob)
    loss.backward()

    # the same model written out: every adapted projection's weight is W + (alpha / r) B A, A and B leaves
    leaves, weights = {}, {}
    for name, module in adapted.named_modules():
        if hasattr(module, "lora_A") and "default" in module.lora_A:
            plain = name.removeprefix("base_model.model.")
            A = module.lora_A["default"].weight.detach().clone().requires_grad_(True)
            B = module.lora_B["default"].weight.detach().clone().requires_grad_(True)
            leaves[plain] = (A, B, module)
            weights[f"{plain}.weight"] = base.get_submodule(plain).weight.detach() + (spec.alpha / spec.rank) * B @ A
    assert len(leaves) == 2 * 7  # every linear projection of both blocks: q k v o gate up down
    full_mask = torch.cat([prompt_mask, response_mask], dim=1)
    logits = torch.func.functional_call(base, weights, args=(), kwargs=dict(
        input_ids=roll.input_ids, attention_mask=full_mask, position_ids=left_pad_positions(full_mask),
        use_cache=False)).logits[:, P - 1:-1]
    explicit_log_prob, _ = logprobs_and_entropy(logits, response, temperature=1.0)
    explicit = loss_of(explicit_log_prob)
    explicit.backward()

    torch.testing.assert_close(log_prob * mask, explicit_log_prob * mask, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(loss, explicit, atol=1e-6, rtol=1e-5)
    for name, (A, B, module) in leaves.items():
        torch.testing.assert_close(module.lora_A["default"].weight.grad, A.grad, atol=1e-6, rtol=1e-4, msg=name)
        torch.testing.assert_close(module.lora_B["default"].weight.grad, B.grad, atol=1e-6, rtol=1e-4, msg=name)
    frozen = [n for n, p in adapted.named_parameters() if "lora_" not in n]
    assert frozen and all(not p.requires_grad and p.grad is None for n, p in adapted.named_parameters()
                          if "lora_" not in n)


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    """The tiny schedule with LoRA stages (rank 8) after a full warm start."""
    from sirius_train.commands.train import run_schedule

    tmp = tmp_path_factory.mktemp("lora")
    cfg = load_config(NANO, [*tiny_overrides(tmp, "lora"), *LORA])
    with (tmp / "stderr.log").open("w") as log, contextlib.redirect_stderr(log):
        summary = run_schedule(cfg)
    return cfg, summary, tmp / "runs" / "lora", (tmp / "stderr.log").read_text()


def _logits(folder: Path, model=None):
    from transformers import AutoModelForCausalLM

    model = model or AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)
    ids = torch.arange(1, 40)[None]
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_a_lora_stage_checkpoints_only_its_adapters_and_hands_over_the_merged_model(lora_run):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from sirius_train.local.checkpoint import list_checkpoints, load_state

    cfg, summary, run_dir, log = lora_run
    assert "LoRA r=8, alpha=16" in log and set(summary["eval_exec_acc"]) == {"sft", "stage1", "stage2"}
    for index in (1, 2):
        stage = run_dir / f"stage{index}"
        last = list_checkpoints(stage / "checkpoints")[-1]
        assert (last / "adapter_model.safetensors").is_file() and not (last / "model.safetensors").exists()
        # optimizer state for the adapters alone: two tensors (A, B) per adapted projection, nothing for the base
        optimizer = load_state(last)["optimizer"]
        assert len(optimizer["state"]) == len(optimizer["param_groups"][0]["params"]) == 2 * 7 * 2
        # the stage's model is its start with the final adapter merged in, and training moved it
        start = Path(json.loads((stage / "DONE.json").read_text())["init"])
        adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(start, local_files_only=True),
                                            stage / "adapter")
        merged = _logits(stage / "model")
        torch.testing.assert_close(merged, _logits(None, adapted), atol=1e-4, rtol=1e-4)
        assert not torch.allclose(merged, _logits(start), atol=1e-4)
        card = json.loads((stage / "model" / "sirius.json").read_text())
        assert card["lora"] == {"base": str(start), "rank": 8, "alpha": 16.0, "target_modules": "all-linear",
                                "adapter": str(stage / "adapter")}
    assert json.loads((run_dir / "stage2" / "DONE.json").read_text())["init"] == str(run_dir / "stage1" / "model")
    assert "lora" not in json.loads((run_dir / "sft" / "model" / "sirius.json").read_text())  # a full warm start


def test_a_lora_stage_resumes_its_adapters_and_refuses_a_checkpoint_of_the_other_kind(lora_run, tmp_path):
    from safetensors.torch import load_file

    from sirius_train.local.backend import LocalBackend, read_curriculum
    from sirius_train.local.checkpoint import list_checkpoints
    from sirius_train.local.trainer import DAPOTrainer
    from sirius_train.lora import LoraSpec, attach
    from sirius_train.metrics import MetricsLog

    cfg, _, run_dir, _ = lora_run
    backend = LocalBackend(cfg)
    items = read_curriculum(run_dir / "stage1" / "curriculum.parquet")

    def trainer(model):
        return DAPOTrainer(model, tokenizer, items, cfg.stages[0], backend.executor, ckpt_dir=run_dir / "stage1" /
                           "checkpoints", metrics=MetricsLog(tmp_path / "m.jsonl"), seed=1)

    model, tokenizer = backend.load(run_dir / "sft" / "model")
    adapted = attach(model, LoraSpec.of(cfg.model))
    resumed = trainer(adapted)
    assert resumed.resume() and resumed.step == cfg.stages[0].steps
    saved = load_file(str(list_checkpoints(run_dir / "stage1" / "checkpoints")[-1] / "adapter_model.safetensors"))
    state = {n.replace(".default", ""): p for n, p in adapted.named_parameters() if "lora_" in n}
    assert saved.keys() == state.keys()
    assert all(torch.equal(saved[n], state[n]) for n in saved)
    from transformers import AutoModelForCausalLM

    plain = AutoModelForCausalLM.from_pretrained(run_dir / "sft" / "model", local_files_only=True)
    with pytest.raises(ValueError, match="holds LoRA adapters, not full weights"):
        trainer(plain).resume()
    backend.close()


def test_lora_keys_are_checked_against_the_model_before_anything_starts(tmp_path):
    from sirius_train.lora import check_run

    cfg = load_config(NANO, [*tiny_overrides(tmp_path), "model.lora_rank=4", "model.lora_target_modules=[q_proj,qkv]"])
    with pytest.raises(ConfigError, match=r"model.lora_target_modules=.*no linear module \['qkv'\].*'q_proj'"):
        check_run(cfg)
    check_run(load_config(NANO, [*tiny_overrides(tmp_path), "model.lora_rank=4",
                                 "model.lora_target_modules=[q_proj,v_proj]"]))
    out = subprocess.run([sys.executable, "-m", "sirius_train.cli", "train", str(NANO), "--dry-run",
                          *tiny_overrides(tmp_path), "model.lora_rank=4", "model.lora_target_modules=[qkv]"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and "model.lora_target_modules" in out.stderr and "gate_proj" in out.stderr
    for bad, message in (("model.lora_rank=-2", "must be >= 0"), ("model.lora_alpha=0", "must be > 0")):
        with pytest.raises(ConfigError, match=message):
            load_config(NANO, [bad])


def test_a_lora_run_without_peft_says_which_extra_to_install(tmp_path, monkeypatch):
    from sirius_train.lora import check_run, is_adapted

    monkeypatch.setitem(sys.modules, "peft", None)  # what `import peft` meets where it is not installed
    with pytest.raises(ConfigError, match=r"model.lora_rank=4 .* peft is not installed: pip install 'sirius-sql\[lora\]'"):
        check_run(load_config(NANO, [*tiny_overrides(tmp_path), "model.lora_rank=4"]))
    check_run(load_config(NANO, tiny_overrides(tmp_path)))  # full weights need no peft
    assert not is_adapted(torch.nn.Linear(2, 2))


def test_a_lora_warm_start_trains_adapters_and_writes_the_merged_model(tmp_path):
    """`sft.lora` (the default with a rank): the Trainer trains and checkpoints adapters only; the warm start's
    model is the base with them merged in, and its card names both."""
    from sirius_train.commands.train import run_schedule

    cfg = load_config(NANO, [*tiny_overrides(tmp_path, "lsft"), "model.lora_rank=4", "sft.epochs=2"])
    with (tmp_path / "stderr.log").open("w") as log, contextlib.redirect_stderr(log):
        run_schedule(cfg, sft_only=True)
    run_dir = tmp_path / "runs" / "lsft"
    checkpoint = next((run_dir / "sft" / "trainer").glob("checkpoint-*"))
    assert (checkpoint / "adapter_model.safetensors").is_file() and not (checkpoint / "model.safetensors").exists()
    card = json.loads((run_dir / "sft" / "model" / "sirius.json").read_text())
    assert card["lora"]["base"] == str(run_dir / "base" / "model") and card["lora"]["rank"] == 4
    assert not torch.allclose(_logits(run_dir / "sft" / "model"), _logits(run_dir / "base" / "model"), atol=1e-4)
