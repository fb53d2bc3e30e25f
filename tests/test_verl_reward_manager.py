"""Our execution reward inside verl's own DAPO reward manager, on real token ids from a real tokenizer.

The manager is built the way verl's reward loop builds it (`verl.trainer.ppo.reward.load_reward_manager`)
from the config our overrides compose to, so the reward file, its kwargs and the overlong buffer all
come from what `sirius train --backend verl` would launch. Responses are token ids decoded by verl.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import import_verl
from server_harness import running_server

import_verl("verl")

from verl import DataProto  # noqa: E402
from verl.trainer.ppo.reward import load_reward_manager  # noqa: E402

from rewards.service import ServerConfig  # noqa: E402
from sirius_train.algorithms.dapo import overlong_penalty  # noqa: E402
from sirius_train.config import load_config  # noqa: E402
from sirius_train.local.model import train_tokenizer  # noqa: E402
from sirius_train.verl_backend.backend import plan_stage  # noqa: E402
from sirius_train.verl_backend.compose import compose_verl_config  # noqa: E402

pytestmark = [pytest.mark.verl, pytest.mark.timeout(180)]
NANO = Path(__file__).resolve().parents[1] / "configs" / "nano.yaml"
GOLD = "SELECT city, count(*) FROM customers GROUP BY city"
L_MAX, L_CACHE = 24, 6


@pytest.fixture(scope="module")
def tokenizer():
    texts = [f"```sql\n{GOLD}\n```", "```sql\nSELECT name FROM customers\n```", "I do not know"] * 30
    return train_tokenizer(texts, 400)


def _manager(tokenizer, db_root: Path, tmp: Path, *extra: str):
    cfg = load_config(NANO, ["backend=verl", f"data.db_root={db_root}", f"stages.0.max_new_tokens={L_MAX}",
                             f"stages.0.overlong_cache={L_CACHE}", *extra])
    plan = plan_stage(cfg, 1, cfg.stages[0], tmp / "c.parquet", tmp / "model", tmp / "stage1", tmp / "e.parquet")
    return load_reward_manager(compose_verl_config(plan.overrides), tokenizer)


def _item(tokenizer, answer: str, length: int) -> DataProto:
    """One rollout as verl stores it: prompt ids, right-padded response ids, attention mask over both."""
    ids = tokenizer(answer, add_special_tokens=False)["input_ids"]
    filler = tokenizer(" know", add_special_tokens=False)["input_ids"][:1]  # plain text after the answer
    ids = ids + filler * (length - len(ids))
    assert len(ids) == length
    response = torch.full((L_MAX,), tokenizer.pad_token_id)
    response[:length] = torch.tensor(ids)
    prompt = torch.tensor(tokenizer("how many customers per city?", add_special_tokens=False)["input_ids"])
    mask = torch.cat([torch.ones_like(prompt), (torch.arange(L_MAX) < length).long()])
    return DataProto.from_dict(
        tensors={"prompts": prompt[None], "responses": response[None], "attention_mask": mask[None]},
        non_tensors={"data_source": np.array(["sirius-sql"], dtype=object),
                     "reward_model": np.array([{"style": "rule", "ground_truth": GOLD}], dtype=object),
                     "extra_info": np.array([{"db_id": "retail", "compare": "bird"}], dtype=object)})


def _score(manager, item) -> dict:
    return manager.loop.run_until_complete(manager.run_single(item))


def test_in_process_reward_through_verls_dapo_manager(tokenizer, demo_db_root, tmp_path):
    manager = _manager(tokenizer, demo_db_root, tmp_path)
    assert type(manager).__name__ == "SiriusDAPORewardManager" and manager.max_resp_len == L_MAX
    correct = f"```sql\n{GOLD}\n```"
    shortest = len(tokenizer(correct, add_special_tokens=False)["input_ids"])
    for length in range(shortest, L_MAX + 1):  # every length verl can produce (it truncates at L_MAX)
        result = _score(manager, _item(tokenizer, correct, length))
        assert float(result["reward_score"]) == pytest.approx(1.0 + overlong_penalty(length, L_MAX, L_CACHE), abs=1e-6)
        assert result["reward_extra_info"]["acc"] == 1.0  # what algorithm.filter_groups.metric=acc reads
    wrong = _score(manager, _item(tokenizer, "```sql\nSELECT name FROM customers\n```", 12))
    assert (float(wrong["reward_score"]), wrong["reward_extra_info"]["acc"]) == (0.0, 0.0)
    no_sql = _score(manager, _item(tokenizer, "I do not know", L_MAX))
    assert float(no_sql["reward_score"]) == pytest.approx(-1.0 - 1.0)  # format failure, plus truncated at L_max
    assert no_sql["reward_extra_info"]["acc"] == 0.0


def test_reward_server_when_configured(tokenizer, demo_db_root, tmp_path, monkeypatch):
    monkeypatch.delenv("SIRIUS_REWARD_URL", raising=False)
    missing = tmp_path / "no_databases_here"  # scored in-process, every answer would be an unknown-db error
    with running_server(ServerConfig(demo_db_root, workers=1, timeout_s=2.0)) as server:
        manager = _manager(tokenizer, missing, tmp_path, f"reward.url={server.url}")
        result = _score(manager, _item(tokenizer, f"```sql\n{GOLD}\n```", 16))
        assert float(result["reward_score"]) == 1.0 and result["reward_extra_info"]["acc"] == 1.0
        wrong = _score(manager, _item(tokenizer, "```sql\nSELECT name FROM customers\n```", 12))
        assert float(wrong["reward_score"]) == 0.0


def test_a_multi_turn_episode_is_measured_by_the_models_own_tokens(tokenizer, demo_db_root, tmp_path):
    """Observations sit in verl's response (attention mask 1, response_mask 0): the overlong buffer counts only the
    model's tokens against max_new_tokens, as the local rollout does (verl's own manager counts both)."""
    manager = _manager(tokenizer, demo_db_root, tmp_path)
    correct = f"```sql\n{GOLD}\n```"
    for own in (L_MAX - L_CACHE, L_MAX - 2):  # before the buffer, and inside it
        item = _item(tokenizer, correct, L_MAX)  # the whole room used: answer + filler standing in for observations
        mask = torch.zeros(1, L_MAX, dtype=torch.int64)
        mask[0, :own] = 1
        item.batch["response_mask"] = mask
        result = _score(manager, item)
        assert float(result["reward_score"]) == pytest.approx(1.0 + overlong_penalty(own, L_MAX, L_CACHE), abs=1e-6)
        assert result["reward_extra_info"]["overlong"] == (own > L_MAX - L_CACHE)


def _as_the_agent_loop_scores_it(output, gold: str) -> DataProto:
    """One episode as verl's `AgentLoopWorker._compute_score` hands it to the reward loop (the path of every run
    without a reward model): prompt and response ids unpadded, an attention mask of ones over both, no
    `response_mask`, and the loop's `extra_fields` as `tool_extra_fields`."""
    prompt, response = torch.tensor(output.prompt_ids), torch.tensor(output.response_ids)
    ids = torch.cat([prompt, response])
    return DataProto.from_dict(
        tensors={"prompts": prompt[None], "responses": response[None], "input_ids": ids[None],
                 "attention_mask": torch.ones_like(ids)[None]},
        non_tensors={"data_source": np.array(["sirius-sql"], dtype=object),
                     "reward_model": np.array([{"style": "rule", "ground_truth": gold}], dtype=object),
                     "extra_info": np.array([{"db_id": "retail", "compare": "bird"}], dtype=object),
                     "tool_extra_fields": np.array([output.extra_fields], dtype=object)})


def test_an_episode_from_our_agent_loop_is_shaped_on_the_models_own_tokens(demo_db_root, tmp_path):
    """End to end on verl's streaming reward path: `SqlAgentLoop` runs a probe and an answer whose own tokens sit
    half-way into the cache (local penalty -0.5) around a long observation; the manager gets the episode as verl's
    agent loop sends it (no `response_mask`) and must give 1 - 0.5, not the -1 of the whole response counted
    against `max_new_tokens`."""
    from test_verl_tool import episode_tokenizer, run_episode

    tokenizer = episode_tokenizer()
    gold = "SELECT count(*) FROM customers WHERE city = 'Paris'"
    probe_turn, answer_turn = "<sql>SELECT id FROM orders</sql>", f"```sql\n{gold}\n```"
    own = sum(len(tokenizer.encode(t, add_special_tokens=False)) for t in (probe_turn, answer_turn))
    cache = 16
    budget = own + cache // 2
    out, policy = run_episode(tmp_path, demo_db_root, tokenizer, [probe_turn, answer_turn + tokenizer.eos_token],
                              max_new_tokens=budget, extra=[f"stages.0.overlong_cache={cache}"])
    assert sum(out.response_mask) == own and len(out.response_ids) > budget + 10  # a long observation between
    manager = load_reward_manager(policy.config, tokenizer)
    result = _score(manager, _as_the_agent_loop_scores_it(out, gold))
    assert overlong_penalty(own, budget, cache) == -0.5
    assert float(result["reward_score"]) == pytest.approx(1.0 - 0.5)
    info = result["reward_extra_info"]
    assert info["acc"] == 1.0 and info["overlong_reward"] == pytest.approx(-0.5) and info["overlong"]
