"""Seconds per DAPO step on this CPU: verl 0.9.1's trainer (`--backend verl`, `verl.device: cpu`) beside the local
backend's `DAPOTrainer`, on the same model, prompts and stage shape. Runs in the verl-on-CPU environment, on an
otherwise idle machine (the figure is a ratio of step times):

    make bench-verl-cpu                     # builds .venv-verl-cpu (once), then runs this with its defaults
    .venv-verl-cpu/bin/python benchmarks/bench_verl_cpu.py --steps 4 --rounds 2

Anywhere else (`make bench` runs every benchmark in .venv, which has no vLLM CPU build) it says so and exits 0.

Inputs: a finished `configs/verl_cpu_smoke.yaml` run (`--run`; run once here when missing): its SFT model is the
policy both start from, its stage-1 curriculum the prompts, its stage 1 the shape (P prompts x G answers, new
tokens, mini-batches, lr, clip, entropy gate, dynamic sampling with `max_gen_rounds`). Each round trains the stage
for --steps steps on each backend from the same start (fresh output folders), local first, then verl; rounds
alternate so a busy neighbour slows both alike. A step is verl's own `timing_s/step` and the local trainer's
`step_time_s`; the first step of each launch is reported apart (warm-up: allocation, vLLM's first batches). verl's
launch cost (Ray, workers, vLLM engine, checkpoint and merge) is the stage's wall time minus its steps.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "verl_cpu_smoke.yaml"


def missing_environment() -> str | None:
    """Why this environment cannot run verl on this CPU (the doctor's check of `verl.device: cpu`), or None."""
    from sirius_train.preflight import FAIL, cpu_platform_check, installed, query_gpus

    if installed("verl") is None:
        return "verl is not installed"
    check = cpu_platform_check(query_gpus())
    return f"{check.detail} ({check.fix})" if check.status == FAIL else None


def ensure_run(run_dir: Path, overrides: list[str]) -> None:
    if (run_dir / "summary.json").is_file():
        return
    print(f"no finished smoke run at {run_dir}: running {CONFIG.name} once", flush=True)
    subprocess.run([sys.executable, "-m", "sirius_train.cli", "train", str(CONFIG), f"output_dir={run_dir.parent}",
                    f"name={run_dir.name}", *overrides], check=True, cwd=ROOT)


def local_steps(cfg, stage, curriculum: Path, init: Path, data, out: Path) -> tuple[list[float], float]:
    from sirius_train.local.backend import LocalBackend

    backend = LocalBackend(cfg)
    t0 = time.monotonic()
    try:
        backend.train_stage(1, stage, curriculum, init, data, out)
    finally:
        backend.close()
    wall = time.monotonic() - t0
    rows = [json.loads(line) for line in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step_time_s"] for r in rows if r.get("stage") == stage.name and "step_time_s" in r]
    return steps[-stage.steps:], wall


def verl_steps(cfg, stage, curriculum: Path, init: Path, data, out: Path) -> tuple[list[float], float]:
    from sirius_train.verl_backend import VerlBackend

    backend = VerlBackend(cfg)
    t0 = time.monotonic()
    try:
        backend.train_stage(1, stage, curriculum, init, data, out)
    finally:
        backend.close()
    wall = time.monotonic() - t0
    rows = [json.loads(line) for line in (out / "verl_metrics.jsonl").read_text().splitlines()]
    return [r["data"]["timing_s/step"] for r in sorted(rows, key=lambda r: r["step"])], wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", type=Path, default=ROOT / "runs" / "verl_cpu_smoke")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench_verl_cpu")
    parser.add_argument("--set", nargs="*", default=[], help="config overrides for both backends")
    args = parser.parse_args()
    if (missing := missing_environment()) is not None:
        print(f"bench_verl_cpu: skipped, it needs the verl-on-CPU environment (`make bench-verl-cpu`): {missing}")
        return
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    from sirius_train.config import load_config
    from sirius_train.schedule import prepare_data

    run = args.run.resolve()
    ensure_run(run, args.set)
    cfg = load_config(CONFIG, [f"output_dir={args.out.resolve()}", "name=bench", f"data.db_root={run.parent / 'dbs'}",
                               *args.set])
    if not Path(cfg.data.db_root).is_dir():
        cfg = load_config(CONFIG, [f"output_dir={args.out.resolve()}", "name=bench", *args.set])
    stage = replace(cfg.stages[0], steps=args.steps, checkpoint_every=args.steps, eval_every=0)
    data = prepare_data(cfg)
    curriculum, init = run / "stage1" / "curriculum.parquet", run / "sft" / "model"
    times: dict[str, list[list[float]]] = {"local": [], "verl": []}
    walls: dict[str, list[float]] = {"local": [], "verl": []}
    for r in range(args.rounds):
        for name, train in (("local", local_steps), ("verl", verl_steps)):
            out = cfg.run_dir / f"{name}_{r}"
            shutil.rmtree(out, ignore_errors=True)
            steps, wall = train(cfg, stage, curriculum, init, data, out)
            times[name].append(steps)
            walls[name].append(wall)
            print(f"round {r} {name}: steps {[round(s, 2) for s in steps]} s, stage wall {wall:.1f} s", flush=True)

    def steady(name):  # every step but each launch's first
        return [s for launch in times[name] for s in launch[1:]]

    report = {
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "omp_threads": os.environ["OMP_NUM_THREADS"]},
        "shape": {"prompts_per_step": stage.prompts_per_step, "n_samples": stage.n_samples,
                  "max_new_tokens": stage.max_new_tokens, "mini_batches": stage.mini_batches,
                  "max_gen_rounds": stage.max_gen_rounds, "steps": args.steps, "rounds": args.rounds},
        "policy": str(init), "curriculum": str(curriculum),
        **{name: {"steps_s": times[name], "first_step_median_s": statistics.median(t[0] for t in times[name]),
                  "steady_median_s": statistics.median(steady(name)),
                  "launch_overhead_median_s": statistics.median(
                      w - sum(t) for w, t in zip(walls[name], times[name]))} for name in times},
    }
    report["ratio_verl_over_local"] = report["verl"]["steady_median_s"] / report["local"]["steady_median_s"]
    (args.out / "report.json").write_text(json.dumps(report, indent=2))
    print(json.dumps({k: v for k, v in report.items() if k not in ("local", "verl")}, indent=2))
    for name in ("local", "verl"):
        r = report[name]
        print(f"{name:5s}: step {r['steady_median_s']:.2f} s (median after the first; first {r['first_step_median_s']:.2f}"
              f" s), launch overhead {r['launch_overhead_median_s']:.1f} s")
    print(f"verl / local step time: {report['ratio_verl_over_local']:.2f}x")


if __name__ == "__main__":
    main()
