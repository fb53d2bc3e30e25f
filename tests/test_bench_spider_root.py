"""Every benchmark that reads Spider takes its folder as a path (issue 39: a project must not assume
../shared/data/spider): `--spider-root PATH`, else SIRIUS_SPIDER_ROOT; docs/BENCHMARKS.md, "Spider data", gives the
layout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_docs import check_script

ROOT = Path(__file__).resolve().parents[1]
READERS = ["bench_benchmark_smollm2.py", "bench_cli_score.py", "bench_executor.py", "bench_sandbox.py",
           "bench_selector.py", "bench_server.py", "bench_variants.py", "bench_ves.py"]


def test_every_benchmark_that_names_spider_is_listed():
    named = {p.name for p in (ROOT / "benchmarks").glob("bench_*.py") if "SPIDER" in p.read_text()}
    assert named - {"bench_synth.py"} == set(READERS)  # bench_synth takes its two paths: --db-root and --gold


@pytest.mark.parametrize("script", READERS)
def test_each_takes_spider_root(script, tmp_path):
    args = ["pools"] if script == "bench_variants.py" else []
    check_script(f"benchmarks/{script}", [*args, "--spider-root", str(tmp_path)], script)


def test_the_env_var_sets_the_default_and_a_missing_folder_says_how_to_point_at_one(tmp_path):
    env = {**os.environ, "SIRIUS_SPIDER_ROOT": str(tmp_path / "nowhere"), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", "import _baselines; print(_baselines.SPIDER); _baselines.load_pool_pairs()"],
                          cwd=ROOT / "benchmarks", env=env, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == str(tmp_path / "nowhere")
    assert done.returncode == 1 and "--spider-root PATH" in done.stderr and "docs/BENCHMARKS.md" in done.stderr
