"""The nano schedule over seeds, and its ablations, on the validation and the test split of both held-out kinds.

For each seed the default run (`configs/nano.yaml`, what `make demo` runs) trains from scratch; each ablation
(entropy gate off, uniform curriculum) then reuses that seed's data, base model and SFT warm start (copied), so
the variants differ only in the DAPO stages. Every run is evaluated after each phase on the four held-out sets
(`data_synthesis.demo_dbs.HELD_OUT_SETS`): validation and test, each as "seen table types" (new databases built
from the training table types) and "unseen table and column names". Design choices are made on validation; the
test split is only reported. Finished runs are not run again (the schedule skips finished phases), so an
interrupted benchmark resumes, and several copies may run side by side on different seeds with one `--out`.
Each run is then diagnosed by `nano_phases.py` (greedy answers per phase and the mistakes the SFT demonstrations
taught; for the first seed's default run also pass@k / maj@k). The report replaces the section between
`<!-- bench_nano:begin -->` and `<!-- bench_nano:end -->` of `--md` (the whole file if it has none), and the
entropy picture is written beside it (`<md name>_entropy.png`).

    python benchmarks/bench_nano.py --seeds 0 1 2 --threads 1
    python benchmarks/bench_nano.py --seeds 0 1 2 --variants default --set reward.variants=3 \\
        --out runs/bench_variants --warm-starts runs/bench_nano --md runs/bench_variants/report.md
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from data_synthesis.demo_dbs import HELD_OUT_SETS  # noqa: E402

VARIANTS = {
    "default": [],
    "gate-off": ["stages.0.entropy.mode=off", "stages.1.entropy.mode=off"],
    "uniform": ["stages.0.curriculum=uniform", "stages.1.curriculum=uniform"],
    # rank-8 adapters on every projection for both stages after the same full SFT (nano's embeddings start random),
    # at 10x the full fine-tune's lr: the common LoRA starting point, not tuned here
    "lora": ["model.lora_rank=8", "model.lora_alpha=16", "sft.lora=false", "stages.0.lr=2e-3", "stages.1.lr=1e-3"],
}
PHASES = ("sft", "stage1", "stage2")
# every run is evaluated on every held-out set; the test sets first, as in configs/nano.yaml (the run's headline)
ALL_SETS = sorted(HELD_OUT_SETS, key=lambda name: HELD_OUT_SETS[name].split != "test")
EVAL_SETS = f"data.eval_sets=[{','.join(ALL_SETS)}]"
KIND = {"seen-types": "seen table types", "unseen-names": "unseen table and column names"}
BEGIN, END = "<!-- bench_nano:begin -->", "<!-- bench_nano:end -->"
# what a warm start depends on: a run may reuse another's base model and SFT only where these agree
WARM_START_KEYS = ("seed", "data", "model", "sft", "threads")


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
                if line.strip() and json.loads(line).get("stage", "").split("@")[0] in parts]
        (dst / "metrics.jsonl").write_text("".join(r + "\n" for r in rows))


def overrides(variant: str, seed: int, out: Path, threads: int, design: list[str]) -> list[str]:
    return [f"name={run_name(variant, seed)}", f"seed={seed}", f"output_dir={out}", f"threads={threads}", EVAL_SETS,
            *design, *VARIANTS[variant]]


def warm_start_of(run_dir: Path, cfg_overrides: list[str]) -> dict:
    """The config sections a warm start depends on, as `run_dir`'s run had them or as these overrides give them."""
    from dataclasses import asdict

    from sirius_train.config import load_config

    cfg = asdict(load_config(run_dir / "config.yaml") if (run_dir / "config.yaml").is_file()
                 else load_config(ROOT / "configs" / "nano.yaml", cfg_overrides))
    keep = {k: cfg[k] for k in WARM_START_KEYS}
    keep["data"] = {k: v for k, v in keep["data"].items() if k != "eval_sets"}  # evaluated sets: not trained on
    return keep


def train(out: Path, variant: str, seed: int, threads: int, design: list[str] = ()) -> None:
    name = run_name(variant, seed)
    cmd = [sys.executable, "-m", "sirius_train.cli", "train", str(ROOT / "configs" / "nano.yaml"),
           *overrides(variant, seed, out, threads, design)]
    with open(out / f"{name}.log", "a") as log:
        subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})


def diagnose(out: Path, variant: str, seed: int, k: int) -> dict:
    """`nano_phases.py` figures of a finished run: greedy answers and taught mistakes on every held-out set; with
    k > 0 also pass@k / maj@k at the training temperature, on the test sets and 200 fresh training-db questions."""
    run_dir = out / run_name(variant, seed)
    path = run_dir / f"phases_k{k}.json"
    if not path.is_file():
        cmd = [sys.executable, str(ROOT / "benchmarks" / "nano_phases.py"), str(run_dir), "--k", str(k),
               "--fresh", "200" if k else "0", "--json", str(path)]
        if k:
            cmd += ["--held-out", *(name for name in ALL_SETS if HELD_OUT_SETS[name].split == "test")]
        with open(out / f"{run_name(variant, seed)}.log", "a") as log:
            subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
    return json.loads(path.read_text())


def mistakes(phases: dict, phase: str, held_out: str) -> int:
    """Greedy answers of `phase` on a held-out set that reproduce one of the mistakes the SFT demonstrations taught."""
    return sum(f["mistake"] for f in phases["phases"][phase][held_out].get("flaws", {}).values())


def steps(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r for r in rows if "reward_mean" in r]


def applied_coef(row: dict) -> float:
    """The coefficient the step's loss used (`entropy_coef` is the gate state c_k, applied only while open)."""
    if "entropy_coef_applied" in row:
        return row["entropy_coef_applied"]
    return row["entropy_coef"] * row.get("entropy_gate_open", 1.0)  # rows logged before that field existed


def mean_sd(values: list[float], fmt: str = ".1f") -> str:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):{fmt}} ± {sd:.1f}"


def held_out_ex(run_dir: Path) -> dict[str, dict[str, float]]:
    """Held-out set -> phase -> EX (%) of a finished run."""
    summary = json.loads((run_dir / "summary.json").read_text())
    return {name: {phase: 100 * summary["eval_sets"][phase][name] for phase in PHASES} for name in ALL_SETS}


def split_and_kind(name: str) -> tuple[str, str]:
    split, kind = name.split("-", 1)
    return HELD_OUT_SETS[name].split, KIND[kind]


def report(out: Path, seeds: list[int], variants: list[str], command: str, design: list[str], diag: dict,
           detail: dict[int, dict], picture: str) -> str:
    from data_synthesis.records import read_examples

    data_dir = out / run_name(variants[0], seeds[0]) / "data"
    sizes = {name: len(read_examples(data_dir / ("eval.jsonl" if i == 0 else f"eval-{name}.jsonl")))
             for i, name in enumerate(ALL_SETS)}
    ex = {(v, s): held_out_ex(out / run_name(v, s)) for v in variants for s in seeds}
    lines = ["## Nano schedule over seeds, and its ablations (`benchmarks/bench_nano.py`)", "",
             f"Rerun: `{command}`" + (f" (design overrides: `{' '.join(design)}`)" if design else ""), "",
             "Held-out execution accuracy (greedy answers) after the SFT warm start → after DAPO stage 2, and "
             "DAPO − SFT in points, per seed, then the mean ± sd over seeds. Each held-out set is "
             f"{', '.join(f'{name} {n}' for name, n in sizes.items())} questions on generated databases no phase "
             "saw (the tokenizer included); validation is where design choices are made, test is only reported. "
             "Ablations reuse the seed's data, base model and SFT, so they differ only in the DAPO stages.", "",
             "| variant | split | held out | " + " | ".join(f"seed {s}: SFT → stage 2" for s in seeds)
             + " | DAPO − SFT, mean ± sd | after SFT, mean ± sd | after stage 2, mean ± sd |",
             "|---|---|---|" + "---:|" * (len(seeds) + 3)]
    for variant in variants:
        for name in sorted(ALL_SETS, key=lambda n: (HELD_OUT_SETS[n].split != "validation", n)):
            split, kind = split_and_kind(name)
            cells = [f"{ex[variant, s][name]['sft']:.1f} → {ex[variant, s][name]['stage2']:.1f} "
                     f"({ex[variant, s][name]['stage2'] - ex[variant, s][name]['sft']:+.1f})" for s in seeds]
            deltas = [ex[variant, s][name]["stage2"] - ex[variant, s][name]["sft"] for s in seeds]
            lines.append(f"| {variant} | {split} | {kind} | " + " | ".join(cells)
                         + f" | **{mean_sd(deltas, '+.1f')}** | {mean_sd([ex[variant, s][name]['sft'] for s in seeds])}"
                         f" | {mean_sd([ex[variant, s][name]['stage2'] for s in seeds])} |")
    seen = [n for n in ALL_SETS if n.endswith("seen-types")]
    lines += ["", "Per run: held-out EX after SFT / stage 1 / stage 2 on each set; the taught mistakes in greedy "
              "answers (SFT → stage 1 → stage 2) on the seen-types sets; entropy and the gate; seconds.", "",
              "| variant | seed | " + " | ".join(ALL_SETS) + " | " + " | ".join(f"taught mistakes, {n}" for n in seen)
              + " | mean entropy stage 1 / 2 | min entropy | steps with the bonus on | largest coef applied "
              "| SFT s | DAPO stages s |", "|---|---:|" + "---:|" * (len(ALL_SETS) + len(seen) + 6)]
    for variant in variants:
        for seed in seeds:
            run_dir = out / run_name(variant, seed)
            summary = json.loads((run_dir / "summary.json").read_text())
            seconds = {p["phase"]: p.get("seconds", 0.0) for p in summary["phases"]}
            rows = steps(run_dir)
            ent = {s: [r["entropy"] for r in rows if r["stage"] == s] for s in ("stage1", "stage2")}
            applied = [applied_coef(r) for r in rows]
            lines.append(
                f"| {variant} | {seed} | "
                + " | ".join(" / ".join(f"{ex[variant, seed][n][p]:.1f}" for p in PHASES) for n in ALL_SETS)
                + " | "
                + " | ".join(" → ".join(str(mistakes(diag[variant, seed], p, n)) for p in PHASES) for n in seen)
                + f" | {statistics.mean(ent['stage1']):.3f} / {statistics.mean(ent['stage2']):.3f} "
                f"| {min(ent['stage1'] + ent['stage2']):.3f} | {sum(c > 0 for c in applied)} / {len(rows)} "
                f"| {max(applied):.4f} | {seconds['sft']:.0f} | {seconds['stage1'] + seconds['stage2']:.0f} |")
    lines += ["", f"![entropy per step]({picture})", ""]
    if detail:
        lines += per_phase(detail)
    return "\n".join(lines)


def per_phase(detail: dict[int, dict]) -> list[str]:
    """The default runs' `nano_phases.py` figures: mean ± sd over seeds (each seed's in brackets), then seed 0's
    failure kinds and taught mistakes."""
    from nano_phases import markdown

    seeds = list(detail)
    k, t = detail[seeds[0]]["k"], detail[seeds[0]]["temperature"]
    keys = {"greedy": "greedy EX", "sampled": f"sampled EX (T = {t})", "pass_at_k": f"pass@{k}", "maj_at_k": f"maj@{k}"}
    lines = [f"Per phase, the default runs (`benchmarks/nano_phases.py`): greedy EX, the mean EX of {k} samples at "
             f"the training temperature, pass@{k} and maj@{k} on the test sets and on 200 fresh questions over the "
             f"training databases (a new seed, none in any pool); mean ± sd over seeds {seeds} (each seed's figure "
             "in brackets).", "", "| phase | questions | " + " | ".join(keys.values()) + " |",
             "|---|---|" + "---:|" * len(keys)]
    first = detail[seeds[0]]["phases"]
    for phase, sets in first.items():
        for name in sets:
            cells = []
            for key in keys:
                values = [100 * detail[s]["phases"][phase][name][key] for s in seeds]
                cells.append(f"{mean_sd(values)} ({' / '.join(f'{v:.1f}' for v in values)})")
            lines.append(f"| {phase} | {name} | " + " | ".join(cells) + " |")
    lines += ["", f"Seed {seeds[0]} alone (one run; the spread over seeds of its greedy EX is in the tables above): "
              "failures by the part a wrong greedy answer got wrong, and per kind of taught mistake the questions it "
              "applies to and the greedy answers that are right / that reproduce the mistake.", "",
              markdown(detail[seeds[0]]), ""]
    return lines


def write_section(path: Path, text: str, begin: str = BEGIN, end: str = END) -> None:
    """Replace the section of `path` marked `begin` ... `end` (the whole file when it has no markers)."""
    old = path.read_text() if path.is_file() else ""
    section = f"{begin}\n{text}\n{end}"
    if begin in old and end in old:
        new = re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda _: section, old, count=1, flags=re.S)
    else:
        new = section + "\n"
    path.write_text(new)


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
    ap.add_argument("--threads", type=int, default=1, help="torch threads per run (1: deterministic on one machine)")
    ap.add_argument("--k", type=int, default=8, help="samples per question for the per-phase figures (0: skip them)")
    ap.add_argument("--md", type=Path, default=ROOT / "docs" / "benchmarks" / "nano.md")
    ap.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE", dest="design",
                    help="overrides of configs/nano.yaml for every run: measure another design the same way")
    ap.add_argument("--warm-starts", type=Path, default=None, metavar="OUT",
                    help="reuse the base model and SFT of OUT/default-seed<S> (another benchmark's runs) wherever "
                         "the warm start's config agrees (seed, data, model, sft, threads); checked, not assumed")
    ap.add_argument("--train-only", action="store_true", help="train and diagnose; write no report")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for seed in args.seeds:
        for variant in args.variants:
            target = args.out / run_name(variant, seed)
            source = args.out / run_name("default", seed)
            if all((target / phase / "DONE.json").is_file() for phase in PHASES):
                continue  # finished: the schedule would skip every phase (and a report reruns no training)
            if args.warm_starts and not (target / "sft" / "DONE.json").is_file():
                source = args.warm_starts / run_name("default", seed)
                want = warm_start_of(target, overrides(variant, seed, args.out, args.threads, args.design))
                if warm_start_of(source, []) != want:
                    sys.exit(f"{source}: its warm start's config differs from this run's; leave out --warm-starts")
                copy_run(source, target)
            elif variant != "default" and not (target / "sft" / "DONE.json").is_file():
                if not (source / "summary.json").is_file():
                    train(args.out, "default", seed, args.threads, args.design)
                copy_run(source, target)
            t0 = time.monotonic()
            train(args.out, variant, seed, args.threads, args.design)
            print(f"{variant} seed {seed}: {time.monotonic() - t0:.0f} s", flush=True)
    diag = {(v, seed): diagnose(args.out, v, seed, 0) for v in args.variants for seed in args.seeds}
    detail = ({seed: diagnose(args.out, "default", seed, args.k) for seed in args.seeds}
              if "default" in args.variants and args.k else {})
    if args.train_only:
        return
    command = "python benchmarks/bench_nano.py " + " ".join(sys.argv[1:])
    picture = args.md.with_name(f"{args.md.stem}_entropy.png")  # nano.md's beside nano.md, another --md's its own
    text = report(args.out, args.seeds, args.variants, command, args.design, diag, detail, picture.name)
    write_section(args.md, text)
    plot(args.out, args.seeds, args.variants, picture)
    print(text)


if __name__ == "__main__":
    main()
