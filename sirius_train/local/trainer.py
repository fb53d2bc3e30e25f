"""The local DAPO trainer: one process, CPU or one GPU, any Hugging Face causal LM.

One step, in the order DAPO prescribes (Yu et al. 2025) and SPEC section 3 writes out:
  1. rollout   -- sample G answers for each prompt (KV-cached, batched `generate`);
  2. reward    -- execute every answer's SQL in the sandbox; correct 1 / wrong 0 / no SQL -1, plus
                  overlong shaping on the token length;
  3. filter    -- dynamic sampling: keep groups with 0 < #correct < G; generate more rounds until the
                  batch is full or the round budget is spent (then train on what there is, and log it);
  4. advantage -- group-normalised, the same for every token of an answer;
  5. update    -- old log-probs (kept from sampling, or one no-grad pass), then mini-batch steps of the
                  clipped token-mean loss minus the gated entropy bonus; gradient clipping (a non-finite
                  gradient norm skips that optimizer step); AdamW at lr * min(1, step / warmup_steps)
                  (warm-up counts training steps, as in verl);
  6. gate      -- the entropy coefficient moves once, from this step's entropy.
The math is in `sirius_train.algorithms`; this file only orchestrates it.
"""

from __future__ import annotations

import math
import random
import sys
import time
from dataclasses import dataclass

import torch

from rewards.executor import Executor
from rewards.extract import extract_sql
from rewards.scoring import ScoreItem
from sirius_train.algorithms import (
    DynamicSamplingBuffer,
    EntropyGate,
    EntropyGateConfig,
    dynamic_sampling_keep,
    group_advantages,
    group_metrics,
    logprobs_and_entropy,
    overlong_penalties,
    policy_loss,
)
from sirius_train.config import StageConfig
from sirius_train.halts import NonFiniteGradients, Preempted, preemption_signals
from sirius_train.local.checkpoint import capture_rng, latest_checkpoint, load_state, restore_rng, save_checkpoint
from data_synthesis.generation import Rollout, generate, left_pad_positions, prompt_cache
from data_synthesis.interaction import ProbeLimits
from sirius_train.metrics import MetricsLog


@dataclass(frozen=True)
class TrainItem:
    """One curriculum row: the chat prompt and what its answers are scored against."""

    prompt: list[dict]
    db_id: str
    gold_sql: str
    uid: str = ""


class EpochSampler:
    """Shuffled passes over the curriculum; its position is part of the checkpoint."""

    def __init__(self, n: int, seed: int):
        self.n, self.seed = n, seed
        self.epoch, self.pos = 0, 0
        self._order = self._shuffle()

    def _shuffle(self) -> list[int]:
        order = list(range(self.n))
        random.Random(self.seed * 1_000_003 + self.epoch).shuffle(order)
        return order

    def take(self, k: int) -> list[int]:
        out = []
        while len(out) < k:
            if self.pos == self.n:
                self.epoch, self.pos = self.epoch + 1, 0
                self._order = self._shuffle()
            out.append(self._order[self.pos])
            self.pos += 1
        return out

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.pos = state["epoch"], state["pos"]
        self._order = self._shuffle()


def response_logprobs(model, roll: Rollout, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs and entropies (N, R) of the sampled response tokens under `model`."""
    return logprobs_and_entropy(response_logits(model, roll), roll.response_ids, temperature=temperature)


def response_logits(model, roll: Rollout) -> torch.Tensor:
    """Logits (N, R, V) that predict each response token, each distinct prompt run once (`prompt_cache`)."""
    P, R = roll.prompt_ids.shape[1], roll.response_ids.shape[1]
    attention_mask = roll.attention_mask  # (N, P + R)
    positions = left_pad_positions(attention_mask)  # (N, P + R)
    # Identical prompts, pads marked -1 in the key so that rows differing only in padding stay apart; the
    # unique keys give back ids and mask (a pad's id is never attended to, so 0 does as well as any).
    key = roll.prompt_ids.masked_fill(roll.prompt_mask == 0, -1)
    unique, row_prompt = torch.unique(key, dim=0, return_inverse=True)  # (U, P), (N,)
    shared = prompt_cache(model, unique.clamp(min=0), (unique >= 0).to(roll.prompt_mask.dtype), row_prompt) \
        if R > 1 else None
    if shared is None:  # every row in full
        logits = model(input_ids=roll.input_ids, attention_mask=attention_mask, position_ids=positions,
                       use_cache=False).logits  # (N, P + R, V)
        return logits[:, P - 1:-1]
    cache, last_prompt_logits = shared  # (N, V): predicts the first response token
    answer_logits = model(input_ids=roll.response_ids[:, :-1], attention_mask=attention_mask[:, :-1],
                          position_ids=positions[:, P:-1], past_key_values=cache, use_cache=True).logits
    return torch.cat([last_prompt_logits[:, None], answer_logits], dim=1)  # (N, R, V)


def trim(roll: Rollout) -> Rollout:
    """Drop all-padding columns (left of prompts, right of responses) so no compute is spent on them."""
    keep_p = roll.prompt_mask.any(dim=0).nonzero()
    keep_r = roll.response_mask.any(dim=0).nonzero()
    p0 = int(keep_p[0]) if len(keep_p) else 0
    r1 = int(keep_r[-1]) + 1 if len(keep_r) else 1
    old = [None if x is None else x[:, :r1] for x in (roll.old_log_prob, roll.old_entropy, roll.loss_mask)]
    return Rollout(roll.prompt_ids[:, p0:], roll.prompt_mask[:, p0:], roll.response_ids[:, :r1],
                   roll.response_mask[:, :r1], roll.texts, roll.lengths, roll.truncated, *old, roll.answers, roll.probes)


def cat_rollouts(parts: list[Rollout], pad_id: int) -> Rollout:
    P = max(r.prompt_ids.shape[1] for r in parts)
    R = max(r.response_ids.shape[1] for r in parts)

    def left(x, width, value):
        return torch.nn.functional.pad(x, (width - x.shape[1], 0), value=value)

    def right(x, width, value):
        return torch.nn.functional.pad(x, (0, width - x.shape[1]), value=value)

    recorded = parts[0].old_log_prob is not None
    assert all((r.old_log_prob is not None) == recorded for r in parts), "some parts carry pi_old, some do not"
    old = [torch.cat([right(getattr(r, name), R, 0.0) for r in parts]) if recorded else None
           for name in ("old_log_prob", "old_entropy")]
    episodes = parts[0].loss_mask is not None  # multi-turn parts
    assert all((r.loss_mask is not None) == episodes for r in parts), "some parts are episodes, some are not"
    multi_turn = [torch.cat([right(r.loss_mask, R, 0) for r in parts]), [a for r in parts for a in r.answers],
                  torch.cat([r.probes for r in parts])] if episodes else [None, None, None]
    return Rollout(torch.cat([left(r.prompt_ids, P, pad_id) for r in parts]),
                   torch.cat([left(r.prompt_mask, P, 0) for r in parts]),
                   torch.cat([right(r.response_ids, R, pad_id) for r in parts]),
                   torch.cat([right(r.response_mask, R, 0) for r in parts]),
                   [t for r in parts for t in r.texts], torch.cat([r.lengths for r in parts]),
                   torch.cat([r.truncated for r in parts]), *old, *multi_turn)


class DAPOTrainer:
    """Trains `model` on `items` for one stage, checkpointing into `ckpt_dir` and resuming from it.

    Multi-turn rollouts (`rollout.multi_turn`): `multi_turn` gives the probe limits and `probe(db_id, sql)` runs
    a probe and returns its observation (`data_synthesis.interaction.run_probe`); the update then counts only
    the policy's own tokens (`Rollout.policy_mask`) in the loss, the entropy and pi_old.
    """

    def __init__(self, model, tokenizer, items: list[TrainItem], stage: StageConfig, executor: Executor, *,
                 ckpt_dir, metrics: MetricsLog, seed: int = 0, compare: str = "bird", evaluate=None,
                 progress=None, multi_turn: ProbeLimits | None = None, probe=None,
                 compute_dtype: torch.dtype | None = None):
        if (multi_turn is None) != (probe is None):
            raise ValueError("multi-turn rollouts need both `multi_turn` (the limits) and `probe` (the runner)")
        if not items:
            raise ValueError(f"stage {stage.name!r} has an empty curriculum: nothing to train on")
        self.model, self.tokenizer, self.items, self.cfg = model, tokenizer, items, stage
        self.executor, self.metrics, self.compare = executor, metrics, compare
        self.ckpt_dir, self.seed = ckpt_dir, seed
        self.evaluate = evaluate  # callable(model) -> {"eval_exec_acc": ...}
        self.progress = progress  # callable(step, row) for a progress bar
        self.multi_turn, self.probe = multi_turn, probe
        self.device = next(model.parameters()).device
        # forward passes in `compute_dtype` (autocast) over the weights' own dtype, float32 on the local backend
        self.compute_dtype = compute_dtype or next(model.parameters()).dtype
        self.optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=stage.lr,
                                           betas=(0.9, 0.999), weight_decay=stage.weight_decay)
        self.gate = EntropyGate(EntropyGateConfig(**vars(stage.entropy)))
        self.sampler = EpochSampler(len(items), seed)
        self.old_logprobs = old_logprobs_source(stage.old_logprobs, self.compute_dtype)
        self.step = 0
        self.nonfinite_in_a_row = 0  # optimizer steps skipped for a non-finite gradient norm, consecutively

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        return {"step": self.step, "stage": self.cfg.name, "optimizer": self.optimizer.state_dict(),
                "gate": self.gate.state_dict(),
                "data": self.sampler.state_dict(), "rng": capture_rng(), "nonfinite_in_a_row": self.nonfinite_in_a_row}

    def save(self) -> None:
        save_checkpoint(self.ckpt_dir, self.step, self.model, self.tokenizer, self.state_dict(),
                        keep_last=self.cfg.keep_last)

    def resume(self) -> bool:
        """Restore the latest checkpoint of this stage, if any; returns whether it did."""
        path = latest_checkpoint(self.ckpt_dir, warn=lambda message: print(f"warning: {message}", file=sys.stderr))
        if path is None:
            return False
        from sirius_train.lora import load_weights

        load_weights(self.model, path, str(self.device))  # the adapters of a LoRA stage, else the whole model
        state = load_state(path)
        self.optimizer.load_state_dict(state["optimizer"])
        self.gate.load_state_dict(state["gate"])
        self.sampler.load_state_dict(state["data"])
        restore_rng(state["rng"])
        self.step = state["step"]
        self.nonfinite_in_a_row = state.get("nonfinite_in_a_row", 0)  # absent in checkpoints from before it existed
        self.metrics.truncate_after(self.cfg.name, self.step)
        return True

    # ------------------------------------------------------------------ the loop
    def train(self) -> None:
        """Train to `cfg.steps`; a preemption signal ends the step in progress, checkpoints it, raises `Preempted`."""
        cfg = self.cfg
        with preemption_signals() as caught:
            while self.step < cfg.steps:
                self.step += 1
                row = self.train_step()
                if self.evaluate is not None and (self.step == cfg.steps or
                                                  (cfg.eval_every and self.step % cfg.eval_every == 0)):
                    row.update(self.evaluate(self.model))
                self.metrics.log(row)
                if self.progress is not None:
                    self.progress(self.step, row)
                if self.step == cfg.steps or self.step % cfg.checkpoint_every == 0 or caught:
                    self.save()
                if caught:
                    raise Preempted(f"{caught[0]}: stage {cfg.name!r} stopped after step {self.step} of {cfg.steps}, "
                                    f"checkpoint {self.ckpt_dir / f'step_{self.step:06d}'} written")

    def train_step(self) -> dict:
        cfg, G = self.cfg, self.cfg.n_samples
        t0 = time.monotonic()
        lr = cfg.lr * warmup_factor(self.step, cfg.warmup_steps)  # warm-up counts training steps, as in verl
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        buffer = DynamicSamplingBuffer(target_groups=cfg.prompts_per_step, max_rounds=cfg.max_gen_rounds)
        all_rewards, all_correct, generated, probes = [], [], 0, []
        while not buffer.done:
            indices = self.sampler.take(cfg.prompts_per_step)
            roll = self.rollout(indices)
            generated += int(roll.lengths.sum())
            if roll.probes is not None:
                probes.append(roll.probes.cpu())
            correct, rewards = self.score(roll, [self.items[i] for i in indices for _ in range(G)])
            correct, rewards = correct.view(-1, G), rewards.view(-1, G)  # (n_prompts, G)
            all_rewards.append(rewards)
            all_correct.append(correct)
            groups = [(roll.select(range(g * G, (g + 1) * G)), rewards[g]) for g in range(len(indices))]
            buffer.add(groups, dynamic_sampling_keep(correct))
        gen_time = time.monotonic() - t0
        row = {"step": self.step, "stage": cfg.name}
        rollout_stats = group_metrics(torch.cat(all_rewards), torch.cat(all_correct))
        row.update({"reward_mean": rollout_stats["dapo/reward_mean"], "acc_mean": rollout_stats["dapo/acc_mean"],
                    "frac_all_correct": rollout_stats["dapo/frac_groups_all_correct"],
                    "frac_all_wrong": rollout_stats["dapo/frac_groups_all_wrong"],
                    "kept_groups": int(buffer.kept), "dropped_groups": int(buffer.dropped),
                    "gen_rounds": buffer.rounds, "train_groups": len(buffer.take()),
                    "response_length": generated / max(sum(r.numel() for r in all_rewards), 1),
                    "reward_fallback": getattr(self.executor, "fallbacks", 0)})  # batches scored in-process so far
        if probes:  # multi-turn: probes per episode, share of episodes that probed (all rounds of the step)
            probes = torch.cat(probes).float()
            row.update({"turns_mean": float(probes.mean()), "probe_share": float((probes > 0).float().mean())})
        groups = buffer.take()
        if groups:
            row.update(self.update(groups))
        else:  # every group was all-correct or all-wrong: no gradient, no entropy reading; the gate holds
            row.update({"entropy": float("nan"), "entropy_coef": self.gate.coefficient(), "entropy_coef_applied": 0.0,
                        "skipped_steps": 0})
        elapsed = time.monotonic() - t0
        row.update({"gen_time_s": round(gen_time, 3), "step_time_s": round(elapsed, 3),
                    "tokens_per_s": round(generated / elapsed, 1), "lr": lr, "peak_rss_gib": peak_rss_gib()})
        if self.device.type == "cuda":
            row["peak_gpu_gib"] = round(torch.cuda.max_memory_allocated(self.device) / 2**30, 3)
        return row

    def autocast(self):
        return torch.autocast(device_type=self.device.type, dtype=self.compute_dtype,
                              enabled=self.compute_dtype != next(self.model.parameters()).dtype)

    def rollout(self, indices: list[int]) -> Rollout:
        """G answers (single-turn) or episodes (multi-turn) for each curriculum item in `indices`."""
        cfg, G = self.cfg, self.cfg.n_samples
        prompts = [self.items[i].prompt for i in indices]
        sampling = dict(n=G, temperature=cfg.temperature, top_p=cfg.top_p, max_new_tokens=cfg.max_new_tokens,
                        batch_size=cfg.gen_batch_size, record_logprobs=self.old_logprobs == "sampler")
        with self.autocast():
            if self.multi_turn is None:
                return generate(self.model, self.tokenizer, prompts, **sampling)
            from data_synthesis.multiturn import generate_episodes

            return generate_episodes(self.model, self.tokenizer, prompts,
                                     lambda k, sql: self.probe(self.items[indices[k]].db_id, sql), self.multi_turn,
                                     **sampling)

    def score(self, roll: Rollout, items: list[TrainItem]) -> tuple[torch.Tensor, torch.Tensor]:
        """(correct, shaped reward) per answer: execution reward + DAPO overlong shaping (model tokens only).

        An episode's answer is the SQL of its final turn; one without a final answer is a format failure."""
        answers = roll.answers if roll.answers is not None else [extract_sql(text) for text in roll.texts]
        results = self.executor.score([ScoreItem(it.db_id, it.gold_sql, sql, self.compare)
                                       for it, sql in zip(items, answers)])
        correct = torch.tensor([r.match for r in results], dtype=torch.bool)
        rewards = torch.tensor([r.reward for r in results], dtype=torch.float32)
        if self.cfg.overlong_cache > 0:
            rewards = rewards + overlong_penalties(roll.lengths.cpu(), self.cfg.max_new_tokens,
                                                   self.cfg.overlong_cache)
        return correct, rewards

    def update(self, groups: list[tuple[Rollout, torch.Tensor]]) -> dict:
        cfg = self.cfg
        batch = trim(cat_rollouts([g[0] for g in groups], self.tokenizer.pad_token_id))
        rewards = torch.stack([g[1] for g in groups])  # (n_groups, G)
        advantages = group_advantages(rewards).flatten().to(self.device)  # (N,)
        mask = batch.policy_mask.float()  # (N, R) the policy's own tokens: observations are context, not actions
        token_adv = advantages[:, None] * mask  # (N, R): Â_i on every token of answer i
        N = mask.shape[0]
        micro = max(1, cfg.micro_batch_size)
        if batch.old_log_prob is not None:  # pi_old as the sampler saw it: no extra forward pass
            old_log_prob, old_entropy = batch.old_log_prob, batch.old_entropy
        else:  # pi_old recomputed by a full forward, before any update of this step (as verl does)
            with torch.no_grad(), self.autocast():
                old_parts, ent_parts = zip(*(response_logprobs(self.model, batch.select(range(s, min(s + micro, N))),
                                                               cfg.temperature) for s in range(0, N, micro)))
                old_log_prob, old_entropy = torch.cat(old_parts), torch.cat(ent_parts)
        entropy_k = float((old_entropy * mask).sum() / mask.sum().clamp(min=1))
        coef = self.gate.active_coefficient(entropy_k)
        sums: dict[str, float] = {}
        weights = 0.0
        grad_norms, skipped = [], 0
        self.model.train()
        for _ in range(cfg.ppo_epochs):
            for mb in split_even(torch.randperm(N).tolist(), cfg.mini_batches):
                self.optimizer.zero_grad(set_to_none=True)
                mb_tokens = mask[mb].sum().clamp(min=1)
                for start in range(0, len(mb), micro):
                    idx = mb[start:start + micro]
                    with self.autocast():
                        log_prob, entropy = response_logprobs(self.model, batch.select(idx), cfg.temperature)
                    pg_loss, m = policy_loss(log_prob, old_log_prob[idx], token_adv[idx], mask[idx],
                                             clip_low=cfg.clip_low, clip_high=cfg.clip_high, clip_c=cfg.clip_c,
                                             num_tokens_global=mb_tokens)
                    entropy_term = (entropy * mask[idx]).sum() / mb_tokens  # this micro-batch's share of H
                    (pg_loss - coef * entropy_term).backward()
                    w = float(mask[idx].sum())
                    weights += w
                    m["actor/pg_loss"] = pg_loss.item() * float(mb_tokens) / max(w, 1.0)
                    for k, v in m.items():
                        sums[k] = sums.get(k, 0.0) + v * w
                grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip))
                if math.isfinite(grad_norm):
                    grad_norms.append(grad_norm)
                    self.optimizer.step()
                    self.nonfinite_in_a_row = 0
                else:  # as verl does: no update from this mini-batch; too many in a row and the run has diverged
                    self.optimizer.zero_grad(set_to_none=True)
                    skipped += 1
                    self.nonfinite_in_a_row += 1
                    if self.nonfinite_in_a_row >= cfg.max_nonfinite_steps:
                        raise NonFiniteGradients(
                            f"stage {cfg.name!r} step {self.step}: gradient norm {grad_norm} in "
                            f"{self.nonfinite_in_a_row} optimizer steps in a row (max_nonfinite_steps="
                            f"{cfg.max_nonfinite_steps}); stopping with the last checkpoint kept. Lower lr, or "
                            "check the model's dtype and inputs")
        gate = self.gate.update(entropy_k)
        out = {k.split("/")[-1]: v / max(weights, 1.0) for k, v in sums.items()}
        out.update({"entropy": entropy_k, "entropy_coef": gate["actor/entropy_coef"],
                    "entropy_gate_open": gate["actor/entropy_gate_open"],
                    "entropy_coef_applied": coef,  # what the loss used: c_k when the gate is open, else 0
                    "grad_norm": sum(grad_norms) / len(grad_norms) if grad_norms else float("nan"),
                    "skipped_steps": skipped, "adv_abs_mean": float(advantages.abs().mean()), "n_answers": N})
        return out


def peak_rss_gib() -> float:
    """This process's peak resident memory so far (GiB): what a machine must hold for the run."""
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3)  # kB on Linux


def warmup_factor(step: int, warmup_steps: int) -> float:
    """LR multiplier of training step `step` (1-based): min(1, step / warmup_steps), 1 without warmup.

    The verl translation sets verl's scheduler to the same values (`verl_backend.translate`)."""
    return min(1.0, step / warmup_steps) if warmup_steps > 0 else 1.0


def old_logprobs_source(setting: str, dtype: torch.dtype) -> str:
    """`sampler` or `recompute`; `auto` recomputes in half precision, where the KV-cached decode and the
    full forward differ in the last bits and the first mini-batch's ratio would not be exactly 1."""
    if setting != "auto":
        return setting
    return "recompute" if dtype in (torch.bfloat16, torch.float16) else "sampler"


def split_even(order: list[int], parts: int) -> list[list[int]]:
    """`order` in exactly `parts` consecutive chunks whose sizes differ by at most one (none empty while
    there are at least `parts` items; fewer items give one chunk each)."""
    parts = min(parts, len(order)) or 1
    return [order[i * len(order) // parts:(i + 1) * len(order) // parts] for i in range(parts)]
