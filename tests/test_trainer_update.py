"""The local trainer's update on a tiny real model: its mini-batches, its loss sign, the entropy term it applies,
non-finite gradients, and where pi_old comes from."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch
from test_samplers import _tiny_model

from data_synthesis.generation import generate
from data_synthesis.prompts import render_prompt
from sirius_train.config import EntropyConfig, StageConfig
from sirius_train.halts import NonFiniteGradients
from sirius_train.local.trainer import (
    DAPOTrainer,
    TrainItem,
    cat_rollouts,
    old_logprobs_source,
    response_logprobs,
    split_even,
    trim,
)
from sirius_train.metrics import MetricsLog

PROMPTS = [render_prompt("how many rows", "t(a)", system=""), render_prompt("list a", "t(a, b)", system="")]
STAGE = StageConfig(name="s", lr=1e-3, warmup_steps=0, mini_batches=1, micro_batch_size=64, grad_clip=1e6,
                    temperature=1.0, entropy=EntropyConfig(mode="off"))


@pytest.fixture(scope="module")
def policy():
    model, tokenizer = _tiny_model()
    torch.manual_seed(0)
    roll = generate(model, tokenizer, PROMPTS, n=6, temperature=1.0, max_new_tokens=8, record_logprobs=True)
    assert len(set(roll.lengths.tolist())) > 1  # answers of different lengths: the masks matter
    return model, tokenizer, roll


def _groups(roll, rewards: list[list[float]]):
    return [(roll.select(list(range(g * 6, g * 6 + 6))), torch.tensor(r)) for g, r in enumerate(rewards)]


MIXED = [[1.0, 0.0, 1.0, 0.0, 0.0, 1.0], [0.0, 1.0, 1.0, 1.0, 0.0, 1.0]]


def _trainer(policy, tmp_path, **stage):
    model, tokenizer, _ = policy
    model = copy.deepcopy(model)
    items = [TrainItem(p, "db", "SELECT 1") for p in PROMPTS]
    return DAPOTrainer(model, tokenizer, items, replace(STAGE, **stage), executor=None, ckpt_dir=tmp_path / "ck",
                       metrics=MetricsLog(tmp_path / "m.jsonl"))


def _adam_steps(trainer) -> int:
    return int(next(iter(trainer.optimizer.state.values()))["step"])


def test_split_even_gives_exactly_the_parts_asked_for():
    parts = split_even(list(range(12)), 5)
    assert sorted(len(p) for p in parts) == [2, 2, 2, 3, 3] and sum(parts, []) == list(range(12))
    assert split_even(list(range(3)), 5) == [[0], [1], [2]]  # fewer answers than parts: no empty step


def test_twelve_answers_in_five_mini_batches_make_five_optimizer_steps(policy, tmp_path):
    trainer = _trainer(policy, tmp_path, mini_batches=5)
    trainer.update(_groups(policy[2], MIXED))
    assert _adam_steps(trainer) == 5


def test_one_step_raises_the_log_prob_of_the_one_rewarded_answer(policy, tmp_path):
    """The loss sign: after one optimizer step on a group where only answer 0 was right, that answer is more
    likely and the wrong ones less (a flipped sign would still change every weight, and fail here)."""
    _, _, roll = policy
    trainer = _trainer(policy, tmp_path)
    group = _groups(roll, [[1.0, 0.0, 0.0, 0.0, 0.0, 0.0]])[:1]
    batch = trim(group[0][0])
    mask = batch.response_mask.bool()

    def answer_log_probs():
        with torch.no_grad():
            log_prob, _ = response_logprobs(trainer.model, batch, temperature=1.0)
        return (log_prob * mask).sum(dim=1)  # (6,) log pi(answer)

    before = answer_log_probs()
    trainer.update(group)
    delta = answer_log_probs() - before
    assert _adam_steps(trainer) == 1
    assert delta[0] > 0.01, delta
    assert (delta[1:] < 0).all(), delta


def _update_grads(policy, tmp_path, entropy: EntropyConfig, name: str) -> tuple[dict, dict]:
    trainer = _trainer(policy, tmp_path / name, entropy=entropy)
    row = trainer.update(_groups(policy[2], MIXED))  # one mini-batch: .grad is that step's whole gradient
    return row, {n: p.grad.clone() for n, p in trainer.model.named_parameters()}


def test_the_entropy_term_the_trainer_applies_is_minus_c_h_below_target_and_nothing_above(policy, tmp_path):
    """The production path: `active_coefficient(H_k)` inside a trainer step. Gradients with the gate open equal
    the plain policy gradient minus c * dH (H the token-mean entropy of the batch); with it closed, equal it."""
    model, tokenizer, roll = policy
    c = 0.003
    _, plain = _update_grads(policy, tmp_path, EntropyConfig(mode="off"), "off")
    row_open, opened = _update_grads(policy, tmp_path, EntropyConfig(target=50.0, coef=c, coef_max=0.005), "open")
    row_shut, shut = _update_grads(policy, tmp_path, EntropyConfig(target=1e-3, coef=c, coef_max=0.005), "shut")
    assert row_open["entropy"] < 50.0 < float("inf") and row_shut["entropy"] > 1e-3  # H_k below / above target
    assert (row_open["entropy_coef_applied"], row_shut["entropy_coef_applied"]) == (c, 0.0)

    h_model = copy.deepcopy(model)
    batch = trim(cat_rollouts([g[0] for g in _groups(roll, MIXED)], tokenizer.pad_token_id))
    mask = batch.response_mask.float()
    _, entropy = response_logprobs(h_model, batch, temperature=1.0)
    ((entropy * mask).sum() / mask.sum()).backward()
    d_entropy = {n: p.grad for n, p in h_model.named_parameters()}
    assert max(float(g.abs().max()) for g in d_entropy.values()) > 1e-3
    for n in plain:
        assert torch.allclose(opened[n], plain[n] - c * d_entropy[n], atol=1e-7, rtol=1e-4), n
        assert torch.allclose(shut[n], plain[n], atol=1e-8, rtol=1e-5), n
    assert any(not torch.allclose(opened[n], plain[n], atol=1e-7, rtol=1e-4) for n in plain)


def test_a_non_finite_gradient_skips_the_step_counts_it_and_stops_after_n_in_a_row(policy, tmp_path):
    trainer = _trainer(policy, tmp_path, mini_batches=2, max_nonfinite_steps=3)
    groups = _groups(policy[2], MIXED)
    weight = trainer.model.lm_head.weight
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    hook = weight.register_hook(lambda g: g * float("nan"))  # a diverged backward: NaN gradients, as in bf16 overflow
    row = trainer.update(groups)
    assert row["skipped_steps"] == 2 and row["grad_norm"] != row["grad_norm"]  # both mini-batches skipped, norm NaN
    assert all(torch.equal(p, before[n]) for n, p in trainer.model.named_parameters())  # no update from them
    assert not trainer.optimizer.state  # AdamW never stepped: its moments hold no NaN either
    with pytest.raises(NonFiniteGradients, match="3 optimizer steps in a row.*max_nonfinite_steps=3"):
        trainer.update(groups)  # the third skip in a row stops the run
    hook.remove()

    trainer = _trainer(policy, tmp_path / "recovers", mini_batches=2, max_nonfinite_steps=3)
    hook = trainer.model.lm_head.weight.register_hook(lambda g: g * float("inf"))
    assert trainer.update(groups)["skipped_steps"] == 2
    hook.remove()
    row = trainer.update(groups)  # a healthy step resets the count ...
    assert row["skipped_steps"] == 0 and _adam_steps(trainer) == 2 and trainer.nonfinite_in_a_row == 0
    hook = trainer.model.lm_head.weight.register_hook(lambda g: g * float("inf"))
    assert trainer.update(groups)["skipped_steps"] == 2  # ... so two more skips do not stop it
    hook.remove()


def test_pi_old_is_recomputed_in_half_precision_and_kept_from_sampling_in_fp32():
    assert StageConfig().old_logprobs == "auto"
    assert old_logprobs_source("auto", torch.bfloat16) == old_logprobs_source("auto", torch.float16) == "recompute"
    assert old_logprobs_source("auto", torch.float32) == "sampler"
    assert old_logprobs_source("sampler", torch.bfloat16) == "sampler"
    assert old_logprobs_source("recompute", torch.float32) == "recompute"


def test_a_bf16_trainer_samples_without_recording_pi_old(policy, tmp_path):
    model, tokenizer, _ = policy
    half = copy.deepcopy(model).to(torch.bfloat16)
    items = [TrainItem(p, "db", "SELECT 1") for p in PROMPTS]
    trainer = DAPOTrainer(half, tokenizer, items, STAGE, executor=None, ckpt_dir=tmp_path / "ck",
                          metrics=MetricsLog(tmp_path / "m.jsonl"))
    assert trainer.old_logprobs == "recompute"
    assert _trainer(policy, tmp_path).old_logprobs == "sampler"
