"""The recipe on a real pretrained model: `configs/smollm2.yaml` (SmolLM2-135M-Instruct) over seeds, both held-out
kinds, validation and test.

Each seed trains the shipped config from the pretrained model (`sirius train`, local backend) and is evaluated
after every phase -- the zero-shot base model, SFT, stage 1, stage 2 -- on the four held-out sets of generated
databases (`data_synthesis.demo_dbs.HELD_OUT_SETS`): validation and test, each as "seen table types" and
"unseen table and column names". Choices are made on validation; test is only reported. A finished run is not
run again and an interrupted one resumes where it stopped (the schedule skips finished phases and resumes the
interrupted one from its checkpoint), so a killed benchmark is rerun with the same command. The report replaces
the section between `<!-- bench_smollm2:begin -->` and `<!-- bench_smollm2:end -->` of `--md`, with a picture.

    python benchmarks/bench_smollm2.py --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench_nano import ALL_SETS, EVAL_SETS, mean_sd, split_and_kind, steps, write_section  # noqa: E402

CONFIG = ROOT / "configs" / "smollm2.yaml"
PHASES = ("base", "sft", "stage1", "stage2")
BEGIN, END = "<!-- bench_smollm2:begin -->", "<!-- bench_smollm2:end -->"


def run_name(seed: int) -> str:
    return f"smollm2-seed{seed}"


def overrides(seed: int, out: Path, threads: int, design: list[str]) -> list[str]:
    return [f"name={run_name(seed)}", f"seed={seed}", f"output_dir={out}", f"threads={threads}", EVAL_SETS, *design]


def train(out: Path, seed: int, threads: int, design: list[str]) -> None:
    cmd = [sys.executable, "-m", "sirius_train.cli", "train", str(CONFIG), *overrides(seed, out, threads, design)]
    with open(out / f"{run_name(seed)}.log", "a") as log:
        subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})


def finished(run_dir: Path) -> bool:
    return (run_dir / "summary.json").is_file() and all((run_dir / p / "DONE.json").is_file() for p in PHASES)


def held_out_ex(run_dir: Path) -> dict[str, dict[str, float]]:
    """Held-out set -> phase -> EX (%) of a finished run."""
    summary = json.loads((run_dir / "summary.json").read_text())
    return {name: {phase: 100 * summary["eval_sets"][phase][name] for phase in PHASES} for name in ALL_SETS}


def costs(run_dir: Path) -> dict:
    """Where a run's time and memory went: SFT, pass rates + curriculum, DAPO steps split into generation / update."""
    summary = json.loads((run_dir / "summary.json").read_text())
    info = {p["phase"]: p for p in summary["phases"]}
    rows = steps(run_dir)
    gen = [r["gen_time_s"] for r in rows]
    update = [r["step_time_s"] - r["gen_time_s"] for r in rows]
    return {"sft_s": info["sft"].get("seconds", 0.0),
            "curriculum_s": [info[s].get("curriculum_seconds", 0.0) for s in ("stage1", "stage2")],
            "stage_s": [info[s].get("seconds", 0.0) for s in ("stage1", "stage2")],
            "curriculum_sizes": [sum(b["selected"] for b in info[s]["curriculum_report"]["bins"])
                                 if "bins" in info[s].get("curriculum_report", {}) else None
                                 for s in ("stage1", "stage2")],
            "steps": len(rows), "gen_s": statistics.median(gen) if gen else 0.0,
            "update_s": statistics.median(update) if update else 0.0,
            "tokens_per_s": statistics.median([r["tokens_per_s"] for r in rows]) if rows else 0.0,
            "peak_rss_gib": max((r.get("peak_rss_gib", 0.0) for r in rows), default=0.0),
            "acc": [statistics.mean([r["acc_mean"] for r in rows if r["stage"] == s] or [0.0])
                    for s in ("stage1", "stage2")],
            "entropy": [r["entropy"] for r in rows]}


def report(out: Path, seeds: list[int], command: str, design: list[str], picture: str) -> str:
    from data_synthesis.records import read_examples

    data_dir = out / run_name(seeds[0]) / "data"
    sizes = {name: len(read_examples(data_dir / ("eval.jsonl" if i == 0 else f"eval-{name}.jsonl")))
             for i, name in enumerate(ALL_SETS)}
    ex = {s: held_out_ex(out / run_name(s)) for s in seeds}
    lines = ["## SmolLM2-135M-Instruct through the recipe, over seeds (`benchmarks/bench_smollm2.py`)", "",
             f"Rerun: `{command}`" + (f" (design overrides: `{' '.join(design)}`)" if design else ""), "",
             "Held-out execution accuracy (greedy answers, %) of the pretrained model zero-shot, after the SFT warm "
             "start, after DAPO stage 1 and stage 2, per seed; then DAPO − SFT (stage 2 − SFT) in points, mean ± sd "
             f"over seeds. Held-out sets: {', '.join(f'{name} {n}' for name, n in sizes.items())} questions on "
             "generated databases no phase trained on; validation is where choices are made, test is only reported.",
             "", "| split | held out | " + " | ".join(f"seed {s}: base / SFT / stage 1 / stage 2" for s in seeds)
             + " | DAPO − SFT, mean ± sd | after SFT | after stage 2 |", "|---|---|" + "---:|" * (len(seeds) + 3)]
    for name in sorted(ALL_SETS, key=lambda n: (split_and_kind(n)[0] != "validation", n)):
        split, kind = split_and_kind(name)
        cells = [" / ".join(f"{ex[s][name][p]:.1f}" for p in PHASES)
                 + f" ({ex[s][name]['stage2'] - ex[s][name]['sft']:+.1f})" for s in seeds]
        deltas = [ex[s][name]["stage2"] - ex[s][name]["sft"] for s in seeds]
        lines.append(f"| {split} | {kind} | " + " | ".join(cells) + f" | **{mean_sd(deltas, '+.1f')}** | "
                     f"{mean_sd([ex[s][name]['sft'] for s in seeds])} | "
                     f"{mean_sd([ex[s][name]['stage2'] for s in seeds])} |")
    lines += ["", "Per run, where the time went (seconds of the run's own phases; DAPO steps as medians) and its "
              "peak memory:", "",
              "| seed | SFT s | pass rates + curriculum s (stage 1 / 2) | stage s (1 / 2) | curriculum examples "
              "(1 / 2) | DAPO steps | generation s / step | update s / step | generated tokens/s | train acc "
              "(1 / 2) | peak RSS GiB |", "|---:|" + "---:|" * 10]
    for s in seeds:
        c = costs(out / run_name(s))
        lines.append(f"| {s} | {c['sft_s']:.0f} | {c['curriculum_s'][0]:.0f} / {c['curriculum_s'][1]:.0f} | "
                     f"{c['stage_s'][0]:.0f} / {c['stage_s'][1]:.0f} | "
                     f"{' / '.join(str(n) for n in c['curriculum_sizes'])} | {c['steps']} | {c['gen_s']:.1f} | "
                     f"{c['update_s']:.1f} | {c['tokens_per_s']:.1f} | {c['acc'][0]:.2f} / {c['acc'][1]:.2f} | "
                     f"{c['peak_rss_gib']:.1f} |")
    lines += ["", f"![held-out EX per phase and entropy per step]({picture})", ""]
    return "\n".join(lines)


def plot(out: Path, seeds: list[int], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    styles = {"seen-types": "-", "unseen-names": "--"}
    for s in seeds:
        ex = held_out_ex(out / run_name(s))
        for name in ALL_SETS:
            split, _ = split_and_kind(name)
            ax = axes[0 if split == "validation" else 1]
            ax.plot(PHASES, [ex[name][p] for p in PHASES], styles[name.split("-", 1)[1]], marker="o", alpha=0.7,
                    label=f"seed {s}, {name.split('-', 1)[1]}")
        axes[2].plot([r["entropy"] for r in steps(out / run_name(s))], alpha=0.7, label=f"seed {s}")
    axes[0].set(title="held-out EX, validation", ylabel="EX %")
    axes[1].set(title="held-out EX, test (only reported)")
    axes[2].set(title="policy entropy per DAPO step (both stages)", xlabel="step", ylabel="nats/token")
    for ax in axes:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "bench_smollm2")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per run (1: the 2 cores are shared)")
    ap.add_argument("--md", type=Path, default=ROOT / "docs" / "benchmarks" / "smollm2_recipe.md")
    ap.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE", dest="design",
                    help="overrides of configs/smollm2.yaml for every run: measure another design the same way")
    ap.add_argument("--train-only", action="store_true", help="train; write no report")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for seed in args.seeds:
        if finished(args.out / run_name(seed)):
            continue  # the schedule would skip every phase; a report reruns no training
        t0 = time.monotonic()
        train(args.out, seed, args.threads, args.design)
        print(f"seed {seed}: {time.monotonic() - t0:.0f} s", flush=True)
    if args.train_only:
        return
    command = "python benchmarks/bench_smollm2.py " + " ".join(sys.argv[1:])
    picture = args.md.with_name(f"{args.md.stem}.png")
    text = report(args.out, args.seeds, command, args.design, picture.name)
    write_section(args.md, text, BEGIN, END)
    plot(args.out, args.seeds, picture)
    print(text)


if __name__ == "__main__":
    main()
