"""The nano schedule over seeds, and its ablations: entropy gate on vs off, smoothed vs uniform curriculum.

For each seed the default run (`configs/nano.yaml`, what `make demo` runs) trains from scratch; each ablation
then reuses that seed's data, base model and SFT warm start (copied), so the variants differ only in the DAPO
stages. Finished runs are not run again (the schedule skips finished phases), so an interrupted benchmark
resumes. Every run is then diagnosed by `nano_phases.py` (greedy answers per phase and the mistakes the SFT
demonstrations taught, if any; for the first seed's default run also pass@k / maj@k at the training
temperature on the held-out set and on fresh training-database questions). Writes docs/benchmarks/nano.md
and docs/benchmarks/nano_entropy.png.

    python benchmarks/bench_nano.py --seeds 0 1 2
    python benchmarks/bench_nano.py --seeds 0 --adopt 0=/path/to/runs/demo   # a finished `make demo` as seed 0
    python benchmarks/bench_nano.py --seeds 0 --set data.synth_where=0 stages.0.lr=3e-4   # another design
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = {
    "default": [],
    "gate-off": ["stages.0.entropy.mode=off", "stages.1.entropy.mode=off"],
    "uniform": ["stages.0.curriculum=uniform", "stages.1.curriculum=uniform"],
}
PHASES = ("sft", "stage1", "stage2")


def run_name(variant: str, seed: int) -> str:
    return f"{variant}-seed{seed}"


def copy_run(src: Path, dst: Path, parts=("base", "sft", "data")) -> None:
    """Copy finished phases of a run, pointing their DONE.json model paths at the copy."""
    dst.mkdir(parents=True, exist_ok=True)
    for part in parts:
        shutil.copytree(src / part, dst / part, dirs_exist_ok=True)
        done = dst / part / "DONE.json"
        if done.is_file():
            info = json.loads(done.read_text())
            model = Path(info["model"])  # <run>/<phase>/model, absolute or relative to where the run ran
            if model.parent.parent.name == src.name:
                info["model"] = str(dst.resolve() / model.parent.name / model.name)
            done.write_text(json.dumps(info, indent=2))
    if (src / "metrics.jsonl").is_file():  # the SFT rows belong to the copy too
        rows = [line for line in (src / "metrics.jsonl").read_text().splitlines()
                if line.strip() and json.loads(line).get("stage") in parts]
        (dst / "metrics.jsonl").write_text("".join(r + "\n" for r in rows))


def train(out: Path, variant: str, seed: int, threads: int, design: list[str] = ()) -> None:
    name = run_name(variant, seed)
    cmd = [sys.executable, "-m", "sirius_train.cli", "train", str(ROOT / "configs" / "nano.yaml"), f"name={name}",
           f"seed={seed}", f"output_dir={out}", f"threads={threads}", *design, *VARIANTS[variant]]
    with open(out / f"{name}.log", "a") as log:
        subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})


def diagnose(out: Path, variant: str, seed: int, k: int) -> dict:
    """`nano_phases.py` figures of a finished run (greedy answers and taught mistakes; pass@k / maj@k when k > 0)."""
    run_dir = out / run_name(variant, seed)
    path = run_dir / f"phases_k{k}.json"
    if not path.is_file():
        cmd = [sys.executable, str(ROOT / "benchmarks" / "nano_phases.py"), str(run_dir), "--k", str(k),
               "--fresh", "200" if k else "0", "--json", str(path)]
        with open(out / f"{run_name(variant, seed)}.log", "a") as log:
            subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
    return json.loads(path.read_text())


def mistakes(phases: dict, phase: str) -> int:
    """Held-out greedy answers of `phase` that reproduce one of the mistakes the SFT demonstrations taught."""
    return sum(f["mistake"] for f in phases["phases"][phase]["held-out"].get("flaws", {}).values())


def steps(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r for r in rows if "reward_mean" in r]


def applied_coef(row: dict) -> float:
    """The coefficient the step's loss used (`entropy_coef` is the gate state c_k, applied only while open)."""
    if "entropy_coef_applied" in row:
        return row["entropy_coef_applied"]
    return row["entropy_coef"] * row.get("entropy_gate_open", 1.0)  # rows logged before that field existed


def mean_sd(values: list[float]) -> str:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.1f} ± {sd:.1f}"


def report(out: Path, seeds: list[int], variants: list[str], command: str, diag: dict, detail: dict | None) -> str:
    held_out = [json.loads(line) for line in
                (out / run_name(variants[0], seeds[0]) / "data" / "eval.jsonl").read_text().splitlines() if line]
    lines = ["## Nano schedule over seeds, and its ablations (`benchmarks/bench_nano.py`)", "",
             f"Rerun: `{command}`", "",
             f"Held-out execution accuracy (greedy answers, {len(held_out)} synthesized questions on "
             f"{len({e['db_id'] for e in held_out})} generated databases never trained on), after the SFT warm "
             "start and after each DAPO stage. Ablations reuse the seed's "
             "data, base model and SFT, so they differ only in the DAPO stages.", "",
             "| variant | seed | after SFT | after stage 1 | after stage 2 | DAPO − SFT (points) | "
             "taught mistakes in greedy answers, SFT → stage 1 → stage 2 | "
             "mean entropy stage 1 / 2 | min entropy | steps with the bonus on | largest coef applied | SFT s | DAPO stages s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    deltas: dict[str, list[float]] = {}
    finals: dict[str, list[float]] = {}
    for variant in variants:
        for seed in seeds:
            run_dir = out / run_name(variant, seed)
            summary = json.loads((run_dir / "summary.json").read_text())
            ex = summary["eval_exec_acc"]
            seconds = {p["phase"]: p.get("seconds", 0.0) for p in summary["phases"]}
            rows = steps(run_dir)
            ent = {s: [r["entropy"] for r in rows if r["stage"] == s] for s in ("stage1", "stage2")}
            applied = [applied_coef(r) for r in rows]
            delta = 100 * (ex["stage2"] - ex["sft"])
            deltas.setdefault(variant, []).append(delta)
            finals.setdefault(variant, []).append(100 * ex["stage2"])
            lines.append(
                f"| {variant} | {seed} | {100 * ex['sft']:.1f} | {100 * ex['stage1']:.1f} | {100 * ex['stage2']:.1f} "
                f"| {delta:+.1f} | {' → '.join(str(mistakes(diag[variant, seed], p)) for p in PHASES)} "
                f"| {statistics.mean(ent['stage1']):.3f} / {statistics.mean(ent['stage2']):.3f} "
                f"| {min(ent['stage1'] + ent['stage2']):.3f} | {sum(c > 0 for c in applied)} / {len(rows)} "
                f"| {max(applied):.4f} "
                f"| {seconds['sft']:.0f} | {seconds['stage1'] + seconds['stage2']:.0f} |")
    lines += ["", "| variant | final EX (mean ± sd over seeds) | DAPO − SFT, points (mean ± sd) |", "|---|---:|---:|"]
    lines += [f"| {v} | {mean_sd(finals[v])} | {mean_sd(deltas[v])} |" for v in variants]
    lines += ["", "![entropy per step](nano_entropy.png)", ""]
    if detail is not None:
        from nano_phases import markdown

        lines += [f"Per phase, seed {seeds[0]}'s default run (`benchmarks/nano_phases.py`): greedy EX, mean EX of "
                  f"{detail['k']} samples at the training temperature, pass@{detail['k']} and maj@{detail['k']}, "
                  "on the held-out set and on 200 fresh questions over the training databases (a new seed, "
                  "none in any pool); then, per kind of mistake the SFT demonstrations carried, the held-out "
                  "questions it applies to and the greedy answers that are right / that reproduce the mistake.",
                  "", markdown(detail), ""]
    return "\n".join(lines)


def plot(out: Path, seeds: list[int], variants: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    colors = {"default": "tab:blue", "gate-off": "tab:red", "uniform": "tab:green"}
    for variant in variants:
        for seed in seeds:
            rows = steps(out / run_name(variant, seed))
            x = list(range(1, len(rows) + 1))
            label = variant if seed == seeds[0] else None
            axes[0].plot(x, [r["entropy"] for r in rows], color=colors.get(variant), alpha=0.7, label=label)
            axes[1].plot(x, [applied_coef(r) for r in rows], color=colors.get(variant), alpha=0.7, label=label)
    axes[0].set(title="policy entropy per DAPO step (both stages)", xlabel="step", ylabel="entropy (nats/token)")
    axes[1].set(title="entropy coefficient applied (gate open)", xlabel="step")
    for ax in axes:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "bench_nano")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--k", type=int, default=8, help="samples per question for the per-phase figures (0: skip them)")
    ap.add_argument("--adopt", action="append", default=[], metavar="SEED=RUN_DIR",
                    help="use a finished default run (e.g. make demo's runs/demo) as that seed's default run")
    ap.add_argument("--md", type=Path, default=ROOT / "docs" / "benchmarks" / "nano.md")
    ap.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE", dest="design",
                    help="overrides of configs/nano.yaml for every run: measure another design the same way")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for item in args.adopt:
        seed, src = item.split("=", 1)
        dst = args.out / run_name("default", int(seed))
        if not (dst / "summary.json").is_file():
            copy_run(Path(src), dst, parts=("base", "sft", "data", "stage1", "stage2"))
            shutil.copy(Path(src) / "metrics.jsonl", dst / "metrics.jsonl")
    for seed in args.seeds:
        for variant in args.variants:
            if variant != "default":
                source = args.out / run_name("default", seed)
                if not (source / "summary.json").is_file():
                    train(args.out, "default", seed, args.threads, args.design)
                target = args.out / run_name(variant, seed)
                if not (target / "sft" / "DONE.json").is_file():
                    copy_run(source, target)
            t0 = time.monotonic()
            train(args.out, variant, seed, args.threads, args.design)
            print(f"{variant} seed {seed}: {time.monotonic() - t0:.0f} s", flush=True)
    diag = {(v, seed): diagnose(args.out, v, seed, 0) for v in args.variants for seed in args.seeds}
    detail = diagnose(args.out, "default", args.seeds[0], args.k) if "default" in args.variants and args.k else None
    command = "python benchmarks/bench_nano.py " + " ".join(sys.argv[1:])
    args.md.write_text(report(args.out, args.seeds, args.variants, command, diag, detail))
    plot(args.out, args.seeds, args.variants, args.md.with_name("nano_entropy.png"))
    print(args.md.read_text())


if __name__ == "__main__":
    main()
