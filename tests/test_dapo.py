"""DAPO math: advantages, aggregation, policy loss (incl. equivalence with verl), dynamic sampling, overlong shaping."""

import math

import pytest
import torch
from conftest import import_verl
from hypothesis import given, settings
from hypothesis import strategies as st

from sirius_train.algorithms.dapo import (
    LOSS_AGG_MODES,
    DynamicSamplingBuffer,
    agg_loss,
    dynamic_sampling_keep,
    group_advantages,
    group_metrics,
    overlong_penalties,
    overlong_penalty,
    policy_loss,
)

SMALL = settings(max_examples=50, deadline=None)
CLIP = dict(clip_low=0.2, clip_high=0.28, clip_c=10.0)


def _reference_token_loss(log_ratio: float, adv: float, clip_low=0.2, clip_high=0.28, clip_c=10.0) -> float:
    """Paper form, one token: −objective, objective = min(r·A, clip(r)·A), floored at c·A for A < 0 (dual clip)."""
    r = math.exp(max(-20.0, min(20.0, log_ratio)))
    objective = min(r * adv, min(max(r, 1 - clip_low), 1 + clip_high) * adv)
    if adv < 0:
        objective = max(objective, clip_c * adv)
    return -objective


def _random_batch(seed: int, bs: int, T: int, dtype=torch.float32, extreme: bool = False):
    g = torch.Generator().manual_seed(seed)
    old_log_prob = -torch.rand(bs, T, generator=g, dtype=torch.float64) * 5
    log_ratio = torch.randn(bs, T, generator=g, dtype=torch.float64) * 0.5
    if extreme:  # ratios far outside every clip range, on both sides of verl's ±20 clamp
        picks = torch.tensor([-30.0, -20.0, -5.0, 5.0, 20.0, 30.0], dtype=torch.float64)
        where = torch.rand(bs, T, generator=g) < 0.3
        log_ratio = torch.where(where, picks[torch.randint(0, 6, (bs, T), generator=g)], log_ratio)
    advantages = torch.randn(bs, T, generator=g, dtype=torch.float64)
    advantages[torch.rand(bs, T, generator=g) < 0.1] = 0.0
    mask = torch.rand(bs, T, generator=g) < 0.7
    if bs > 1:
        mask[0] = False  # one all-masked row
    lp = (old_log_prob + log_ratio).to(dtype)
    return lp, old_log_prob.to(dtype), advantages.to(dtype), mask


# --------------------------------------------------------------------------------------------- group advantages


def test_group_advantages_known_values():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [3.0, 1.0, 2.0, 2.0]])
    adv = group_advantages(rewards)
    std0 = math.sqrt(1 / 3)  # Bessel-corrected std of [1, 0, 0, 1]
    std1 = math.sqrt(2 / 3)
    expected = torch.tensor([[0.5, -0.5, -0.5, 0.5], [1.0, -1.0, 0.0, 0.0]])
    expected[0] /= std0 + 1e-6
    expected[1] /= std1 + 1e-6
    torch.testing.assert_close(adv, expected)


def test_all_equal_group_gets_exactly_zero_even_when_the_mean_rounds():
    rewards = torch.full((1, 3), 0.9)  # float32: mean(0.9, 0.9, 0.9) != 0.9
    naive = (rewards - rewards.mean()) / (rewards.std() + 1e-6)
    assert naive.abs().max() > 1e-2, "the trap this test guards against is gone; pick another value"
    assert torch.equal(group_advantages(rewards), torch.zeros(1, 3))
    mixed = torch.tensor([[0.9, 0.9, 0.9], [1.0, 0.0, 0.0]])
    adv = group_advantages(mixed)
    assert torch.equal(adv[0], torch.zeros(3)) and adv[1].abs().min() > 0.5


def test_group_advantages_needs_groups_of_at_least_two():
    with pytest.raises(AssertionError, match="G>=2"):
        group_advantages(torch.ones(4, 1))


@SMALL
@given(
    n_groups=st.integers(1, 6),
    G=st.integers(2, 8),
    seed=st.integers(0, 2**16),
    dtype=st.sampled_from([torch.float32, torch.float64]),
    binary=st.booleans(),
)
def test_group_advantages_properties(n_groups, G, seed, dtype, binary):
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randint(0, 2, (n_groups, G), generator=g) if binary else torch.randn(n_groups, G, generator=g)
    rewards = rewards.to(dtype)
    adv = group_advantages(rewards)
    assert adv.shape == rewards.shape and adv.dtype == dtype
    for row_r, row_a in zip(rewards, adv):
        if (row_r == row_r[0]).all():
            assert torch.equal(row_a, torch.zeros_like(row_a))
        else:
            sigma = row_r.double().std().item()
            # r - mean rounds at eps * |r| in `dtype`; divided by a tiny sigma that error is no longer tiny
            tol = 1e-5 + 8 * torch.finfo(dtype).eps * row_r.double().abs().max().item() / (sigma + 1e-6)
            assert abs(row_a.double().mean().item()) < tol
            assert row_a.double().std().item() == pytest.approx(sigma / (sigma + 1e-6), abs=1e-4 + tol)
            # ranking preserved: higher reward, higher advantage
            order = torch.argsort(row_r)
            assert (row_a[order].diff() >= 0).all()


def test_group_advantages_match_verl_grpo_estimator():
    core_algos = import_verl("verl.trainer.ppo.core_algos")
    import numpy as np

    n_groups, G, T = 5, 4, 6
    g = torch.Generator().manual_seed(0)
    rewards = torch.randint(0, 3, (n_groups, G), generator=g).float() / 2
    rewards[2] = 1.0  # an all-equal group
    mask = torch.ones(n_groups * G, T)
    token_rewards = torch.zeros(n_groups * G, T)
    token_rewards[:, -1] = rewards.view(-1)
    index = np.repeat(np.arange(n_groups), G)
    verl_adv, _ = core_algos.compute_grpo_outcome_advantage(token_rewards, mask, index, epsilon=1e-6)
    ours = group_advantages(rewards).view(-1, 1) * mask
    torch.testing.assert_close(ours, verl_adv, rtol=0, atol=1e-6)


# --------------------------------------------------------------------------------------------- loss aggregation


def test_agg_loss_modes_known_values():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])
    assert agg_loss(loss, mask, "token-mean").item() == pytest.approx((1 + 2 + 3 + 4) / 4)
    assert agg_loss(loss, mask, "seq-mean-token-sum").item() == pytest.approx((6 + 4) / 2)
    assert agg_loss(loss, mask, "seq-mean-token-mean").item() == pytest.approx((2 + 4) / 2)


def test_agg_loss_unknown_mode_lists_valid_ones():
    with pytest.raises(ValueError, match="token-mean, seq-mean-token-sum, seq-mean-token-mean"):
        agg_loss(torch.zeros(2, 2), torch.ones(2, 2), "token_mean")


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_agg_loss_all_masked_is_zero_with_zero_grad(mode):
    loss = torch.randn(3, 4, requires_grad=True)
    out = agg_loss(loss, torch.zeros(3, 4), mode)
    out.backward()
    assert out.item() == 0.0 and torch.equal(loss.grad, torch.zeros(3, 4))


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_agg_loss_ignores_nan_and_inf_in_masked_positions(mode):
    loss = torch.randn(3, 4)
    mask = torch.ones(3, 4, dtype=torch.bool)
    mask[:, -1] = False
    dirty = loss.clone()
    dirty[:, -1] = torch.tensor([float("nan"), float("inf"), -float("inf")])
    assert agg_loss(dirty, mask, mode).item() == agg_loss(loss, mask, mode).item()


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_agg_loss_is_invariant_to_micro_batching_with_the_global_count(mode):
    g = torch.Generator().manual_seed(1)
    loss = torch.randn(10, 7, generator=g, dtype=torch.float64, requires_grad=True)
    mask = torch.rand(10, 7, generator=g) < 0.6
    mask[3] = False
    full = agg_loss(loss, mask, mode)
    (full_grad,) = torch.autograd.grad(full, loss)

    global_count = mask.sum() if mode == "token-mean" else (mask.sum(-1) > 0).sum()
    splits = [(0, 3), (3, 4), (4, 9), (9, 10)]  # uneven micro-batches, one of them all-masked
    summed = sum(agg_loss(loss[a:b], mask[a:b], mode, global_count=global_count) for a, b in splits)
    (summed_grad,) = torch.autograd.grad(summed, loss)
    torch.testing.assert_close(summed, full)
    torch.testing.assert_close(summed_grad, full_grad)

    # Same thing, written as: weight each micro-batch's own loss by its share of the global count.
    def own_count(m):
        return m.sum() if mode == "token-mean" else (m.sum(-1) > 0).sum()

    weighted = sum(agg_loss(loss[a:b], mask[a:b], mode) * own_count(mask[a:b]) / global_count for a, b in splits)
    torch.testing.assert_close(weighted, full)
    # ... whereas a plain mean over micro-batch losses is biased (this is what the test guards against).
    plain = sum(agg_loss(loss[a:b], mask[a:b], mode) for a, b in splits) / len(splits)
    assert abs(plain.item() - full.item()) > 1e-3


# --------------------------------------------------------------------------------------------- policy loss


@pytest.mark.parametrize(
    "log_ratio, adv, expected_loss, clipfrac, clipfrac_lower",
    [
        (math.log(1.1), 1.0, -1.1, 0.0, 0.0),  # inside the trust region: plain r·A
        (math.log(2.0), 1.0, -1.28, 1.0, 0.0),  # A > 0, ratio above 1 + clip_high: clip-higher caps the gain
        (math.log(0.5), 1.0, -0.5, 0.0, 0.0),  # A > 0, ratio below 1 − clip_low: no clipping (pessimistic min)
        (math.log(0.5), -1.0, 0.8, 1.0, 0.0),  # A < 0, ratio below 1 − clip_low: clipped at 0.8
        (math.log(1.2), -1.0, 1.2, 0.0, 0.0),  # A < 0, ratio inside: plain
        (math.log(20.0), -1.0, 10.0, 0.0, 1.0),  # A < 0, ratio above clip_c: dual clip bounds the loss at c·|A|
        (40.0, -2.0, 20.0, 0.0, 1.0),  # log-ratio beyond the ±20 clamp, still bounded by dual clip
        (math.log(3.0), 0.0, 0.0, 0.0, 0.0),  # zero advantage
    ],
)
def test_policy_loss_single_token_cases(log_ratio, adv, expected_loss, clipfrac, clipfrac_lower):
    old = torch.tensor([[-1.0]], dtype=torch.float64)
    loss, metrics = policy_loss(old + log_ratio, old, torch.tensor([[adv]], dtype=torch.float64), torch.ones(1, 1))
    assert loss.item() == pytest.approx(expected_loss, rel=1e-12)
    assert loss.item() == pytest.approx(_reference_token_loss(log_ratio, adv), rel=1e-12)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(clipfrac)
    assert metrics["actor/pg_clipfrac_lower"] == pytest.approx(clipfrac_lower)


def test_policy_loss_is_token_mean_over_the_whole_batch():
    # Two answers, lengths 1 and 3, on-policy (ratio 1): token-mean weights tokens, not answers.
    lp = torch.zeros(2, 3)
    adv = torch.tensor([[1.0, 0.0, 0.0], [-1.0, -1.0, -1.0]])
    mask = torch.tensor([[1, 0, 0], [1, 1, 1]])
    loss, metrics = policy_loss(lp, lp, adv, mask)
    assert loss.item() == pytest.approx((-1 + 3) / 4)
    assert metrics["actor/ppo_kl"] == 0.0


def test_policy_loss_metric_keys_and_split_of_clipfrac():
    lp, old, adv, mask = _random_batch(3, 16, 32, extreme=True)
    _, m = policy_loss(lp, old, adv, mask, **CLIP)
    assert set(m) == {
        "actor/pg_clipfrac",
        "actor/clipfrac_low",
        "actor/clipfrac_high",
        "actor/pg_clipfrac_lower",
        "actor/ppo_kl",
    }
    assert all(isinstance(v, float) for v in m.values())
    assert m["actor/clipfrac_low"] > 0 and m["actor/clipfrac_high"] > 0
    assert m["actor/clipfrac_low"] + m["actor/clipfrac_high"] == pytest.approx(m["actor/pg_clipfrac"], abs=1e-6)


def test_policy_loss_all_masked_batch_gives_zero_not_nan():
    lp, old, adv, _ = _random_batch(0, 4, 5)
    lp.requires_grad_(True)
    loss, metrics = policy_loss(lp, old, adv, torch.zeros(4, 5))
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(lp.grad, torch.zeros(4, 5))
    assert all(v == 0.0 for v in metrics.values())


def test_policy_loss_gradcheck_float64():
    lp, old, adv, mask = _random_batch(7, 4, 6, dtype=torch.float64)
    # Keep every ratio away from the clip kinks (0.8, 1.28, 10) so finite differences are well defined.
    log_ratio = lp - old
    for kink in (math.log(0.8), math.log(1.28), math.log(10.0)):
        near = (log_ratio - kink).abs() < 1e-3
        log_ratio = torch.where(near, log_ratio + 1e-2, log_ratio)
    lp = (old + log_ratio).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x: policy_loss(x, old, adv, mask, **CLIP)[0], (lp,))


def test_policy_loss_gradient_is_zero_exactly_where_clipped():
    old = torch.zeros(1, 4, dtype=torch.float64)
    lp = torch.tensor([[math.log(1.1), math.log(2.0), math.log(0.5), math.log(20.0)]], dtype=torch.float64)
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]], dtype=torch.float64)
    lp.requires_grad_(True)
    policy_loss(lp, old, adv, torch.ones(1, 4))[0].backward()
    # d/dlp of −A·r / 4 = −A·r / 4 on the unclipped token; the clip-higher, clip-low and dual-clip tokens get none.
    torch.testing.assert_close(lp.grad, torch.tensor([[-1.1 / 4, 0.0, 0.0, 0.0]], dtype=torch.float64))


@SMALL
@given(
    bs=st.integers(1, 5),
    T=st.integers(1, 9),
    seed=st.integers(0, 2**16),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    bool_mask=st.booleans(),
)
def test_policy_loss_properties(bs, T, seed, dtype, bool_mask):
    lp, old, adv, mask = _random_batch(seed, bs, T, dtype=dtype, extreme=True)
    mask_arg = mask if bool_mask else mask.to(dtype)
    loss, metrics = policy_loss(lp, old, adv, mask_arg, **CLIP)
    assert loss.shape == () and torch.isfinite(loss)
    assert all(0.0 <= metrics[k] <= 1.0 for k in metrics if "clipfrac" in k)
    # Matches the paper-form reference evaluated on the same (rounded) inputs.
    ref_tokens = [
        _reference_token_loss(float(lp[i, t]) - float(old[i, t]), float(adv[i, t]))
        for i in range(bs)
        for t in range(T)
        if mask[i, t]
    ]
    ref = sum(ref_tokens) / len(ref_tokens) if ref_tokens else 0.0
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert float(loss) == pytest.approx(ref, rel=tol, abs=tol)
    # Whatever sits in masked positions (even inf/nan) does not matter.
    dirty_lp, dirty_adv = lp.clone(), adv.clone()
    dirty_lp[~mask] = float("nan")
    dirty_adv[~mask] = float("inf")
    assert torch.equal(policy_loss(dirty_lp, old, dirty_adv, mask_arg, **CLIP)[0], loss)


def test_policy_loss_micro_batches_sum_to_the_full_batch_loss():
    lp, old, adv, mask = _random_batch(11, 12, 8, dtype=torch.float64)
    full, _ = policy_loss(lp, old, adv, mask)
    n = mask.sum()
    parts = [policy_loss(lp[a:b], old[a:b], adv[a:b], mask[a:b], num_tokens_global=n)[0] for a, b in [(0, 5), (5, 12)]]
    torch.testing.assert_close(sum(parts), full)


# --------------------------------------------------------------------------------------------- equivalence with verl


@pytest.fixture(scope="module")
def verl_vanilla():
    core_algos = import_verl("verl.trainer.ppo.core_algos")
    from verl.workers.config.actor import FSDPActorConfig

    # The real actor config verl builds from YAML; micro-batch size and rollout_n are required fields that
    # the loss does not read.
    config = FSDPActorConfig(
        strategy="fsdp",
        rollout_n=4,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio_low=0.2,
        clip_ratio_high=0.28,
        clip_ratio_c=10.0,
        loss_agg_mode="token-mean",
    )
    loss_fn = core_algos.get_policy_loss_fn("vanilla")
    assert loss_fn is core_algos.compute_policy_loss_vanilla

    def call(lp, old, adv, mask):
        return loss_fn(old, lp, adv, mask.float(), loss_agg_mode="token-mean", config=config)

    return call


@pytest.mark.verl
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("extreme", [False, True])
def test_policy_loss_equals_verl_vanilla(verl_vanilla, seed, extreme):
    lp, old, adv, mask = _random_batch(seed, 16, 64, extreme=extreme)
    ours_lp = lp.clone().requires_grad_(True)
    verl_lp = lp.clone().requires_grad_(True)
    ours, ours_metrics = policy_loss(ours_lp, old, adv, mask, **CLIP)
    theirs, verl_metrics = verl_vanilla(verl_lp, old, adv, mask)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)
    for key in ("actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl"):
        assert ours_metrics[key] == pytest.approx(verl_metrics[key], abs=1e-6), key
    if extreme:  # the extreme batches really exercise every branch
        assert verl_metrics["actor/pg_clipfrac"] > 0.05 and verl_metrics["actor/pg_clipfrac_lower"] > 0.01
    ours.backward()
    theirs.backward()
    torch.testing.assert_close(ours_lp.grad, verl_lp.grad, rtol=0, atol=1e-6)


@pytest.mark.verl
def test_all_masked_batch_is_where_we_deliberately_differ_from_verl(verl_vanilla):
    lp, old, adv, _ = _random_batch(0, 2, 3)
    empty = torch.zeros(2, 3, dtype=torch.bool)
    assert torch.isnan(verl_vanilla(lp, old, adv, empty)[0])  # verl: 0 / 0
    assert policy_loss(lp, old, adv, empty)[0].item() == 0.0


# --------------------------------------------------------------------------------------------- dynamic sampling


def test_dynamic_sampling_keeps_only_mixed_groups():
    correct = torch.tensor([[1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 0, 0], [1, 1, 1, 0]])
    assert dynamic_sampling_keep(correct).tolist() == [False, False, True, True]
    assert dynamic_sampling_keep(correct.bool()).tolist() == [False, False, True, True]


def test_dynamic_sampling_rejects_shaped_rewards():
    with pytest.raises(ValueError, match="0/1 accuracy"):
        dynamic_sampling_keep(torch.tensor([[1.0, 0.75, 0.0]]))


def test_all_equal_group_has_zero_advantage_and_is_filtered_out():
    correct = torch.tensor([[1, 1, 1], [0, 1, 0]])
    rewards = correct.float() - 0.1 * torch.tensor([[0.0, 0.5, 1.0], [0.0, 0.0, 0.0]])  # overlong-shaped
    # Shaped rewards of the solved group differ, so its advantages are not zero, but correctness filters it out.
    assert group_advantages(rewards)[0].abs().max() > 0
    assert dynamic_sampling_keep(correct).tolist() == [False, True]
    # An all-equal reward group is both zero-advantage and filtered.
    assert torch.equal(group_advantages(correct[:1].float()), torch.zeros(1, 3))


@SMALL
@given(n_groups=st.integers(1, 8), G=st.integers(1, 8), seed=st.integers(0, 2**16))
def test_dynamic_sampling_property(n_groups, G, seed):
    g = torch.Generator().manual_seed(seed)
    correct = torch.rand(n_groups, G, generator=g) < torch.rand(n_groups, 1, generator=g)
    keep = dynamic_sampling_keep(correct)
    for row, k in zip(correct.tolist(), keep.tolist()):
        assert k == (any(row) and not all(row))


def test_buffer_fills_over_rounds_and_discards_surplus():
    buf = DynamicSamplingBuffer(target_groups=3, max_rounds=5)
    buf.add(["a", "b", "c"], torch.tensor([True, False, False]))
    assert not buf.done
    buf.add(["d", "e", "f"], [False, True, True])
    assert buf.done and buf.take() == ["a", "e", "f"]

    buf = DynamicSamplingBuffer(target_groups=3, max_rounds=5)
    buf.add([0, 1, 2, 3], [True, True, False, False])
    buf.add([4, 5, 6, 7], [False, True, True, True])
    assert buf.done and buf.take() == [0, 1, 5]
    assert buf.metrics() == {
        "dapo/gen_rounds": 2.0,
        "dapo/kept_groups": 5.0,
        "dapo/dropped_groups": 3.0,
        "dapo/train_groups": 3.0,
        "dapo/batch_fill": 1.0,
    }
    with pytest.raises(RuntimeError, match="done"):
        buf.add([8], [True])


def test_buffer_stops_after_max_rounds_with_what_it_has():
    buf = DynamicSamplingBuffer(target_groups=4, max_rounds=2)
    rounds = 0
    while not buf.done:
        buf.add([rounds], [rounds == 0])
        rounds += 1
    assert rounds == 2 and buf.take() == [0]
    assert buf.metrics()["dapo/batch_fill"] == 0.25 and buf.metrics()["dapo/dropped_groups"] == 1.0


def test_buffer_checks_lengths():
    with pytest.raises(AssertionError, match="2 groups but 1 keep"):
        DynamicSamplingBuffer(2, 2).add(["a", "b"], [True])


# --------------------------------------------------------------------------------------------- overlong shaping


@pytest.mark.parametrize(
    "length, expected",
    [(0, 0.0), (16, 0.0), (17, -0.25), (18, -0.5), (19, -0.75), (20, -1.0), (21, -1.0), (1000, -1.0)],
)
def test_overlong_penalty_boundaries(length, expected):
    # L_max = 20, L_cache = 4: free up to 16 = L_max − L_cache, linear to −1 at L_max, −1 beyond.
    assert overlong_penalty(length, max_len=20, cache_len=4) == expected
    assert overlong_penalties(torch.tensor([length]), max_len=20, cache_len=4).item() == expected


def test_overlong_penalty_realistic_sizes():
    L_max, L_c = 16384, 4096
    free = L_max - L_c
    assert overlong_penalty(free, L_max, L_c) == 0.0
    assert overlong_penalty(free + 1, L_max, L_c) == -1 / L_c
    assert overlong_penalty(L_max, L_max, L_c) == -1.0
    assert overlong_penalty(L_max + 1, L_max, L_c) == -1.0


def test_overlong_vectorised_equals_scalar():
    lengths = torch.arange(0, 60)
    vec = overlong_penalties(lengths, max_len=40, cache_len=12)
    assert vec.dtype == torch.float32 and vec.shape == (60,)
    scalar = torch.tensor([overlong_penalty(n, 40, 12) for n in range(60)], dtype=torch.float32)
    assert torch.equal(vec, scalar)
    assert (vec.diff() <= 0).all() and vec.min() == -1.0 and vec.max() == 0.0


@pytest.mark.parametrize("max_len, cache_len", [(10, 0), (10, 11), (10, -1)])
def test_overlong_rejects_bad_config(max_len, cache_len):
    with pytest.raises(ValueError, match="0 < cache_len <= max_len"):
        overlong_penalty(5, max_len, cache_len)
    with pytest.raises(ValueError, match="0 < cache_len <= max_len"):
        overlong_penalties(torch.tensor([5]), max_len, cache_len)


# --------------------------------------------------------------------------------------------- metrics


def test_group_metrics():
    correct = torch.tensor([[1, 1], [0, 0], [1, 0], [0, 1]])
    rewards = correct.float()
    rewards[0, 0] = 0.5  # solved group whose shaped rewards differ
    m = group_metrics(rewards, correct)
    assert m["dapo/acc_mean"] == 0.5
    assert m["dapo/frac_groups_all_correct"] == 0.25 and m["dapo/frac_groups_all_wrong"] == 0.25
    assert m["dapo/frac_groups_all_equal_reward"] == 0.25  # only the all-wrong group
    assert m["dapo/reward_mean"] == pytest.approx(3.5 / 8)
    assert m["dapo/reward_std"] == pytest.approx(rewards.double().std(unbiased=False).item())
