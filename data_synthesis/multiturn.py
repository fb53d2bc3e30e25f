"""Multi-turn rollouts with HF models: episodes that probe the database between turns (`data_synthesis.interaction`).

All episodes of a batch advance together, one token per episode per forward pass, through one KV cache
that lives for the whole episode: each episode either samples its next token (a *model* token) or, right
after a probe, is fed the next token of the probe's observation (an *observation* token, teacher-forced
through the same decode step). Nothing is ever re-prefilled, so an observation costs one decode step per
token -- the same as a sampled one -- and turns cost nothing extra. An episode that ends (final answer,
no answer, out of probes or tokens) drops out of the batch and its rows of the cache with it.

The `Rollout` returned is the trainer's usual one, plus the multi-turn fields: `loss_mask` (1 on model
tokens, 0 on observation tokens, which stay in `response_mask`, the attention mask), `answers` (the final
SQL, scored as single-turn answers are) and `probes`. `lengths` counts model tokens only (overlong
shaping); `max_new_tokens` bounds them, observations aside. With `record_logprobs`, pi_old and its entropy
are kept for model tokens (0 on observation tokens), under the full tempered softmax as in single-turn.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from data_synthesis.generation import (Rollout, encode_prompts, left_pad_cat, left_pad_positions, prompt_cache,
                                      tempered_log_softmax, token_ids_with)
from data_synthesis.episode import (after_turn, end_ids, observation_fits, observation_ids, tokens_left,
                                    turn_over)
from data_synthesis.interaction import EpisodeEnd, ProbeLimits, with_probe_instructions

Probe = Callable[[int, "str | None"], str]  # (prompt index, probe SQL) -> observation text


@dataclass
class _Episode:
    prompt: int  # index into the prompts of the call
    context: int  # prompt tokens (its real length, padding aside)
    tokens: list[int] = field(default_factory=list)  # response tokens, model and observation
    is_model: list[int] = field(default_factory=list)  # 1 where the policy sampled the token
    log_probs: list[float] = field(default_factory=list)  # per response token (0 on observations)
    entropies: list[float] = field(default_factory=list)
    forced: deque = field(default_factory=deque)  # observation tokens still to feed
    turn_start: int = 0  # index in `tokens` where the current model turn began
    model_tokens: int = 0
    probes: int = 0
    end: EpisodeEnd | None = None
    answer: str | None = None


@torch.no_grad()
def generate_episodes(model, tokenizer, prompts: list[list[dict]], probe: Probe, limits: ProbeLimits, *, n: int = 1,
                      temperature: float = 1.0, top_p: float = 1.0, max_new_tokens: int = 128, batch_size: int = 64,
                      record_logprobs: bool = False, instruct: bool = True) -> Rollout:
    """Sample `n` episodes per prompt (rows i*n .. i*n+n-1 belong to prompt i), about `batch_size` at a time.

    `probe(i, sql)` runs a probe of an episode of prompt i and returns its observation (`interaction.run_probe`
    on that prompt's database). `instruct` adds the probe instructions to the prompts (`with_probe_instructions`);
    pass False when they already carry them. `temperature` 0 decodes greedily.
    """
    if instruct:
        prompts = [with_probe_instructions(p, limits) for p in prompts]
    device = next(model.parameters()).device
    max_positions = getattr(model.config, "max_position_embeddings", None) or 1 << 30
    ends = end_ids(tokenizer.eos_token_id, getattr(getattr(model, "generation_config", None), "eos_token_id", None))
    # only after one of them can a turn be over (closed a block, or stopped)
    closers = torch.cat([token_ids_with(tokenizer, "`>"), torch.tensor(sorted(ends), dtype=torch.long)])
    per_call = max(1, batch_size // n)
    was_training = model.training
    model.eval()
    parts = []
    try:
        for start in range(0, len(prompts), per_call):
            prompt_ids, prompt_mask = encode_prompts(tokenizer, prompts[start:start + per_call], device)
            episodes = [_Episode(start + r // n, int(prompt_mask[r // n].sum())) for r in range(len(prompt_ids) * n)]
            _run(model, tokenizer, prompt_ids, prompt_mask, episodes, probe, limits, closers=closers, ends=ends, n=n,
                 temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens, max_positions=max_positions)
            parts.append((prompt_ids.repeat_interleave(n, dim=0), prompt_mask.repeat_interleave(n, dim=0), episodes))
    finally:
        model.train(was_training)
    return _assemble(parts, tokenizer, record_logprobs and temperature > 0)


def _run(model, tokenizer, prompt_ids, prompt_mask, episodes: list[_Episode], probe: Probe, limits: ProbeLimits, *,
         closers: torch.Tensor, ends: frozenset[int], n: int, temperature: float, top_p: float, max_new_tokens: int,
         max_positions: int) -> None:
    """Decode one batch of episodes to their ends, filling them in place."""
    device = prompt_ids.device
    rows = torch.arange(len(prompt_ids), device=device).repeat_interleave(n)
    shared = prompt_cache(model, prompt_ids, prompt_mask, rows)  # each prompt once, shared by its n episodes
    if shared is None:
        cache = DynamicCache(config=model.config)
        logits = model(input_ids=prompt_ids[rows], attention_mask=prompt_mask[rows],
                       position_ids=left_pad_positions(prompt_mask[rows]), past_key_values=cache, use_cache=True,
                       logits_to_keep=1).logits[:, -1]
    else:
        cache, logits = shared  # (B, V): predicts each episode's first token
    attention = prompt_mask[rows]  # (B, P + t): grows by one column per step
    position = prompt_mask[rows].sum(dim=1)  # (B,) position of the token fed next
    live = list(episodes)
    while live:
        token, log_prob, entropy = _sample(logits, temperature, top_p)  # (b,) each
        may_close = torch.isin(token, closers.to(token.device)).tolist()
        token, log_prob, entropy = token.tolist(), log_prob.tolist(), entropy.tolist()
        fed = []
        for j, e in enumerate(live):
            if e.forced:
                e.tokens.append(e.forced.popleft())
                e.is_model.append(0)
                e.log_probs.append(0.0)
                e.entropies.append(0.0)
            else:
                e.tokens.append(token[j])
                e.is_model.append(1)
                e.log_probs.append(log_prob[j])
                e.entropies.append(entropy[j])
                e.model_tokens += 1
                _after_model_token(e, may_close[j], tokenizer, probe, limits, max_new_tokens, max_positions, ends)
            fed.append(e.tokens[-1])
        keep = [j for j, e in enumerate(live) if e.end is None]
        if not keep:
            return
        if len(keep) < len(live):  # finished episodes leave the batch and the cache
            index = torch.tensor(keep, device=device)
            cache.batch_select_indices(index)
            attention, position = attention[index], position[index]
            live, fed = [live[j] for j in keep], [fed[j] for j in keep]
        attention = torch.cat([attention, attention.new_ones(len(live), 1)], dim=1)
        logits = model(input_ids=torch.tensor(fed, device=device)[:, None], attention_mask=attention,
                       position_ids=position[:, None], past_key_values=cache, use_cache=True).logits[:, -1]
        position = position + 1


def _after_model_token(e: _Episode, may_close: bool, tokenizer, probe: Probe, limits: ProbeLimits,
                       max_new_tokens: int, max_positions: int, ends: frozenset[int]) -> None:
    """End the turn where the protocol says it is over (`data_synthesis.episode`): finish the episode, or run its
    probe and queue the observation's tokens."""
    # the model's budget, or the model's positions: the token just sampled would be fed at position context + len
    out_of_tokens = tokens_left(e.model_tokens, max_new_tokens, e.context + len(e.tokens), max_positions) <= 0
    if not (may_close or out_of_tokens):
        return
    turn = turn_over(tokenizer.decode(e.tokens[e.turn_start:], skip_special_tokens=True),
                     stopped=e.tokens[-1] in ends, out_of_tokens=out_of_tokens)
    if turn is None:
        return
    e.end, e.answer = after_turn(turn, e.probes, limits, out_of_tokens)
    if e.end is not None:
        return
    encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    observation = observation_ids(probe(e.prompt, turn.sql), encode, limits)
    if not observation_fits(e.context + len(e.tokens), len(observation), max_positions):
        e.end = EpisodeEnd.TRUNCATED
        return
    e.probes += 1
    e.forced.extend(observation)
    e.turn_start = len(e.tokens) + len(observation)


def _sample(logits: torch.Tensor, temperature: float, top_p: float):
    """(token, log pi(token), H(pi)) per row, pi = softmax(logits / temperature) (the full tempered softmax, the
    pi_old the update scores); the token is drawn from its top-p nucleus. Greedy at temperature 0."""
    if temperature <= 0:
        token = logits.argmax(dim=-1)
        zeros = torch.zeros(len(token))
        return token, zeros, zeros
    log_p, entropy = tempered_log_softmax(logits, temperature)  # (b, V), (b,)
    p = log_p.exp()
    draw = p
    if top_p < 1.0:  # keep the smallest set of most likely tokens whose mass reaches top_p
        sorted_p, order = p.sort(dim=-1, descending=True)
        outside = sorted_p.cumsum(dim=-1) - sorted_p >= top_p  # (b, V) mass before this token already enough
        draw = torch.zeros_like(p).scatter(1, order, sorted_p.masked_fill(outside, 0.0))
    token = torch.multinomial(draw, 1)[:, 0]
    return token, log_p.gather(1, token[:, None])[:, 0].cpu(), entropy.cpu()


def _assemble(parts, tokenizer, record: bool) -> Rollout:
    pad = tokenizer.pad_token_id
    episodes = [e for _, _, eps in parts for e in eps]
    R = max(max(len(e.tokens) for e in episodes), 1)

    def rows(values) -> torch.Tensor:  # right-padded (N, R)
        return torch.tensor([v + [0] * (R - len(v)) for v in values])

    prompt_ids = left_pad_cat([ids for ids, _, _ in parts], pad)
    prompt_mask = left_pad_cat([m for _, m, _ in parts], 0)
    device = prompt_ids.device
    response_ids = torch.tensor([e.tokens + [pad] * (R - len(e.tokens)) for e in episodes], device=device)
    response_mask = rows([[1] * len(e.tokens) for e in episodes]).to(device)
    loss_mask = rows([e.is_model for e in episodes]).to(device)
    old = [rows([e.log_probs for e in episodes]).float().to(device),
           rows([e.entropies for e in episodes]).float().to(device)] if record else [None, None]
    return Rollout(prompt_ids, prompt_mask, response_ids, response_mask,
                   tokenizer.batch_decode([e.tokens for e in episodes], skip_special_tokens=True),
                   torch.tensor([e.model_tokens for e in episodes], device=device),
                   torch.tensor([e.end is EpisodeEnd.TRUNCATED for e in episodes], device=device), *old,
                   loss_mask=loss_mask, answers=[e.answer for e in episodes],
                   probes=torch.tensor([e.probes for e in episodes], device=device))
