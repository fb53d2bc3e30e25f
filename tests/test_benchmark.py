"""`sirius benchmark`: the figures' math, equality with the run's own evaluation, official layouts that
`sirius evaluate` re-scores to the same EX, resumption, the OpenAI engine on a real 127.0.0.1 server, and
one-line errors."""

from __future__ import annotations

import json
import socket
from itertools import combinations
from pathlib import Path

import pytest
from fake_openai import FakeOpenAIServer
from typer.testing import CliRunner

from sirius_train.benchmark_figures import QuestionScore, figures, pass_at_k
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
    from sirius_train.benchmark import score_samples
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

    cfg, summary, root = tiny_demo()
    return cfg, summary, root


@pytest.fixture(scope="module")
def run_benchmark(tiny, tmp_path_factory):
    cfg, summary, root = tiny
    out = tmp_path_factory.mktemp("bench")
    result = _cli("benchmark", "--run", root / "runs" / "demo", "--questions", root / "runs/demo/data/eval.jsonl",
                  "--db-root", root / "demo_data/dbs", "--k", 4, "--workers", 0, "--out", out, "--name", "demo",
                  "--quiet")
    return json.loads((out / "demo.json").read_text()), out, result.output


@TINY_RUN
def test_run_benchmark_greedy_ex_is_the_runs_eval_exec_acc(tiny, run_benchmark):
    cfg, summary, root = tiny
    report, out, output = run_benchmark
    models = {m["model"]: m for m in report["models"]}
    assert list(models) == ["base", "sft", "stage1", "stage2"]
    for phase in summary["phases"]:
        m = models[phase["phase"]]
        assert m["overall"]["greedy_ex"] == phase["eval_exec_acc"], phase["phase"]
        assert m["temperature"] == (cfg.stages[1].temperature if phase["phase"] == "stage2" else cfg.stages[0].temperature)
        assert m["overall"]["n"] == phase["eval_n"]
        assert m["overall"]["headroom"] == pytest.approx(m["overall"]["pass_at_k"] - m["overall"]["greedy_ex"])
        assert m["overall"]["greedy_ex"] <= m["overall"]["pass_at_k"] or m["overall"]["mean_sampled_ex"] < 1
        assert set(m["databases"]) == {"gen_eval_00"} and m["buckets"]
    for ext in ("json", "md", "png"):
        assert (out / f"demo.{ext}").stat().st_size > 200
    assert "pass@4" in (out / "demo.md").read_text() and "pass@4" in output


@TINY_RUN
@pytest.mark.parametrize("layout", ["spider", "bird"])
def test_official_layouts_rescore_to_the_same_ex(tiny, run_benchmark, tmp_path, layout):
    cfg, summary, root = tiny
    report, out, _ = run_benchmark
    pred = out / ("demo.stage2.pred.sql" if layout == "spider" else "demo.stage2.predict_dev.json")
    _cli("evaluate", "--pred", pred, "--gold", root / "runs/demo/data/eval.jsonl", "--db-root", root / "demo_data/dbs",
         "--format", layout, "--compare", report["compare"], "--out", tmp_path, "--workers", 0, "--quiet")
    rescored = json.loads((tmp_path / "eval.json").read_text())
    stage2 = next(m for m in report["models"] if m["model"] == "stage2")
    assert rescored["correct"] / rescored["n"] == stage2["overall"]["greedy_ex"]


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
def test_spider_and_bird_dev_json_in_and_official_files_out(tiny, tmp_path, layout):
    cfg, summary, root = tiny
    dev = _official_dev_json(root / "runs/demo/data/eval.jsonl", layout, tmp_path / "dev.json")
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
def test_a_killed_benchmark_resumes_with_the_same_figures(tiny, tmp_path):
    cfg, summary, root = tiny
    args = ["benchmark", "--model", root / "runs/demo/stage2/model", "--questions", root / "runs/demo/data/eval.jsonl",
            "--db-root", root / "demo_data/dbs", "--k", 3, "--batch-size", 4, "--workers", 0, "--out", tmp_path,
            "--name", "r", "--quiet", "--lifecycle"]
    _cli(*args)
    first = json.loads((tmp_path / "r.json").read_text())["models"][0]
    [cache] = (tmp_path / "r.cache").iterdir()
    lines = cache.read_text().splitlines(keepends=True)
    assert len(lines) == summary["phases"][-1]["eval_n"]
    cache.write_text("".join(lines[:4]) + lines[4][:20])  # killed mid-write in the second chunk
    _cli(*args)
    again = json.loads((tmp_path / "r.json").read_text())["models"][0]
    assert again["overall"] == first["overall"] and "selected_ex" in again["overall"]
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
             "model folder not found": ["--model", tmp_path / "absent"]}
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
def test_training_time_eval_k_gives_the_benchmarks_figures(tiny, tmp_path):
    """`eval.k` in a run config: metrics rows gain eval_pass_at_k / eval_maj_at_k / eval_headroom, the same
    numbers `sirius benchmark` reports for that model, seed and temperature."""
    from dataclasses import replace

    from sirius_train.local.backend import LocalBackend
    from sirius_train.schedule import prepare_data

    cfg, summary, root = tiny
    cfg = replace(cfg, eval=replace(cfg.eval, k=4, temperature=1.0))
    backend = LocalBackend(cfg)
    try:
        figures = backend.evaluate(root / "runs/demo/stage2/model", prepare_data(cfg), "check")
    finally:
        backend.close()
    rows = [json.loads(line) for line in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["stage"] == "check" and "eval_pass_at_k" in rows[-1] and "eval_headroom" in rows[-1]
    _cli("benchmark", "--model", root / "runs/demo/stage2/model", "--questions", root / "runs/demo/data/eval.jsonl",
         "--db-root", root / "demo_data/dbs", "--k", 4, "--temperature", 1.0, "--workers", 0, "--out", tmp_path,
         "--quiet")
    overall = json.loads((tmp_path / "benchmark.json").read_text())["models"][0]["overall"]
    assert figures["eval_exec_acc"] == overall["greedy_ex"]
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


def test_vllm_engine_missing_is_one_line(tiny, tmp_path):
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here")
    cfg, summary, root = tiny
    result = _cli("benchmark", "--model", root / "runs/demo/stage2/model", "--engine", "vllm", "--questions",
                  root / "runs/demo/data/eval.jsonl", "--db-root", root / "demo_data/dbs", "--out", tmp_path,
                  "--quiet", "--workers", 0, code=2)
    assert "pip install 'sirius-sql[vllm]'" in result.output and "Traceback" not in result.output

