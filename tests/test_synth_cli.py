"""`sirius synth pool | estimate | curriculum` end to end, against a real OpenAI-protocol server on 127.0.0.1."""

import json

import pyarrow.parquet as pq
import pytest
from fake_openai import FakeOpenAIServer
from typer.testing import CliRunner

from data_synthesis.records import read_examples
from data_synthesis.sqlgen.llm_writer import required_literals
from sirius_train.cli import app

runner = CliRunner()


def _run(*args):
    result = runner.invoke(app, ["synth", *map(str, args)])
    return result.exit_code, " ".join(result.output.split())  # rich wraps long lines


@pytest.fixture(scope="module")
def pool_file(demo_db_root, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cli")
    dataset = tmp / "dev.json"
    dataset.write_text(json.dumps([
        {"db_id": "library", "question": "How many books?", "query": "SELECT count(*) FROM books"},
        {"db_id": "library", "question": "Broken", "query": "SELECT nonsense FROM books"},
    ]))
    out = tmp / "pool.jsonl"
    code, output = _run("pool", "--db-root", demo_db_root, "--dataset", dataset, "--synthesize", 10,
                        "--synth-db", "retail", "--synth-db", "clinic", "--out", out, "--quiet")
    assert code == 0, output
    return out


def test_pool(pool_file):
    examples = read_examples(pool_file)
    assert len(examples) == 21 and {e.source for e in examples} == {"spider", "synth"}
    report = json.loads(pool_file.with_suffix(".report.json").read_text())
    assert report["kept"] == 21 and report["dropped"] == {"gold error": 1}
    assert report["dropped_examples"][0]["reason"] == "gold error: no such column: nonsense"
    assert report["synthesized"]["retail"]["made"] == 10


def test_pool_errors(demo_db_root, tmp_path):
    dataset = tmp_path / "d.json"
    dataset.write_text(json.dumps([{"db_id": "atlantis", "question": "q", "query": "SELECT 1"}]))
    code, output = _run("pool", "--db-root", demo_db_root, "--dataset", dataset, "--out", tmp_path / "p.jsonl")
    assert code == 2 and "['atlantis']" in output and "--skip-missing-dbs" in output
    code, output = _run("pool", "--db-root", demo_db_root, "--dataset", dataset, "--out", tmp_path / "p.jsonl",
                        "--skip-missing-dbs", "--quiet")
    assert code == 0 and read_examples(tmp_path / "p.jsonl") == []
    dataset.write_text("[{oops")
    code, output = _run("pool", "--db-root", demo_db_root, "--dataset", dataset, "--out", tmp_path / "p.jsonl")
    assert code == 2 and "not valid JSON" in output
    code, output = _run("pool", "--db-root", demo_db_root, "--out", tmp_path / "p.jsonl")
    assert code == 2 and "nothing to pool" in output


def _policy(pool_file):
    """A scripted policy: right on every sample for some questions, on some samples for others."""
    examples = read_examples(pool_file)
    gold = {e.question: e.gold_sql for e in examples}
    share = {e.question: [0, 1, 2, 3, 4][i % 5] / 4 for i, e in enumerate(examples)}

    def answer(messages, j):
        question = messages[-1]["content"].split("Question: ")[-1]
        if question not in gold:  # a mutant: the policy gets it right half the time
            return "```sql\nSELECT 1\n```" if j % 2 else "no idea"
        return f"```sql\n{gold[question] if j < share[question] * 4 else 'SELECT 2'}\n```"
    return answer, share


def test_estimate_then_curriculum(pool_file, demo_db_root, tmp_path):
    answer, share = _policy(pool_file)
    rates = tmp_path / "rates.jsonl"
    with FakeOpenAIServer(answer) as server:
        common = ["--db-root", demo_db_root, "--url", server.url, "--served-model", "policy", "--k", 4, "--quiet"]
        code, output = _run("estimate", "--pool", pool_file, "--out", rates, *common)
        assert code == 0, output
        rows = [json.loads(line) for line in rates.read_text().splitlines()]
        questions = {e.id: e.question for e in read_examples(pool_file)}
        assert {r["id"]: r["pass_rate"] for r in rows} == {i: share[q] for i, q in questions.items()}
        sent = len(server.requests)
        code, output = _run("estimate", "--pool", pool_file, "--out", rates, *common)
        assert code == 0 and len(server.requests) == sent  # resumed entirely from the cache

        out = tmp_path / "cur"
        code, output = _run("curriculum", "--pool", pool_file, "--rates", rates, "--budget", 40, "--out-dir", out,
                            "--stage", "stage1", "--seed", 1, *common)
        assert code == 0, output
    report = json.loads((out / "stage1.report.json").read_text())
    assert report["dropped"]["all correct (p = 1)"] == sum(1 for p in share.values() if p == 1)
    assert report["fill_rounds"], "bins of 4-5 examples cannot fill 10 slots each without mutants"
    assert report["new_examples"] > 0 and (out / "stage1.new_examples.jsonl").exists()
    table = pq.read_table(out / "stage1.parquet").to_pylist()
    assert len(table) == report["selected"] and all(r["extra_info"]["difficulty"] < 1 for r in table)
    assert (out / "stage1.histogram.png").stat().st_size > 1000


def test_sampler_and_endpoint_errors(pool_file, demo_db_root, tmp_path):
    base = ["estimate", "--pool", pool_file, "--db-root", demo_db_root, "--out", tmp_path / "r.jsonl"]
    code, output = _run(*base, "--url", "http://127.0.0.1:9/v1", "--served-model", "m", "--quiet")
    assert code == 2 and "endpoint unreachable" in output and "127.0.0.1:9" in output
    code, output = _run(*base, "--model", tmp_path / "no-model")
    assert code == 2 and "model path not found" in output
    code, output = _run(*base)
    assert code == 2 and "--model" in output and "--url" in output
    code, output = _run("curriculum", "--pool", pool_file, "--rates", tmp_path / "missing.jsonl", "--db-root",
                        demo_db_root, "--budget", 8, "--out-dir", tmp_path / "o", "--no-fill")
    assert code == 2 and "missing.jsonl: no such file" in output


def test_pool_with_llm_questions(demo_db_root, tmp_path):
    def answer(messages, i):  # a writer that names every value of the SQL it is shown
        sql = messages[-1]["content"].split("SQL:\n")[1].split("\n\n")[0]
        return "Show: " + " ".join(f"'{t}'" for t in required_literals(sql)) + "?"

    with FakeOpenAIServer(answer) as server:
        code, output = _run("pool", "--db-root", demo_db_root, "--synthesize", 4, "--synth-db", "flights",
                            "--llm-url", server.url, "--llm-model", "writer", "--out", tmp_path / "p.jsonl", "--quiet")
    assert code == 0, output
    examples = read_examples(tmp_path / "p.jsonl")
    assert len(examples) == 4 and all(e.question.startswith("Show:") for e in examples)
    assert {e.meta["question_from"] for e in examples} == {"llm"}
