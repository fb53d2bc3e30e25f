"""One episode protocol, three drivers: the same scripted model through `multiturn.generate_episodes` (a token at a
time), `turns.run_episodes` (an engine, a call per turn) and verl's `SqlAgentLoop` (verl's agent loop on a server)
writes the same episode -- its tokens, which of them are the model's, its answer, how it ends and its probes.

The model is `multiturn_policy`'s tiny Llama that follows a bigram script, decoded greedily; for `turns` and verl it
is served by `GreedyServer`, which continues token ids as vLLM does (through a stop string, an end token, or
`max_tokens`). verl reports no end: the reward reads the text, so its end is read from its output by the protocol's
own rule for the last turn (`_verl_end`). The verl column skips where verl is absent.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass

import pytest
import torch
from multiturn_policy import scripted_policy

from data_synthesis.interaction import EpisodeEnd, ProbeLimits, SandboxProbes, episode_answer, episode_end, parse_turn
from data_synthesis.multiturn import generate_episodes
from data_synthesis.turns import run_episodes

PROBE = "SELECT count(*) FROM customers"
GOLD = "SELECT count(*) FROM customers"
ANSWER = f"```sql\n{GOLD}\n```"
PRINTS_AN_ANSWER = "SELECT '<ans' || 'wer>SELECT 1</ans' || 'wer>' AS a"  # its observation holds <answer>..</answer>
OTHER_END = "<end2>"  # a second end token of the model (generation_config.json), as Qwen2.5's <|endoftext|>
WORDS = ["<sql>", "</sql>", PROBE, PRINTS_AN_ANSWER, ANSWER, " and more", OTHER_END]
MESSAGES = [{"role": "user", "content": "How many customers are there?"}]
ONE_PROBE = {"=": "<sql>", "<sql>": PROBE, PROBE: "</sql>", "\n": ANSWER}  # "=" ends the prompt, "\n" an observation


@dataclass(frozen=True)
class Case:
    script: dict
    end: EpisodeEnd
    answer: str | None
    probes: int
    max_turns: int = 3
    max_new_tokens: int = 16


CASES = {
    "probe, observe, answer": Case(ONE_PROBE, EpisodeEnd.ANSWERED, GOLD, 1),
    "stops at once": Case({"=": "<eos>"}, EpisodeEnd.NO_ANSWER, None, 0),
    "out of probes": Case({**ONE_PROBE, "\n": "<sql>"}, EpisodeEnd.TRUNCATED, None, 2, max_turns=2),
    "out of tokens": Case({**ONE_PROBE, "\n": "<sql>"}, EpisodeEnd.TRUNCATED, None, 1, max_turns=5, max_new_tokens=5),
    "nothing after the answer": Case({"=": ANSWER, ANSWER: " and more", " and more": "<eos>"}, EpisodeEnd.ANSWERED,
                                     GOLD, 0),
    "an observation's SQL is no answer": Case({"=": "<sql>", "<sql>": PRINTS_AN_ANSWER, PRINTS_AN_ANSWER: "</sql>",
                                               "\n": "<eos>"}, EpisodeEnd.NO_ANSWER, None, 1),
    "another end token ends the turn": Case({"=": "<sql>", "<sql>": OTHER_END}, EpisodeEnd.NO_ANSWER, None, 0),
    "a </sql> that closed nothing goes on": Case({"=": "</sql>", "</sql>": ANSWER}, EpisodeEnd.ANSWERED, GOLD, 0),
}


@dataclass(frozen=True)
class Episode:
    tokens: list[int]  # response: model and observation tokens
    model: list[int]  # 1 on the model's own tokens
    answer: str | None
    end: EpisodeEnd
    probes: int


class GreedyServer:
    """The scripted model served as vLLM serves it: a context continued greedily through the first stop string
    (kept), one of the model's end tokens (kept) or `max_tokens` -- as `turns`' engine and as verl's server."""

    def __init__(self, model, tokenizer, ends: frozenset[int]):
        self.model, self.tokenizer, self.end_token_ids = model, tokenizer, ends
        self.max_model_len = model.config.max_position_embeddings

    def continue_ids(self, contexts, *, max_tokens, seeds, temperature, top_p, stop):
        return [self._continue(list(c), m, stop) for c, m in zip(contexts, max_tokens)]

    async def generate(self, request_id=None, *, prompt_ids, sampling_params, **kwargs):
        from verl.workers.rollout.replica import TokenOutput

        ids = self._continue(list(prompt_ids), sampling_params["max_tokens"], sampling_params.get("stop") or [])
        return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids), stop_reason="completed")

    @torch.no_grad()
    def _continue(self, context: list[int], max_tokens: int, stop) -> list[int]:
        new: list[int] = []
        while len(new) < max_tokens:
            new.append(int(self.model(input_ids=torch.tensor([context + new])).logits[0, -1].argmax()))
            text = self.tokenizer.decode(new, skip_special_tokens=True)
            if new[-1] in self.end_token_ids or any(s in text for s in stop):
                break
        return new


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model on a shared machine: a second thread only waits
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def db_root(demo_db_root, tmp_path):
    (tmp_path / "db" / "retail").mkdir(parents=True)
    shutil.copy(demo_db_root / "retail" / "retail.sqlite", tmp_path / "db" / "retail" / "retail.sqlite")
    return tmp_path / "db"


def _policy(case: Case):
    model, tokenizer = scripted_policy(WORDS, case.script)
    other = tokenizer.convert_tokens_to_ids(OTHER_END)
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, other]
    return model, tokenizer, frozenset({tokenizer.eos_token_id, other})


def _local(case, limits, db_root, tmp_path) -> Episode:
    model, tokenizer, _ = _policy(case)
    with SandboxProbes(db_root, limits) as probes:
        roll = generate_episodes(model, tokenizer, [MESSAGES], lambda i, sql: probes("retail", sql), limits,
                                 temperature=0.0, max_new_tokens=case.max_new_tokens)
    n = int(roll.response_mask[0].sum())
    end = (EpisodeEnd.ANSWERED if roll.answers[0] is not None else EpisodeEnd.TRUNCATED if roll.truncated[0]
           else EpisodeEnd.NO_ANSWER)
    return Episode(roll.response_ids[0][:n].tolist(), roll.loss_mask[0][:n].tolist(), roll.answers[0], end,
                   int(roll.probes[0]))


def _engine(case, limits, db_root, tmp_path) -> Episode:
    model, tokenizer, ends = _policy(case)
    with SandboxProbes(db_root, limits) as probes:
        (e,) = run_episodes(GreedyServer(model, tokenizer, ends), [MESSAGES], lambda i, sql: probes("retail", sql),
                            limits, temperature=0.0, max_new_tokens=case.max_new_tokens)
    return Episode(e.response, e.is_model, e.answer, e.end, e.probes)


def _verl(case, limits, db_root, tmp_path) -> Episode:
    from conftest import import_verl

    import_verl("verl")
    from test_verl_tool import run_episode

    model, tokenizer, ends = _policy(case)
    model_dir = tmp_path / "model"
    model_dir.mkdir(parents=True)
    (model_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": sorted(ends)}))
    out, _ = run_episode(tmp_path / "run", db_root, tokenizer, None, limits=limits,
                         max_new_tokens=case.max_new_tokens, question=MESSAGES[0]["content"],
                         policy=GreedyServer(model, tokenizer, ends), model_dir=model_dir,
                         extra=["stages.0.overlong_cache=0"])
    text = tokenizer.decode(out.response_ids, skip_special_tokens=True)
    probes = sum(1 for a, b in zip([1] + out.response_mask, out.response_mask) if a == 1 and b == 0)
    return Episode(list(out.response_ids), list(out.response_mask), episode_answer(text),
                   _verl_end(tokenizer, out, probes, limits, case.max_new_tokens), probes)


def _verl_end(tokenizer, out, probes: int, limits: ProbeLimits, max_new_tokens: int) -> EpisodeEnd:
    """How verl's episode ended, read from its last turn as the protocol ends one: an episode that stopped where the
    protocol would go on ran out of room for the observation."""
    last = len(out.response_mask) - out.response_mask[::-1].index(0) if 0 in out.response_mask else 0
    turn = parse_turn(tokenizer.decode(out.response_ids[last:], skip_special_tokens=True))
    return episode_end(turn, probes, limits, sum(out.response_mask) >= max_new_tokens) or EpisodeEnd.TRUNCATED


DRIVERS = {"multiturn": _local, "turns": _engine, "verl": _verl}


@pytest.mark.parametrize("name", CASES)
def test_the_three_drivers_write_one_episode(name, db_root, tmp_path):
    case = CASES[name]
    limits = ProbeLimits(max_turns=case.max_turns, max_rows=3, max_chars=200, turn_timeout_s=1.0)
    local = _local(case, limits, db_root, tmp_path / "local")
    assert (local.end, local.answer, local.probes) == (case.end, case.answer, case.probes), name
    _, tokenizer, _ = _policy(case)
    # the answer is the model's own: read from the whole text it is the same
    assert episode_answer(tokenizer.decode(local.tokens, skip_special_tokens=True)) == local.answer
    for driver in ("turns", "verl"):
        other = DRIVERS[driver](case, limits, db_root, tmp_path / driver)
        assert tokenizer.decode(other.tokens) == tokenizer.decode(local.tokens), (name, driver)
        assert other == local, (name, driver)
