"""Pass-rate estimation: exact rates through a real OpenAI-protocol server, HF generate, and kill-and-resume."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fake_openai import FakeOpenAIServer
from test_samplers import _tiny_model

from data_synthesis.difficulty import CacheError, estimate, estimate_pass_rates, prompt_for
from data_synthesis.records import Example, write_examples
from data_synthesis.samplers import HFSampler, OpenAISampler
from data_synthesis.sqlgen.synthesize import synthesize

ROOT = Path(__file__).resolve().parents[1]
K = 8


def _pool(demo_db_root, n=12) -> list[Example]:
    return synthesize(demo_db_root / "retail" / "retail.sqlite", n, seed=5)


def _expected(i: int) -> float:
    """Example i's scripted pass rate: all right, half right, one right, no SQL at all."""
    return [1.0, 0.5, 1 / K, 0.0][i % 4]


def _answerer(pool: list[Example], delay_s: float = 0.0):
    index = {e.question: i for i, e in enumerate(pool)}

    def answer(messages, j):
        time.sleep(delay_s)
        i = index[messages[-1]["content"].split("Question: ")[-1]]
        gold = pool[i].gold_sql
        right = j < round(_expected(i) * K)
        if i % 4 == 3:
            return "I am not sure."  # format failure
        return f"Let me think.\n```sql\n{gold if right else 'SELECT 1 FROM customers WHERE 0'}\n```"
    return answer


def test_exact_pass_rates_over_http_and_cache_reuse(demo_db_root, tmp_path):
    pool = _pool(demo_db_root)
    with FakeOpenAIServer(_answerer(pool)) as server:
        sampler = OpenAISampler(server.url, "policy", concurrency=4)
        cache = tmp_path / "cache.jsonl"
        rates = estimate_pass_rates(pool, sampler, demo_db_root, K, cache_path=cache, batch_size=5, seed=3)
        assert rates == {e.id: _expected(i) for i, e in enumerate(pool)}
        first = len(server.requests)
        assert first == len(pool)
        # the prompt is the training prompt: schema from the file, the question, one request per example
        assert prompt_for(pool[0], demo_db_root) in [r["messages"] for r in server.requests]
        # prompt i seeded 3 + i whatever its chunk; its request seed (3 + i) * K keeps answer j on its own stream
        assert sorted(r["seed"] for r in server.requests) == [(3 + i) * K for i in range(len(pool))]
        assert {r["n"] for r in server.requests} == {K}
        assert estimate_pass_rates(pool, sampler, demo_db_root, K, cache_path=cache, batch_size=5, seed=3) == rates
        assert len(server.requests) == first  # everything came from the cache
        estimate_pass_rates(pool, sampler, demo_db_root, K, cache_path=cache, batch_size=5, seed=3,
                            temperature=0.7)
        assert len(server.requests) == 2 * first  # a different sampling setting is a different estimate
    details = estimate(pool[:4], sampler, demo_db_root, K, cache_path=cache, batch_size=5, seed=3)
    assert details[3].format_failures == K and details[1].statuses == {"ok": K // 2, "empty": K // 2}


def test_kill_and_resume_gives_the_same_rates(demo_db_root, tmp_path):
    pool = _pool(demo_db_root, 24)
    pool_path, cache = tmp_path / "pool.jsonl", tmp_path / "cache.jsonl"
    write_examples(pool_path, pool)
    script = (
        "import sys\n"
        "from data_synthesis.difficulty import estimate_pass_rates\n"
        "from data_synthesis.records import read_examples\n"
        "from data_synthesis.samplers import OpenAISampler\n"
        "pool = read_examples(sys.argv[1])\n"
        "estimate_pass_rates(pool, OpenAISampler(sys.argv[2], 'policy'), sys.argv[3], 8, cache_path=sys.argv[4],\n"
        "                    batch_size=2, seed=11)\n"
    )
    with FakeOpenAIServer(_answerer(pool, delay_s=0.03)) as server:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        proc = subprocess.Popen([sys.executable, "-c", script, str(pool_path), server.url, str(demo_db_root),
                                 str(cache)], env=env)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            if cache.exists() and cache.read_text().count("\n") >= 6:
                break
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait() == -signal.SIGKILL
        lines = cache.read_bytes().split(b"\n")
        cached = {json.loads(line)["id"] for line in lines[:-1]}
        assert 6 <= len(cached) < len(pool), "the run must be killed mid-estimation"
        # chunks of 2 not fully cached are sampled again, and only those (the resumed run asks under another
        # served-model name, which is not part of the cache key, so its requests are told apart exactly)
        expected_requests = sum(2 for s in range(0, len(pool), 2)
                                if not {pool[s].id, pool[s + 1].id} <= cached)
        rates = estimate_pass_rates(pool, OpenAISampler(server.url, "resumed"), demo_db_root, 8, cache_path=cache,
                                    batch_size=2, seed=11)
        assert sum(r["model"] == "resumed" for r in server.requests) == expected_requests
    assert rates == {e.id: _expected(i) for i, e in enumerate(pool)}
    assert sum(1 for _ in cache.open()) == len(pool)  # one line per example, no duplicates


def test_torn_cache_tail_is_repaired_and_a_broken_line_is_named(demo_db_root, tmp_path):
    pool = _pool(demo_db_root, 4)
    cache = tmp_path / "cache.jsonl"
    with FakeOpenAIServer(_answerer(pool)) as server:
        sampler = OpenAISampler(server.url, "policy")
        estimate_pass_rates(pool, sampler, demo_db_root, K, cache_path=cache, batch_size=1)
        text = cache.read_text().splitlines(keepends=True)
        cache.write_text("".join(text[:2]) + text[2][:25])  # killed while writing line 3
        rates = estimate_pass_rates(pool, sampler, demo_db_root, K, cache_path=cache, batch_size=1)
        assert len(server.requests) == 4 + 2
    assert rates == {e.id: _expected(i) for i, e in enumerate(pool)}
    assert all(json.loads(line) for line in cache.read_text().splitlines())
    cache.write_text(cache.read_text().replace("\n", "\n{oops\n", 1))
    with pytest.raises(CacheError, match=r"cache.jsonl:2: not an estimate line"):
        estimate_pass_rates(pool, sampler, demo_db_root, K, cache_path=cache)


def test_hf_generate_sampler_estimates(demo_db_root, tmp_path):
    model, tokenizer = _tiny_model()
    sampler = HFSampler(model, tokenizer, batch_size=8)
    pool = [Example(f"x{i}", "retail", q, "SELECT COUNT(*) FROM orders")
            for i, q in enumerate(["How many orders?", "Count orders."])]
    details = estimate(pool, sampler, demo_db_root, 4, max_new_tokens=6, seed=1, batch_size=2,
                       cache_path=tmp_path / "c.jsonl")
    # a randomly initialised model writes no SQL block: every answer is a format failure, p = 0
    assert [(d.k, d.correct, d.format_failures, d.gold_status) for d in details] == [(4, 0, 4, "ok")] * 2
    assert estimate_pass_rates(pool, sampler, demo_db_root, 4, max_new_tokens=6, seed=1, batch_size=2,
                               cache_path=tmp_path / "c.jsonl") == {"x0": 0.0, "x1": 0.0}


def test_missing_database_is_reported_before_sampling(demo_db_root):
    class Refuse:
        def sample(self, *a, **k):
            raise AssertionError("must not sample")

    with pytest.raises(LookupError, match=r"no database under .* for db_id\(s\) \['nope'\]"):
        estimate_pass_rates([Example("1", "nope", "q", "SELECT 1")], Refuse(), demo_db_root)
