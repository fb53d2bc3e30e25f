"""The multi-turn episode protocol: every decision about an episode, made once, for the three drivers that run one.

`multiturn` (an HF model, a token at a time), `turns` (an engine, a call per turn) and verl's agent loop
(`sirius_train.verl_backend.sql_tool.SqlAgentLoop`) each sample, probe and tokenize in their own way; what they
decide is asked here, so the same model writes the same episode on each (tests/test_episode_protocol.py):

- a turn is over when it closes its first block, when the model stops (any of its end tokens, `end_ids`), or when
  it has no token left (`turn_over`); tokens sampled past the first closed block are not the model's turn
  (`first_close`): nothing is generated after a final answer;
- how it ends (`after_turn`): answered, with the answering turn's own SQL as the answer (never text of an
  observation: `interaction.episode_answer` reads the same from a whole text), no answer, or truncated; else the
  turn's probe runs;
- the observation is `interaction.observation_segment` cut to `observation_tokens` (`observation_ids`), and is
  appended only if a model token still fits after it (`observation_fits`);
- the model's own tokens are kept to `max_new_tokens`, observations aside; the context (positions, or verl's
  response budget) holds both (`tokens_left`).

Pure: no model, engine, tokenizer or database (a driver passes its own `encode`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from data_synthesis.interaction import (OBSERVATION_CLOSE, OBSERVATION_OPEN, EpisodeEnd, ParsedTurn, ProbeLimits,
                                        TurnKind, episode_end, fit_observation, observation_segment, parse_turn)

Encode = Callable[[str], list[int]]  # text -> token ids, no special tokens added


def end_ids(eos: int | None, more: int | Iterable[int] | None = None) -> frozenset[int]:
    """Every token that ends a turn: the tokenizer's EOS and each EOS id of the model's generation config (vLLM
    stops on each: Qwen2.5's <|endoftext|> beside <|im_end|>), so a driver never goes on past one.

    >>> sorted(end_ids(2, [2, 7])), sorted(end_ids(2, 5)), sorted(end_ids(None))
    ([2, 7], [2, 5], [])
    """
    extra = [] if more is None else [more] if isinstance(more, int) else list(more)
    return frozenset(t for t in [eos, *extra] if t is not None)


def tokens_left(model_tokens: int, max_new_tokens: int, used: int, room: int) -> int:
    """Tokens the model may still sample: its own budget counts its tokens only, the context's `room` (the
    model's positions, or verl's response budget) counts the `used` tokens of both kinds.

    >>> tokens_left(3, 8, used=10, room=100), tokens_left(3, 8, used=98, room=100)
    (5, 2)
    """
    return min(max_new_tokens - model_tokens, room - used)


def turn_over(text: str, *, stopped: bool, out_of_tokens: bool) -> ParsedTurn | None:
    """The turn parsed, if it is over: it closed a block, the model stopped (an end token, or no token came), or
    no token is left; None: it goes on (a `</sql>` or backtick that closed nothing).

    >>> turn_over("<sql>SELECT 1</sql>", stopped=False, out_of_tokens=False).kind.value
    'probe'
    >>> turn_over("no </sql> here", stopped=False, out_of_tokens=False) is None
    True
    >>> turn_over("no </sql> here", stopped=True, out_of_tokens=False).kind.value
    'none'
    """
    turn = parse_turn(text)
    return turn if turn.kind is not TurnKind.NONE or stopped or out_of_tokens else None


def first_close(n: int, text_of: Callable[[int], str]) -> int:
    """The fewest of a turn's `n` new tokens whose text, `text_of(k)`, closes a block (`n` when none does): an
    engine samples past the close (to its stop string or EOS), the protocol's turn ends at it.

    >>> words = ["```sql\\nSELECT 1\\n", "```", " and more", "<eos>"]
    >>> first_close(4, lambda k: "".join(words[:k])), first_close(1, lambda k: "".join(words[:k]))
    (2, 1)
    """
    if parse_turn(text_of(n)).kind is TurnKind.NONE:
        return n
    low, high = 1, n  # a longer prefix of a closed turn stays closed
    while low < high:
        mid = (low + high) // 2
        low, high = (low, mid) if parse_turn(text_of(mid)).kind is not TurnKind.NONE else (mid + 1, high)
    return low


def after_turn(turn: ParsedTurn, probes: int, limits: ProbeLimits, out_of_tokens: bool
               ) -> tuple[EpisodeEnd | None, str | None]:
    """(how the episode ends, its answer) after a model turn that is over, `probes` probes run before it; an end
    of None: run the turn's probe (`turn.sql`) and observe. The answer is the answering turn's own SQL.

    >>> after_turn(parse_turn("```sql\\nSELECT 1\\n```"), 0, ProbeLimits(), False)[1]
    'SELECT 1'
    >>> after_turn(parse_turn("<sql>SELECT 1</sql>"), 0, ProbeLimits(), False)
    (None, None)
    """
    end = episode_end(turn, probes, limits, out_of_tokens)
    return end, turn.sql if end is EpisodeEnd.ANSWERED else None


def max_observation_chars(limits) -> int:
    """The longest observation a probe renders: the body (cut at `max_chars`; each neutralised `</observation>` in
    the data grows by one character) inside the block's tags and newlines.

    >>> max_observation_chars(ProbeLimits(max_chars=400))
    457
    """
    return (limits.max_chars + limits.max_chars // len(OBSERVATION_CLOSE) + len(OBSERVATION_OPEN)
            + len(OBSERVATION_CLOSE) + 2)


def observation_tokens(limits) -> int:
    """Tokens an observation may take: one per character of the longest one, with `observation_segment`'s two
    newlines (verl's response budget reserves this much per probe)."""
    return max_observation_chars(limits) + 2


def observation_ids(observation: str, encode: Encode, limits: ProbeLimits) -> list[int]:
    """The tokens that follow a probe turn: the observation's segment, its body cut so that it keeps to
    `observation_tokens` (a character may be several tokens: non-ASCII text under a byte-level tokenizer)."""
    fitted = fit_observation(observation, lambda text: len(encode(text)), observation_tokens(limits))
    return encode(observation_segment(fitted))


def observation_fits(used: int, observation: int, room: int) -> bool:
    """Whether an `observation` of that many tokens leaves a position for the model to answer in; else the
    episode is truncated before it.

    >>> observation_fits(90, 9, 100), observation_fits(90, 10, 100)
    (True, False)
    """
    return used + observation < room
