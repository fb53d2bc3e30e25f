"""A checkpoint carries its prompt format (`sirius.json`), and the commands that load it ask it as trained.

The tiny run trains on the nano format (compact schema, no sample values, no system prompt). With no
prompt flag, `sirius synth estimate` must reproduce the trainer's own pass-rate estimate and `sirius infer`
(one greedy specialist candidate, no repair) the run's held-out `eval_exec_acc`, exactly.
"""

from __future__ import annotations

import json

import pytest
from tiny_demo import tiny_demo
from typer.testing import CliRunner

from data_synthesis.model_card import CARD_FILE, CardError, read_card, resolve_prompt_format, write_card
from data_synthesis.prompts import PromptFormat
from sirius_train.cli import app

NANO_FORMAT = PromptFormat(schema_style="compact", schema_samples=0, system="")
TINY_RUN_TIMEOUT = pytest.mark.timeout(1800)  # the first test to ask builds the shared tiny run


def _cli(*args):
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, (result.output, result.exception)
    return result


@pytest.fixture(scope="module")
def tiny_run():
    cfg, summary, root = tiny_demo()
    return cfg, summary, root / "runs" / "demo", root / "demo_data" / "dbs"


@TINY_RUN_TIMEOUT
def test_every_phase_model_carries_its_card(tiny_run):
    cfg, summary, run_dir, _ = tiny_run
    for phase in summary["phases"]:
        card = read_card(phase["model"])
        assert card["phase"] == phase["phase"] and card["run"] == str(run_dir)
        assert card["prompt_format"] == NANO_FORMAT
        assert card["figures"]["eval_exec_acc"] == phase["eval_exec_acc"]
        assert card["config"]["data"]["schema_style"] == "compact"
        assert card["chat_template"] == "tokenizer"
    stage2 = read_card(run_dir / "stage2" / "model")
    assert stage2["sampling"]["temperature"] == cfg.stages[1].temperature
    assert stage2["sampling"]["max_new_tokens"] == cfg.stages[1].max_new_tokens


def _rates(path):
    return {r["id"]: r["correct"] / r["k"] for r in map(json.loads, path.read_text().splitlines())}


@TINY_RUN_TIMEOUT
@pytest.mark.parametrize("index", [1, 2])
def test_synth_estimate_with_no_flag_reproduces_the_trainers_estimate(tiny_run, tmp_path, index):
    cfg, summary, run_dir, db_root = tiny_run
    stage = cfg.stages[index - 1]
    init = run_dir / ("sft" if index == 1 else "stage1") / "model"  # the policy that stage estimated with
    out = tmp_path / "rates.jsonl"
    _cli("synth", "estimate", "--pool", run_dir / "data" / "rl.jsonl", "--db-root", db_root, "--model", init,
         "--out", out, "--k", stage.estimate_k, "--seed", cfg.seed, "--temperature", stage.temperature,
         "--max-new-tokens", stage.max_new_tokens, "--batch-size", stage.gen_batch_size // stage.estimate_k,
         "--quiet")
    ours = _rates(out)
    trainer = _rates(run_dir / f"stage{index}" / "passrates.cache.jsonl")
    assert ours == trainer
    assert 0 < sum(ours.values()) < len(ours)  # a real comparison: neither all wrong nor all right


@TINY_RUN_TIMEOUT
def test_infer_greedy_specialist_answers_with_the_runs_eval_exec_acc(tiny_run, tmp_path):
    """On the run's training questions, which the tiny models answer partly right (its held-out EX is 0, where
    any prompt would agree): the trainer's evaluation (behind `eval_exec_acc`) and `sirius infer` agree."""
    from tiny_demo import trained_questions

    cfg, summary, run_dir, db_root = tiny_run
    questions, figures = trained_questions()
    model = run_dir / "stage2" / "model"
    answers = tmp_path / "answers.jsonl"
    _cli("infer", "--specialist", model, "--input", questions, "--db-root", db_root,
         "--output", answers, "--n-specialist", 1, "--temperature", 0, "--no-recovery", "--workers", 0,
         "--max-new-tokens", max(s.max_new_tokens for s in cfg.stages), "--quiet")
    _cli("evaluate", "--pred", answers, "--gold", questions, "--db-root", db_root,
         "--out", tmp_path / "eval", "--workers", 0, "--quiet")
    report = json.loads((tmp_path / "eval" / "eval.json").read_text())
    assert report["correct"] / report["n"] == figures["stage2"]["eval_exec_acc"]
    assert 0 < report["correct"] < report["n"]


def test_precedence_flags_over_config_over_card_over_default(tmp_path):
    notices = []
    assert resolve_prompt_format(tmp_path, notice=notices.append) == PromptFormat()
    assert len(notices) == 1 and CARD_FILE in notices[0]
    write_card(tmp_path, NANO_FORMAT, phase="sft")
    assert resolve_prompt_format(tmp_path, notice=notices.append) == NANO_FORMAT
    config = PromptFormat(schema_style="ddl", schema_samples=5)
    assert resolve_prompt_format(tmp_path, config, notice=notices.append) == config
    assert resolve_prompt_format(tmp_path, config, notice=notices.append, schema_samples=1, system=None) == \
        PromptFormat(schema_style="ddl", schema_samples=1)
    assert len(notices) == 1  # only the folder without a card was noticed
    (tmp_path / CARD_FILE).write_text("{not json")
    with pytest.raises(CardError, match=CARD_FILE):
        read_card(tmp_path)


def test_without_a_card_the_default_format_is_used_with_a_one_line_notice(tmp_path):
    import pyarrow.parquet as pq

    from data_synthesis.demo_dbs import build_demo_dbs

    db = tmp_path / "dbs"
    build_demo_dbs(db, db_ids=["retail"], seed=0)
    pool, rates = tmp_path / "pool.jsonl", tmp_path / "rates.jsonl"
    ids = "abcd"
    pool.write_text("".join(json.dumps({"id": i, "db_id": "retail", "question": "How many customers?",
                                        "gold_sql": "SELECT COUNT(*) FROM customers"}) + "\n" for i in ids))
    rates.write_text("".join(json.dumps({"id": i, "pass_rate": p}) + "\n" for i, p in zip(ids, (.1, .3, .6, .9))))

    def curriculum(*flags):
        out = tmp_path / str(len(flags))
        result = _cli("synth", "curriculum", "--pool", pool, "--rates", rates, "--db-root", db, "--budget", 4,
                      "--out-dir", out, *flags)
        prompt = pq.read_table(out / "stage1.parquet").to_pylist()[0]["prompt"]
        return result.output, list(prompt)

    output, prompt = curriculum()
    assert sum("default prompt format" in line for line in output.splitlines()) == 1
    assert prompt[0]["role"] == "system" and "CREATE TABLE" in prompt[1]["content"]
    output, prompt = curriculum("--schema-style", "compact", "--system-prompt", "")
    assert "default prompt format" not in output
    assert [m["role"] for m in prompt] == ["user"] and "CREATE TABLE" not in prompt[0]["content"]
