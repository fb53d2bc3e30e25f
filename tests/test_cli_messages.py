"""What the command line says: endpoint failures and unknown config keys in one line (exit 2) with the fix,
help texts as written, an empty stage flagged, pool drops counted by kind, and docs that match the code."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import click
import pytest
import typer
from fake_openai import FakeOpenAIServer
from rich.text import Text
from typer.testing import CliRunner

from sirius_train.cli import app
from sirius_train.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[1]
Q = {"db_id": "concert_singer", "question": "How many singers do we have?", "gold_sql": "SELECT count(*) FROM singer"}


def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), COLUMNS="80")
    return subprocess.run([sys.executable, "-m", "sirius_train.cli", *args], capture_output=True, text=True, env=env,
                          timeout=300)


def one_error_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    return errors[0]


@pytest.fixture
def dead_url() -> str:
    """An OpenAI-style URL on 127.0.0.1 where nothing listens."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


# ------------------------------------------------------------------------------- unreachable endpoints
def test_select_with_an_unreachable_llm_is_one_line_and_exit_2(tmp_path, spider_root, dead_url):
    with (spider_root / "dev_candidate_pools.jsonl").open() as f:
        (tmp_path / "pools.jsonl").write_text("".join(next(f) for _ in range(20)))  # some questions near a tie
    result = run_cli("select", "--db-root", str(spider_root / "databases"), "--input", str(tmp_path / "pools.jsonl"),
                     "--output", str(tmp_path / "picks.jsonl"), "--llm-url", dead_url, "--quiet")
    line = one_error_line(result)
    assert line.startswith(f"error: endpoint unreachable or failing: {dead_url}/chat/completions failed after")
    assert not (tmp_path / "picks.jsonl").exists()


def test_infer_with_an_unreachable_generalist_is_one_line_and_exit_2(tmp_path, spider_root, dead_url):
    (tmp_path / "q.jsonl").write_text(json.dumps({"id": 0, **Q}) + "\n")
    with FakeOpenAIServer(lambda messages, i: f"```sql\n{Q['gold_sql']}\n```") as specialist:
        result = run_cli("infer", "--db-root", str(spider_root / "databases"), "--input", str(tmp_path / "q.jsonl"),
                         "--output", str(tmp_path / "answers.jsonl"), "--specialist", specialist.url,
                         "--specialist-model", "fake", "--generalist-url", dead_url, "--quiet")
    assert one_error_line(result).startswith(f"error: endpoint unreachable or failing: {dead_url}/chat/completions")
    assert not (tmp_path / "answers.jsonl").exists()


# ------------------------------------------------------------------------------- config keys
@pytest.mark.parametrize("override, message", [
    ("stages.0.stepz=3", "unknown key 'stepz' in stages.0; did you mean 'steps'?"),
    ("stages[1].entropy.targt=0.3", "unknown key 'targt' in stages.1.entropy; did you mean 'target'?"),
    ("nmae=x", "unknown key 'nmae' at the top level; did you mean 'name'?"),
    ("data.zzz=1", "unknown key 'zzz' in data; the keys there are db_root, build_demo_dbs,"),
])
def test_an_unknown_config_key_names_its_section_and_the_closest_key(override, message):
    with pytest.raises(ConfigError, match=re.escape(f"override {override!r}: {message}")):
        load_config(ROOT / "configs" / "nano.yaml", [override])


def test_an_unknown_key_in_a_yaml_file_is_found_by_its_path(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("name: x\nstages:\n  - name: a\n  - name: b\n    budgte: 8\n")
    with pytest.raises(ConfigError, match=re.escape(f"{config}: unknown key 'budgte' in stages.1; did you mean "
                                                    "'budget'?")):
        load_config(config)


def test_sirius_train_says_the_unknown_key_in_one_line(tmp_path):
    line = one_error_line(run_cli("train", str(ROOT / "configs" / "nano.yaml"), "stages.0.stepz=3",
                                  f"output_dir={tmp_path}"))
    assert line == "error: override 'stages.0.stepz=3': unknown key 'stepz' in stages.0; did you mean 'steps'?"
    assert not any(tmp_path.iterdir())  # nothing started


@pytest.mark.parametrize("override, message", [
    ("stages.0.temperature=-1", "stages.0.temperature=-1.0: the sampling temperature (1.0 samples the policy as it "
                                "is) must be > 0; the default is stages.0.temperature=1.0"),
    ("sft.lr=-1", "sft.lr=-1.0: the SFT learning rate must be > 0; the default is sft.lr=0.002"),
    ("reward.timeout_s=0", "reward.timeout_s=0.0: the deadline of one SQL query in seconds must be > 0; the default "
                           "is reward.timeout_s=2.0"),
    ("stages.1.top_p=1.5", "stages.1.top_p=1.5: nucleus sampling's probability mass (1.0: off) must be in (0, 1]"),
    ("stages.0.checkpoint_every=0", "stages.0.checkpoint_every=0: the number of steps between checkpoints must be "
                                    ">= 1"),
    ("sft.epochs=0", "sft.epochs=0.0: the number of passes over the SFT examples must be > 0"),
    ("model.hidden_size=130", "model.num_attention_heads=4: must divide model.hidden_size (130)"),
    ("device=gpu", "device='gpu': use 'auto', 'cpu', 'cuda' or 'cuda:N'"),
])
def test_a_value_no_run_can_use_fails_at_load_with_the_key_the_rule_and_the_default(override, message):
    with pytest.raises(ConfigError, match="^" + re.escape(message)):
        load_config(ROOT / "configs" / "nano.yaml", [override])


def test_doctor_and_train_refuse_an_impossible_value_in_one_line(tmp_path):
    expected = "error: stages.0.temperature=-1.0: the sampling temperature"
    line = one_error_line(run_cli("train", str(ROOT / "configs" / "nano.yaml"), "stages.0.temperature=-1",
                                  f"output_dir={tmp_path}"))
    assert line.startswith(expected), line
    doctor = CliRunner().invoke(app, ["doctor", str(ROOT / "configs" / "nano.yaml"), "stages.0.temperature=-1"],
                                env={"COLUMNS": "400"})
    assert doctor.exit_code == 2 and doctor.output.startswith(expected) and len(doctor.output.splitlines()) == 1
    assert not any(tmp_path.iterdir())


def test_a_yaml_syntax_error_is_one_line_naming_the_line(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("name: x\nstages:\n  - name: a\n   steps: 3\n")
    expected = f"error: {config} is not valid YAML at line 4, column 4: 'steps: 3'"
    assert one_error_line(run_cli("train", str(config))).startswith(expected)
    for command in ("doctor", "sft"):
        result = CliRunner().invoke(app, [command, str(config)], env={"COLUMNS": "400"})
        assert result.exit_code == 2 and result.output.startswith(expected) and len(result.output.splitlines()) == 1


def test_sirius_sft_with_missing_databases_says_so_without_a_traceback(tmp_path):
    result = run_cli("sft", str(ROOT / "configs" / "nano.yaml"), f"output_dir={tmp_path}",
                     f"data.db_root={tmp_path / 'none'}", "data.build_demo_dbs=false")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.stderr.startswith("error: databases:") and "missing: gen_eval_00" in result.stderr.splitlines()[0]
    assert result.stderr.splitlines()[1:] == ["nothing was started; `sirius doctor CONFIG` shows every check"]
    assert not (tmp_path / "nano").exists()


# ------------------------------------------------------------------------------- help texts
def all_options(command: click.Command, path: str = "sirius"):
    for param in command.params:
        yield f"{path} {param.name}", getattr(param, "help", None) or ""
    for name, sub in getattr(command, "commands", {}).items():
        yield from all_options(sub, f"{path} {name}")


def test_no_help_text_is_eaten_by_rich_markup():
    """`[vllm]` in a help text is a rich tag unless escaped; every option's help must render as written."""
    texts = dict(all_options(typer.main.get_command(app)))
    assert "sirius synth estimate engine" in texts
    eaten = {where: text for where, text in texts.items()
             if Text.from_markup(text).plain != text.replace("\\[", "[")}
    assert not eaten


def test_synth_estimate_help_names_the_vllm_extra():
    result = run_cli("synth", "estimate", "--help")
    assert result.returncode == 0
    assert "sirius-sql[vllm]" in " ".join(result.stdout.replace("│", " ").split())


# ------------------------------------------------------------------------------- synth pool and curriculum
def test_the_pool_report_counts_drops_by_kind(tmp_path, spider_root):
    other = {"db_id": "concert_singer", "question": "How many stadiums?", "gold_sql": "SELECT count(*) FROM stadium"}
    rows = [{"id": "a", **Q}, {"id": "a2", **Q}, {"id": "b", **other}, {"id": "b2", **other},
            {"id": "c", **Q, "question": "Broken?", "gold_sql": "SELECT nope FROM singer"}]
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = run_cli("synth", "pool", "--db-root", str(spider_root / "databases"), "--dataset",
                     str(tmp_path / "data.jsonl"), "--out", str(tmp_path / "pool.jsonl"), "--quiet")
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "pool.report.json").read_text())
    assert report["dropped"] == {"duplicate": 2, "gold error": 1}
    assert [d["reason"] for d in report["dropped_examples"]][:2] == [
        "duplicate: same database, question and gold SQL as a", "duplicate: same database, question and gold SQL as b"]
    assert len(re.findall(r"dropped: duplicate\s", result.stderr)) == 1


def test_a_curriculum_that_keeps_nothing_warns_and_exits_1(tmp_path, spider_root):
    rows = [{"id": f"q{i}", **Q} for i in range(3)]
    (tmp_path / "pool.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "rates.jsonl").write_text("".join(json.dumps({"id": r["id"], "pass_rate": p}) + "\n"
                                                  for r, p in zip(rows, (0.0, 0.0, 1.0))))
    result = run_cli("synth", "curriculum", "--pool", str(tmp_path / "pool.jsonl"), "--rates",
                     str(tmp_path / "rates.jsonl"), "--db-root", str(spider_root / "databases"), "--budget", "8",
                     "--out-dir", str(tmp_path / "stage"), "--no-fill", "--quiet")
    assert result.returncode == 1, result.stderr
    warning = " ".join(result.stderr[result.stderr.index("warning:"):].split())
    assert warning.startswith("warning: stage stage1 kept 0 of its budget of 8 (all correct (p = 1): 1, all wrong "
                              "(p = 0): 2): nothing to train on. Give p = 0 examples a share (--keep-zero-share)")
    assert json.loads((tmp_path / "stage" / "stage1.report.json").read_text())["selected"] == 0  # written: it says why
    kept = run_cli("synth", "curriculum", "--pool", str(tmp_path / "pool.jsonl"), "--rates",
                   str(tmp_path / "rates.jsonl"), "--db-root", str(spider_root / "databases"), "--budget", "8",
                   "--out-dir", str(tmp_path / "stage"), "--no-fill", "--keep-zero-share", "0.5", "--quiet")
    assert kept.returncode == 0 and "warning:" not in kept.stderr


# ------------------------------------------------------------------------------- docs match the code
def test_the_documented_chunk_size_is_the_one_the_server_uses():
    from rewards.executor import Executor
    from rewards.service import ServerConfig

    doc = (ROOT / "docs" / "REWARD_SERVER.md").read_text()
    documented = int(re.search(r"\| `--chunk-size N` \| `(\d+)` \|", doc).group(1))
    command = typer.main.get_command(app).commands["reward-server"]
    cli_default = next(p.default for p in command.params if p.name == "chunk_size")
    executor_default = Executor.__init__.__kwdefaults__["chunk_size"]
    assert documented == cli_default == ServerConfig.chunk_size == executor_default


def test_the_documented_score_contract_is_what_sirius_score_writes(tmp_path, spider_root):
    doc = " ".join((ROOT / "docs" / "REWARD_SERVER.md").read_text().split("## Offline: `sirius score`", 1)[1]
                   .split("\n## ", 1)[0].split())
    assert 'output, one line per input line, in the same order: `{"id", "match", "pred_status", "gold_status"}` ' \
           'plus `"pred_error"`' in doc
    for field in ("`id`", "`db_id`", "`pred_sql`", "`gold_sql`"):
        assert field in doc.split("output, one line")[0]
    pairs = [{"id": 0, "db_id": Q["db_id"], "pred_sql": Q["gold_sql"], "gold_sql": Q["gold_sql"]},
             {"id": "x", "db_id": Q["db_id"], "pred_sql": "SELECT nope FROM singer", "gold_sql": Q["gold_sql"]}]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs))
    result = run_cli("score", "--db-root", str(spider_root / "databases"), "--input", str(tmp_path / "in.jsonl"),
                     "--output", str(tmp_path / "out.jsonl"), "--quiet")
    assert result.returncode == 0, result.stderr
    out = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [sorted(r) for r in out] == [sorted(["id", "match", "pred_status", "gold_status"]),
                                        sorted(["id", "match", "pred_status", "gold_status", "pred_error"])]
    assert [(r["id"], r["match"], r["pred_status"]) for r in out] == [(0, True, "ok"), ("x", False, "error")]


def test_score_and_evaluate_refuse_a_db_root_without_the_databases(tmp_path, spider_root):
    """A wrong --db-root used to give EX 0.00% and exit 0 (every query an error); infer and benchmark refuse it."""
    rows = [{"id": "a", **Q, "pred_sql": Q["gold_sql"]}, {"id": "b", **Q, "db_id": "pets_1", "pred_sql": None}]
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "gold.jsonl").write_text("".join(json.dumps({k: r[k] for k in ("id", "db_id", "gold_sql")}) + "\n"
                                                 for r in rows))
    (tmp_path / "picks.jsonl").write_text("".join(json.dumps({"id": r["id"], "pred_sql": r["pred_sql"]}) + "\n"
                                                  for r in rows))
    wrong = tmp_path / "empty"
    wrong.mkdir()
    score = CliRunner().invoke(app, ["score", "--db-root", str(wrong), "--input", str(tmp_path / "pairs.jsonl"),
                                     "--output", str(tmp_path / "scored.jsonl")], env={"COLUMNS": "400"})
    assert score.exit_code == 2 and not (tmp_path / "scored.jsonl").exists(), score.output
    assert score.output.startswith(f"error: 2 line(s) of {tmp_path / 'pairs.jsonl'} use database(s) not found under "
                                   f"{wrong}: ['concert_singer', 'pets_1']; each needs "), score.output
    evaluate = CliRunner().invoke(app, ["evaluate", "--db-root", str(wrong), "--pred", str(tmp_path / "picks.jsonl"),
                                        "--gold", str(tmp_path / "gold.jsonl"), "--out", str(tmp_path / "eval"),
                                        "--quiet"], env={"COLUMNS": "400"})
    assert evaluate.exit_code == 2 and not (tmp_path / "eval").exists(), evaluate.output
    assert "error: 2 question(s) use database(s) not found under" in evaluate.output
    right = CliRunner().invoke(app, ["score", "--db-root", str(spider_root / "databases"), "--input",
                                     str(tmp_path / "pairs.jsonl"), "--output", str(tmp_path / "scored.jsonl"),
                                     "--quiet"])
    assert right.exit_code == 0 and "EX (bird) = 50.00% over 2 pairs" in " ".join(right.output.split())


def test_an_override_that_is_not_valid_yaml_is_one_line_naming_it(tmp_path):
    """A `${...}` inside a flow list is YAML's mapping syntax: the override is named, no parser traceback."""
    override = "verl.overrides=[trainer.rollout_data_dir=${trainer.default_local_dir}/x]"
    line = one_error_line(run_cli("train", str(ROOT / "configs" / "nano.yaml"), override, f"output_dir={tmp_path}"))
    assert line.startswith(f"error: override {override!r}: while parsing a flow sequence"), line
    assert not any(tmp_path.iterdir())
