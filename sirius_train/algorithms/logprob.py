"""Token log-probabilities and entropies from logits, chunked so a 151,936-token vocabulary fits in memory.

The naive route (log_softmax, gather, softmax · log_softmax) allocates several logits-sized tensors; at
(4, 1024, 151936) fp32 each is 2.5 GB. Here a custom autograd function walks over row chunks of the
flattened (B·T, V) logits, keeps only per-row scalars (logsumexp, entropy) for backward, and recomputes the
softmax of each chunk there. Forward allocates O(chunk_size · V) beyond its (B, T) outputs; backward
allocates the logits-sized gradient it must return plus O(chunk_size · V).
Measured against the naive route in benchmarks/bench_logprob_entropy.py.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

# Logits elements per chunk when chunk_size is not given: 2M (8 MiB fp32, 13 rows at V = 151,936), so the
# chunk's work buffers stay cache-resident. Picked on CPU with benchmarks/bench_logprob_entropy.py
# (docs/benchmarks/logprob_entropy.md: 8-16 rows were fastest there). Not measured on GPU, where kernel
# launches per chunk dominate at this size: pass a larger chunk_size (hundreds of rows) there.
DEFAULT_CHUNK_ELEMENTS = 2**21


def logprobs_and_entropy(
    logits: torch.Tensor,
    labels: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """log π(label) and entropy H(π) per position, with π = softmax(logits / temperature).

    Entropy uses H = logsumexp(z) − Σ softmax(z)·z, evaluated with z shifted by its row max. Both outputs
    are differentiable w.r.t. logits (the gradient is computed chunk by chunk, not by autograd's saved
    intermediates). Math runs in float32 at least (bf16 logits are upcast per chunk; float64 stays float64).

    Args:
        logits: (..., V), typically (B, T, V); any dtype, need not be contiguous.
        labels: (...) int64 token ids in [0, V), same leading shape as logits.
        chunk_size: rows per chunk; default DEFAULT_CHUNK_ELEMENTS // V.
    Returns:
        log_probs: (...) log-probability of each label.
        entropy: (...) entropy of each position's distribution, in nats.
    """
    assert labels.shape == logits.shape[:-1], f"labels {tuple(labels.shape)} vs logits {tuple(logits.shape)}"
    assert temperature > 0, f"temperature must be > 0, got {temperature}"
    if chunk_size is None:
        chunk_size = max(1, DEFAULT_CHUNK_ELEMENTS // logits.shape[-1])
    assert chunk_size >= 1, f"chunk_size must be >= 1, got {chunk_size}"
    log_probs, entropy = _ChunkedLogProbEntropy.apply(logits, labels, temperature, chunk_size)
    return log_probs, entropy


class _ChunkedLogProbEntropy(torch.autograd.Function):
    """Forward and backward over row chunks; saves logits (already alive), labels, lse and entropy only."""

    @staticmethod
    def forward(ctx, logits, labels, temperature, chunk_size):
        compute_dtype = torch.promote_types(logits.dtype, torch.float32)
        out_shape = logits.shape[:-1]
        n_rows = out_shape.numel()
        log_probs = torch.empty(n_rows, dtype=compute_dtype, device=logits.device)  # (N,)
        lse = torch.empty_like(log_probs)  # (N,)
        entropy = torch.empty_like(log_probs)  # (N,)
        flat_labels = labels.reshape(-1).long()  # (N,)
        bufs = _Buffers(logits, chunk_size, compute_dtype, temperature)
        for start, rows in _row_chunks(logits, chunk_size):
            n = rows.shape[0]
            stop = start + n
            z = bufs.scaled(rows)  # (n, V) logits / temperature
            row_max = z.amax(dim=-1, keepdim=True)  # (n, 1)
            shifted = torch.sub(z, row_max, out=bufs.a[:n])  # (n, V)
            exp = torch.exp(shifted, out=bufs.b[:n])  # (n, V)
            sum_exp = exp.sum(dim=-1)  # (n,)
            log_sum_exp = sum_exp.log()  # (n,) logsumexp of shifted
            label_shifted = shifted.gather(-1, flat_labels[start:stop, None]).view(n)  # (n,)
            log_probs[start:stop] = label_shifted - log_sum_exp
            # Σ p·(z − max), reusing the shifted buffer for the product. A matmul dot product would save
            # nothing and, over 152k terms, loses ~1e-4 relative precision in fp32 (sum() is pairwise).
            mean_shifted = shifted.mul_(exp).sum(dim=-1) / sum_exp  # (n,)
            entropy[start:stop] = log_sum_exp - mean_shifted
            lse[start:stop] = log_sum_exp + row_max.view(n)
        ctx.save_for_backward(logits, flat_labels, lse, entropy)
        ctx.temperature, ctx.chunk_size = temperature, chunk_size
        ctx.mark_non_differentiable(lse)
        return log_probs.view(out_shape), entropy.view(out_shape)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_log_probs, grad_entropy):
        # With p = softmax(z): d log p_y / dz = onehot(y) − p;  dH/dz = p · (Σ p·z − z),  Σ p·z = lse − H.
        logits, flat_labels, lse, entropy = ctx.saved_tensors
        temperature = ctx.temperature
        compute_dtype = lse.dtype
        g_lp = grad_log_probs.reshape(-1).to(compute_dtype)  # (N,)
        g_h = grad_entropy.reshape(-1).to(compute_dtype)  # (N,)
        mean_z = lse - entropy  # (N,) Σ p·z
        grad_logits = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)  # (..., V) contiguous
        grad_flat = grad_logits.view(-1, logits.shape[-1])  # (N, V)
        bufs = _Buffers(logits, ctx.chunk_size, compute_dtype, temperature)
        for start, rows in _row_chunks(logits, ctx.chunk_size):
            n = rows.shape[0]
            stop = start + n
            z = bufs.scaled(rows)  # (n, V)
            p = torch.sub(z, lse[start:stop, None], out=bufs.a[:n]).exp_()  # (n, V)
            grad = torch.sub(mean_z[start:stop, None], z, out=bufs.b[:n])  # (n, V) Σp·z − z
            grad.mul_(p).mul_(g_h[start:stop, None])  # entropy term
            grad.addcmul_(p, g_lp[start:stop, None], value=-1.0)  # −p · g_lp
            grad.scatter_add_(-1, flat_labels[start:stop, None], g_lp[start:stop, None])  # +onehot · g_lp
            if temperature != 1.0:
                grad.div_(temperature)
            grad_flat[start:stop].copy_(grad)
        return grad_logits, None, None, None


class _Buffers:
    """Two reusable (chunk_size, V) work buffers, plus one for the upcast/tempered copy when one is needed.

    Reusing them across chunks avoids allocating (and page-faulting) fresh memory for every chunk.
    """

    def __init__(self, logits: torch.Tensor, chunk_size: int, dtype: torch.dtype, temperature: float):
        rows = min(chunk_size, max(1, logits.shape[:-1].numel()))
        shape = (rows, logits.shape[-1])
        self.a = torch.empty(shape, dtype=dtype, device=logits.device)
        self.b = torch.empty(shape, dtype=dtype, device=logits.device)
        self.temperature = temperature
        self.needs_copy = logits.dtype != dtype or temperature != 1.0
        self.z = torch.empty(shape, dtype=dtype, device=logits.device) if self.needs_copy else None

    def scaled(self, rows: torch.Tensor) -> torch.Tensor:
        """rows / temperature in the compute dtype; the input itself when no conversion is needed."""
        if not self.needs_copy:
            return rows
        z = self.z[: rows.shape[0]]
        z.copy_(rows)
        return z.div_(self.temperature) if self.temperature != 1.0 else z


def _row_chunks(x: torch.Tensor, chunk_size: int):
    """Yield (first_row, (n, V) view) over the rows of x (..., V) flattened, never copying x.

    x.view(-1, V) fails for e.g. logits[:, :-1] (a slice along T); we then split the leading dim and retry,
    which keeps every block a view and the rows in row-major order.
    """
    start = 0
    for block in _row_blocks(x):
        for lo in range(0, block.shape[0], chunk_size):
            rows = block[lo : lo + chunk_size]
            yield start, rows
            start += rows.shape[0]


def _row_blocks(x: torch.Tensor) -> list[torch.Tensor]:
    try:
        return [x.view(-1, x.shape[-1])]
    except RuntimeError:
        return [blk for sub in x.unbind(0) for blk in _row_blocks(sub)]
