"""Rollouts for the local backend: batched, KV-cached sampling with HF `generate`, as token tensors.

The trainer needs more than texts: the exact token ids it sampled (to score their log-probs), a mask
of which response tokens count, and whether a response was cut at the length limit (for DAPO's
overlong shaping). Generation stops at EOS or as soon as the SQL block is closed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import StoppingCriteria, StoppingCriteriaList

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

    @property
    def input_ids(self) -> torch.Tensor:
        return torch.cat([self.prompt_ids, self.response_ids], dim=1)  # (N, P + R)

    @property
    def attention_mask(self) -> torch.Tensor:
        return torch.cat([self.prompt_mask, self.response_mask], dim=1)  # (N, P + R)

    def select(self, index: torch.Tensor | list[int]) -> Rollout:
        index = torch.as_tensor(index, dtype=torch.long)
        return Rollout(self.prompt_ids[index], self.prompt_mask[index], self.response_ids[index],
                       self.response_mask[index], [self.texts[i] for i in index.tolist()], self.lengths[index],
                       self.truncated[index])


class SQLBlockClosed(StoppingCriteria):
    """Stop a sequence once its answer holds a closed ```sql block (checked only after a backtick)."""

    def __init__(self, tokenizer, prompt_len: int):
        self.tokenizer = tokenizer
        self.prompt_len = prompt_len
        self.backtick_ids = torch.tensor(sorted({i for t, i in tokenizer.get_vocab().items()
                                                 if "`" in tokenizer.convert_tokens_to_string([t])}))

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        last = input_ids[:, -1]
        candidates = torch.isin(last, self.backtick_ids.to(last.device)).nonzero().flatten().tolist()
        for i in candidates:
            text = self.tokenizer.decode(input_ids[i, self.prompt_len:], skip_special_tokens=True).lower()
            start = text.find("```sql")
            done[i] = start >= 0 and text.find("```", start + 6) >= 0
        return done


def encode_prompts(tokenizer, prompts: list[list[dict]], device) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompt ids and mask for chat prompts."""
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    try:
        enc = tokenizer([chat_text(tokenizer, p) for p in prompts], return_tensors="pt", padding=True,
                        add_special_tokens=False)
    finally:
        tokenizer.padding_side = side
    return enc["input_ids"].to(device), enc["attention_mask"].to(device)


@torch.no_grad()
def generate(model, tokenizer, prompts: list[list[dict]], *, n: int = 1, temperature: float = 1.0, top_p: float = 1.0,
             max_new_tokens: int = 128, batch_size: int = 64) -> Rollout:
    """Sample `n` answers per prompt (grouped: answers of prompt i are rows i*n .. i*n+n-1)."""
    device = next(model.parameters()).device
    flat = [p for p in prompts for _ in range(n)]
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    was_training = model.training
    model.eval()
    parts = []
    try:
        for start in range(0, len(flat), batch_size):
            prompt_ids, prompt_mask = encode_prompts(tokenizer, flat[start:start + batch_size], device)
            out = model.generate(
                input_ids=prompt_ids, attention_mask=prompt_mask, do_sample=temperature > 0,
                temperature=temperature if temperature > 0 else None, top_p=top_p if temperature > 0 else None,
                top_k=None, max_new_tokens=max_new_tokens, pad_token_id=pad, eos_token_id=eos,
                stopping_criteria=StoppingCriteriaList([SQLBlockClosed(tokenizer, prompt_ids.shape[1])]),
            )
            parts.append((prompt_ids, prompt_mask, out[:, prompt_ids.shape[1]:]))
    finally:
        model.train(was_training)
    return _assemble(parts, tokenizer, max_new_tokens)


def _assemble(parts, tokenizer, max_new_tokens: int) -> Rollout:
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    P = max(p.shape[1] for p, _, _ in parts)
    R = max(max(r.shape[1] for _, _, r in parts), 1)
    prompt_ids, prompt_mask, response_ids, response_mask, lengths, truncated, texts = [], [], [], [], [], [], []
    for p_ids, p_mask, resp in parts:
        n = resp.shape[0]
        prompt_ids.append(torch.nn.functional.pad(p_ids, (P - p_ids.shape[1], 0), value=pad))
        prompt_mask.append(torch.nn.functional.pad(p_mask, (P - p_mask.shape[1], 0), value=0))
        resp = torch.nn.functional.pad(resp, (0, R - resp.shape[1]), value=pad)
        # A response ends at its first EOS (kept: the model must learn to stop) or its first pad.
        is_end = (resp == eos) | (resp == pad)
        has_end = is_end.any(dim=1)
        first_end = torch.where(has_end, is_end.float().argmax(dim=1), torch.full((n,), R))
        ended_with_eos = has_end & (resp.gather(1, first_end.clamp(max=R - 1)[:, None])[:, 0] == eos)
        length = torch.where(ended_with_eos, first_end + 1, first_end)  # (n,)
        mask = (torch.arange(R)[None, :].to(resp.device) < length[:, None]).long()
        response_ids.append(torch.where(mask.bool(), resp, torch.full_like(resp, pad)))
        response_mask.append(mask)
        lengths.append(length)
        truncated.append((length >= max_new_tokens) & ~ended_with_eos)
        texts += tokenizer.batch_decode(resp * mask + pad * (1 - mask), skip_special_tokens=True)
    return Rollout(torch.cat(prompt_ids), torch.cat(prompt_mask), torch.cat(response_ids), torch.cat(response_mask),
                   texts, torch.cat(lengths), torch.cat(truncated))
