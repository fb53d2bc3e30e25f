"""Per-GPU memory plans for the phases of a verl run, from the model's shape and the config (pure arithmetic).

Estimates, not measurements: each part is the textbook size of what the phase keeps on a GPU, so that a
shape that cannot fit is caught in seconds instead of an hour into a cluster job. The parts (their labels):

    FSDP state            fp32 parameters + fp32 gradients + AdamW m, v = 16 bytes/param, sharded over all GPUs
                          (LoRA: 4 bytes a frozen base parameter, 16 an adapter parameter; no base gradients)
                          (on the GPU during the update even with offload: verl loads them back for the step)
    actor kept            what stays of it while vLLM generates: fp32 params unless param_offload, AdamW unless
                          optimizer_offload (gradients are freed after the step)
    gathered layers       FSDP unshards two decoder layers at a time in bf16 (the one running, the one
                          prefetched) and one layer's gradient (bf16, then its fp32 copy for the reduce-scatter:
                          6 bytes/param); and the vocabulary matrices with their gradients, 4 bytes/param each:
                          embedding *and* LM head when untied (FSDP1 keeps both in the root unit, gathered from the
                          first forward to the end of backward, their bf16 gradients accumulating beside them; FSDP2
                          gathers the LM head alone in backward, but with its fp32 reduce copy: the same 8 bytes a
                          vocabulary row), the one shared matrix when tied
    saved activations     gradient checkpointing keeps each layer's bf16 input (layers x tokens x hidden x 2);
    recompute             one layer at a time is recomputed: (5h + 2 kv_heads head_dim + 4 intermediate) x 2 bytes
                          a token (without checkpointing, "activations" = that for every layer)
    logits                tokens x vocab x (2 bf16 logits + 4 fp32 log-softmax + 4 fp32 gradient), + 4 for the
                          softmax an entropy term in the loss keeps (the adaptive gate, a fixed coefficient)
    weights / TP, vLLM    vLLM takes gpu_memory_utilization x GPU memory: bf16 weights / TP, its profiled
    activations, CUDA     activations (max_num_batched_tokens x (4h + 3 intermediate / TP) x 2 bytes + 256
    graphs, KV cache      sequences' fp32 logits), 1 GiB of CUDA graphs unless enforce_eager, and the KV cache
                          gets the rest; vLLM refuses to start when that cannot hold one max_model_len sequence
    context               CUDA context, NCCL buffers, allocator slack: 2 GiB a GPU outside all of the above

`tokens` is the per-GPU token budget of one micro-batch (`ppo_max_token_len_per_gpu`; with Ulysses
sequence parallelism each GPU holds that many tokens of a longer sequence).
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 2**30
CONTEXT_GIB = 2.0  # CUDA context, NCCL buffers, allocator slack per GPU
CUDA_GRAPHS_GIB = 1.0
VLLM_PROFILE_SEQS = 256  # vLLM's default max_num_seqs: sequences whose logits its profile run holds


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer's sizes (a Hugging Face config.json's fields)."""

    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int = 0  # 0: hidden / heads
    tied_embeddings: bool = False
    qkv_bias: bool = False

    @property
    def hd(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def layer_params(self) -> int:
        q, kv = self.heads * self.hd, self.kv_heads * self.hd
        attention = self.hidden * (q + 2 * kv) + q * self.hidden + ((q + 2 * kv) if self.qkv_bias else 0)
        return attention + 3 * self.hidden * self.intermediate + 2 * self.hidden

    @property
    def vocab_params(self) -> int:
        """The embedding and the LM head (one matrix when tied)."""
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2)

    @property
    def params(self) -> int:
        return self.vocab_params + self.layers * self.layer_params + self.hidden

    def adapter_params(self, rank: int, targets: tuple[str, ...] = ()) -> int:
        """LoRA's trained parameters: r x (in + out) for each adapted projection of each block (`targets`
        empty: all seven, as "all-linear" takes them)."""
        q, kv, h, i = self.heads * self.hd, self.kv_heads * self.hd, self.hidden, self.intermediate
        sizes = {"q_proj": h + q, "k_proj": h + kv, "v_proj": h + kv, "o_proj": q + h,
                 "gate_proj": h + i, "up_proj": h + i, "down_proj": i + h}
        unknown = set(targets) - set(sizes)
        if unknown:
            raise ValueError(f"no size for LoRA target(s) {sorted(unknown)}: the planner knows {sorted(sizes)}")
        return self.layers * rank * sum(size for name, size in sizes.items() if not targets or name in targets)

    def kv_bytes_per_token(self, tp: int = 1) -> int:
        """bf16 K and V of one token on one tensor-parallel rank (KV heads are split, or replicated past TP)."""
        return 2 * self.layers * -(-self.kv_heads // tp) * self.hd * 2

    @classmethod
    def from_hf_config(cls, c: dict) -> ModelShape:
        return cls(vocab=c["vocab_size"], hidden=c["hidden_size"], intermediate=c["intermediate_size"],
                   layers=c["num_hidden_layers"], heads=c["num_attention_heads"],
                   kv_heads=c.get("num_key_value_heads") or c["num_attention_heads"], head_dim=c.get("head_dim") or 0,
                   tied_embeddings=bool(c.get("tie_word_embeddings", False)),
                   qkv_bias=bool(c.get("attention_bias", c.get("model_type") == "qwen2")))


# Published shapes (each model's config.json on the Hugging Face hub), for planning before the weights are here.
QWEN25_7B = ModelShape(vocab=152064, hidden=3584, intermediate=18944, layers=28, heads=28, kv_heads=4, qkv_bias=True)
QWEN25_32B = ModelShape(vocab=152064, hidden=5120, intermediate=27648, layers=64, heads=40, kv_heads=8, qkv_bias=True)
QWEN25_05B = ModelShape(vocab=151936, hidden=896, intermediate=4864, layers=24, heads=14, kv_heads=2,
                        tied_embeddings=True, qkv_bias=True)
KNOWN_SHAPES = {"qwen2.5-0.5b": QWEN25_05B, "qwen2.5-coder-0.5b": QWEN25_05B,
                "qwen2.5-coder-7b": QWEN25_7B, "qwen2.5-7b": QWEN25_7B, "qwen2.5-math-7b": QWEN25_7B,
                "qwen2.5-coder-32b": QWEN25_32B, "qwen2.5-32b": QWEN25_32B}


def known_shape(model_path: str) -> tuple[str, ModelShape] | None:
    """(name, shape) of a published model whose name the folder carries, e.g. /models/Qwen2.5-Coder-7B-Instruct."""
    folder = model_path.rstrip("/").rsplit("/", 1)[-1].lower()
    for name, shape in KNOWN_SHAPES.items():
        if folder.startswith(name):
            return name, shape
    return None


@dataclass(frozen=True)
class Layout:
    """How one verl stage lays the model out on GPUs (the run config's `verl:` section and the stage's lengths)."""

    gpus: int  # FSDP shards over every GPU of the job
    gpu_gib: float
    tokens_per_gpu: int  # ppo_max_token_len_per_gpu
    max_model_len: int  # prompt + answer tokens
    rollout_tp: int = 1
    gpu_memory_utilization: float = 0.6
    max_num_batched_tokens: int = 8192
    param_offload: bool = False
    optimizer_offload: bool = False
    gradient_checkpointing: bool = True
    entropy_in_loss: bool = False
    enforce_eager: bool = False
    lora_rank: int = 0  # > 0: adapters train, the base is frozen (no gradients, no AdamW state)
    lora_targets: tuple[str, ...] = ()

    def trained(self, shape: ModelShape) -> int:
        """Parameters with gradients and optimizer state: the adapters under LoRA, else every one."""
        return shape.adapter_params(self.lora_rank, self.lora_targets) if self.lora_rank else shape.params


@dataclass(frozen=True)
class PhasePlan:
    """One phase's per-GPU memory: its parts (GiB), their total against the GPU, and what the numbers mean."""

    phase: str
    parts: tuple[tuple[str, float], ...]
    gpu_gib: float
    fits: bool
    note: str = ""

    @property
    def total_gib(self) -> float:
        return sum(gib for _, gib in self.parts)


def update_plan(shape: ModelShape, layout: Layout) -> PhasePlan:
    """The FSDP actor update (the peak of the training side) at `tokens_per_gpu` tokens per micro-batch."""
    p, t = shape.params, layout.tokens_per_gpu
    per_layer_token = (5 * shape.hidden + 2 * shape.kv_heads * shape.hd + 4 * shape.intermediate) * 2
    if layout.lora_rank:  # frozen fp32 base, adapters with gradients and AdamW; no gradient of a base layer
        a = layout.trained(shape)
        parts = [("FSDP state (frozen base + adapters)", (4 * p + 16 * a) / layout.gpus / GIB),
                 ("gathered layers", (shape.layer_params * 2 * 2 + shape.vocab_params * 2) / GIB)]
    else:
        parts = [("FSDP state", 16 * p / layout.gpus / GIB),
                 ("gathered layers", (shape.layer_params * (2 * 2 + 2 + 4) + shape.vocab_params * (2 + 2)) / GIB)]
    if layout.gradient_checkpointing:
        parts += [("saved activations", shape.layers * t * shape.hidden * 2 / GIB),
                  ("recompute", t * per_layer_token / GIB)]
    else:
        parts += [("activations", shape.layers * t * per_layer_token / GIB)]
    parts += [("logits", t * shape.vocab * (10 + (4 if layout.entropy_in_loss else 0)) / GIB),
              ("context", CONTEXT_GIB)]
    total = sum(g for _, g in parts)
    return PhasePlan("update (FSDP actor)", tuple(parts), layout.gpu_gib, total <= layout.gpu_gib,
                     f"{t} tokens per micro-batch per GPU, state sharded over {layout.gpus} GPUs")


def vllm_plan(phase: str, shape: ModelShape, *, tp: int, utilization: float, gpu_gib: float, max_model_len: int,
              max_num_batched_tokens: int, enforce_eager: bool = False, resident_gib: float = 0.0,
              resident_label: str = "") -> PhasePlan:
    """A vLLM engine of `tp` GPUs taking `utilization` of each, beside `resident_gib` that something else holds."""
    budget = utilization * gpu_gib
    weights = 2 * shape.params / tp / GIB
    activations = (max_num_batched_tokens * (4 * shape.hidden + 3 * shape.intermediate / tp) * 2
                   + VLLM_PROFILE_SEQS * shape.vocab * 4) / GIB
    graphs = 0.0 if enforce_eager else CUDA_GRAPHS_GIB
    kv = budget - weights - activations - graphs
    kv_tokens = int(max(kv, 0.0) * GIB // shape.kv_bytes_per_token(tp))
    parts = [(resident_label, resident_gib)] if resident_gib else []
    parts += [(f"weights / TP {tp}", weights), ("vLLM activations", activations)]
    parts += [("CUDA graphs", graphs)] if graphs else []
    parts += [("KV cache", max(kv, 0.0)), ("context", CONTEXT_GIB)]
    free_at_start = gpu_gib - resident_gib - CONTEXT_GIB
    fits = budget <= free_at_start and kv_tokens >= max_model_len
    if budget > free_at_start:
        note = f"vLLM asks for {budget:.1f} GiB but only {free_at_start:.1f} GiB are free beside what the actor keeps"
    elif kv_tokens < max_model_len:
        note = f"KV cache holds {kv_tokens} tokens, less than one {max_model_len}-token sequence"
    else:
        note = (f"KV cache {kv_tokens / 1000:.0f}k tokens = {kv_tokens // max_model_len} sequences of "
                f"{max_model_len} tokens per engine")
    return PhasePlan(phase, tuple(parts), gpu_gib, fits, note)


def rollout_plan(shape: ModelShape, layout: Layout) -> PhasePlan:
    """verl's rollouts: vLLM beside what the actor keeps on the GPU (hybrid engine: the same GPUs)."""
    resident = ((0 if layout.param_offload else 4 * shape.params)
                + (0 if layout.optimizer_offload else 8 * layout.trained(shape))) / layout.gpus
    label = "actor kept"
    return vllm_plan("rollout (vLLM in verl)", shape, tp=layout.rollout_tp,
                     utilization=layout.gpu_memory_utilization, gpu_gib=layout.gpu_gib,
                     max_model_len=layout.max_model_len, max_num_batched_tokens=layout.max_num_batched_tokens,
                     enforce_eager=layout.enforce_eager, resident_gib=resident / GIB, resident_label=label)


def stage_plans(shape: ModelShape, layout: Layout) -> list[PhasePlan]:
    """A verl stage's two peaks: rollout and update (the no-grad log-prob pass needs less than the update)."""
    return [rollout_plan(shape, layout), update_plan(shape, layout)]


def checkpoint_gib(shape: ModelShape, trained: int | None = None) -> float:
    """One verl actor checkpoint: fp32 weights + AdamW m, v (12 bytes/param) of what trains (`trained`: the
    adapters of a LoRA run, which saves them alone; default every parameter), sharded files."""
    return 12 * (shape.params if trained is None else trained) / GIB


def disk_plan_gib(shape: ModelShape, checkpoints_per_stage: list[int], trained: int | None = None) -> float:
    """Checkpoints every stage keeps, plus each stage's merged bf16 model (stages keep theirs after they end)."""
    return sum(n * checkpoint_gib(shape, trained) + 2 * shape.params / GIB for n in checkpoints_per_stage)


def stage_layout(cfg, stage, gpu_gib: float) -> Layout:
    """The `Layout` a run config gives one stage (`cfg`: RunConfig; `verl.overrides` are not read)."""
    from sirius_train.verl_backend.translate import response_tokens  # multi-turn: observations count too

    v = cfg.verl
    max_model_len = v.max_prompt_length + response_tokens(cfg, stage)
    tokens = v.ppo_max_token_len_per_gpu if v.use_dynamic_bsz else v.ppo_micro_batch_size_per_gpu * max_model_len
    return Layout(gpus=v.nnodes * v.n_gpus_per_node, gpu_gib=gpu_gib, tokens_per_gpu=tokens,
                  max_model_len=max_model_len, rollout_tp=v.rollout_tp,
                  gpu_memory_utilization=v.gpu_memory_utilization, max_num_batched_tokens=v.max_num_batched_tokens,
                  param_offload=v.param_offload, optimizer_offload=v.optimizer_offload,
                  gradient_checkpointing=v.gradient_checkpointing, entropy_in_loss=stage.entropy.mode != "off",
                  enforce_eager=v.enforce_eager, lora_rank=cfg.model.lora_rank,
                  lora_targets=tuple(cfg.model.lora_target_modules))


def estimation_plan(cfg, shape: ModelShape, gpu_gib: float) -> PhasePlan:
    """Pass rates and evaluation on the verl backend: vLLM engines of `rollout_tp` GPUs, nothing else on them."""
    from sirius_train.verl_backend.translate import engine_context_length

    v = cfg.verl
    return vllm_plan("pass rates + eval (vLLM)", shape, tp=v.rollout_tp, utilization=v.estimate_gpu_memory_utilization,
                     gpu_gib=gpu_gib, max_model_len=engine_context_length(cfg),
                     max_num_batched_tokens=v.max_num_batched_tokens, enforce_eager=v.enforce_eager)
