"""`make bench` runs every benchmarks/bench_*.py in .venv: the verl-on-CPU benchmark must say it is skipped there,
not start a smoke run that fails (and stops `make bench`) once verl reaches for vLLM's CPU build."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sirius_train.preflight import installed

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif("cpu" in (installed("vllm") or ""), reason="the verl-on-CPU environment runs the benchmark")
def test_bench_verl_cpu_is_skipped_with_its_reason_outside_the_verl_cpu_environment(tmp_path):
    command = [sys.executable, str(ROOT / "benchmarks" / "bench_verl_cpu.py"), "--run", str(tmp_path / "smoke"),
               "--out", str(tmp_path / "bench")]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bench_verl_cpu: skipped, it needs the verl-on-CPU environment "
                                                   "(`make bench-verl-cpu`): "), done.stdout
    assert "vllm" in lines[0] or "verl is not installed" in lines[0]
    assert not (tmp_path / "smoke").exists() and not (tmp_path / "bench").exists()  # nothing was started
