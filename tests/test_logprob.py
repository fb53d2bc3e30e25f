"""Chunked log-prob + entropy equals the naive log_softmax route, in values and gradients."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sirius_train.algorithms.logprob import logprobs_and_entropy

SMALL = settings(max_examples=50, deadline=None)


def naive(logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0):
    """The textbook route, fully materialised: log_softmax, gather, −Σ p·log p."""
    logp = torch.log_softmax(logits / temperature, dim=-1)  # (..., V)
    return logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1), -(logp.exp() * logp).sum(-1)


def _inputs(B, T, V, seed=0, dtype=torch.float32, scale=4.0):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(B, T, V, generator=g, dtype=torch.float64) * scale).to(dtype)
    labels = torch.randint(0, V, (B, T), generator=g)
    return logits, labels


@pytest.mark.parametrize("chunk_size", [1, 3, 7, 1000])  # 1 row, uneven split, exact multiple, one chunk
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_values_match_naive_fp32(chunk_size, temperature):
    logits, labels = _inputs(3, 7, 257, scale=8.0)
    lp, ent = logprobs_and_entropy(logits, labels, temperature=temperature, chunk_size=chunk_size)
    ref_lp, ref_ent = naive(logits.double(), labels, temperature)
    assert lp.dtype == ent.dtype == torch.float32 and lp.shape == ent.shape == (3, 7)
    torch.testing.assert_close(lp.double(), ref_lp, rtol=0, atol=1e-5)
    torch.testing.assert_close(ent.double(), ref_ent, rtol=0, atol=1e-5)


@pytest.mark.parametrize("chunk_size", [2, 5, 64])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_gradients_match_naive(chunk_size, temperature):
    logits, labels = _inputs(2, 9, 100, seed=1)
    g = torch.Generator().manual_seed(2)
    w_lp, w_ent = torch.randn(2, 9, generator=g), torch.randn(2, 9, generator=g)

    x = logits.clone().requires_grad_(True)
    lp, ent = logprobs_and_entropy(x, labels, temperature=temperature, chunk_size=chunk_size)
    ((lp * w_lp).sum() + (ent * w_ent).sum()).backward()

    ref = logits.clone().requires_grad_(True)
    ref_lp, ref_ent = naive(ref, labels, temperature)
    ((ref_lp * w_lp).sum() + (ref_ent * w_ent).sum()).backward()
    torch.testing.assert_close(x.grad, ref.grad, rtol=0, atol=1e-5)


def test_gradient_of_one_output_only():
    logits, labels = _inputs(2, 4, 30, seed=3)
    for pick in (0, 1):
        x = logits.clone().requires_grad_(True)
        logprobs_and_entropy(x, labels, chunk_size=3)[pick].sum().backward()
        ref = logits.clone().requires_grad_(True)
        naive(ref, labels)[pick].sum().backward()
        torch.testing.assert_close(x.grad, ref.grad, rtol=0, atol=1e-5)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_gradcheck_float64(temperature):
    logits, labels = _inputs(2, 5, 11, seed=4, dtype=torch.float64, scale=2.0)
    logits.requires_grad_(True)
    assert torch.autograd.gradcheck(
        lambda x: logprobs_and_entropy(x, labels, temperature=temperature, chunk_size=3), (logits,)
    )


def test_bf16_logits_are_upcast_per_chunk():
    logits, labels = _inputs(2, 6, 300, seed=5, dtype=torch.bfloat16)
    x = logits.clone().requires_grad_(True)
    lp, ent = logprobs_and_entropy(x, labels, chunk_size=4)
    assert lp.dtype == ent.dtype == torch.float32
    # Same as the fp32 computation on the bf16 values: no precision lost beyond the input's own rounding.
    ref_lp, ref_ent = naive(logits.double(), labels)
    torch.testing.assert_close(lp.double(), ref_lp, rtol=0, atol=1e-5)
    torch.testing.assert_close(ent.double(), ref_ent, rtol=0, atol=1e-5)
    (lp.sum() + ent.sum()).backward()
    assert x.grad.dtype == torch.bfloat16
    ref = logits.double().requires_grad_(True)
    sum(naive(ref, labels)).sum().backward()
    torch.testing.assert_close(x.grad.double(), ref.grad, rtol=1e-2, atol=1e-3)  # bf16 grad rounding


def test_non_viewable_slice_of_logits():
    # logits[:, :-1] (drop the last position) cannot be viewed as (B·T, V); it must work without a copy.
    logits, labels = _inputs(3, 8, 40, seed=6)
    x = logits.clone().requires_grad_(True)
    sliced = x[:, :-1]
    with pytest.raises(RuntimeError):
        sliced.view(-1, 40)
    lp, ent = logprobs_and_entropy(sliced, labels[:, 1:], chunk_size=4)
    (lp.sum() + 2 * ent.sum()).backward()
    ref = logits.clone().requires_grad_(True)
    ref_lp, ref_ent = naive(ref[:, :-1], labels[:, 1:])
    (ref_lp.sum() + 2 * ref_ent.sum()).backward()
    torch.testing.assert_close(lp, ref_lp, rtol=0, atol=1e-5)
    torch.testing.assert_close(ent, ref_ent, rtol=0, atol=1e-5)
    torch.testing.assert_close(x.grad, ref.grad, rtol=0, atol=1e-5)


def test_qwen_sized_vocabulary_with_the_default_chunking():
    logits, labels = _inputs(2, 10, 151_936, seed=7)  # 20 rows: two default chunks of 13 and 7
    x = logits.clone().requires_grad_(True)
    lp, ent = logprobs_and_entropy(x, labels)
    ref = logits.double().requires_grad_(True)
    ref_lp, ref_ent = naive(ref, labels)
    torch.testing.assert_close(lp.double(), ref_lp, rtol=0, atol=1e-5)
    torch.testing.assert_close(ent.double(), ref_ent, rtol=0, atol=1e-5)
    assert (ent > 0).all() and (ent <= torch.log(torch.tensor(151_936.0)) + 1e-4).all()
    (lp.sum() - ent.sum()).backward()
    (ref_lp.sum() - ref_ent.sum()).backward()
    torch.testing.assert_close(x.grad.double(), ref.grad, rtol=1e-5, atol=1e-6)


def test_extreme_logits_stay_finite():
    logits = torch.tensor([[[1e4, 0.0, -1e4], [-1e30, -1e30, 5.0], [0.0, 0.0, 0.0]]])
    labels = torch.tensor([[1, 2, 0]])
    lp, ent = logprobs_and_entropy(logits, labels)
    torch.testing.assert_close(lp, torch.tensor([[-1e4, 0.0, -torch.log(torch.tensor(3.0)).item()]]))
    torch.testing.assert_close(ent, torch.tensor([[0.0, 0.0, torch.log(torch.tensor(3.0)).item()]]))


def test_works_under_no_grad_and_with_int32_labels():
    logits, labels = _inputs(2, 3, 17, seed=8)
    with torch.no_grad():
        lp, ent = logprobs_and_entropy(logits, labels.int())
    ref_lp, ref_ent = naive(logits, labels)
    torch.testing.assert_close(lp, ref_lp, rtol=0, atol=1e-5)
    assert not lp.requires_grad


def test_rejects_mismatched_labels():
    with pytest.raises(AssertionError, match="labels"):
        logprobs_and_entropy(torch.zeros(2, 3, 5), torch.zeros(2, 4, dtype=torch.long))


@SMALL
@given(
    shape=st.sampled_from([(1,), (4,), (2, 3), (3, 1, 2)]),
    V=st.integers(2, 64),
    chunk_size=st.integers(1, 8),
    seed=st.integers(0, 2**16),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
)
def test_properties(shape, V, chunk_size, seed, dtype):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(*shape, V, generator=g) * 5).to(dtype)
    labels = torch.randint(0, V, shape, generator=g)
    lp, ent = logprobs_and_entropy(logits, labels, chunk_size=chunk_size)
    assert lp.shape == ent.shape == shape
    ref_lp, ref_ent = naive(logits.double(), labels)
    torch.testing.assert_close(lp.double(), ref_lp, rtol=0, atol=1e-5)
    torch.testing.assert_close(ent.double(), ref_ent, rtol=0, atol=1e-5)
    assert (lp <= 0).all() and (ent >= -1e-6).all()
