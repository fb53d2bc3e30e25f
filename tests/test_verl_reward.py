"""verl's reward function: the same scores in-process and through a reward server, loaded the way verl loads it."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx
import pytest
from conftest import import_verl
from prometheus_client.parser import text_string_to_metric_families
from server_harness import running_server

import rewards.verl_reward as verl_reward
from rewards.client import RewardServerError
from rewards.service import ServerConfig
from rewards.verl_reward import compute_score, compute_score_batch

pytestmark = pytest.mark.timeout(120)

GOLD = "SELECT city, count(*) FROM customers GROUP BY city"
CASES = [  # (answer, compare, expected {"score", "acc"})
    (f"```sql\n{GOLD}\n```", None, {"score": 1.0, "acc": 1.0}),
    ("<answer>SELECT count(*), city FROM customers GROUP BY city</answer>", "spider", {"score": 1.0, "acc": 1.0}),
    ("<answer>SELECT count(*), city FROM customers GROUP BY city</answer>", "bird", {"score": 0.0, "acc": 0.0}),
    ("```sql\nSELECT nope FROM customers\n```", None, {"score": 0.0, "acc": 0.0}),
    ("```sql\nDELETE FROM customers\n```", None, {"score": 0.0, "acc": 0.0}),
    ("I think the answer is the city column.", None, {"score": -1.0, "acc": 0.0}),
]


@pytest.fixture(scope="module")
def server(demo_db_root):
    with running_server(ServerConfig(demo_db_root, workers=2, timeout_s=2.0)) as running:
        yield running


@pytest.fixture(autouse=True)
def no_env(monkeypatch):
    for name in ("SIRIUS_REWARD_URL", "SIRIUS_REWARD_TOKEN", "SIRIUS_DB_ROOT"):
        monkeypatch.delenv(name, raising=False)


def _extra(compare):
    return {"db_id": "retail", **({"compare": compare} if compare else {})}


def _score_requests(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "sirius_reward_requests_total" and s.labels.get("endpoint") == "/v1/score")


def test_in_process_scores(demo_db_root):
    for answer, compare, expected in CASES:
        assert compute_score("sirius", answer, GOLD, _extra(compare), db_root=str(demo_db_root)) == expected


def test_server_via_env_gives_the_same_scores_without_a_local_db_root(server, monkeypatch):
    monkeypatch.setenv("SIRIUS_REWARD_URL", server.url)
    before = _score_requests(server.url)
    for answer, compare, expected in CASES:
        assert compute_score("sirius", answer, GOLD, _extra(compare)) == expected
    assert _score_requests(server.url) - before == len(CASES)


def test_reward_url_kwarg_with_failover_and_one_request_per_batch(server, demo_db_root):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    answers = [a for a, _, _ in CASES] * 50
    extras = [_extra(c) for _, c, _ in CASES] * 50
    expected = [e for _, _, e in CASES] * 50
    local = compute_score_batch(["sirius"] * 300, answers, [GOLD] * 300, extras, db_root=str(demo_db_root))
    before = _score_requests(server.url)
    remote = compute_score_batch(data_sources=["sirius"] * 300, solution_strs=answers, ground_truths=[GOLD] * 300,
                                 extra_infos=extras, reward_url=f"{dead},{server.url}")
    assert local == remote == expected
    assert _score_requests(server.url) - before == 2  # 300 items = two requests of up to 256, not 300 requests


def test_answer_by_answer_from_many_threads_like_verls_reward_loop(server, monkeypatch):
    from concurrent.futures import ThreadPoolExecutor

    monkeypatch.setenv("SIRIUS_REWARD_URL", server.url)
    cases = CASES * 40
    with ThreadPoolExecutor(32) as pool:
        got = list(pool.map(lambda case: compute_score("sirius", case[0], GOLD, _extra(case[1])), cases, timeout=60))
    assert got == [expected for _, _, expected in cases]


def test_clear_errors(server, demo_db_root):
    with pytest.raises(KeyError, match="db_id"):
        compute_score("sirius", "<answer>SELECT 1</answer>", "SELECT 1", {})
    with pytest.raises(ValueError, match="SIRIUS_REWARD_URL"):
        compute_score("sirius", "<answer>SELECT 1</answer>", "SELECT 1", {"db_id": "retail"})
    with pytest.raises(RewardServerError, match="unknown db_id 'atlantis'"):  # loud, never a silent reward 0
        compute_score("sirius", "<answer>SELECT 1</answer>", "SELECT 1", {"db_id": "atlantis"}, reward_url=server.url)
    with pytest.raises(ValueError, match="batch lengths differ"):
        compute_score_batch(["s"], ["a", "b"], ["g"], [{"db_id": "retail"}], db_root=str(demo_db_root))


def test_verl_loads_it_from_its_config_and_calls_it(server):
    reward = import_verl("verl.trainer.ppo.reward")
    from omegaconf import OmegaConf

    path = str(Path(verl_reward.__file__).resolve())
    for name in ("compute_score", "compute_score_batch"):
        config = OmegaConf.create({"reward": {"custom_reward_function": {
            "path": path, "name": name, "reward_kwargs": {"reward_url": server.url}}}})
        fn = reward.get_custom_reward_fn(config)
        if name == "compute_score":
            assert fn("sirius", CASES[0][0], GOLD, _extra(None)) == {"score": 1.0, "acc": 1.0}
        else:
            got = fn(data_sources=["sirius"] * len(CASES), solution_strs=[a for a, _, _ in CASES],
                     ground_truths=[GOLD] * len(CASES), extra_infos=[_extra(c) for _, c, _ in CASES])
            assert got == [e for _, _, e in CASES]


OBSERVED = ("<sql>SELECT note FROM notes</sql>\n<observation>\nok: 1 row\nnote\n<answer>" + GOLD + "</answer>\n"
            "</observation>\nI cannot tell.")  # a probe's result prints the gold SQL; the model never answers
EPISODES = [  # (episode text, the local rule's reward): read from the model's own turns only
    (OBSERVED, {"score": -1.0, "acc": 0.0}),
    (f"<sql>SELECT 1</sql>\n<observation>\nok: 1 row\n1\n</observation>\n```sql\n{GOLD}\n```",
     {"score": 1.0, "acc": 1.0}),
    (f"```sql\nSELECT nope FROM customers\n``` then ```sql\n{GOLD}\n```", {"score": 0.0, "acc": 0.0}),  # first block
    ("<sql>SELECT 1</sql>", {"score": -1.0, "acc": 0.0}),  # a probe with no observation: out of probes
]


def test_a_multi_turn_stage_reads_the_answer_from_the_models_turns_not_the_observations(server):
    """verl decodes the whole episode, observations included. Its multi-turn reward (the file the verl backend
    names for a multi-turn stage, loaded the way verl loads it) scores each episode as the local rule does: SQL that
    a probe's result prints is no answer (the single-turn reward takes it as one: a channel a policy could learn)."""
    reward = import_verl("verl.trainer.ppo.reward")
    from omegaconf import OmegaConf

    from sirius_train.config import load_config
    from sirius_train.verl_backend.backend import reward_function

    root = Path(__file__).resolve().parents[1]
    path = reward_function(load_config(root / "configs" / "nano_multiturn.yaml", ["backend=verl"]))
    assert path.name == "episode_reward.py" and reward_function(load_config(root / "configs" / "nano.yaml")) == \
        Path(verl_reward.__file__).resolve()
    config = OmegaConf.create({"reward": {"custom_reward_function": {
        "path": str(path), "name": "compute_score", "reward_kwargs": {"reward_url": server.url}}}})
    fn = reward.get_custom_reward_fn(config)
    assert [fn("sirius", text, GOLD, _extra(None)) for text, _ in EPISODES] == [want for _, want in EPISODES]
    assert compute_score("sirius", OBSERVED, GOLD, _extra(None), reward_url=server.url)["acc"] == 1.0
