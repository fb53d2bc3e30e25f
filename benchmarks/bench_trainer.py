"""Seconds per DAPO step: the local backend's `DAPOTrainer` beside TRL's `GRPOTrainer(loss_type="dapo")`.

    python benchmarks/bench_trainer.py       # nano SFT policy, stage 1 shape, 3 rounds of 1 + 5 steps each
    python benchmarks/bench_trainer.py --steps 2 --rounds 1 --set sft.epochs=1 --contenders ours,trl   # a quick look

One step = generate G answers for each of P prompts, score them by execution, and update the policy (DAPO
clipped token-mean loss, no KL), as the stage's mini-batches. Both trainers get the same policy (one HF
checkpoint: the config's data, nano base model and SFT warm start, built once and cached under
`runs/bench_trainer_<hash>`), the same prompts in the same order (the RL pool, shuffled by the trainer's own
`EpochSampler`), the same reward (the sandboxed `Executor` on the same databases plus DAPO's overlong
shaping, each side with its own fresh executor) and the same shape, taken from the stage (nano stage 1:
P=8, G=8, 48 new tokens, temperature 1, 2 mini-batches, lr 2e-4, clip 0.2/0.28, adaptive entropy gate).

Contenders (each in its own fresh process, so imports, allocator state and peak RSS never mix):
  ours       `DAPOTrainer.train_step` with dynamic sampling's keep rule replaced by "keep every group": one
             generation round, and the update trains on all P*G answers -- the same work TRL does.
  ours-dapo  `DAPOTrainer.train_step` as shipped: groups with all answers right or all wrong are dropped and
             up to `max_gen_rounds` rounds refill the batch (more generation, a varying update size).
  trl        `GRPOTrainer`: per_device_train_batch_size = P*G/mini_batches, gradient_accumulation_steps = 1,
             steps_per_generation = mini_batches, so one generation of P*G answers feeds `mini_batches`
             optimizer steps, each on one mini-batch of whole answers (our mini-batches); beta=0,
             epsilon/epsilon_high = clip_low/clip_high, mask_truncated_completions=False (ours trains on
             truncated answers too, with the overlong penalty), fp32, no gradient checkpointing.

Each contender process runs 1 warm-up step, then --steps timed steps; the contenders take turns round by
round (a busy neighbour slows all alike) and the figures pool every timed step. A step's time is wall time
(CPU s: this process's user + system time): around `train_step()` for ours; between the optimizer-step
callbacks that close a step (`on_step_end` at every `mini_batches`-th optimizer step) for TRL, so TRL's own
loop overhead counts. "Rollout" is ours' `gen_time_s` (generate + score, every round) and, for TRL, its
`_generate_and_score_completions` (generate + old log-probs + score + advantages). Answer lengths are each
side's own count: TRL stops at EOS and counts it; ours also stops as soon as the ```sql block is closed
(`data_synthesis.generation.SQLBlockClosed`), typically one token before the EOS the SFT policy writes next.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path
from unittest import mock

import torch
from _memory import status_kib

ROOT = Path(__file__).resolve().parents[1]
NANO = ROOT / "configs" / "nano.yaml"
CONTENDERS = ("ours", "ours-dapo", "trl")


def load_run_config(args):
    """The config under a run name derived from config + overrides, so a changed override gets its own cache."""
    from sirius_train.config import load_config

    key = hashlib.sha1(json.dumps([str(args.config), args.set]).encode()).hexdigest()[:8]
    run_dir = Path(args.output_dir) / f"bench_trainer_{key}"
    overrides = [f"name={run_dir.name}", f"output_dir={run_dir.parent}", f"data.db_root={run_dir / 'dbs'}",
                 f"threads={args.threads}", "logging.backends=[]", "logging.plots=false", *args.set]
    return load_config(args.config, overrides)


def prepare_policy(cfg) -> Path:
    """Data, base model and SFT warm start through the project's own schedule (skipped when already done)."""
    from sirius_train.local.backend import LocalBackend
    from sirius_train.schedule import run

    backend = LocalBackend(cfg)
    try:
        return Path(run(cfg, backend, sft_only=True)["final_model"])
    finally:
        backend.close()


def train_items(data):
    """The raw RL pool as trainer items: a step's cost does not need the pass-rate curriculum built first."""
    from data_synthesis.difficulty import prompt_for
    from sirius_train.local.trainer import TrainItem

    return [TrainItem(prompt_for(e, data.db_root, data.prompt_format), e.db_id, e.gold_sql, e.id)
            for e in data.rl_pool]


def keep_every_group(correct: torch.Tensor) -> torch.Tensor:
    """Stands in for `dynamic_sampling_keep`: no group is dropped, so no round refills the batch."""
    return torch.ones(correct.shape[0], dtype=torch.bool)


def run_ours(cfg, stage, model_path: Path, items, args, dynamic_sampling: bool) -> dict:
    from sirius_train.local.backend import LocalBackend
    from sirius_train.local.trainer import DAPOTrainer

    backend = LocalBackend(cfg)
    model, tokenizer = backend.load(model_path)
    if not dynamic_sampling:
        stage = replace(stage, max_gen_rounds=1)
    trainer = DAPOTrainer(model, tokenizer, items, stage, backend.executor, ckpt_dir=cfg.run_dir / "bench_ckpt",
                          metrics=backend.metrics, seed=args.seed)
    torch.set_num_threads(args.threads)
    rss_start = status_kib("VmRSS")
    steps = []
    keep = nullcontext() if dynamic_sampling else mock.patch("sirius_train.local.trainer.dynamic_sampling_keep",
                                                            keep_every_group)
    with keep:
        for _ in range(1 + args.steps):
            trainer.step += 1
            start, cpu_start = time.perf_counter(), time.process_time()
            row = trainer.train_step()
            seconds, cpu = time.perf_counter() - start, time.process_time() - cpu_start
            answers = stage.prompts_per_step * stage.n_samples * row["gen_rounds"]
            steps.append({"seconds": seconds, "cpu_s": cpu, "rollout_s": row["gen_time_s"], "answers": answers,
                          "tokens": row["response_length"] * answers, "trained": row.get("n_answers", 0)})
    backend.close()
    return {"steps": steps, "rss_start_kib": rss_start, "peak_rss_kib": status_kib("VmHWM"),
            "threads": torch.get_num_threads()}


def run_trl(cfg, stage, model_path: Path, items, args) -> dict:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rewards.extract import extract_sql
    from rewards.scoring import ScoreItem
    from sirius_train.algorithms import overlong_penalties
    from sirius_train.local.backend import LocalBackend
    from sirius_train.local.trainer import EpochSampler

    backend = LocalBackend(cfg)
    model, tokenizer = backend.load(model_path)
    executor, compare = backend.executor, cfg.data.compare
    P, G, total = stage.prompts_per_step, stage.n_samples, 1 + args.steps
    order = EpochSampler(len(items), args.seed).take(P * total)  # the prompts `ours` takes, in its order
    dataset = Dataset.from_list([{"prompt": items[i].prompt, "db_id": items[i].db_id, "gold_sql": items[i].gold_sql}
                                 for i in order])
    lengths: list[list[int]] = []

    def sql_execution(completions, completion_ids, db_id, gold_sql, **_) -> list[float]:
        """`DAPOTrainer.score`'s reward: execution outcome plus the overlong shaping on the token length."""
        results = executor.score([ScoreItem(d, g, extract_sql(c[0]["content"]), compare)
                                  for d, g, c in zip(db_id, gold_sql, completions)])
        n_tokens = torch.tensor([len(ids) for ids in completion_ids])
        lengths.append(n_tokens.tolist())
        rewards = torch.tensor([r.reward for r in results], dtype=torch.float32)
        if stage.overlong_cache > 0:
            rewards = rewards + overlong_penalties(n_tokens, stage.max_new_tokens, stage.overlong_cache)
        return rewards.tolist()

    class StepClock(TrainerCallback):
        """Marks the end of every DAPO step: `mini_batches` optimizer steps share one generation."""

        def __init__(self):
            self.marks: list[tuple[float, float]] = []  # (wall, process CPU) seconds
            self.rss_start = 0

        def on_train_begin(self, *_, **__):
            torch.set_num_threads(args.threads)
            self.rss_start = status_kib("VmRSS")
            self.marks.append((time.perf_counter(), time.process_time()))

        def on_step_end(self, _args, state, *_, **__):
            if state.global_step % stage.mini_batches == 0:
                self.marks.append((time.perf_counter(), time.process_time()))

    entropy = stage.entropy
    config = GRPOConfig(
        output_dir=str(cfg.run_dir / "trl"), use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False,
        per_device_train_batch_size=P * G // stage.mini_batches, gradient_accumulation_steps=1,
        steps_per_generation=stage.mini_batches, num_iterations=stage.ppo_epochs, num_generations=G,
        max_completion_length=stage.max_new_tokens, temperature=stage.temperature, top_p=stage.top_p,
        learning_rate=stage.lr, lr_scheduler_type="constant_with_warmup",
        warmup_steps=stage.warmup_steps * stage.mini_batches,  # TRL counts optimizer steps, ours training steps
        weight_decay=stage.weight_decay, max_grad_norm=stage.grad_clip, adam_beta1=0.9, adam_beta2=0.999,
        loss_type="dapo", beta=0.0, epsilon=stage.clip_low, epsilon_high=stage.clip_high, scale_rewards="group",
        mask_truncated_completions=False,
        use_adaptive_entropy=entropy.mode == "adaptive", entropy_coef=entropy.coef if entropy.mode != "off" else 0.0,
        entropy_target=entropy.target, entropy_coef_delta=entropy.delta, entropy_coef_max=entropy.coef_max,
        shuffle_dataset=False, max_steps=stage.mini_batches * total, seed=args.seed,
        logging_strategy="no", save_strategy="no", report_to="none", disable_tqdm=True)
    clock = StepClock()
    trainer = GRPOTrainer(model=model, reward_funcs=sql_execution, args=config, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[clock])
    rollout_s: list[float] = []
    generate_and_score = trainer._generate_and_score_completions

    def timed_rollout(inputs):
        start = time.perf_counter()
        out = generate_and_score(inputs)
        rollout_s.append(time.perf_counter() - start)
        return out

    trainer._generate_and_score_completions = timed_rollout
    trainer.train()
    backend.close()
    steps = [{"seconds": b[0] - a[0], "cpu_s": b[1] - a[1], "rollout_s": r, "answers": len(n), "tokens": sum(n),
              "trained": len(n)} for a, b, r, n in zip(clock.marks, clock.marks[1:], rollout_s, lengths)]
    return {"steps": steps, "rss_start_kib": clock.rss_start, "peak_rss_kib": status_kib("VmHWM"),
            "threads": torch.get_num_threads()}


def worker(args) -> dict:
    from sirius_train.schedule import prepare_data

    cfg = load_run_config(args)
    stage = cfg.stages[args.stage]
    torch.manual_seed(args.seed)
    items = train_items(prepare_data(cfg))
    if args.worker == "trl":
        return run_trl(cfg, stage, args.model, items, args)
    return run_ours(cfg, stage, args.model, items, args, dynamic_sampling=args.worker == "ours-dapo")


def measure(name: str, model: Path, args) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", name, "--model", str(model),
           "--config", str(args.config), "--output-dir", str(args.output_dir), "--stage", str(args.stage),
           "--steps", str(args.steps), "--threads", str(args.threads), "--seed", str(args.seed),
           *(x for s in args.set for x in ("--set", s))]
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if done.returncode:
        sys.exit(f"{name} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def summarize(results: list[dict]) -> dict:
    """Pool the timed steps of every round (each round's first step is its warm-up)."""
    steps = [s for r in results for s in r["steps"][1:]]
    seconds = [s["seconds"] for s in steps]
    tokens = sum(s["tokens"] for s in steps)
    return {"n": len(steps), "median": statistics.median(seconds), "mean": statistics.mean(seconds),
            "cpu": statistics.median(s["cpu_s"] for s in steps),
            "rollout": statistics.median(s["rollout_s"] for s in steps),
            "answers": statistics.mean(s["answers"] for s in steps),
            "trained": statistics.mean(s["trained"] for s in steps),
            "length": tokens / sum(s["answers"] for s in steps), "tok_s": tokens / sum(seconds),
            "ms_per_token": 1000 * sum(seconds) / tokens,
            "rss_start": max(r["rss_start_kib"] for r in results) / 1024,
            "peak_rss": max(r["peak_rss_kib"] for r in results) / 1024,
            "threads": sorted({r["threads"] for r in results})}


def report(results: dict[str, list[dict]], cfg, args, load: tuple, command: str) -> str:
    import transformers
    import trl

    stage = cfg.stages[args.stage]
    stats = {name: summarize(rounds) for name, rounds in results.items()}
    threads = ", ".join(f"{name} {s['threads']}" for name, s in stats.items())
    lines = [f"Command: `{command}`", "",
             f"Machine: {platform.machine()}, {os.cpu_count()} CPUs (`nproc`), load average before/after "
             f"{load[0]:.1f}/{load[1]:.1f}; Python {platform.python_version()}, torch {torch.__version__}, "
             f"transformers {transformers.__version__}, trl {trl.__version__}; torch threads per contender "
             f"{threads}.", "",
             f"Shape: {stage.name} of {Path(args.config).name} -- P={stage.prompts_per_step} prompts x "
             f"G={stage.n_samples} answers, max {stage.max_new_tokens} new tokens, temperature {stage.temperature}, "
             f"{stage.mini_batches} mini-batches, lr {stage.lr}; {args.steps} timed steps after 1 warm-up, "
             f"x {args.rounds} round(s).", "",
             "| contender | timed steps | median step s | mean step s | median CPU s | median rollout s "
             "| answers generated "
             "| answers trained | mean answer tokens | generated tok/s | ms per generated token "
             "| RSS at start MiB | peak RSS MiB | median vs trl | per token vs trl |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    trl_stats = stats.get("trl")
    for name, s in stats.items():
        vs = f"{s['median'] / trl_stats['median']:.2f}x" if trl_stats else "-"
        per_token = f"{s['ms_per_token'] / trl_stats['ms_per_token']:.2f}x" if trl_stats else "-"
        lines.append(f"| {name} | {s['n']} | {s['median']:.3f} | {s['mean']:.3f} | {s['cpu']:.3f} | "
                     f"{s['rollout']:.3f} | {s['answers']:.0f} | {s['trained']:.0f} | {s['length']:.1f} | {s['tok_s']:.0f} | "
                     f"{s['ms_per_token']:.2f} | {s['rss_start']:.0f} | {s['peak_rss']:.0f} | {vs} | {per_token} |")
    lines += ["", "Every step's seconds (warm-up first, one line per round):", ""]
    lines += [f"- {name}: " + "; ".join(" ".join(f"{s['seconds']:.2f}" for s in r["steps"]) for r in rounds)
              for name, rounds in results.items()]
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", type=Path, default=NANO)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override (repeatable)")
    p.add_argument("--stage", type=int, default=0, help="index of the stage whose shape is timed")
    p.add_argument("--steps", type=int, default=5, help="timed steps per contender and round (after 1 warm-up)")
    p.add_argument("--rounds", type=int, default=3, help="contenders take turns this many times")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--contenders", default=",".join(CONTENDERS))
    p.add_argument("--output-dir", type=Path, default=ROOT / "runs", help="where the cached policy is built")
    p.add_argument("--markdown", type=Path, help="also write the report here")
    p.add_argument("--worker", choices=CONTENDERS, help=argparse.SUPPRESS)
    p.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()

    if args.worker:
        print(json.dumps(worker(args)))
        return 0

    names = [c for c in args.contenders.split(",") if c]
    unknown = set(names) - set(CONTENDERS)
    if unknown:
        p.error(f"unknown contender(s) {sorted(unknown)}; choose from {list(CONTENDERS)}")
    cfg = load_run_config(args)
    model = prepare_policy(cfg)
    load_before = os.getloadavg()[0]
    results: dict[str, list[dict]] = {n: [] for n in names}
    for _ in range(args.rounds):
        for name in names:
            results[name].append(measure(name, model, args))
    command = "PYTHONPATH=. python benchmarks/bench_trainer.py " + " ".join(sys.argv[1:])
    text = report(results, cfg, args, (load_before, os.getloadavg()[0]), command.strip())
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
