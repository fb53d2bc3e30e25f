"""The trainer benchmark runs end to end on the tiny configuration: both trainers step, the table is written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tiny_run import tiny_overrides

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_bench_trainer_times_ours_and_trl(tmp_path):
    report = tmp_path / "trainer.md"
    sets = [x for o in tiny_overrides(tmp_path) for x in ("--set", o)]
    command = [sys.executable, str(ROOT / "benchmarks" / "bench_trainer.py"), "--steps", "1", "--rounds", "1",
               "--threads", "1", "--output-dir", str(tmp_path), "--markdown", str(report), *sets]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {line.split("|")[1].strip(): line for line in report.read_text().splitlines() if line.startswith("| ")}
    assert {"ours", "ours-dapo", "trl"} <= set(rows)
    assert rows["trl"].rstrip(" |").endswith("1.00x")
