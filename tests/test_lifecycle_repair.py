"""Typed LLM repair and recovery against a real OpenAI-compatible HTTP server on 127.0.0.1.

The model is scripted; the protocol, the sandbox and the databases are real. The assertions are about
what the corrector is *told*: the engine's error verbatim, a rewrite request for a timeout, the
diagnosis for an empty result, condensed feedback for recovery.
"""

from __future__ import annotations

import pytest
from fake_openai import FakeOpenAIServer

from data_synthesis.chat_client import ChatClient
from data_synthesis.schema import read_schema
from rewards.executor import Executor
from rewards.outcome import Status
from rewards.sandbox import Limits
from sirius_train.inference.candidates import Candidate, Question
from sirius_train.inference.corrector import Corrector
from sirius_train.inference.lifecycle import Lifecycle, Task

GOOD = "SELECT name FROM customers WHERE city = 'Paris'"
SLOW = ("WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r WHERE x < 100000000) "
        "SELECT name FROM customers WHERE city = 'Paris' AND id IN (SELECT x FROM r)")


@pytest.fixture(scope="module")
def retail(demo_db_root):
    return read_schema(demo_db_root / "retail" / "retail.sqlite")


def task_with(retail, *sqls) -> Task:
    question = Question(1, "retail", "Which customers live in Paris?", retail.to_text())
    return Task(question, retail, [Candidate("spec", k, sql) for k, sql in enumerate(sqls)])


def fenced(sql: str) -> str:
    return f"```sql\n{sql}\n```"


def instructions(server) -> list[str]:
    return [r["messages"][-1]["content"] for r in server.requests]


def test_runtime_error_goes_to_the_corrector_verbatim(demo_db_root, retail):
    broken = "SELECT name FROM customers WHERE substr(city) = 'Paris'"
    task = task_with(retail, broken)
    with Executor(demo_db_root, workers=0) as executor:
        engine_error = executor.execute("retail", broken).error
        with FakeOpenAIServer(lambda messages, i: fenced(GOOD)) as server:
            Lifecycle(executor, Corrector(ChatClient(server.url, "fixer"))).run([task])
    [asked] = instructions(server)
    assert engine_error == "wrong number of arguments to function substr()"
    assert f"SQLite error (verbatim):\n{engine_error}\n" in asked and broken in asked
    messages = server.requests[0]["messages"]
    assert messages[-2] == {"role": "assistant", "content": fenced(broken)}  # the failed attempt is the model's turn
    assert task.question.question in messages[-3]["content"]
    candidate = task.candidates[0]
    assert candidate.sql == GOOD and candidate.outcome.status is Status.OK and candidate.dropped is None
    assert [e["step"] for e in candidate.events] == ["filter", "execute", "repair", "reexecute"]
    assert candidate.events[2]["engine_error"] == engine_error


def test_timeout_asks_for_an_intent_preserving_rewrite(demo_db_root, retail):
    task = task_with(retail, SLOW)
    with Executor(demo_db_root, workers=1, limits=Limits(timeout_s=0.3)) as executor:
        with FakeOpenAIServer(lambda messages, i: fenced(GOOD)) as server:
            Lifecycle(executor, Corrector(ChatClient(server.url, "fixer"))).run([task])
    [asked] = instructions(server)
    assert "did not finish within 0.3 seconds" in asked and "Do not change what it computes" in asked
    assert task.candidates[0].events[1]["status"] == "timeout"
    assert task.candidates[0].outcome.status is Status.OK


def test_empty_result_tries_operators_then_tells_the_llm_what_failed(demo_db_root, retail):
    nowhere = "SELECT name FROM customers WHERE city = 'Atlantis'"
    task = task_with(retail, nowhere)
    with Executor(demo_db_root, workers=0) as executor:
        with FakeOpenAIServer(lambda messages, i: fenced(GOOD)) as server:
            Lifecycle(executor, Corrector(ChatClient(server.url, "fixer"))).run([task])
    [asked] = instructions(server)
    assert "returned no rows" in asked
    assert "city is compared with 'Atlantis', which never occurs in that column" in asked
    assert "model-free rewrites tried without rows: relax_case, relax_containment" in asked
    steps = [(e["step"], e.get("operator")) for e in task.candidates[0].events]
    assert steps == [("filter", None), ("execute", None), ("repair", "relax_case"), ("repair", "relax_containment"),
                     ("repair", "llm"), ("reexecute", None)]
    assert task.candidates[0].outcome.status is Status.OK


def test_structural_fix_means_no_model_call(demo_db_root, retail):
    task = task_with(retail, "SELECT name FROM customers WHERE city = 'PARIS'")
    with Executor(demo_db_root, workers=0) as executor:
        with FakeOpenAIServer(lambda messages, i: fenced(GOOD)) as server:
            Lifecycle(executor, Corrector(ChatClient(server.url, "fixer"))).run([task])
    assert server.requests == []
    assert task.candidates[0].sql.endswith("'Paris'")


def test_recovery_gets_condensed_feedback_when_the_pool_collapses(demo_db_root, retail):
    task = task_with(retail, "SELECT nme FROM customers", "SELECT name FROM customers WHERE id < 0")
    seen = []

    def recover(question, feedback, n):
        seen.append((question.id, feedback, n))
        return [Candidate("spec", 9, GOOD, origin="recovery")]

    with Executor(demo_db_root, workers=0) as executor:
        Lifecycle(executor, recover=recover).run([task])
    [(qid, feedback, n)] = seen
    assert qid == 1 and n == 2
    assert feedback.splitlines() == ["- SELECT nme FROM customers -> filtered: unknown column: nme (not in customers)",
                                     "- SELECT name FROM customers WHERE id < 0 -> returned no rows"]
    recovered = task.candidates[-1]
    assert recovered.origin == "recovery" and recovered.outcome.status is Status.OK
    assert recovered.name == "spec#9(recovery)"


def test_a_dead_endpoint_loses_nothing(demo_db_root, retail):
    broken = "SELECT name FROM customers WHERE substr(city) = 'Paris'"
    task = task_with(retail, broken, GOOD)
    with Executor(demo_db_root, workers=0) as executor:
        with FakeOpenAIServer(lambda messages, i: "", fail_first=10) as server:
            client = ChatClient(server.url, "fixer", max_retries=0)
            Lifecycle(executor, Corrector(client)).run([task])
    failed, good = task.candidates
    assert "503" in failed.events[2]["error"] and failed.dropped.startswith("error: wrong number of arguments")
    assert good.outcome.status is Status.OK and good.dropped is None


def test_select_repair_with_llm_url_runs_the_recovery_step(demo_db_root, tmp_path):
    """`sirius select --repair --llm-url`: a pool whose every candidate fails (unknown column, runtime error the
    corrector cannot fix) is asked afresh with condensed negative feedback, and the recovered SQL is the pick."""
    import json

    from typer.testing import CliRunner

    from sirius_train.cli import app
    from sirius_train.commands.select import RECOVERY_SOURCE

    broken = "SELECT name FROM customers WHERE substr(city) = 'Paris'"
    pools = tmp_path / "pools.jsonl"
    pools.write_text(json.dumps({"id": "q", "db_id": "retail", "question": "Which customers live in Paris?",
                                 "candidates": [{"source": "a", "sql": "SELECT nme FROM customers"},
                                                {"source": "b", "sql": broken}]}) + "\n")

    def scripted(messages, i):  # the corrector repeats the failure; a fresh attempt told what failed gets it right
        return fenced(GOOD if "Earlier attempts failed" in messages[-1]["content"] else broken)

    out, trace = tmp_path / "picks.jsonl", tmp_path / "trace.jsonl"
    with FakeOpenAIServer(scripted) as server:
        result = CliRunner().invoke(app, ["select", "--db-root", str(demo_db_root), "--input", str(pools),
                                          "--output", str(out), "--trace", str(trace), "--repair", "--llm-url",
                                          server.url, "--quiet", "--workers", "0"])
        asked = instructions(server)
    assert result.exit_code == 0, result.output
    [feedback] = [p for p in asked if "Earlier attempts failed" in p]
    assert "- SELECT nme FROM customers -> filtered: unknown column: nme" in feedback
    assert f"- {broken} -> error: wrong number of arguments" in feedback
    pick = json.loads(out.read_text())
    assert pick["sql"] == GOOD and pick["source"] == RECOVERY_SOURCE
    [line] = trace.read_text().splitlines()
    recovered = [c for c in json.loads(line)["candidates"] if c["origin"] == "recovery"]
    assert recovered and all(c["events"][1]["step"] == "recovery" for c in recovered)
