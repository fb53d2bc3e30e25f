"""What imports what: the packages import, the light commands never load a model library, and imports flow
one way (rewards <- data_synthesis <- sirius_train; the run config imports no backend).

The light commands run through the real command line in a fresh interpreter with
`PYTHONPROFILEIMPORTTIME=1` (`python -X importtime`), which names every module the process imported."""

from __future__ import annotations

import ast
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "peft", "accelerate", "vllm", "deepspeed")


@pytest.mark.parametrize("name", ["rewards", "data_synthesis", "sirius_train"])
def test_top_level_packages_import(name):
    assert importlib.import_module(name).__doc__


def imported(stderr: str) -> set[str]:
    """Top-level names of every module an importtime log shows."""
    names = set()
    for line in stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            module = line.rsplit("|", 1)[1].strip()
            if module != "package":  # the header line
                names.add(module.split(".")[0])
    return names


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPROFILEIMPORTTIME="1",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "sirius_train.cli", *args], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=300)


@pytest.fixture(scope="module")
def light_inputs(tmp_path_factory, spider_root) -> dict:
    """Small real inputs for each light command: Spider dev questions and their published candidates."""
    tmp = tmp_path_factory.mktemp("light")
    with (spider_root / "dev_candidate_pools.jsonl").open() as f:
        pools = [json.loads(next(f)) for _ in range(3)]
    (tmp / "pools.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pools))
    (tmp / "pairs.jsonl").write_text("".join(
        json.dumps({"id": p["id"], "db_id": p["db_id"], "pred_sql": p["candidates"][0]["sql"],
                    "gold_sql": p["gold_sql"]}) + "\n" for p in pools))
    (tmp / "gold.jsonl").write_text("".join(
        json.dumps({"id": p["id"], "db_id": p["db_id"], "question": p["question"], "gold_sql": p["gold_sql"]}) + "\n"
        for p in pools))
    (tmp / "pred.jsonl").write_text("".join(json.dumps({"id": p["id"], "sql": p["candidates"][1]["sql"]}) + "\n"
                                            for p in pools))
    return {"dir": tmp, "db_root": str(spider_root / "databases")}


LIGHT = {
    "help": ["--help"],
    "score": ["score", "--db-root", "{db_root}", "--input", "pairs.jsonl", "--output", "scored.jsonl", "--quiet"],
    "select": ["select", "--db-root", "{db_root}", "--input", "pools.jsonl", "--output", "picks.jsonl", "--quiet"],
    "evaluate": ["evaluate", "--db-root", "{db_root}", "--pred", "pred.jsonl", "--gold", "gold.jsonl", "--out",
                 "eval", "--quiet"],
    "synth pool": ["synth", "pool", "--db-root", "{db_root}", "--dataset", "gold.jsonl", "--out", "pool.jsonl",
                   "--quiet"],
    "synth estimate --help": ["synth", "estimate", "--help"],
}


@pytest.mark.parametrize("command", LIGHT)
def test_light_commands_import_no_model_library(command, light_inputs):
    args = [a.format(db_root=light_inputs["db_root"]) for a in LIGHT[command]]
    done = run_cli(*args, cwd=light_inputs["dir"])
    assert done.returncode == 0, done.stderr[-2000:]
    modules = imported(done.stderr)
    assert "typer" in modules  # the log is real
    assert not modules & set(HEAVY), f"`sirius {command}` imported {sorted(modules & set(HEAVY))}"


def test_reward_server_imports_no_model_library(demo_db_root, monkeypatch):
    from rewards.launch import spawn
    from rewards.service import ServerConfig

    monkeypatch.setenv("PYTHONPROFILEIMPORTTIME", "1")  # the server and its workers inherit it
    server = spawn(ServerConfig(demo_db_root, workers=1))
    try:
        response = httpx.post(server.url + "/v1/score", timeout=30, json={"items": [
            {"id": 0, "db_id": "retail", "pred_sql": "SELECT 1", "gold_sql": "SELECT 1"}]})
        assert response.json()["results"][0]["match"] is True
    finally:
        server.stop()
    modules = imported("".join(server.log))
    assert {"uvicorn", "rewards"} <= modules
    assert not modules & set(HEAVY), sorted(modules & set(HEAVY))


# ---------------------------------------------------------------------------------------- layering
def imports_of(path: Path, root: Path = ROOT) -> set[str]:
    """Every module a file imports, at the top or inside a function (relative imports resolved)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = ".".join(path.relative_to(root).with_suffix("").parts[:-1])
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            found.add(".".join(filter(None, [base, node.module])))
    return found


def floor_violations(package: str, above: tuple[str, ...], root: Path = ROOT) -> list[str]:
    return sorted(f"{path.relative_to(root)} imports {module}"
                  for path in (root / package).rglob("*.py")
                  for module in imports_of(path, root)
                  if module.split(".")[0] in above)


def test_rewards_imports_nothing_above_it():
    assert floor_violations("rewards", ("data_synthesis", "sirius_train")) == []


def test_the_run_config_imports_no_backend():
    imports = imports_of(ROOT / "sirius_train" / "config.py")
    backends = ("sirius_train.local", "sirius_train.verl_backend", "torch", "transformers", "deepspeed", "verl")
    assert "omegaconf" in imports and not [m for m in imports if m.startswith(backends)]



def test_only_the_benchmark_sits_on_top_of_the_evaluation_package():
    """Training-time evaluation and the evaluation modules below the benchmark never import it (they did: the
    sampled figures came from `benchmark.score_samples`)."""
    benchmark = "sirius_train.evaluation.benchmark"
    users = sorted(str(path.relative_to(ROOT)) for path in (ROOT / "sirius_train").rglob("*.py")
                   if benchmark in imports_of(path))
    assert users and all(u.startswith("sirius_train/commands/") for u in users), users
    assert imports_of(ROOT / "sirius_train" / "local" / "evaluate.py") & {benchmark, "sirius_train.evaluation.reports"} == set()

def test_the_layering_check_sees_imports_inside_functions(tmp_path):
    """The walk must find a lazy import (the kind that climbed before) and resolve relative ones."""
    (tmp_path / "data_synthesis" / "sub").mkdir(parents=True)
    (tmp_path / "data_synthesis" / "sub" / "probe.py").write_text(
        "import json\n\ndef f():\n    from sirius_train.local.rollout import generate\n"
        "    from . import x\n    from ..records import Example\n")
    assert imports_of(tmp_path / "data_synthesis" / "sub" / "probe.py", tmp_path) == {
        "json", "sirius_train.local.rollout", "data_synthesis.sub", "data_synthesis.records"}
    assert floor_violations("data_synthesis", ("sirius_train",), tmp_path) == [
        "data_synthesis/sub/probe.py imports sirius_train.local.rollout"]
