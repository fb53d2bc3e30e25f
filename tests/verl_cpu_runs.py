"""Helpers of the tests that launch verl's real trainer on this CPU (test_verl_cpu_e2e, test_verl_cpu_multiturn):
each launch gets its own Ray temp folder (Ray's sockets), and what is left of that Ray is stopped at the end."""

from __future__ import annotations

import json
import shutil
from pathlib import Path


def stop_ray(ray_dir: Path) -> None:
    """Stop what is left of one run's Ray (its raylet and workers hold sockets under `ray_dir`)."""
    import psutil

    for p in psutil.process_iter(["pid", "cmdline"]):
        if any(str(ray_dir) in part for part in p.info["cmdline"] or []):
            try:
                p.kill()
            except psutil.Error:
                pass
    shutil.rmtree(ray_dir, ignore_errors=True)


def verl_metrics(stage_dir: Path) -> dict[int, dict]:
    """verl's own per-step metrics of one stage (its file logger), later launches of a step winning."""
    by_step = {}
    for part in sorted(stage_dir.glob("verl_metrics.jsonl.*")) + [stage_dir / "verl_metrics.jsonl"]:
        if part.is_file():
            for line in part.read_text().splitlines():
                row = json.loads(line)
                by_step[row["step"]] = row["data"]
    return by_step
