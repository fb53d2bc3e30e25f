"""The local backend: every phase of the schedule in this process, on the CPU or one GPU.

Checkpoints move between phases as ordinary HF folders (the schedule's contract with every backend);
the loaded model stays in memory between phases so the nano demo does not pay for reloading.
"""

from __future__ import annotations

import os
import random
from contextlib import contextmanager
from pathlib import Path

import torch

from rewards.client import FallbackScorer, RewardClient
from rewards.executor import Executor
from rewards.reward import RewardTable
from rewards.sandbox import Limits
from rewards.suites import Suite
from sirius_train.config import RunConfig, StageConfig
from sirius_train.local.precision import MASTER_DTYPE, autocast, compute_dtype
from sirius_train.local.trainer import DAPOTrainer, TrainItem
from sirius_train.metrics import MetricsLog
from sirius_train.progress import stderr


def read_curriculum(parquet: Path) -> list[TrainItem]:
    """Training items from a verl-layout parquet (the same file verl would train on)."""
    import pyarrow.parquet as pq

    rows = pq.read_table(parquet).to_pylist()
    return [TrainItem(prompt=[{"role": m["role"], "content": m["content"]} for m in r["prompt"]],
                      db_id=r["extra_info"]["db_id"], gold_sql=r["reward_model"]["ground_truth"],
                      uid=r["extra_info"].get("id") or str(r["extra_info"]["index"])) for r in rows]


class LocalBackend:
    def __init__(self, cfg: RunConfig):
        from transformers.utils import logging as hf_logging

        from sirius_train.local.quiet import quiet_deepspeed

        hf_logging.disable_progress_bar()  # our rich bars report the phases; HF's tqdm bars would interleave
        quiet_deepspeed()  # the Trainer imports DeepSpeed, which announces its CPU fallback on a CPU machine
        self.cfg = cfg
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        self.device = cfg.device if cfg.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
        # weights and optimizer state in float32, the forward passes in model.dtype (local/precision.py says why)
        self.dtype = compute_dtype(cfg.model.dtype, self.device)
        torch.manual_seed(cfg.seed)
        self.metrics = MetricsLog(cfg.run_dir / "metrics.jsonl", cfg.logging.backends, cfg.logging.project,
                                  cfg.name)
        self._executor: Executor | FallbackScorer | None = None
        self._eval_executor: Executor | None = None
        self._probes = None  # SandboxProbes of multi-turn runs, opened on first use
        self._loaded: tuple[Path, object, object] | None = None

    @property
    def executor(self) -> Executor | FallbackScorer:
        """The reward's scorer, opened on first use (the databases may be built by the schedule first): in
        process, or on `reward.url`'s servers with the in-process one as the fallback (`reward.fallback`)."""
        if self._executor is None:
            r = self.cfg.reward
            table = RewardTable(correct=r.correct, wrong=r.wrong, error=r.error, timeout=r.timeout,
                                rejected=r.rejected, format_failure=r.format_failure, empty_match=r.empty_match)

            def in_process() -> Executor:
                return Executor(self.cfg.data.db_root, workers=r.workers, limits=Limits(timeout_s=r.timeout_s),
                                table=table, suite=Suite(variants=r.variants))

            if r.url:
                client = RewardClient(r.url, token=os.environ.get("SIRIUS_REWARD_TOKEN"),
                                      timeout_s=max(60.0, 10 * r.timeout_s))
                self._executor = FallbackScorer(client, in_process, fallback=r.fallback,
                                                warn=lambda message: stderr.print(f"[yellow]warning:[/] {message}"))
            else:
                self._executor = in_process()
        return self._executor

    @property
    def eval_executor(self) -> Executor | FallbackScorer:
        """The scorer of held-out evaluations: the reward's, except that EX is always the plain figure on the
        shipped databases (with `reward.variants` the reward also asks for a match on variants; EX does not)."""
        if not self.cfg.reward.variants:
            return self.executor
        if self._eval_executor is None:
            self._eval_executor = Executor(self.cfg.data.db_root, workers=0,
                                           limits=Limits(timeout_s=self.cfg.reward.timeout_s))
        return self._eval_executor

    @property
    def multi_turn(self):
        """(ProbeLimits, probe(db_id, sql) -> observation) when `rollout.multi_turn.enabled`, else None."""
        mt = self.cfg.rollout.multi_turn
        if not mt.enabled:
            return None
        from data_synthesis.interaction import ProbeLimits, SandboxProbes

        if self._probes is None:
            self._probes = SandboxProbes(self.cfg.data.db_root, ProbeLimits(
                max_turns=mt.max_turns, max_rows=mt.max_rows, max_chars=mt.max_chars, turn_timeout_s=mt.turn_timeout_s))
        return self._probes.limits, self._probes

    # ------------------------------------------------------------------ models
    def load(self, path: Path, dtype: torch.dtype = MASTER_DTYPE):
        """(model, tokenizer) of a checkpoint folder with weights in `dtype`, reusing the one in memory when it is
        that folder in that dtype."""
        path = Path(path)
        if self._loaded is not None and self._loaded[0] == path and self._loaded[1].dtype == dtype:
            return self._loaded[1], self._loaded[2]
        from data_synthesis.checkpoints import load_model

        gguf = self.cfg.model.gguf_file if self.cfg.model.path and path == Path(self.cfg.model.path) else None
        model, tokenizer = load_model(path, device=self.device, dtype=dtype, gguf_file=gguf)
        self._loaded = (path, model, tokenizer)
        return model, tokenizer

    def precision(self):
        """The context every forward pass of this backend runs in (autocast to `model.dtype`)."""
        return autocast(self.device, self.dtype)

    @contextmanager
    def _adapted(self, model, lora: bool = True):
        """The model a phase trains: `model` itself, or with fresh LoRA adapters (`model.lora_rank`). A phase that
        raises leaves adapters in `model`'s modules, so the model kept in memory is dropped (reloaded when next
        needed)."""
        from sirius_train.lora import LoraSpec, attach, trainable_parameters

        spec = LoraSpec.of(self.cfg.model) if lora else None
        if spec is None:
            yield model
            return
        adapted = attach(model, spec)
        trained, total = trainable_parameters(adapted)
        stderr.print(f"LoRA r={spec.rank}, alpha={spec.alpha:g}: {trained / 1e6:.2f}M of {total / 1e6:.2f}M "
                     f"parameters trained ({100 * trained / total:.2f}%)")
        try:
            yield adapted
        except BaseException:
            self._loaded = None
            raise

    def _merged(self, trained, out: Path):
        """The phase's model to keep: a LoRA phase's adapters saved to `out/adapter`, then merged into the base."""
        from sirius_train.lora import ADAPTER_DIR, is_adapted, merged

        return merged(trained, out / ADAPTER_DIR) if is_adapted(trained) else trained

    def _keep(self, path: Path, model, tokenizer) -> Path:
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
        self._loaded = (Path(path), model, tokenizer)
        return Path(path)

    def prepare_base(self, data, out: Path) -> Path:
        if self.cfg.model.path:
            from data_synthesis.checkpoints import locate

            folder, gguf = locate(self.cfg.model.path, self.cfg.model.gguf_file)
            if gguf is None:
                return folder
            # a GGUF checkpoint becomes an ordinary model folder once: every later phase, vLLM and verl load that
            model, tokenizer = self.load(Path(self.cfg.model.path))
            stderr.print(f"{folder / gguf}: de-quantized to a {MASTER_DTYPE} model folder, {out}")
            return self._keep(out, model, tokenizer)
        from data_synthesis.schema import read_schema
        from sirius_train.local.model import NanoModelConfig, build_nano_model, count_parameters, train_tokenizer
        from sirius_train.local.sft import answer_text

        m = self.cfg.model
        fmt = data.prompt_format
        db_ids = sorted({e.db_id for e in data.sft_pool + data.rl_pool})
        schemas = [read_schema(data.db_root / db / f"{db}.sqlite", n_samples=fmt.schema_samples)
                   .to_text(samples=fmt.schema_samples > 0, style=fmt.schema_style) for db in db_ids]
        # The tokenizer is fitted on what training sees: the training databases' schemas, questions and SQL.
        # Held-out schemas stay out (a held-out name may split into pieces; reading it is the skill measured).
        texts = schemas * 4 + [f"{fmt.system}\n{e.question}\n{answer_text(e.gold_sql)}"
                               for e in data.sft_pool + data.rl_pool]
        if self.multi_turn is not None:  # the episode format's words and tables, as the SFT demos show them
            from data_synthesis.interaction import probe_instructions

            texts += [probe_instructions(self.multi_turn[0])] * 8 + [answer for _, answer in self._sft_pairs(data)]
        tokenizer = train_tokenizer(texts, m.tokenizer_vocab)
        model = build_nano_model(NanoModelConfig(
            vocab_size=m.tokenizer_vocab, hidden_size=m.hidden_size, intermediate_size=m.intermediate_size,
            num_hidden_layers=m.num_hidden_layers, num_attention_heads=m.num_attention_heads,
            num_key_value_heads=m.num_attention_heads, max_position_embeddings=m.max_position_embeddings),
            tokenizer, seed=self.cfg.seed).to(self.device, MASTER_DTYPE)
        stderr.print(f"nano model: {count_parameters(model) / 1e6:.2f}M parameters, vocabulary {len(tokenizer)} "
                     f"(trained on {len(texts)} texts)")
        return self._keep(out, model, tokenizer)

    # ------------------------------------------------------------------ phases
    def sft(self, data, init: Path, out: Path):
        from sirius_train.local.sft import train_sft
        from sirius_train.local.hf_progress import HFProgressCallback

        s = self.cfg.sft
        # DeepSpeed keeps its own float32 master copy of bf16 weights; without it the weights themselves are float32
        model, tokenizer = self.load(init, self.dtype if s.deepspeed else MASTER_DTYPE)
        pairs = self._sft_pairs(data)
        with self._adapted(model, s.lora) as trained:
            figures = train_sft(trained, tokenizer, pairs, out / "trainer", epochs=s.epochs, lr=s.lr, batch_size=s.batch_size,
                                warmup_ratio=s.warmup_ratio, weight_decay=s.weight_decay, max_len=s.max_len,
                                packing=s.packing, deepspeed=s.deepspeed, seed=self.cfg.seed,
                                gradient_accumulation_steps=s.gradient_accumulation_steps,
                                gradient_checkpointing=s.gradient_checkpointing, bf16=self.dtype == torch.bfloat16,
                                    callbacks=[HFProgressCallback("SFT")], report_to=self.cfg.logging.backends)
        model = self._merged(trained, out)
        self.metrics.log({"stage": "sft", "step": figures["sft_steps"], **figures})
        return self._keep(out / "model", model, tokenizer), figures

    def pass_rates(self, examples, model_path: Path, stage: StageConfig, data, out: Path):
        from data_synthesis.difficulty import estimate_pass_rates
        from data_synthesis.samplers import EpisodeSampler, HFSampler
        from sirius_train.halts import preemptible
        from sirius_train.progress import progress_bar

        model, tokenizer = self.load(model_path)
        sampler = HFSampler(model, tokenizer, batch_size=stage.gen_batch_size, compute_dtype=self.dtype)
        if self.multi_turn is not None:  # in episodes: the format the stage trains (and SFT taught) in
            sampler = EpisodeSampler(sampler, self.multi_turn[0], data.db_root)
        with progress_bar(f"pass rates ({stage.name}, k={stage.estimate_k})", len(examples)) as advance:
            options = {"temperature": stage.temperature, "top_p": stage.top_p, "max_new_tokens": stage.max_new_tokens,
                       "batch_size": max(1, stage.gen_batch_size // stage.estimate_k), "compare": data.compare,
                       "timeout_s": self.cfg.reward.timeout_s, "policy": str(model_path),
                       "variants": self.cfg.reward.variants, "prompt_format": data.prompt_format}
            rates = estimate_pass_rates(
                examples, sampler, data.db_root, k=stage.estimate_k, cache_path=out / "passrates.cache.jsonl",
                seed=self.cfg.seed, **options,
                progress=preemptible(advance, f"{stage.name}: pass rates stopped, the finished ones cached"))
        return rates, sampler, options

    def train_stage(self, index: int, stage: StageConfig, curriculum: Path, init: Path, data, out: Path) -> Path:
        from sirius_train.progress import progress_bar

        model, tokenizer = self.load(init)
        items = read_curriculum(curriculum)
        eval_items = self._eval_items(data)

        def evaluate(m) -> dict:
            return self._eval(m, tokenizer, eval_items, data, stage.max_new_tokens)

        with progress_bar(f"DAPO {stage.name}", stage.steps) as advance:
            def show(step: int, row: dict) -> None:
                advance(reward=row["reward_mean"], acc=row["acc_mean"])

            limits, probe = self.multi_turn or (None, None)
            with self._adapted(model) as trained:
                trainer = DAPOTrainer(trained, tokenizer, items, stage, self.executor, ckpt_dir=out / "checkpoints",
                                      metrics=self.metrics, seed=self.cfg.seed + index, compare=data.compare,
                                      evaluate=evaluate if stage.eval_every else None, progress=show,
                                      multi_turn=limits, probe=probe, compute_dtype=self.dtype)
                if trainer.resume():
                    stderr.print(f"resumed {stage.name} from step {trainer.step}")
                    advance(trainer.step, earlier=True)
                trainer.train()
        return self._keep(out / "model", self._merged(trained, out), tokenizer)

    def evaluate(self, model_path: Path, data, stage: str) -> dict:
        from sirius_train.progress import progress_bar

        model, tokenizer = self.load(model_path)
        max_new = max([s.max_new_tokens for s in self.cfg.stages] or [96])
        items = self._eval_items(data)
        with progress_bar(f"evaluation ({stage})", len(items) * (1 + self.cfg.eval.k)) as advance:
            figures = self._eval(model, tokenizer, items, data, max_new, progress=advance)
        self.metrics.log({"stage": stage, "step": -1, "eval": "final", **figures})
        return figures

    # ------------------------------------------------------------------ helpers
    def _sft_pairs(self, data) -> list[tuple[list[dict], str]]:
        """(prompt, answer) demos. Multi-turn runs ask with the probe instructions, and `sft_probe_share` of the
        demos probe their own query once and read its real observation before answering."""
        from data_synthesis.interaction import demo_episode, with_probe_instructions
        from sirius_train.local.sft import answer_text

        pairs = [(self._prompt(e, data), answer_text(e.gold_sql)) for e in data.sft_pool]
        if self.multi_turn is None:
            return pairs
        limits, probe = self.multi_turn
        rng = random.Random(self.cfg.seed)
        share = self.cfg.rollout.multi_turn.sft_probe_share
        return [(with_probe_instructions(prompt, limits),
                 demo_episode(e.gold_sql, probe(e.db_id, e.gold_sql), answer) if rng.random() < share else answer)
                for (prompt, answer), e in zip(pairs, data.sft_pool)]


    def _prompt(self, example, data) -> list[dict]:
        from data_synthesis.difficulty import prompt_for

        return prompt_for(example, data.db_root, data.prompt_format)

    def _eval_items(self, data) -> list[TrainItem]:
        return [TrainItem(self._prompt(e, data), e.db_id, e.gold_sql, e.id) for e in data.eval_set]

    def _eval(self, model, tokenizer, items, data, max_new_tokens: int, progress=None) -> dict:
        from sirius_train.local.evaluate import evaluate_policy

        with self.precision():
            return evaluate_policy(model, tokenizer, items, self.eval_executor, compare=data.compare,
                                   max_new_tokens=max_new_tokens, k=self.cfg.eval.k,
                                   temperature=self.cfg.eval.temperature, seed=self.cfg.seed,
                                   multi_turn=self.multi_turn, progress=progress)

    def close(self) -> None:
        for executor in (self._executor, self._eval_executor):
            if executor is not None:
                executor.close()
        if self._probes is not None:
            self._probes.close()
        self.metrics.close()
