"""Every input reader, through the real command line: a non-UTF-8 byte, a truncated last line or a field of the
wrong type ends the command with one line `error: file:line: what is wrong`, exit code 2, and no output file
(nor a temp file) left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
Q = {"db_id": "concert_singer", "question": "How many singers do we have?", "gold_sql": "SELECT count(*) FROM singer"}
POOL = {"id": 0, **{k: Q[k] for k in ("db_id", "question")},
        "candidates": [{"source": "a", "sql": "SELECT count(*) FROM singer"}]}


# command -> (input file name, good rows, (a row with a field of the wrong type, what the error says), argv)
COMMANDS = {
    "score": ("pairs.jsonl", [{"id": 0, "db_id": Q["db_id"], "pred_sql": Q["gold_sql"], "gold_sql": Q["gold_sql"]}],
              ({"id": 1, "db_id": Q["db_id"], "pred_sql": "SELECT 1", "gold_sql": 5},
               "field 'gold_sql' must be a string, got 5 (an integer)"),
              ["score", "--db-root", "{db}", "--input", "{input}", "--output", "{out}/scored.jsonl", "--quiet"]),
    "select": ("pools.jsonl", [POOL], ({**POOL, "id": 1, "candidates": "SELECT 1"},
                                       'field \'candidates\' must be a list, got "SELECT 1" (a string)'),
               ["select", "--db-root", "{db}", "--input", "{input}", "--output", "{out}/picks.jsonl", "--quiet"]),
    "evaluate": ("gold.jsonl", [{"id": 0, **Q}], ({"id": 1, "db_id": Q["db_id"], "gold_sql": 5},
                                                  "a gold entry needs db_id and one of"),
                 ["evaluate", "--db-root", "{db}", "--pred", "{out}/pred.jsonl", "--gold", "{input}", "--out",
                  "{out}/report", "--quiet"]),
    "infer": ("questions.jsonl", [{"id": 0, "db_id": Q["db_id"], "question": Q["question"]}],
              ({"id": 1, "db_id": Q["db_id"], "question": 7}, "field 'question' must be a string, got 7 (an integer)"),
              ["infer", "--db-root", "{db}", "--input", "{input}", "--output", "{out}/answers.jsonl",
               "--specialist", "http://127.0.0.1:9/v1", "--specialist-model", "m", "--quiet"]),
    "synth pool": ("dataset.jsonl", [{"id": "q0", **Q}], ({"id": "q1", **Q, "evidence": ["x"]},
                                                          "field 'evidence' must be a string, got ['x']"),
                   ["synth", "pool", "--db-root", "{db}", "--dataset", "{input}", "--out", "{out}/pool.jsonl",
                    "--quiet"]),
    "synth curriculum": ("rates.jsonl", [{"id": "q0", "pass_rate": 0.5}],
                         ({"id": "q1", "pass_rate": "high"}, 'field \'pass_rate\' must be a number, got "high"'),
                         ["synth", "curriculum", "--pool", "{out}/pool_in.jsonl", "--rates", "{input}", "--db-root",
                          "{db}", "--budget", "4", "--out-dir", "{out}/stage", "--no-fill", "--quiet"]),
}
# fault -> (the file's bytes from the good lines and the wrong line, where the error is, what it says)
FAULTS = {
    "bad utf-8": (lambda good, wrong: good + b'{"id": 9, "db_id": "caf\xe9"}\n', 2, "not valid UTF-8 (byte 0xe9"),
    "truncated last line": (lambda good, wrong: good + good[: len(good) // 2], 2, "truncated last line"),
    "wrong type": (lambda good, wrong: good + wrong, 2, None),
}


def lines(*rows) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def run_cli(args: list[str]) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), COLUMNS="80")
    return subprocess.run([sys.executable, "-m", "sirius_train.cli", *args], capture_output=True, text=True, env=env,
                          timeout=300)


def files_under(folder: Path) -> set[Path]:
    return set(folder.rglob("*"))


def assert_one_line_exit_2(result: subprocess.CompletedProcess, starts: str, words: str, before: set[Path],
                           folder: Path) -> None:
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith(f"error: {starts}"), result.stderr
    assert words in errors[0], errors[0]
    assert files_under(folder) == before, "an output or temp file was left behind"


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("command", COMMANDS)
def test_a_bad_input_file_is_one_line_and_exit_2(command, fault, tmp_path, spider_root):
    name, good_rows, (wrong_row, wrong_words), argv = COMMANDS[command]
    (tmp_path / "pred.jsonl").write_bytes(lines({"id": 0, "sql": Q["gold_sql"]}))  # evaluate's predictions
    (tmp_path / "pool_in.jsonl").write_bytes(lines({"id": "q0", **Q}))  # curriculum's pool
    make, lineno, words = FAULTS[fault]
    path = tmp_path / name
    path.write_bytes(make(lines(*good_rows), lines(wrong_row)))
    before = files_under(tmp_path)
    result = run_cli([a.format(db=spider_root / "databases", input=path, out=tmp_path) for a in argv])
    assert_one_line_exit_2(result, f"{path}:{lineno}: ", words or wrong_words, before, tmp_path)


def test_a_spider_json_item_of_the_wrong_type_is_named_by_line(tmp_path, spider_root):
    dataset = tmp_path / "dev.json"
    dataset.write_text(json.dumps([{"db_id": Q["db_id"], "question": Q["question"], "query": Q["gold_sql"]},
                                   {"db_id": Q["db_id"], "question": 7, "query": Q["gold_sql"]}], indent=2))
    before = files_under(tmp_path)
    result = run_cli(["synth", "pool", "--db-root", str(spider_root / "databases"), "--dataset", str(dataset),
                      "--out", str(tmp_path / "pool.jsonl"), "--quiet"])
    assert_one_line_exit_2(result, f"{dataset}:7: item 1: field 'question' must be a non-empty string", "got 7",
                           before, tmp_path)


def test_a_spider_sql_file_with_a_bad_byte_is_named_by_line(tmp_path, spider_root):
    gold = tmp_path / "dev_gold.sql"
    gold.write_bytes(f"{Q['gold_sql']}\t{Q['db_id']}\nSELECT 'caf\xe9'\t{Q['db_id']}\n".encode("latin-1"))
    pred = tmp_path / "pred.sql"
    pred.write_text(f"{Q['gold_sql']}\nSELECT 1\n")
    before = files_under(tmp_path)
    result = run_cli(["evaluate", "--db-root", str(spider_root / "databases"), "--pred", str(pred), "--gold",
                      str(gold), "--out", str(tmp_path / "report"), "--quiet"])
    assert_one_line_exit_2(result, f"{gold}:2: not valid UTF-8 (byte 0xe9 at column 12)", "save the file as UTF-8",
                           before, tmp_path)


def test_fixed_value_options_offer_exactly_what_the_code_accepts():
    """Options with fixed values are typer choices (refused before anything runs, listed in --help, checked in
    the docs by tests/test_docs.py); each offers the values the code behind it knows."""
    from rewards.compare import CompareMode
    from sirius_train.commands.evaluate import COMPARE, LAYOUT
    from sirius_train.commands.select import METHOD, RERANK
    from sirius_train.evaluation.reports import FORMATS
    from sirius_train.inference.pipeline import METHODS
    from sirius_train.inference.selector import RERANK_MODES

    def values(enum):
        return [m.value for m in enum]

    assert values(METHOD) == list(METHODS) and values(RERANK) == list(RERANK_MODES)
    assert values(LAYOUT) == ["auto", *FORMATS] and values(COMPARE) == ["auto", *values(CompareMode)]
