"""`sirius benchmark`: the figures' math, equality with the run's own evaluation, official layouts that
`sirius evaluate` re-scores to the same EX, resumption, the OpenAI engine on a real 127.0.0.1 server, and
one-line errors."""

from __future__ import annotations

import json
import socket
import sqlite3
from dataclasses import replace
from itertools import combinations
from pathlib import Path

import pytest
from fake_openai import FakeOpenAIServer
from typer.testing import CliRunner

from sirius_train.evaluation.figures import QuestionScore, figures, pass_at_k
from sirius_train.cli import app

TINY_RUN = pytest.mark.timeout(1800)  # the first test to ask builds the shared tiny run (tests/tiny_demo.py)


def _cli(*args, code=0):
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == code, (result.output, result.exception)
    return result


def _enumerated_pass_at_k(outcomes: tuple[bool, ...], k: int) -> float:
    subsets = list(combinations(range(len(outcomes)), k))
    return sum(any(outcomes[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 6])
def test_pass_at_k_equals_direct_enumeration(n):
    for c in range(n + 1):
        outcomes = (True,) * c + (False,) * (n - c)
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(_enumerated_pass_at_k(outcomes, k), abs=1e-12), (n, c, k)


def test_pass_at_k_rejects_impossible_counts():
    for n, c, k in ((4, 5, 1), (4, 2, 5), (4, 2, 0)):
        with pytest.raises(ValueError):
            pass_at_k(n, c, k)


def test_figures_per_question_then_mean():
    scores = [QuestionScore(1, "a", "easy", True, (True, True, False, False), True),
              QuestionScore(2, "b", "hard", False, (False, False, False, True), False, selected=True)]
    f = figures(scores, 2)
    assert f["greedy_ex"] == 0.5 and f["mean_sampled_ex"] == 0.375 and f["maj_at_k"] == 0.5
    assert f["pass_at_k"] == pytest.approx((pass_at_k(4, 2, 2) + pass_at_k(4, 1, 2)) / 2)
    assert f["headroom"] == pytest.approx(f["pass_at_k"] - 0.5)
    assert "selected_ex" not in f  # only when every question has a selected answer


def test_maj_at_k_is_the_selectors_majority_vote(demo_db_root):
    from rewards.executor import Executor
    from rewards.outcome import Status
    from rewards.scoring import ScoreItem
    from sirius_train.evaluation.figures import score_samples
    from sirius_train.inference.selector import Ballot, majority_vote

    gold = ("retail", "SELECT COUNT(*) FROM customers")
    pools = [["SELECT COUNT(*) FROM orders", "SELECT COUNT(id) FROM customers", None,
              "SELECT COUNT(*) FROM customers", "SELECT COUNT(*) FROM orders", "SELECT COUNT(*) FROM orders"],
             ["SELECT COUNT(1) FROM customers", "SELECT COUNT(id) FROM customers", "SELECT COUNT(*) FROM products"]]
    with Executor(demo_db_root, workers=0) as executor:
        got = score_samples(executor, [gold, gold], pools, "bird", k=3)
        for sqls, (matches, majority) in zip(pools, got):
            ballots = [Ballot("s", "", Status.REJECTED) if s is None else
                       Ballot("s", s, (o := executor.execute("retail", s)).status, o.rows) for s in sqls[:3]]
            pick = majority_vote(ballots).index
            assert majority == (pick is not None and matches[pick])
            assert matches == [r.match for r in executor.score([ScoreItem(*gold, s, "bird") for s in sqls])]
    assert got[0][1] is False  # first 3: orders / customers / no SQL: a tie, the earliest (orders) wins
    assert got[1][1] is True


@pytest.fixture(scope="module")
def tiny():
    from tiny_demo import tiny_demo

    return tiny_demo()


@pytest.fixture(scope="module")
def trained(tiny):
    """(questions, trainer figures per phase): where the tiny run's models are partly right (tests/tiny_demo.py)."""
    from tiny_demo import trained_questions

    return trained_questions()


def _some_right(figure: float, n: int) -> None:
    """Guard of an equality: neither none nor all of n right, so a wrong prompt format or scorer would break it."""
    assert 0 < round(figure * n) < n, (figure, n)


@pytest.fixture(scope="module")
def run_benchmark(tiny):
    """`sirius benchmark --run runs/demo` in the clone, no other flag: the run's held-out set and databases."""
    cfg, summary, root = tiny
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        result = _cli("benchmark", "--run", "runs/demo")
    out = root / "benchmarks_out"
    return json.loads((out / "benchmark.json").read_text()), out, result.output


@pytest.fixture(scope="module")
def trained_benchmark(tiny, trained, tmp_path_factory):
    """`--run` with `--questions` the run's trained questions: an explicit flag wins over the run's held-out set."""
    cfg, summary, root = tiny
    questions, _ = trained
    out = tmp_path_factory.mktemp("trained")
    _cli("benchmark", "--run", root / "runs/demo", "--questions", questions, "--k", 4, "--workers", 0, "--out", out,
         "--name", "t", "--quiet")
    return json.loads((out / "t.json").read_text()), out


@TINY_RUN
def test_run_benchmark_greedy_ex_is_the_runs_eval_exec_acc(tiny, run_benchmark, trained, trained_benchmark):
    cfg, summary, root = tiny
    report, out, output = run_benchmark
    assert report["questions"] == "runs/demo/data/eval.jsonl" and report["k"] == 8
    models = {m["model"]: m for m in report["models"]}
    assert list(models) == ["sft", "stage1", "stage2"]  # the untrained base only with --base
    for phase in summary["phases"]:  # held out: 0 in every phase of the tiny run, so also...
        m = models[phase["phase"]]
        assert m["overall"]["greedy_ex"] == phase["eval_exec_acc"], phase["phase"]
        assert m["temperature"] == (cfg.stages[1].temperature if phase["phase"] == "stage2" else cfg.stages[0].temperature)
        assert m["overall"]["n"] == phase["eval_n"]
        assert set(m["databases"]) == {"gen_eval_00"} and m["buckets"]
    for ext in ("json", "md", "png"):
        assert (out / f"benchmark.{ext}").stat().st_size > 200
    assert "pass@8" in (out / "benchmark.md").read_text() and "maj@8" in output
    questions, figures = trained  # ...on questions the models answer partly right, the trainer's own evaluation
    report, _ = trained_benchmark
    assert report["questions"] == str(questions)
    for m in report["models"]:
        assert m["overall"]["greedy_ex"] == figures[m["model"]]["eval_exec_acc"], m["model"]
        _some_right(m["overall"]["greedy_ex"], m["overall"]["n"])


@TINY_RUN
def test_the_figures_are_the_cached_answers_figures(trained_benchmark):
    """greedy, mean sampled, pass@k and maj@k recomputed from each model's cached per-question matches."""
    report, out = trained_benchmark
    k = report["k"]
    for m in report["models"]:
        [cache] = (out / "t.cache").glob(f"{m['model']}-*.jsonl")
        rows = [json.loads(line) for line in cache.read_text().splitlines()]
        n = len(rows)
        overall = m["overall"]
        assert overall["greedy_ex"] == pytest.approx(sum(r["greedy"] for r in rows) / n)
        assert overall["mean_sampled_ex"] == pytest.approx(sum(sum(r["samples"]) / len(r["samples"]) for r in rows) / n)
        assert overall["pass_at_k"] == pytest.approx(sum(pass_at_k(len(r["samples"]), sum(r["samples"]), k)
                                                         for r in rows) / n)
        assert overall["maj_at_k"] == pytest.approx(sum(r["majority"] for r in rows) / n)
        assert 0 < overall["mean_sampled_ex"] < 1 and overall["headroom"] == pytest.approx(
            overall["pass_at_k"] - overall["greedy_ex"])


@TINY_RUN
@pytest.mark.parametrize("layout", ["spider", "bird"])
def test_official_layouts_rescore_to_the_same_ex(trained, trained_benchmark, tmp_path, layout):
    questions, _ = trained
    report, out = trained_benchmark
    pred = out / ("t.stage2.pred.sql" if layout == "spider" else "t.stage2.predict_dev.json")
    _cli("evaluate", "--pred", pred, "--gold", questions, "--db-root", questions.parent / "demo_data/dbs",
         "--format", layout, "--compare", report["compare"], "--out", tmp_path, "--workers", 0, "--quiet")
    rescored = json.loads((tmp_path / "eval.json").read_text())
    stage2 = next(m for m in report["models"] if m["model"] == "stage2")
    assert rescored["correct"] / rescored["n"] == stage2["overall"]["greedy_ex"]
    _some_right(stage2["overall"]["greedy_ex"], rescored["n"])


def _official_dev_json(questions: Path, layout: str, path: Path) -> Path:
    rows = [json.loads(line) for line in questions.read_text().splitlines()]
    levels = ("simple", "moderate", "challenging")
    if layout == "bird":
        data = [{"question_id": i, "db_id": r["db_id"], "question": r["question"], "evidence": "",
                 "SQL": r["gold_sql"], "difficulty": levels[i % 3]} for i, r in enumerate(rows)]
    else:
        data = [{"db_id": r["db_id"], "question": r["question"], "query": r["gold_sql"]} for r in rows]
    path.write_text(json.dumps(data))
    return path


@TINY_RUN
@pytest.mark.parametrize("layout", ["spider", "bird"])
def test_spider_and_bird_dev_json_in_and_official_files_out(tiny, trained, tmp_path, layout):
    cfg, summary, root = tiny
    dev = _official_dev_json(trained[0], layout, tmp_path / "dev.json")
    db_root = root / "demo_data/dbs"
    _cli("benchmark", "--model", root / "runs/demo/stage2/model", "--questions", dev, "--format", layout,
         "--db-root", db_root, "--k", 2, "--workers", 0, "--out", tmp_path / "b", "--name", "dev", "--quiet")
    report = json.loads((tmp_path / "b" / "dev.json").read_text())
    model = report["models"][0]
    assert report["compare"] == ("spider" if layout == "spider" else "bird")
    if layout == "bird":
        assert list(model["buckets"]) == ["simple", "moderate", "challenging"]
    pred = tmp_path / "b" / ("dev.stage2.pred.sql" if layout == "spider" else "dev.stage2.predict_dev.json")
    _cli("evaluate", "--pred", pred, "--gold", dev, "--db-root", db_root, "--out", tmp_path / "e", "--workers", 0,
         "--quiet")
    rescored = json.loads((tmp_path / "e" / "eval.json").read_text())
    assert rescored["compare"] == report["compare"]
    assert rescored["correct"] / rescored["n"] == model["overall"]["greedy_ex"]
    _some_right(model["overall"]["greedy_ex"], rescored["n"])
    if layout == "bird":
        assert {b: v["ex"] for b, v in rescored["buckets"].items()} == pytest.approx(
            {b: v["greedy_ex"] for b, v in model["buckets"].items()}, abs=1e-6)
        # BIRD's official metrics of the greedy answers, per bucket: Soft-F1 as `sirius evaluate` has it, R-VES 0
        # exactly where no greedy answer is right (timings differ between runs, rewards only for right answers)
        assert {b: v["soft_f1"] for b, v in rescored["buckets"].items()} == pytest.approx(
            {b: v["greedy_soft_f1"] for b, v in model["buckets"].items()}, abs=1e-6)
        assert all((v["greedy_r_ves"] == 0) == (v["greedy_ex"] == 0) for v in model["buckets"].values())
        assert "R-VES" in (tmp_path / "b" / "dev.md").read_text()


@TINY_RUN
def test_a_killed_benchmark_resumes_with_the_same_figures(tiny, trained, tmp_path):
    cfg, summary, root = tiny
    args = ["benchmark", "--model", root / "runs/demo/stage2/model", "--questions", trained[0],
            "--db-root", root / "demo_data/dbs", "--k", 3, "--batch-size", 4, "--workers", 0, "--out", tmp_path,
            "--name", "r", "--quiet", "--lifecycle"]
    _cli(*args)
    first = json.loads((tmp_path / "r.json").read_text())["models"][0]
    [cache] = (tmp_path / "r.cache").iterdir()
    lines = cache.read_text().splitlines(keepends=True)
    assert len(lines) == first["overall"]["n"] == len(trained[0].read_text().splitlines())
    cache.write_text("".join(lines[:4]) + lines[4][:20])  # killed mid-write in the second chunk
    _cli(*args)
    again = json.loads((tmp_path / "r.json").read_text())["models"][0]

    def answers(overall: dict) -> dict:  # R-VES times the right answers again on every call: not from the cache
        return {k: v for k, v in overall.items() if k != "greedy_r_ves"}

    assert answers(again["overall"]) == answers(first["overall"]) and "selected_ex" in again["overall"]
    assert again["overall"]["greedy_r_ves"] > 0 and first["overall"]["greedy_r_ves"] > 0
    assert again["generated"] == len(lines) - 4  # the first chunk came from the cache
    _some_right(first["overall"]["greedy_ex"], len(lines))
    assert len(cache.read_text().splitlines()) == len(lines)


def test_openai_engine_against_a_real_server(demo_db_root, tmp_path):
    questions = tmp_path / "q.jsonl"
    gold = {"How many customers are there?": "SELECT COUNT(*) FROM customers",
            "How many products are there?": "SELECT COUNT(*) FROM products"}
    questions.write_text("".join(json.dumps({"id": i, "db_id": "retail", "question": q, "gold_sql": g}) + "\n"
                                 for i, (q, g) in enumerate(gold.items())))

    def answer(messages, i):  # greedy and samples 0, 2: right on question 1 only; sample 1: always right
        question = messages[-1]["content"].rsplit("Question: ", 1)[1]
        right = i == 1 or "customers" in question
        return f"```sql\n{gold[question] if right else 'SELECT 1'}\n```"

    with FakeOpenAIServer(answer) as server:
        _cli("benchmark", "--model", server.url, "--served-model", "fake", "--questions", questions,
             "--db-root", demo_db_root, "--k", 3, "--temperature", 0.5, "--workers", 0, "--out", tmp_path,
             "--quiet", "--schema-style", "compact")
        requests = list(server.requests)
    model = json.loads((tmp_path / "benchmark.json").read_text())["models"][0]
    assert model["engine"] == "openai" and model["model"] == "fake"
    assert model["overall"]["greedy_ex"] == 0.5 and model["overall"]["pass_at_k"] == 1.0
    assert model["overall"]["mean_sampled_ex"] == pytest.approx((1 + 1 / 3) / 2)
    assert sorted((r["n"], r["temperature"]) for r in requests) == [(1, 0.0)] * 2 + [(3, 0.5)] * 2
    assert all(r["model"] == "fake" for r in requests)


def _count_questions(tmp_path: Path, gold_sql: str) -> Path:
    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps({"id": 1, "db_id": "retail", "question": "How many customers are there?",
                                     "gold_sql": gold_sql}) + "\n")
    return questions


def _right_answer(messages, i):
    return "```sql\nSELECT COUNT(*) FROM customers\n```"


def test_a_changed_questions_file_or_database_is_generated_again(demo_db_root, tmp_path):
    """The cache is keyed on contents: the same paths with other gold answers or another database are new work."""
    import shutil

    questions = _count_questions(tmp_path, "SELECT COUNT(*) FROM customers")
    db_root = tmp_path / "dbs"
    shutil.copytree(demo_db_root / "retail", db_root / "retail")
    args = ["benchmark", "--served-model", "fake", "--questions", questions, "--db-root", db_root, "--k", 2,
            "--workers", 0, "--out", tmp_path / "o", "--quiet"]

    def greedy(server) -> tuple[float, int]:
        before = len(server.requests)
        _cli(*args, "--model", server.url)
        report = json.loads((tmp_path / "o" / "benchmark.json").read_text())
        return report["models"][0]["overall"]["greedy_ex"], len(server.requests) - before

    with FakeOpenAIServer(_right_answer) as server:
        assert greedy(server) == (1.0, 2)  # a greedy and a sampled request
        assert greedy(server) == (1.0, 0)  # unchanged: all from the cache
        _count_questions(tmp_path, "SELECT COUNT(*) FROM products")  # same file, other gold
        assert greedy(server) == (0.0, 2)
        with sqlite3.connect(db_root / "retail" / "retail.sqlite") as db:  # same path, another database
            db.execute("DELETE FROM products")
        assert greedy(server) == (0.0, 2)



def test_the_cache_follows_the_rendered_prompts_and_the_databases_rows(demo_db_root, tmp_path, monkeypatch):
    """Keyed on what a copy or a code change cannot keep: prompt-building code that renders other prompts, and rows
    changed under the database's size and mtime (`cp -p`, `rsync -a`, another release unpacked), are new work."""
    import os
    import shutil

    import data_synthesis.prompts as prompts

    questions = _count_questions(tmp_path, "SELECT COUNT(*) FROM customers WHERE city <> 'Nowhr'")
    db_root = tmp_path / "dbs"
    shutil.copytree(demo_db_root / "retail", db_root / "retail")
    args = ["benchmark", "--served-model", "fake", "--questions", questions, "--db-root", db_root, "--k", 2,
            "--workers", 0, "--out", tmp_path / "o", "--quiet"]

    def answer(messages, i):  # right only when the prompt shows the schema
        return _right_answer(messages, i) if "CREATE TABLE" in messages[-1]["content"] else "```sql\nSELECT 0\n```"

    def greedy(server) -> tuple[float, int]:
        before = len(server.requests)
        _cli(*args, "--model", server.url)
        report = json.loads((tmp_path / "o" / "benchmark.json").read_text())
        return report["models"][0]["overall"]["greedy_ex"], len(server.requests) - before

    with FakeOpenAIServer(answer) as server:
        assert greedy(server) == (1.0, 2)
        assert greedy(server) == (1.0, 0)
        shown = prompts.render_prompt
        monkeypatch.setattr(prompts, "render_prompt", lambda q, schema, evidence=None, system=prompts.SYSTEM_PROMPT:
                            shown(q, "(schema left out)", evidence, system))  # the prompt code changed
        assert greedy(server) == (0.0, 2)
        monkeypatch.setattr(prompts, "render_prompt", shown)
        assert greedy(server) == (1.0, 0)  # the old prompts again: their answers are still cached
        db = db_root / "retail" / "retail.sqlite"
        st = db.stat()
        with sqlite3.connect(db) as conn:  # one customer moves to 'Nowhr': same length, same pages, same size
            conn.execute("UPDATE customers SET city = 'Nowhr' WHERE rowid = (SELECT min(rowid) FROM customers)")
        os.utime(db, ns=(st.st_atime_ns, st.st_mtime_ns))  # and the mtime a copy keeps
        assert (db.stat().st_size, db.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
        assert greedy(server) == (0.0, 2)
    assert len(list((tmp_path / "o" / "benchmark.cache").iterdir())) == 3


def test_a_database_is_hashed_once_while_untouched(spider_root, tmp_path, monkeypatch):
    """`Digests`: a second benchmark over the same files reads their hashes back; a copy onto one (`cp -p` keeps
    size and mtime, not ctime) is hashed again."""
    import shutil

    from sirius_train.evaluation import benchmark

    db = tmp_path / "concert_singer.sqlite"
    shutil.copy2(spider_root / "databases" / "concert_singer" / "concert_singer.sqlite", db)
    first = benchmark.Digests(tmp_path / "b.digests")
    digest = first(db)
    first.save()
    monkeypatch.setattr(benchmark, "file_digest", lambda path: pytest.fail(f"{path} hashed again"))
    assert benchmark.Digests(tmp_path / "b.digests")(db) == digest
    shutil.copy2(spider_root / "databases" / "pets_1" / "pets_1.sqlite", db)  # another database, as `cp -p` copies
    monkeypatch.undo()
    assert benchmark.Digests(tmp_path / "b.digests")(db) != digest

def test_the_cache_key_follows_the_models_files_and_the_scoring_timeout(tmp_path):
    from data_synthesis.prompts import PromptFormat
    from sirius_train.evaluation.benchmark import BenchQuestion, ModelSpec, Settings, cache_path

    db_root = tmp_path / "dbs"
    (db_root / "d").mkdir(parents=True)
    (db_root / "d" / "d.sqlite").write_bytes(b"")
    questions = tmp_path / "q.jsonl"
    questions.write_text("{}\n")
    items = [BenchQuestion(1, "d", "?", "SELECT 1", "", "easy")]
    model = tmp_path / "stage2" / "model"
    model.mkdir(parents=True)
    (model / "model.safetensors").write_bytes(b"weights of run 1")
    (model / "sirius.json").write_text('{"run": "runs/demo", "phase": "stage2"}')
    spec = ModelSpec("stage2", str(model), "hf", PromptFormat(), 0.7, 64)
    settings = Settings(k=2, n=2, seed=0, compare="bird", lifecycle=False, batch_size=8)

    def key(spec=spec, settings=settings, timeout=30.0):
        return cache_path(tmp_path / "o", "b", spec, questions, db_root, items, settings, timeout).name

    first = key()
    assert key() == first and first.startswith("stage2-")
    (model / "model.safetensors").write_bytes(b"weights of run 2")  # retrained into the same folder, same card
    second = key()
    assert second != first
    assert len({second, key(timeout=1.0), key(settings=replace(settings, multi_turn=2)),
                key(spec=replace(spec, max_new_tokens=32))}) == 4


def test_the_report_counts_tokens_and_the_rate_of_generated_questions_only(demo_db_root, tmp_path):
    questions = tmp_path / "q.jsonl"
    questions.write_text("".join(json.dumps({"id": i, "db_id": "retail", "question": f"How many customers ({i})?",
                                             "gold_sql": "SELECT COUNT(*) FROM customers"}) + "\n" for i in range(2)))

    def answer(messages, i):  # tokens are words: 4, or 8 cut at --max-new-tokens 6
        return "```sql\nSELECT COUNT(*) FROM customers\n```" if i == 0 else \
            "```sql\nSELECT COUNT(*) FROM customers WHERE 1 = 1\n```"

    args = ["benchmark", "--served-model", "fake", "--questions", questions, "--db-root", demo_db_root, "--k", 2,
            "--max-new-tokens", 6, "--workers", 0, "--out", tmp_path / "o", "--quiet"]
    with FakeOpenAIServer(answer) as server:
        first = _cli(*args, "--model", server.url)
        prompt = sum(len(m["content"].split(" ")) for r in server.requests for m in r["messages"])
        second = _cli(*args, "--model", server.url)
        assert len(server.requests) == 4  # greedy + sampled per question, once
    report = json.loads((tmp_path / "o" / "benchmark.json").read_text())["models"][0]
    tokens = {"prompt": prompt, "answer": 2 * (4 + 4 + 6), "answers": 2 * 3, "at_max_new_tokens": 2}
    assert report["tokens"] == tokens and report["generated"] == 0 and report["questions_per_s"] is None
    row = next(line for line in second.output.splitlines() if line.startswith("| fake |"))
    assert row.endswith(f"| cached | {prompt} | 28 | 2 of 6 |")
    row = next(line for line in first.output.splitlines() if line.startswith("| fake |"))
    assert "cached" not in row and row.endswith(f"| {prompt} | 28 | 2 of 6 |")
    assert "benchmark fake: 2/2 (" in first.output  # --quiet: no bar, still a line per model


def test_a_served_name_with_a_slash_is_a_safe_file_label(demo_db_root, tmp_path):
    """vLLM serves a Hugging Face id (`Qwen/...`) by default: the run writes its files under --out, flat."""
    questions = _count_questions(tmp_path, "SELECT COUNT(*) FROM customers")
    served = "Qwen/Qwen2.5-0.5B-Instruct"
    with FakeOpenAIServer(_right_answer) as server:
        _cli("benchmark", "--model", server.url, "--served-model", served, "--questions", questions, "--db-root",
             demo_db_root, "--k", 2, "--workers", 0, "--out", tmp_path / "o", "--quiet")
        assert {r["model"] for r in server.requests} == {served}
    [model] = json.loads((tmp_path / "o" / "benchmark.json").read_text())["models"]
    assert model["model"] == "Qwen_Qwen2.5-0.5B-Instruct" and model["served_model"] == served
    assert model["overall"]["greedy_ex"] == 1.0
    assert (tmp_path / "o" / "benchmark.Qwen_Qwen2.5-0.5B-Instruct.pred.sql").read_text().startswith("SELECT COUNT")
    assert all(f.parent == tmp_path / "o" / "benchmark.cache" for f in (tmp_path / "o").rglob("*.jsonl"))
    result = _cli("benchmark", "--model", server.url, "--served-model", served, "--questions", questions,
                  "--db-root", demo_db_root, "--out", tmp_path / "o", "--name", "a/b", code=2)
    assert "--name 'a/b': a file stem" in result.output and "'a_b'" in result.output


def test_without_questions_a_run_is_needed(tmp_path):
    result = _cli("benchmark", "--model", tmp_path, "--quiet", code=2)
    assert "give --questions and --db-root (or --run RUN_DIR" in result.output
    (tmp_path / "config.yaml").write_text("name: x\n")
    result = _cli("benchmark", "--run", tmp_path, "--quiet", code=2)
    assert f"--run {tmp_path}: no held-out set" in result.output and "Traceback" not in result.output


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_one_line_errors(demo_db_root, tmp_path):
    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps({"id": 1, "db_id": "retail", "question": "How many?",
                                     "gold_sql": "SELECT COUNT(*) FROM customers"}) + "\n")
    folder = tmp_path / "no_tokenizer"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    base = ["benchmark", "--questions", questions, "--db-root", demo_db_root, "--out", tmp_path / "o", "--quiet",
            "--workers", 0]
    cases = {"has no tokenizer": ["--model", folder],
             "unreachable": ["--model", f"http://127.0.0.1:{_free_port()}/v1", "--served-model", "x"],
             "model path not found": ["--model", tmp_path / "absent"]}
    for message, extra in cases.items():
        result = _cli(*base, *extra, code=2)
        errors = [line for line in result.output.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and message in errors[0] and "Traceback" not in result.output, result.output
    missing = tmp_path / "m.jsonl"
    missing.write_text(json.dumps({"id": 7, "db_id": "atlantis", "question": "?", "gold_sql": "SELECT 1"}) + "\n")
    result = _cli("benchmark", "--model", folder, "--questions", missing, "--db-root", demo_db_root, "--quiet", code=2)
    assert "atlantis (question 7)" in result.output
    assert not (tmp_path / "o" / "benchmark.json").exists()


@TINY_RUN
def test_training_time_eval_k_gives_the_benchmarks_figures(tiny, trained, tmp_path):
    """`eval.k` in a run config: metrics rows gain eval_pass_at_k / eval_maj_at_k / eval_headroom, the same
    numbers `sirius benchmark` reports for that model, seed and temperature."""
    from dataclasses import replace

    from data_synthesis.records import read_examples
    from sirius_train.local.backend import LocalBackend
    from sirius_train.schedule import prepare_data

    cfg, summary, root = tiny
    questions, _ = trained
    cfg = replace(cfg, eval=replace(cfg.eval, k=4, temperature=1.0))
    backend = LocalBackend(cfg)
    try:
        figures = backend.evaluate(root / "runs/demo/stage2/model",
                                   replace(prepare_data(cfg), eval_set=read_examples(questions)), "check")
    finally:
        backend.close()
    rows = [json.loads(line) for line in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["stage"] == "check" and "eval_pass_at_k" in rows[-1] and "eval_headroom" in rows[-1]
    _cli("benchmark", "--model", root / "runs/demo/stage2/model", "--questions", questions,
         "--db-root", root / "demo_data/dbs", "--k", 4, "--temperature", 1.0, "--workers", 0, "--out", tmp_path,
         "--quiet")
    overall = json.loads((tmp_path / "benchmark.json").read_text())["models"][0]["overall"]
    assert figures["eval_exec_acc"] == overall["greedy_ex"]
    _some_right(overall["greedy_ex"], overall["n"])
    assert 0 < overall["mean_sampled_ex"] < 1
    for name in ("pass_at_k", "maj_at_k", "mean_sampled_ex", "headroom"):
        assert figures[f"eval_{name}"] == pytest.approx(overall[name]), name


@TINY_RUN
def test_vllm_engine_where_installed(tiny, tmp_path):
    pytest.importorskip("vllm")
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("vLLM needs a CUDA GPU")
    cfg, summary, root = tiny
    _cli("benchmark", "--model", root / "runs/demo/stage2/model", "--engine", "vllm", "--questions",
         root / "runs/demo/data/eval.jsonl", "--db-root", root / "demo_data/dbs", "--k", 2, "--out", tmp_path, "--quiet")
    model = json.loads((tmp_path / "benchmark.json").read_text())["models"][0]
    assert model["engine"] == "vllm" and model["overall"]["n"] == summary["phases"][-1]["eval_n"]


def test_vllm_engine_missing_is_one_line(demo_db_root, tmp_path):
    import importlib.util

    from test_infer import tiny_specialist

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here")
    result = _cli("benchmark", "--model", tiny_specialist(tmp_path / "m"), "--engine", "vllm", "--questions",
                  _count_questions(tmp_path, "SELECT COUNT(*) FROM customers"), "--db-root", demo_db_root, "--out",
                  tmp_path, "--quiet", "--workers", 0, code=2)
    assert "pip install 'sirius-sql[vllm]'" in result.output and "Traceback" not in result.output

