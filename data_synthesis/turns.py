"""Multi-turn episodes on an engine that continues token sequences (vLLM): one engine call per turn.

The verl backend estimates pass rates and evaluates on vLLM engines, which cannot host `multiturn`'s loop (one
HF KV cache, observations teacher-forced token by token). Here, as in verl's agent loop on its servers, every
live episode's whole context -- prompt with the probe instructions, its tokens so far, observations -- goes to the
engine each round, which samples until `</sql>`, EOS, the episode's token budget or the model's positions. The
turn is cut where its first block closes, parsed and ended by the protocol `multiturn` and verl's agent loop follow
too (`data_synthesis.episode`); a probe's observation joins the context as tokens. The text of an
episode is what a local rollout would write: probes, observations, final answer.

An engine (`TokenEngine`) has a `tokenizer`, `max_model_len` and `continue_ids`; `VLLMSampler` and `HFSampler`
are engines. Each request of episode j of prompt i at turn t has its own seed, so an episode depends only on its
prompt and the call's seed, never on the other requests of a call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from data_synthesis.episode import (after_turn, end_ids, first_close, observation_fits, observation_ids, tokens_left,
                                    turn_over)
from data_synthesis.interaction import PROBE_CLOSE, EpisodeEnd, ProbeLimits, with_probe_instructions
from data_synthesis.prompts import chat_text
from data_synthesis.samplers import request_seed

Probe = Callable[[int, "str | None"], str]  # (prompt index, probe SQL) -> observation text


class TokenEngine(Protocol):
    tokenizer: object
    max_model_len: int
    # optional `end_token_ids`: every token id the engine stops on besides `tokenizer.eos_token_id` (vLLM stops on
    # each EOS id of the model's generation_config: Qwen2.5's <|endoftext|> beside <|im_end|>)

    def continue_ids(self, contexts: list[list[int]], *, max_tokens: list[int], seeds: list[int | None],
                     temperature: float, top_p: float, stop: list[str]) -> list[list[int]]:
        """For each context, the token ids sampled after it: through the first `stop` string (its tokens kept),
        EOS (kept) or `max_tokens`."""
        ...


@dataclass
class Episode:
    row: int  # episode j of prompt i is row i*n + j
    prompt: int  # index into the prompts of the call
    context: list[int]  # prompt ids, then every response token
    prompt_len: int
    is_model: list[int] = field(default_factory=list)  # per response token: 1 sampled, 0 observation
    turn_start: int = 0  # index into the response where the current model turn began
    probes: int = 0
    end: EpisodeEnd | None = None
    answer: str | None = None

    @property
    def response(self) -> list[int]:
        return self.context[self.prompt_len:]

    @property
    def model_tokens(self) -> int:
        return sum(self.is_model)


def run_episodes(engine: TokenEngine, prompts: list[list[dict]], probe: Probe, limits: ProbeLimits, *, n: int = 1,
                 temperature: float = 1.0, top_p: float = 1.0, max_new_tokens: int = 128,
                 seed: int | None = None) -> list[Episode]:
    """`n` episodes per prompt (rows i*n .. i*n+n-1 belong to prompt i); the prompts gain the probe instructions.
    `max_new_tokens` bounds each episode's sampled tokens, observations aside; the model's positions bound it all."""
    tokenizer = engine.tokenizer
    ends = end_ids(tokenizer.eos_token_id, getattr(engine, "end_token_ids", None))
    ids = [tokenizer(chat_text(tokenizer, with_probe_instructions(p, limits)), add_special_tokens=False)["input_ids"]
           for p in prompts]
    episodes = [Episode(r, r // n, list(ids[r // n]), len(ids[r // n])) for r in range(len(prompts) * n)]
    for e in episodes:
        if e.prompt_len >= engine.max_model_len:  # no position left to answer in
            e.end = EpisodeEnd.TRUNCATED
    turn = 0
    while live := [e for e in episodes if e.end is None]:
        budget = [_left(e, max_new_tokens, engine.max_model_len) for e in live]
        seeds = [_turn_seed(seed, e.row, n, turn, limits) for e in live]
        new = engine.continue_ids([e.context for e in live], max_tokens=budget, seeds=seeds,
                                  temperature=temperature, top_p=top_p, stop=[PROBE_CLOSE])
        for e, tokens in zip(live, new):
            _after_turn(e, tokens, tokenizer, probe, limits, max_new_tokens, engine.max_model_len, ends)
        turn += 1
    return episodes


def episode_text(tokenizer, episode: Episode) -> str:
    return tokenizer.decode(episode.response, skip_special_tokens=True)


def _left(e: Episode, max_new_tokens: int, max_positions: int) -> int:
    return tokens_left(e.model_tokens, max_new_tokens, len(e.context), max_positions)


def _turn_seed(seed: int | None, row: int, n: int, turn: int, limits: ProbeLimits) -> int | None:
    """Episode `row`'s request seed at `turn`: prompt i = row // n keeps `request_seed(seed, i, n)` + its episode
    index as a one-call sampler would seed it, spread over the turns an episode can take."""
    base = request_seed(seed, row // n, n)
    return None if base is None else (base + row % n) * (limits.max_turns + 1) + turn


def _after_turn(e: Episode, tokens: list[int], tokenizer, probe: Probe, limits: ProbeLimits, max_new_tokens: int,
                max_positions: int, ends: frozenset[int]) -> None:
    """Take the engine's tokens up to where the turn closed its first block; end the episode, or run its probe and
    append the observation, or (the turn not over, `data_synthesis.episode.turn_over`) let it go on next round."""
    def turn_text(k: int) -> str:
        return tokenizer.decode(e.response[e.turn_start:] + tokens[:k], skip_special_tokens=True)

    tokens = tokens[:first_close(len(tokens), turn_text)]
    e.context += tokens
    e.is_model += [1] * len(tokens)
    out_of_tokens = _left(e, max_new_tokens, max_positions) <= 0
    turn = turn_over(turn_text(0), stopped=not tokens or tokens[-1] in ends, out_of_tokens=out_of_tokens)
    if turn is None:
        return
    e.end, e.answer = after_turn(turn, e.probes, limits, out_of_tokens)
    if e.end is not None:
        return
    observation = observation_ids(probe(e.prompt, turn.sql),
                                  lambda text: tokenizer(text, add_special_tokens=False)["input_ids"], limits)
    if not observation_fits(len(e.context), len(observation), max_positions):
        e.end = EpisodeEnd.TRUNCATED
        return
    e.probes += 1
    e.context += observation
    e.is_model += [0] * len(observation)
    e.turn_start = len(e.response)


class TurnEpisodeSampler:
    """A `Sampler` of multi-turn episodes on a `TokenEngine` (`run_episodes`), probing each prompt's database through
    `probes(db_id, sql)` (`interaction.SandboxProbes` on `db_root`, or `interaction.ServerProbes` on the reward
    servers). Each text is the whole episode; `rewards.extract.extract_sql` reads its final answer."""

    multi_turn = True  # `sample` takes the prompts' `db_ids`

    def __init__(self, engine: TokenEngine, limits: ProbeLimits, probes: Callable[[str, "str | None"], str]):
        self.engine, self.limits, self.probes = engine, limits, probes
        self.prompt_format = getattr(engine, "prompt_format", None)

    def sample(self, prompts, n, *, db_ids, temperature=1.0, top_p=1.0, max_new_tokens=256, seed=None):
        if len(db_ids) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(db_ids)} db_ids")
        episodes = run_episodes(self.engine, prompts, lambda i, sql: self.probes(db_ids[i], sql), self.limits, n=n,
                                temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens, seed=seed)
        texts = [episode_text(self.engine.tokenizer, e) for e in episodes]
        return [texts[i * n:(i + 1) * n] for i in range(len(prompts))]


def episode_sampler(make_engine: Callable[[], TokenEngine], limits: ProbeLimits, db_root: str | None,
                    reward_url: str | None = None) -> TurnEpisodeSampler:
    """A `TurnEpisodeSampler` on the engine `make_engine` builds (in a Ray actor: picklable with `functools.partial`),
    probing as the verl rollout's SQL tool does: on the reward servers of `reward_url` while they answer, else in a
    read-only sandbox on `db_root`."""
    from data_synthesis.interaction import SandboxProbes, ServerProbes

    if not (db_root or reward_url):
        raise ValueError("multi-turn episodes need db_root (probes in a sandbox) or reward_url (on the servers)")
    local = SandboxProbes(db_root, limits) if db_root else None
    return TurnEpisodeSampler(make_engine(), limits, ServerProbes(reward_url, limits, local) if reward_url else local)
