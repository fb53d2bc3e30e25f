"""S_rm against a real OpenAI-compatible HTTP server on 127.0.0.1 (scripted answers, real protocol)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from fake_openai import FakeOpenAIServer

from data_synthesis.chat_client import ChatClient
from rewards.outcome import Status
from sirius_train.inference.candidates import Question
from sirius_train.inference.judge import PairwiseJudge
from sirius_train.inference.selector import Ballot, SelectorConfig, select

QUESTION = Question(7, "retail", "How many customers live in Paris?", "CREATE TABLE customers (id INTEGER, city TEXT);")
POOL = [Ballot("spec", "SELECT count(*) FROM customers WHERE city = 'Paris'", Status.OK, ((35,),)),
        Ballot("spec", "SELECT count(*) FROM customers", Status.OK, ((400,),)),
        Ballot("gen", "SELECT count(*) FROM customers", Status.OK, ((400,),)),
        Ballot("gen", "SELECT count(*) FROM customers WHERE city = 'Paris'", Status.OK, ((35,),)),
        Ballot("spec", "SELECT count(*) FROM customers WHERE city LIKE '%a%'", Status.OK, ((120,),))]


def sides(prompt: str) -> tuple[str, str]:
    a, b = re.findall(r"```sql\n(.*?)\n```", prompt, re.S)
    return a, b


def prefer_paris(messages, i):
    a, b = sides(messages[-1]["content"])
    return "A" if "Paris" in a and "Paris" not in b else "B" if "Paris" in b and "Paris" not in a else "A"


def test_judge_is_asked_both_orders_over_http():
    with FakeOpenAIServer(prefer_paris) as server:
        judge = PairwiseJudge(ChatClient(server.url, "judge")).for_question(QUESTION)
        selection = select(POOL, SelectorConfig(judge_top_k=2, judge_weight=0.5, margin=0.0), judge)
    prompts = [r["messages"][-1]["content"] for r in server.requests]
    pairs = [sides(p) for p in prompts]
    assert len(pairs) == 2 and pairs[0] == pairs[1][::-1]  # the same pair, both orders
    assert all(QUESTION.question in p and "(1 rows): [[35]]" in p and "(1 rows): [[400]]" in p for p in prompts)
    assert all(r["temperature"] == 0.0 for r in server.requests)
    winner = selection.classes[0]
    assert selection.index == 0 and winner.s_rm == 0.5  # 2/2 wins, weighted 0.5
    assert selection.classes[1].s_rm == 0.0


def test_position_biased_judge_changes_nothing():
    with FakeOpenAIServer(lambda messages, i: "A") as server:
        judge = PairwiseJudge(ChatClient(server.url, "judge")).for_question(QUESTION)
        with_judge = select(POOL, SelectorConfig(judge_weight=1.0), judge)
    without = select(POOL, SelectorConfig(judge_weight=1.0))
    assert [c.s_rm for c in with_judge.classes] == [0.5, 0.5, 0.5]
    assert with_judge.index == without.index


def test_unreadable_verdicts_are_skipped_not_guessed():
    with FakeOpenAIServer(lambda messages, i: "I cannot decide between A and B.") as server:
        judge = PairwiseJudge(ChatClient(server.url, "judge")).for_question(QUESTION)
        selection = select(POOL, SelectorConfig(), judge)
    assert all(c.s_rm == 0.0 for c in selection.classes)


def test_select_cli_with_llm_url_uses_the_judge(tmp_path, demo_db_root):
    pools = tmp_path / "pools.jsonl"
    pool = {"id": "q1", "db_id": "retail", "question": "How many customers live in Paris?",
            "candidates": [{"source": "s1", "sql": "SELECT count(*) FROM customers"},
                           {"source": "s2", "sql": "SELECT count(*) FROM customers WHERE city = 'Paris'"}]}
    pools.write_text(json.dumps(pool) + "\n")

    def run(*extra):
        out = tmp_path / "picks.jsonl"
        r = subprocess.run([sys.executable, "-m", "sirius_train.cli", "select", "--db-root", str(demo_db_root),
                            "--input", str(pools), "--output", str(out), "--quiet", *extra],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        return json.loads(out.read_text())

    assert run()["source"] == "s1"  # a 1-1 tie, no judge: input order
    with FakeOpenAIServer(prefer_paris) as server:
        picked = run("--llm-url", server.url, "--llm-model", "judge")
    assert picked["source"] == "s2" and picked["sql"].endswith("'Paris'")
    assert len(server.requests) == 2 and all(r["model"] == "judge" for r in server.requests)


def test_a_pair_counts_only_when_both_orders_gave_a_verdict():
    """A judge that answers only when Paris is shown first (and then says "A") would, counting each order
    alone, hand Paris every win on its position; with the pair skipped nobody scores."""
    def first_only(messages, i):
        a, b = sides(messages[-1]["content"])
        return "A" if "Paris" in a and "Paris" not in b else "no idea"

    with FakeOpenAIServer(first_only) as server:
        judge = PairwiseJudge(ChatClient(server.url, "judge")).for_question(QUESTION)
        selection = select(POOL, SelectorConfig(), judge)
    assert len(server.requests) == 6  # 3 classes: 3 pairs, both orders
    assert all(c.s_rm == 0.0 for c in selection.classes)
