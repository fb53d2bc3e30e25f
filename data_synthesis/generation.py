"""Batched, KV-cached sampling with HF `generate`, as token tensors: the HF sampler's loop and the
local trainer's rollouts (it lives on the sampler's floor so that both use it without an upward import).

The trainer needs more than texts: the exact token ids it sampled (to score their log-probs), a mask
of which response tokens count, and whether a response was cut at the length limit (for DAPO's
overlong shaping). Generation stops at EOS or as soon as the SQL block is closed. On request it also
keeps each sampled token's log-prob and entropy under the sampling policy, read off the logits `generate`
computes anyway, so that the update needs no separate pass for pi_old.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, fields

import torch
from transformers import (DynamicCache, GenerationConfig, LogitsProcessor, LogitsProcessorList, StoppingCriteria,
                          StoppingCriteriaList)
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from data_synthesis.prompts import chat_text


@dataclass
class Rollout:
    """N sampled answers. Prompts are left-padded, responses right-padded."""

    prompt_ids: torch.Tensor  # (N, P)
    prompt_mask: torch.Tensor  # (N, P)
    response_ids: torch.Tensor  # (N, R)
    response_mask: torch.Tensor  # (N, R) 1 for sampled tokens up to and including EOS
    texts: list[str]
    lengths: torch.Tensor  # (N,) number of response tokens that count
    truncated: torch.Tensor  # (N,) bool: hit max_new_tokens without finishing
    old_log_prob: torch.Tensor | None = None  # (N, R) log pi_old(token) at sampling time, 0 off the mask
    old_entropy: torch.Tensor | None = None  # (N, R) entropy of pi_old there, 0 off the mask
    # multi-turn episodes (data_synthesis.multiturn); None in single-turn rollouts
    loss_mask: torch.Tensor | None = None  # (N, R) 1 on the policy's own tokens, 0 on observations (attended to)
    answers: list[str | None] | None = None  # each episode's final SQL; None: it gave no final answer
    probes: torch.Tensor | None = None  # (N,) probes each episode ran

    @property
    def input_ids(self) -> torch.Tensor:
        return torch.cat([self.prompt_ids, self.response_ids], dim=1)  # (N, P + R)

    @property
    def attention_mask(self) -> torch.Tensor:
        return torch.cat([self.prompt_mask, self.response_mask], dim=1)  # (N, P + R)

    @property
    def policy_mask(self) -> torch.Tensor:
        """(N, R) the tokens the policy loss, its entropy and pi_old count: the sampled ones."""
        return self.response_mask if self.loss_mask is None else self.loss_mask

    def select(self, index: torch.Tensor | list[int]) -> Rollout:
        index = torch.as_tensor(index, dtype=torch.long)
        rows = index.tolist()

        def pick(x):
            return None if x is None else [x[i] for i in rows] if isinstance(x, list) else x[index]

        return Rollout(*(pick(getattr(self, f.name)) for f in fields(self)))


def tempered_log_softmax(logits: torch.Tensor, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(log pi, H(pi)) of (B, V) logits, pi = softmax(logits / temperature) in float32: the sampling policy's pi_old
    and its entropy, as the update scores them (`-p log p` is 0 where p = 0)."""
    log_p = torch.log_softmax(logits.float() / temperature, dim=-1)
    return log_p, torch.special.entr(log_p.exp()).sum(dim=-1)


def token_ids_with(tokenizer, chars: str) -> torch.Tensor:
    """The ids of every vocabulary token whose text holds one of `chars`: a block can only have closed after one."""
    return torch.tensor(sorted({i for t, i in tokenizer.get_vocab().items()
                                if any(c in tokenizer.convert_tokens_to_string([t]) for c in chars)}))


def left_pad_cat(tensors: list[torch.Tensor], value: int) -> torch.Tensor:
    """(N, W) rows of (n_i, w_i) tensors, each left-padded with `value` to the widest: prompts of several calls."""
    width = max(t.shape[1] for t in tensors)
    return torch.cat([torch.nn.functional.pad(t, (width - t.shape[1], 0), value=value) for t in tensors])


class SampledTokenLogprobs(LogitsProcessor):
    """Records log pi(token) and H(pi) for every token `generate` samples, pi = softmax(logits / temperature).

    Custom processors run before HF's temperature / top-p warpers, and `generate` below switches off the
    model's own generation config (`policy_sampling`), so this sees the raw logits and records the full
    tempered softmax -- the pi_old of DAPO's ratio, as `logprobs_and_entropy` computes it in the update --
    not the top-p truncated distribution. The token drawn from step t's distribution is only known
    at step t+1 (or, for the last step, from the output), so one (B, V) row of log-probs waits in between.
    """

    def __init__(self, temperature: float, prompt_len: int):
        self.temperature, self.prompt_len = temperature, prompt_len
        self.pending: torch.Tensor | None = None  # (B, V) log-probs of the last step, awaiting its token
        self.log_probs: list[torch.Tensor] = []  # per step, (B,)
        self.entropies: list[torch.Tensor] = []  # per step, (B,)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if input_ids.shape[1] > self.prompt_len:
            self._take(input_ids[:, -1])
        self.pending, entropy = tempered_log_softmax(scores, self.temperature)
        self.entropies.append(entropy)
        return scores

    def _take(self, tokens: torch.Tensor) -> None:
        self.log_probs.append(self.pending.gather(1, tokens[:, None])[:, 0])
        self.pending = None

    def result(self, sequences: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, R) log-probs and entropies of the R sampled tokens of `sequences` (prompt + response)."""
        if self.pending is not None:
            self._take(sequences[:, -1])
        R = sequences.shape[1] - self.prompt_len
        assert len(self.log_probs) == len(self.entropies) == R, (len(self.log_probs), len(self.entropies), R)
        return torch.stack(self.log_probs, dim=1), torch.stack(self.entropies, dim=1)


class SQLBlockClosed(StoppingCriteria):
    """Stop a sequence once its answer holds a closed ```sql block (checked only after a backtick)."""

    def __init__(self, tokenizer, prompt_len: int):
        self.tokenizer = tokenizer
        self.prompt_len = prompt_len
        self.backtick_ids = token_ids_with(tokenizer, "`")
        self.stopped_at: torch.Tensor | None = None  # (B,) response length when the block closed, -1: never

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        if self.stopped_at is None:
            self.stopped_at = torch.full((input_ids.shape[0],), -1, dtype=torch.long)
        last = input_ids[:, -1]
        candidates = torch.isin(last, self.backtick_ids.to(last.device)).nonzero().flatten().tolist()
        for i in candidates:
            text = self.tokenizer.decode(input_ids[i, self.prompt_len:], skip_special_tokens=True).lower()
            start = text.find("```sql")
            done[i] = start >= 0 and text.find("```", start + 6) >= 0
            if done[i] and self.stopped_at[i] < 0:
                self.stopped_at[i] = input_ids.shape[1] - self.prompt_len
        return done

    def lengths(self, batch: int) -> torch.Tensor:
        """(B,) response length at which each row's block closed, -1 where it never did."""
        return self.stopped_at if self.stopped_at is not None else torch.full((batch,), -1, dtype=torch.long)


def encode_prompts(tokenizer, prompts: list[list[dict]], device) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompt ids and mask for chat prompts, padded after their common prefix: [shared | pads | own tokens].

    Questions on one database share the whole schema; laid out this way the shared tokens sit in the same
    columns of every row, so their prefill runs once (`prompt_cache(shared=...)`). With nothing shared this
    is left padding. Positions come from the mask (`left_pad_positions`), so the gap changes nothing.
    """
    ids = [tokenizer(chat_text(tokenizer, p), add_special_tokens=False)["input_ids"] for p in prompts]
    width, shortest = max(map(len, ids)), min(map(len, ids))
    c = 0  # tokens shared by all rows, leaving each row at least its last token after the gap
    while c < shortest - 1 and all(x[c] == ids[0][c] for x in ids):
        c += 1
    pad = tokenizer.pad_token_id
    rows = [x[:c] + [pad] * (width - len(x)) + x[c:] for x in ids]
    mask = [[1] * c + [0] * (width - len(x)) + [1] * (len(x) - c) for x in ids]
    return torch.tensor(rows, device=device), torch.tensor(mask, device=device)


def shared_prefix(ids: torch.Tensor, mask: torch.Tensor) -> int:
    """Leading columns every row holds, with the same tokens (the prefix `encode_prompts` lines up)."""
    same = mask.bool().all(dim=0) & (ids == ids[:1]).all(dim=0)
    return int(same.int().cumprod(dim=0).sum())


@torch.no_grad()
def generate(model, tokenizer, prompts: list[list[dict]], *, n: int = 1, temperature: float = 1.0, top_p: float = 1.0,
             max_new_tokens: int = 128, batch_size: int = 64, record_logprobs: bool = False,
             progress: Callable[[int], None] | None = None) -> Rollout:
    """Sample `n` answers per prompt (grouped: answers of prompt i are rows i*n .. i*n+n-1), about
    `batch_size` sequences at a time (whole groups; a group larger than that is one call); `progress(m)` hears
    of the m sequences each call made.

    The n answers of a prompt share one prefill (`prompt_cache`). With `record_logprobs` (sampling only)
    the rollout carries each token's log-prob and entropy under the sampling policy (`SampledTokenLogprobs`).
    """
    record = record_logprobs and temperature > 0
    device = next(model.parameters()).device
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    context = getattr(model.config, "max_position_embeddings", None) or 1 << 30
    was_training = model.training
    model.eval()
    parts = []
    try:
        with policy_sampling(model):
            for chunk, fits in prompt_chunks(tokenizer, prompts, max(1, batch_size // n), context):
                prompt_ids, prompt_mask = encode_prompts(tokenizer, chunk, device)
                if not fits:  # no position left for an answer: an empty one, cut at the limit, never past the context
                    rows = torch.arange(len(prompt_ids), device=device).repeat_interleave(n)
                    empty = prompt_ids.new_zeros((len(rows), 0))
                    parts.append((prompt_ids[rows], prompt_mask[rows], empty, torch.full((len(rows),), -1),
                                  (empty.float(), empty.float()) if record else None))
                    continue
                rows = torch.arange(len(prompt_ids), device=device).repeat_interleave(n)
                # every prompt token but the last: `generate` must run at least one token itself
                shared = prompt_cache(model, prompt_ids[:, :-1], prompt_mask[:, :-1], rows,
                                      shared=shared_prefix(prompt_ids[:, :-1], prompt_mask[:, :-1])) \
                    if prompt_ids.shape[1] > 1 else None
                prompt_ids, prompt_mask = prompt_ids[rows], prompt_mask[rows]
                recorder = SampledTokenLogprobs(temperature, prompt_ids.shape[1]) if record else None
                sql_closed = SQLBlockClosed(tokenizer, prompt_ids.shape[1])
                out = model.generate(
                    input_ids=prompt_ids, attention_mask=prompt_mask, do_sample=temperature > 0,
                    temperature=temperature if temperature > 0 else None, top_p=top_p if temperature > 0 else None,
                    top_k=None, max_new_tokens=min(max_new_tokens, context - prompt_ids.shape[1]), pad_token_id=pad,
                    eos_token_id=eos,
                    stopping_criteria=StoppingCriteriaList([sql_closed]),
                    logits_processor=LogitsProcessorList([recorder] if record else []),
                    past_key_values=None if shared is None else shared[0],
                )
                recorded = None if recorder is None else recorder.result(out)
                parts.append((prompt_ids, prompt_mask, out[:, prompt_ids.shape[1]:], sql_closed.lengths(len(out)),
                              recorded))
                if progress is not None:
                    progress(len(out))
    finally:
        model.train(was_training)
    return _assemble(parts, tokenizer)


def prompt_chunks(tokenizer, prompts: list[list[dict]], per_call: int, context: int):
    """`prompts` in order as (chunk, fits): runs of up to `per_call` prompts that leave the model's `context` room
    for at least one answer token, and, alone, each one that does not (it gets an empty answer, not a generation
    past the positions the model has: a real model's schema prompt can be longer than its context)."""
    chunk: list = []
    for prompt in prompts:
        if len(tokenizer(chat_text(tokenizer, prompt), add_special_tokens=False)["input_ids"]) < context:
            chunk.append(prompt)
            if len(chunk) == per_call:
                yield chunk, True
                chunk = []
            continue
        if chunk:
            yield chunk, True
            chunk = []
        yield [prompt], False
    if chunk:
        yield chunk, True


@contextmanager
def policy_sampling(model):
    """Sample from the policy itself, not through the model's shipped generation config.

    A checkpoint's `generation_config` may add processors (Qwen2.5-Instruct: repetition_penalty 1.05,
    top_k 20) that `generate` would apply on top of ours. For RL the sampled distribution must be the one
    the update scores, so for the duration only our own arguments count.
    """
    shipped = model.generation_config
    model.generation_config = GenerationConfig()
    try:
        yield
    finally:
        model.generation_config = shipped


def left_pad_positions(mask: torch.Tensor) -> torch.Tensor:
    """Position ids under left padding: 0, 1, ... from each row's first real token (pads get 0, unused)."""
    return (mask.cumsum(-1) - 1).clamp(min=0)


def prompt_cache(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, rows: torch.Tensor,
                 shared: int = 0) -> tuple[DynamicCache, torch.Tensor] | None:
    """Run each prompt once; its KV cache and last-position logits, gathered so row r holds prompt rows[r].

    Rollouts (n answers per prompt) and updates (answers of a group in one micro-batch) both feed the same
    prompt to many rows. Running it once and sharing its cache gives the same values and gradients as a
    forward per row (tests check both) at a fraction of the compute, since text-to-SQL prompts (schema +
    question) are long and answers (one query) short. Returns None when the model's cache cannot be
    shared that way (linear-attention or quantized layers, encoder-decoders, or gradient checkpointing,
    which drops caches in training mode): callers then run every row in full. The first `shared` columns,
    identical in every row (`shared_prefix`), run once for all of them (inference only: no_grad callers).
    """
    if model.config.is_encoder_decoder:
        return None
    cache = DynamicCache(config=model.config)
    if not all(type(layer) in (DynamicLayer, DynamicSlidingWindowLayer) for layer in cache.layers):
        return None
    positions = left_pad_positions(prompt_mask)
    shared = min(shared, prompt_ids.shape[1] - 1) if len(prompt_ids) > 1 else 0
    if shared > 0:  # one row of the common prefix, then every row's own tokens on top of it
        model(input_ids=prompt_ids[:1, :shared], attention_mask=prompt_mask[:1, :shared],
              position_ids=positions[:1, :shared], past_key_values=cache, use_cache=True, logits_to_keep=1)
        cache.batch_repeat_interleave(len(prompt_ids))
    logits = model(input_ids=prompt_ids[:, shared:], attention_mask=prompt_mask, position_ids=positions[:, shared:],
                   past_key_values=cache, use_cache=True, logits_to_keep=1).logits[:, -1]  # (U, V)
    if cache.get_seq_length() != prompt_ids.shape[1]:
        return None
    cache.batch_select_indices(rows)  # (U, ...) -> (len(rows), ...)
    return cache, logits[rows]


def _assemble(parts, tokenizer) -> Rollout:
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    R = max(max(p[2].shape[1] for p in parts), 1)
    response_ids, response_mask, lengths, truncated, texts = [], [], [], [], []
    recorded: list[tuple[torch.Tensor, torch.Tensor]] = []
    for p_ids, p_mask, resp, sql_closed_at, sampled in parts:
        # A response ends where generation stopped it: at its first EOS (kept: the model must learn to stop)
        # or where its SQL block closed. What `generate` appends after that is filler; a pad token the policy
        # sampled before it is part of the answer (pad may be a real token: Qwen-Instruct's <|endoftext|>).
        length, ended_with_eos = stop_lengths(resp.cpu(), sql_closed_at, eos)  # (n,), (n,)
        resp = torch.nn.functional.pad(resp, (0, R - resp.shape[1]), value=pad)
        length = length.to(resp.device)
        mask = (torch.arange(R)[None, :].to(resp.device) < length[:, None]).long()
        response_ids.append(torch.where(mask.bool(), resp, torch.full_like(resp, pad)))
        response_mask.append(mask)
        lengths.append(length)
        truncated.append(((sql_closed_at < 0) & ~ended_with_eos).to(resp.device))
        texts += tokenizer.batch_decode(resp * mask + pad * (1 - mask), skip_special_tokens=True)
        if sampled is not None:
            recorded.append(tuple(torch.where(mask.bool(), torch.nn.functional.pad(x, (0, R - x.shape[1])), 0.0)
                                  for x in sampled))
    old = [torch.cat(xs) for xs in zip(*recorded)] if recorded else [None, None]
    return Rollout(left_pad_cat([p[0] for p in parts], pad), left_pad_cat([p[1] for p in parts], 0),
                   torch.cat(response_ids), torch.cat(response_mask), texts, torch.cat(lengths), torch.cat(truncated), *old)


def stop_lengths(resp: torch.Tensor, sql_closed_at: torch.Tensor, eos: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(length, ended with EOS) of each row of `resp` (B, generated), as `generate` stopped it: at the first
    EOS (counted) or where its SQL block closed, whichever came first; a row stopped by neither ran to the
    length limit, every generated column."""
    generated = resp.shape[1]
    if generated == 0:  # no answer was generated (a prompt that filled the context)
        return torch.zeros(len(resp), dtype=torch.long), torch.zeros(len(resp), dtype=torch.bool)
    is_eos = resp == eos
    eos_len = torch.where(is_eos.any(dim=1), is_eos.int().argmax(dim=1) + 1, generated + 1)
    sql_len = torch.where(sql_closed_at >= 0, sql_closed_at, generated + 1)
    return torch.minimum(eos_len, sql_len).clamp(max=generated), is_eos.any(dim=1) & (eos_len <= sql_len)
