"""`sirius infer --multi-turn` and `sirius benchmark --multi-turn`: the model answers in the episode format of
training -- it probes the question's database, reads the observation, then answers. The model is a real tiny
Llama whose weights follow a script (tests/multiturn_policy.py), saved as a folder the CLI loads; the
databases are real."""

from __future__ import annotations

import json
import sqlite3

import pytest
from multiturn_policy import scripted_policy
from typer.testing import CliRunner

from sirius_train.cli import app

PROBE = "SELECT count(*) FROM customers"
ANSWER = "```sql\nSELECT count(*) FROM customers WHERE city = 'Paris'\n```"
# "=" ends every prompt and "\n" every observation: probe first, then answer
ONE_PROBE = {"=": "<sql>", "<sql>": PROBE, PROBE: "</sql>", "\n": ANSWER}


@pytest.fixture(scope="module")
def prober(tmp_path_factory):
    model, tokenizer = scripted_policy(["<sql>", "</sql>", PROBE, ANSWER], ONE_PROBE)
    path = tmp_path_factory.mktemp("prober") / "model"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def infer(tmp_path, db_root, specialist, *flags):
    out = tmp_path / "answers.jsonl"
    result = CliRunner().invoke(app, ["infer", "--db-root", str(db_root), "--output", str(out), "--specialist",
                                      str(specialist), "--db-id", "retail", "--question", "How many live in Paris?",
                                      "--n-specialist", "1", "--temperature", "0", "--max-new-tokens", "24",
                                      "--workers", "0", "--quiet", *flags])
    return result, out


def test_multi_turn_specialist_probes_then_answers(tmp_path, demo_db_root, prober):
    result, out = infer(tmp_path, demo_db_root, prober, "--multi-turn", "2")
    assert result.exit_code == 0, result.output
    (answer,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert answer["sql"] == "SELECT count(*) FROM customers WHERE city = 'Paris'"
    customers = sqlite3.connect(demo_db_root / "retail" / "retail.sqlite").execute(PROBE).fetchone()[0]
    (trace,) = [json.loads(line) for line in out.with_name("answers.trace.jsonl").read_text().splitlines()]
    raw = json.dumps(trace)
    assert f"<observation>\\nok: 1 row\\ncount(*)\\n{customers}\\n</observation>" in raw  # the probe ran here


def test_multi_turn_needs_a_local_model(tmp_path, demo_db_root):
    result, out = infer(tmp_path, demo_db_root, "http://127.0.0.1:9", "--specialist-model", "m", "--multi-turn", "2")
    assert result.exit_code == 2
    assert "multi-turn episodes need a local HF model" in result.output and not out.exists()


def test_benchmark_scores_multi_turn_episodes(tmp_path, demo_db_root, prober):
    questions = tmp_path / "questions.jsonl"
    golds = ["SELECT count(*) FROM customers WHERE city = 'Paris'", "SELECT count(*) FROM orders"]
    questions.write_text("".join(json.dumps({"id": f"q{i}", "db_id": "retail", "question": "How many?", "gold_sql": g})
                                 + "\n" for i, g in enumerate(golds)))
    args = ["benchmark", "--questions", str(questions), "--db-root", str(demo_db_root), "--model", str(prober),
            "--k", "1", "--temperature", "0", "--max-new-tokens", "24", "--workers", "0", "--out", str(tmp_path),
            "--name", "mt", "--quiet", "--multi-turn", "2"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "mt.json").read_text())
    assert report["multi_turn"] == 2 and "multi-turn episodes, up to 2 probes" in result.output
    overall = report["models"][0]["overall"]
    assert (overall["greedy_ex"], overall["mean_sampled_ex"]) == (0.5, 0.5)  # the scripted answer is q0's gold
    (cache,) = (tmp_path / "mt.cache").iterdir()  # single-turn answers would have another cache file
    rows = [json.loads(line) for line in cache.read_text().splitlines()]
    assert [r["greedy_sql"] for r in rows] == [golds[0]] * 2


def test_benchmark_multi_turn_needs_the_hf_engine(tmp_path, demo_db_root, prober):
    questions = tmp_path / "questions.jsonl"
    questions.write_text(json.dumps({"id": 1, "db_id": "retail", "question": "q", "gold_sql": "SELECT 1"}) + "\n")
    result = CliRunner().invoke(app, ["benchmark", "--questions", str(questions), "--db-root", str(demo_db_root),
                                      "--model", str(prober), "--engine", "vllm", "--multi-turn", "2",
                                      "--out", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert "multi-turn episodes need a local HF model" in result.output and not (tmp_path / "out").exists()

