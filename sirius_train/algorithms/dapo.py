"""DAPO (Yu et al. 2025, arXiv:2503.14476): group advantages, clip-higher policy loss, dynamic sampling, overlong shaping.

Pure torch, no I/O: the local trainer and the verl backend call the same functions. `policy_loss` reproduces
verl 0.9.1's `core_algos.compute_policy_loss_vanilla` with token-mean aggregation (tests/test_dapo.py checks
it against verl itself), except that an all-masked batch gives loss 0 where verl divides 0 by 0.

Layout conventions: per-token tensors are (bs, response_length); per-answer tensors that belong to prompts
are (n_groups, G), one row per prompt and its G sampled answers (callers reshape with `.view(-1, G)`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, Sequence, TypeVar

import torch

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")
# verl clamps the log-ratio to this range before exp() (core_algos.compute_policy_loss_vanilla); we do the same
# so that the ratio stays finite and our loss matches verl's bit for bit on extreme inputs.
LOG_RATIO_CLAMP = 20.0


def group_advantages(rewards: torch.Tensor, *, eps: float = 1e-6) -> torch.Tensor:
    """Group-normalised advantage Â_i = (R_i − mean R) / (std R + eps) over the G answers of each prompt.

    std is Bessel-corrected (torch.std, as verl's GRPO estimator). A group whose rewards are all equal gets
    exactly 0: computed naively, (R − mean R) can be a rounding residue (e.g. three float32 0.9s), which the
    division by eps would blow up to O(1e-2).

    Args:
        rewards: (n_groups, G) scalar reward per answer, G >= 2.
    Returns:
        (n_groups, G) advantages (integer rewards give float32); per token: `adv.view(-1, 1) * response_mask`.
    """
    assert rewards.dim() == 2 and rewards.shape[1] >= 2, f"rewards must be (n_groups, G>=2), got {tuple(rewards.shape)}"
    if not rewards.is_floating_point():
        rewards = rewards.float()
    mean = rewards.mean(dim=1, keepdim=True)  # (n_groups, 1)
    std = rewards.std(dim=1, keepdim=True)  # (n_groups, 1)
    adv = (rewards - mean) / (std + eps)  # (n_groups, G)
    all_equal = (rewards == rewards[:, :1]).all(dim=1, keepdim=True)  # (n_groups, 1)
    return torch.where(all_equal, torch.zeros_like(adv), adv)


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    mode: str = "token-mean",
    *,
    global_count: float | torch.Tensor | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss to a scalar; the mode is where GRPO (seq-mean-token-mean) and DAPO (token-mean) differ.

    - token-mean: Σ masked loss / number of masked tokens (DAPO: long answers weigh in proportion to length).
    - seq-mean-token-sum: mean over non-empty sequences of each sequence's token sum (Dr.GRPO-style).
    - seq-mean-token-mean: mean over non-empty sequences of each sequence's token mean (GRPO).

    Micro-batching: pass `global_count` = the count the mode divides by (masked tokens for token-mean,
    non-empty sequences for seq-mean-*) over the whole mini-batch, and *sum* the micro-batch losses (or sum
    their gradients); the result then equals the loss of the un-split mini-batch. Equivalently, weight each
    micro-batch's default loss by its own count / global count. Without `global_count` the count of this
    batch is used. A batch with nothing to count gives 0, not NaN.

    Args:
        loss_mat: (bs, response_length) per-token loss.
        loss_mask: (bs, response_length) 1/True for tokens that count.
    Returns:
        0-dim tensor.
    """
    if mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss aggregation mode {mode!r}; valid modes: {', '.join(LOSS_AGG_MODES)}")
    assert loss_mat.shape == loss_mask.shape, f"loss {tuple(loss_mat.shape)} vs mask {tuple(loss_mask.shape)}"
    mask = loss_mask.to(loss_mat.dtype)
    # where() first: a NaN/inf in a masked-out position must not leak through 0 * inf.
    masked = torch.where(loss_mask.bool(), loss_mat, torch.zeros_like(loss_mat)) * mask  # (bs, T)
    if mode == "token-mean":
        count = mask.sum() if global_count is None else global_count
        return masked.sum() / _nonzero(count)
    tokens_per_seq = mask.sum(dim=-1)  # (bs,)
    seq_loss = masked.sum(dim=-1)  # (bs,)
    if mode == "seq-mean-token-mean":
        seq_loss = seq_loss / _nonzero(tokens_per_seq)
    nonempty = tokens_per_seq > 0  # (bs,)
    count = nonempty.sum() if global_count is None else global_count
    return torch.where(nonempty, seq_loss, torch.zeros_like(seq_loss)).sum() / _nonzero(count)


def policy_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    clip_c: float = 10.0,
    num_tokens_global: float | torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """DAPO clipped surrogate with clip-higher and dual clip, token-mean over the batch (no KL term).

    Per token, with ratio r = exp(log_prob − old_log_prob) and pg1 = −A·r, pg2 = −A·clip(r, 1−clip_low, 1+clip_high):
    loss = max(pg1, pg2) for A ≥ 0, and min(max(pg1, pg2), −A·clip_c) for A < 0 (dual clip, Ye et al. 2020,
    arXiv:1912.09729), i.e. exactly verl's compute_policy_loss_vanilla. Clip-higher (clip_high > clip_low)
    leaves low-probability tokens room to grow, which is DAPO's remedy for entropy collapse.

    Args:
        log_prob: (bs, response_length) log π_θ of the taken tokens; gradients flow through it.
        old_log_prob: (bs, response_length) log π_old of the same tokens (rollout policy).
        advantages: (bs, response_length) per-token advantages (the answer's Â on each of its tokens).
        response_mask: (bs, response_length) 1/True on answer tokens.
        num_tokens_global: masked-token count of the whole mini-batch when this call sees one micro-batch;
            sum the returned losses over micro-batches (see `agg_loss`). Default: this batch's count.
    Returns:
        loss: 0-dim tensor to minimise.
        metrics: floats under `actor/`: pg_clipfrac (share of tokens where the clipped branch is taken, as
            verl), clipfrac_low / clipfrac_high (its split: A<0 with r<1−clip_low / A>0 with r>1+clip_high),
            pg_clipfrac_lower (dual clip active, as verl), ppo_kl (mean of old_log_prob − log_prob, clamped
            like the ratio). Means over this call's masked tokens; weight by token count across micro-batches.
    """
    assert clip_c > 1.0, f"clip_c must be > 1 for dual clip, got {clip_c}"
    assert log_prob.shape == old_log_prob.shape == advantages.shape == response_mask.shape, (
        f"shapes differ: log_prob {tuple(log_prob.shape)}, old_log_prob {tuple(old_log_prob.shape)}, "
        f"advantages {tuple(advantages.shape)}, response_mask {tuple(response_mask.shape)}"
    )
    log_ratio = torch.clamp(log_prob - old_log_prob, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # (bs, T)
    ratio = torch.exp(log_ratio)  # (bs, T)
    pg_losses1 = -advantages * ratio  # (bs, T)
    pg_losses2 = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)  # (bs, T)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)  # (bs, T)
    pg_losses3 = -advantages * clip_c  # (bs, T)
    clip_pg_losses2 = torch.minimum(pg_losses3, clip_pg_losses1)  # (bs, T)
    negative = advantages < 0  # (bs, T)
    pg_losses = torch.where(negative, clip_pg_losses2, clip_pg_losses1)  # (bs, T)
    loss = agg_loss(pg_losses, response_mask, "token-mean", global_count=num_tokens_global)

    with torch.no_grad():
        clipped = pg_losses2 > pg_losses1  # (bs, T)
        metrics = {
            "actor/pg_clipfrac": clipped,
            "actor/clipfrac_low": clipped & negative,
            "actor/clipfrac_high": clipped & (advantages > 0),
            "actor/pg_clipfrac_lower": (clip_pg_losses1 > pg_losses3) & negative,
            "actor/ppo_kl": -log_ratio,
        }
        means = torch.stack([_masked_mean(v, response_mask).float() for v in metrics.values()])
    return loss, dict(zip(metrics, means.tolist()))  # one device sync for all metrics


def dynamic_sampling_keep(correct: torch.Tensor) -> torch.Tensor:
    """Which prompts to keep for DAPO dynamic sampling: those with 0 < #correct < G.

    All-correct and all-wrong groups have zero advantage for every answer, so they only dilute the batch.
    Takes correctness, not the shaped reward: an overlong penalty must not make an all-correct group look mixed.

    Args:
        correct: (n_groups, G) bool, or 0/1 numbers, per answer.
    Returns:
        (n_groups,) bool keep mask.
    """
    assert correct.dim() == 2, f"correct must be (n_groups, G), got {tuple(correct.shape)}"
    if correct.dtype != torch.bool:
        if not ((correct == 0) | (correct == 1)).all():
            raise ValueError("correct must be 0/1 accuracy per answer, not a shaped reward; got other values")
        correct = correct.bool()
    n_correct = correct.sum(dim=1)  # (n_groups,)
    return (n_correct > 0) & (n_correct < correct.shape[1])


T = TypeVar("T")


@dataclass
class DynamicSamplingBuffer(Generic[T]):
    """Collects kept groups over generation rounds until `target_groups` are in hand or `max_rounds` ran out.

    The trainer generates a round, calls `add(groups, keep)` and loops while `not done`; `take()` then returns
    at most `target_groups` groups (surplus from the last round is discarded, as in verl). Groups are opaque
    payloads (indices, dicts, batch slices). If rounds run out first, the step trains on fewer groups and
    `metrics()` says so.
    """

    target_groups: int
    max_rounds: int
    groups: list[T] = field(default_factory=list)
    rounds: int = 0
    kept: int = 0
    dropped: int = 0

    def __post_init__(self):
        assert self.target_groups >= 1, f"target_groups must be >= 1, got {self.target_groups}"
        assert self.max_rounds >= 1, f"max_rounds must be >= 1, got {self.max_rounds}"

    @property
    def done(self) -> bool:
        return len(self.groups) >= self.target_groups or self.rounds >= self.max_rounds

    def add(self, groups: Sequence[T], keep: torch.Tensor | Sequence[bool]) -> None:
        """Record one generation round: `groups[i]` is kept when `keep[i]` (see `dynamic_sampling_keep`)."""
        if self.done:
            raise RuntimeError(f"buffer is done ({len(self.groups)} groups, {self.rounds} rounds); call take()")
        keep = [bool(k) for k in keep]
        assert len(keep) == len(groups), f"{len(groups)} groups but {len(keep)} keep flags"
        self.groups.extend(g for g, k in zip(groups, keep) if k)
        self.rounds += 1
        self.kept += sum(keep)
        self.dropped += len(keep) - sum(keep)

    def take(self) -> list[T]:
        """The groups to train on: the first `target_groups` kept ones (fewer if rounds ran out)."""
        return self.groups[: self.target_groups]

    def metrics(self) -> dict[str, float]:
        return {
            "dapo/gen_rounds": float(self.rounds),
            "dapo/kept_groups": float(self.kept),
            "dapo/dropped_groups": float(self.dropped),
            "dapo/train_groups": float(min(len(self.groups), self.target_groups)),
            "dapo/batch_fill": min(len(self.groups), self.target_groups) / self.target_groups,
        }


def overlong_penalty(length: int, max_len: int, cache_len: int) -> float:
    """DAPO soft overlong punishment for one answer of `length` tokens (added to the task reward).

    0 up to L_max − L_cache; ((L_max − L_cache) − |o|) / L_cache inside the cache, reaching −1 at L_max;
    −1 beyond L_max (truncated answers).
    """
    _check_overlong_args(max_len, cache_len)
    if length > max_len:
        return -1.0
    return min(0.0, ((max_len - cache_len) - length) / cache_len)


def overlong_penalties(lengths: torch.Tensor, max_len: int, cache_len: int) -> torch.Tensor:
    """Vectorised `overlong_penalty`: (N,) integer answer lengths -> (N,) float32 penalties in [−1, 0]."""
    _check_overlong_args(max_len, cache_len)
    lengths = lengths.to(torch.float64)  # exact for any realistic length; rounds once at the end
    penalty = torch.clamp(((max_len - cache_len) - lengths) / cache_len, max=0.0)  # (N,)
    return torch.where(lengths > max_len, torch.full_like(penalty, -1.0), penalty).to(torch.float32)


def group_metrics(rewards: torch.Tensor, correct: torch.Tensor) -> dict[str, float]:
    """Rollout diagnostics under `dapo/`: reward and accuracy mean/std, shares of all-equal / solved / failed groups.

    Args:
        rewards: (n_groups, G) shaped rewards.
        correct: (n_groups, G) bool or 0/1 correctness.
    """
    assert rewards.shape == correct.shape and rewards.dim() == 2, (
        f"rewards {tuple(rewards.shape)} and correct {tuple(correct.shape)} must both be (n_groups, G)"
    )
    acc = correct.to(torch.float64)
    r = rewards.to(torch.float64)
    n_correct = acc.sum(dim=1)  # (n_groups,)
    return {
        "dapo/reward_mean": r.mean().item(),
        "dapo/reward_std": r.std(unbiased=False).item(),
        "dapo/acc_mean": acc.mean().item(),
        "dapo/frac_groups_all_equal_reward": (r == r[:, :1]).all(dim=1).double().mean().item(),
        "dapo/frac_groups_all_correct": (n_correct == acc.shape[1]).double().mean().item(),
        "dapo/frac_groups_all_wrong": (n_correct == 0).double().mean().item(),
    }


def _check_overlong_args(max_len: int, cache_len: int) -> None:
    if not 0 < cache_len <= max_len:
        raise ValueError(f"need 0 < cache_len <= max_len, got cache_len={cache_len}, max_len={max_len}")


def _nonzero(count: float | torch.Tensor) -> float | torch.Tensor:
    """Denominator guard: an empty batch sums to 0, and 0 / 1 = 0 instead of NaN."""
    if isinstance(count, torch.Tensor):
        return torch.where(count == 0, torch.ones_like(count), count)
    return count if count != 0 else 1


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `values` over mask; 0 when the mask is empty. Same formula as verl's masked_mean."""
    dtype = torch.promote_types(values.dtype, torch.float32)  # bool/bf16 -> fp32, fp64 stays
    mask = mask.to(dtype)
    return (values.to(dtype) * mask).sum() / (mask.sum() + 1e-8)
