"""Errors that used to escape the batch commands (issue 28): each is now one line naming its cause (exit 2),
or, where a part is optional, a fallback the output records; an internal error is not dressed up as the user's."""

from __future__ import annotations

import json
import shutil

import pytest
import typer
from fake_openai import FakeOpenAIServer
from typer.testing import CliRunner

from sirius_train.cli import app

PARIS = {"db_id": "retail", "question": "How many customers live in Paris?",
         "candidates": [{"source": "s1", "sql": "SELECT count(*) FROM customers"},
                        {"source": "s2", "sql": "SELECT count(*) FROM customers WHERE city = 'Paris'"}]}


def _cli(*args, code=0):
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == code, (result.output, result.exception)
    return result


def _one_error(result) -> str:
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in result.output, result.output
    return errors[0]


@pytest.fixture
def lfs_db_root(demo_db_root, tmp_path):
    """The demo databases, with `retail` replaced by what a clone without git-lfs holds: a pointer file."""
    root = tmp_path / "dbs"
    shutil.copytree(demo_db_root, root)
    (root / "retail" / "retail.sqlite").write_text(
        "version https://git-lfs.github.com/spec/v1\noid sha256:4d7a\nsize 12345\n")
    return root


def test_a_database_that_is_not_sqlite_is_one_line_in_select_and_benchmark(lfs_db_root, tmp_path):
    pools = tmp_path / "pools.jsonl"
    pools.write_text(json.dumps({"id": 1, **PARIS}) + "\n")
    result = _cli("select", "--db-root", lfs_db_root, "--input", pools, "--output", tmp_path / "p.jsonl", "--quiet",
                  "--workers", 0, code=2)
    assert "retail.sqlite: not a readable SQLite database" in _one_error(result)
    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps({"id": 1, "db_id": "retail", "question": "How many customers?",
                                     "gold_sql": "SELECT count(*) FROM customers"}) + "\n")
    result = _cli("benchmark", "--model", tmp_path / "unused", "--questions", questions, "--db-root", lfs_db_root,
                  "--out", tmp_path / "b", "--quiet", "--workers", 0, code=2)
    assert "retail.sqlite: not a readable SQLite database" in _one_error(result)


@pytest.mark.parametrize("bad_id", [[1, 2], {"k": 1}])
def test_evaluate_with_a_list_or_object_id_names_the_line(demo_db_root, tmp_path, bad_id):
    gold = tmp_path / "gold.jsonl"
    gold.write_text(json.dumps({"id": 1, "db_id": "retail", "gold_sql": "SELECT 1"}) + "\n")
    pred = tmp_path / "pred.jsonl"
    pred.write_text(json.dumps({"id": 1, "sql": "SELECT 1"}) + "\n" + json.dumps({"id": bad_id, "sql": "SELECT 1"}) + "\n")
    result = _cli("evaluate", "--db-root", demo_db_root, "--pred", pred, "--gold", gold, "--out", tmp_path / "e",
                  "--quiet", "--workers", 0, code=2)
    assert f"{pred}:2: field 'id' must be" in _one_error(result)
    gold.write_text(json.dumps({"id": bad_id, "db_id": "retail", "gold_sql": "SELECT 1"}) + "\n")
    result = _cli("evaluate", "--db-root", demo_db_root, "--pred", pred, "--gold", gold, "--out", tmp_path / "e",
                  "--quiet", "--workers", 0, code=2)
    assert f"{gold}:1: field 'id' must be" in _one_error(result)


def test_a_judge_failing_midway_gives_s_rm_0_for_those_questions(demo_db_root, tmp_path):
    """Three Paris ties; the judge (it prefers the Paris filter) answers 2 requests, then fails: at most one
    question got both its verdicts, the others are selected without the judge (input order: s1)."""
    def prefer_paris(messages, i):
        a = messages[-1]["content"].split("Candidate B:")[0]
        return "A" if "'Paris'" in a else "B"

    pools = tmp_path / "pools.jsonl"
    pools.write_text("".join(json.dumps({"id": k, **PARIS}) + "\n" for k in range(3)))
    out, trace = tmp_path / "picks.jsonl", tmp_path / "trace.jsonl"
    with FakeOpenAIServer(prefer_paris, fail_after=2) as server:
        result = _cli("select", "--db-root", demo_db_root, "--input", pools, "--output", out, "--trace", trace,
                      "--llm-url", server.url, "--quiet", "--workers", 0)
    picks = [json.loads(line) for line in out.read_text().splitlines()]
    traces = [json.loads(line) for line in trace.read_text().splitlines()]
    assert [p["id"] for p in picks] == [0, 1, 2]
    unjudged = [t for t in traces if "judge_error" in t]
    assert len(unjudged) >= 2 and "failed on" in result.output
    for pick, t in zip(picks, traces):
        if "judge_error" in t:
            assert pick["source"] == "s1" and "HTTP 400" in t["judge_error"] and "S_rm is 0" in t["why"]
            assert all(c["s_rm"] == 0 for c in t["selection"]["classes"])
        else:
            assert pick["source"] == "s2"


def test_a_corrupt_benchmark_cache_line_names_the_file(tmp_path):
    from sirius_train.evaluation.benchmark import BenchmarkError, _read_cache

    cache = tmp_path / "m-abc.jsonl"
    cache.write_text('{"id": 1, "greedy": true}\n{"id": 2, "gree\n{"id": 3}\n')
    with pytest.raises(BenchmarkError, match=rf"{cache}:2: .*delete {cache}"):
        _read_cache(cache)


def test_internal_lookup_errors_are_not_user_errors():
    from rewards.databases import UnknownDatabase
    from sirius_train.commands import one_line_errors

    with pytest.raises(KeyError):
        with one_line_errors():
            {}["x"]
    with pytest.raises(IndexError):
        with one_line_errors():
            [][0]
    with pytest.raises(typer.Exit):
        with one_line_errors():
            raise UnknownDatabase("no database 'atlantis' under dbs")


def test_overriding_a_stage_that_does_not_exist_names_the_stages(tmp_path):
    from sirius_train.config import ConfigError, load_config

    config = tmp_path / "one_stage.yaml"
    config.write_text("stages:\n  - steps: 3\n")
    with pytest.raises(ConfigError, match=r"no stages\.1: the config has 1 \(stages\.0\)"):
        load_config(config, ["stages.1.steps=2"])
    assert load_config(config, ["stages.0.steps=2"]).stages[0].steps == 2
