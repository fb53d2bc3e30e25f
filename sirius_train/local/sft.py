"""Supervised warm start (the usual cold start before RL): next-token loss on the answer tokens only.

Built on the Hugging Face `Trainer`, so the same code runs the nano warm start on a laptop CPU and a
32B cold start under DeepSpeed ZeRO-2/3 (`deepspeed=` a JSON config such as `configs/deepspeed/zero3.json`)
on a cluster. The answer is the SQL in the format the reward extracts (a ```sql block), followed by the chat
template's end-of-turn, so the model learns where to stop.

Launched on several processes (`torchrun`, `deepspeed`, `accelerate launch`; see docs/SFT.md), `sirius sft`
runs the schedule on rank 0 and the other ranks wait in `follow_sft` (`sirius_train.local.ranks`): rank 0's
`train_sft` writes the starting weights and the encoded data under `output_dir/handoff` (the run directory
must be on a filesystem every node sees, as DeepSpeed checkpoints need anyway) and every rank then trains in
one `Trainer`. Under ZeRO-3 the trained shards are gathered back into rank 0's model, so the caller saves
and evaluates a whole model, exactly as after a one-process run.
"""

from __future__ import annotations

import os
import shutil
import socket
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from data_synthesis.interaction import observation_spans
from data_synthesis.jsonl import read_jsonl, write_jsonl
from data_synthesis.prompts import chat_text
from sirius_train.local import ranks
from sirius_train.local.deepspeed_config import check_deepspeed_config

IGNORE = -100


def answer_text(sql: str) -> str:
    """The target answer for `sql`: what `rewards.extract.extract_sql` reads back.

    Example:
        >>> answer_text("SELECT 1")
        '```sql\\nSELECT 1\\n```'
    """
    return f"```sql\n{sql.strip()}\n```"


def encode_example(tokenizer, prompt: list[dict], answer: str, max_len: int) -> dict | None:
    """input_ids with labels masked to the answer, less the observations of a multi-turn demo (the environment's
    text, as in RL rollouts); None if the prompt alone does not fit."""
    prompt_text = chat_text(tokenizer, prompt)
    full_text = tokenizer.apply_chat_template(prompt + [{"role": "assistant", "content": answer}], tokenize=False,
                                              chat_template=tokenizer.chat_template or None)
    if not full_text.startswith(prompt_text):  # templates that rewrite earlier turns: fall back to concatenation
        full_text = prompt_text + answer + (tokenizer.eos_token or "")
    prompt_ids = tokenizer(prompt_text, add_special_tokens=False)["input_ids"]
    full_ids = tokenizer(full_text, add_special_tokens=False)["input_ids"]
    if len(prompt_ids) >= max_len:
        return None
    full_ids = full_ids[:max_len]
    labels = [IGNORE] * len(prompt_ids) + full_ids[len(prompt_ids):]
    spans = [(a + len(prompt_text), b + len(prompt_text)) for a, b in observation_spans(full_text[len(prompt_text):])]
    if spans:
        offsets = tokenizer(full_text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        for i, (start, end) in enumerate(offsets[:len(full_ids)]):
            if any(start < b and end > a for a, b in spans):
                labels[i] = IGNORE
    return {"input_ids": full_ids, "labels": labels}


def pack(examples: list[dict], max_len: int) -> list[dict]:
    """Greedy packing of encoded examples into sequences of at most `max_len` tokens."""
    packed, cur_ids, cur_labels = [], [], []
    for ex in examples:
        if cur_ids and len(cur_ids) + len(ex["input_ids"]) > max_len:
            packed.append({"input_ids": cur_ids, "labels": cur_labels})
            cur_ids, cur_labels = [], []
        cur_ids = cur_ids + ex["input_ids"]
        cur_labels = cur_labels + ex["labels"]
    if cur_ids:
        packed.append({"input_ids": cur_ids, "labels": cur_labels})
    return packed


@dataclass
class PadCollator:
    pad_id: int

    def __call__(self, batch: list[dict]) -> dict:
        width = max(len(b["input_ids"]) for b in batch)
        ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        labels = torch.full((len(batch), width), IGNORE, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, b in enumerate(batch):
            n = len(b["input_ids"])
            ids[i, :n] = torch.tensor(b["input_ids"])
            labels[i, :n] = torch.tensor(b["labels"])
            mask[i, :n] = 1
        return {"input_ids": ids, "labels": labels, "attention_mask": mask}


@dataclass(frozen=True)
class SFTOptions:
    """The `Trainer` settings of one warm start: what rank 0 hands to the other ranks of a launch."""

    epochs: float = 3.0
    lr: float = 2e-3
    batch_size: int = 32  # per device (DeepSpeed's train_micro_batch_size_per_gpu)
    gradient_accumulation_steps: int = 1
    warmup_ratio: float = 0.05
    weight_decay: float = 0.0
    gradient_checkpointing: bool = False  # recompute activations in backward: long sequences on big models
    deepspeed: str | None = None  # DeepSpeed JSON; None: plain PyTorch (CPU, or DDP under a launcher)
    seed: int = 0
    bf16: bool = False  # mixed precision: float32 weights, bf16 autocast (on a CPU too; local/precision.py)


def train_sft(model, tokenizer, pairs: list[tuple[list[dict], str]], output_dir: str | Path, *, epochs: float = 3.0,
              lr: float = 2e-3, batch_size: int = 32, warmup_ratio: float = 0.05, weight_decay: float = 0.0,
              max_len: int = 512, packing: bool = False, deepspeed: str | None = None, seed: int = 0,
              gradient_accumulation_steps: int = 1, gradient_checkpointing: bool = False, bf16: bool = False,
              callbacks=(), report_to=()) -> dict:
    """Fine-tune `model` in place on (prompt messages, answer text) pairs; resumes from `output_dir` checkpoints.

    On rank 0 of a launch led by `ranks.leading()` the other ranks join this training (see the module
    docstring); the returned figures and the trained `model` are rank 0's.
    """
    options = SFTOptions(epochs=epochs, lr=lr, batch_size=batch_size, warmup_ratio=warmup_ratio,
                         weight_decay=weight_decay, deepspeed=deepspeed, seed=seed,
                         gradient_accumulation_steps=gradient_accumulation_steps,
                         gradient_checkpointing=gradient_checkpointing, bf16=bf16)
    encoded = [e for e in (encode_example(tokenizer, p, a, max_len) for p, a in pairs) if e is not None]
    dropped = len(pairs) - len(encoded)
    if not encoded:
        raise ValueError("no SFT examples to train on" if not pairs else
                         f"no SFT example fits in max_len={max_len} tokens; raise sft.max_len")
    data = pack(encoded, max_len) if packing else encoded
    resume = resume_point(Path(output_dir))
    handoff = ranks.current_handoff()
    if handoff is not None:
        handoff.publish(_write_handoff(model, tokenizer.pad_token_id, data, output_dir, options, report_to, resume))
    result = _fit(model, tokenizer.pad_token_id, data, output_dir, options, callbacks, report_to, resume)
    if handoff is not None:  # every rank read it before the first (collective) step
        shutil.rmtree(Path(output_dir) / "handoff", ignore_errors=True)
    return {"sft_loss": result.training_loss, "sft_steps": result.global_step, "sft_examples": len(encoded),
            "sft_sequences": len(data), "sft_dropped_too_long": dropped}


def follow_sft(timeout_s: float = ranks.LEADER_TIMEOUT_S) -> bool:
    """A rank > 0 of a launched `sirius sft`: wait for rank 0's spec and train with it; False if there was none."""
    spec = ranks.wait_for_leader(timeout_s)
    if spec is None:
        return False
    from transformers import AutoModelForCausalLM

    device = f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(spec["init"], dtype=getattr(torch, spec["dtype"]),
                                                 local_files_only=True).to(device)
    if spec.get("lora"):  # rank 0 trains adapters: every rank puts the same fresh ones on the same base
        from sirius_train.lora import LoraSpec, attach

        model = attach(model, LoraSpec(**{**spec["lora"], "target_modules": tuple(spec["lora"]["target_modules"])}))
    data = read_jsonl(Path(spec["data"]), required=("input_ids", "labels"))
    _fit(model, spec["pad_id"], data, spec["output_dir"], SFTOptions(**spec["options"]), (), spec["report_to"],
         spec["resume"])
    return True


def training_arguments(output_dir: str | Path, options: SFTOptions, on_gpu: bool, report_to=(), deepspeed=None):
    """The `TrainingArguments` of a warm start (`deepspeed`: the checked config dict, or None)."""
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=str(output_dir), num_train_epochs=options.epochs, learning_rate=options.lr,
        per_device_train_batch_size=options.batch_size, gradient_accumulation_steps=options.gradient_accumulation_steps,
        warmup_steps=options.warmup_ratio, weight_decay=options.weight_decay, lr_scheduler_type="cosine",
        logging_steps=10, save_strategy="steps", save_steps=200, report_to=list(report_to),
        seed=options.seed, data_seed=options.seed, use_cpu=not on_gpu, bf16=options.bf16,
        gradient_checkpointing=options.gradient_checkpointing,
        gradient_checkpointing_kwargs={"use_reentrant": False} if options.gradient_checkpointing else None,
        deepspeed=deepspeed, dataloader_num_workers=0, remove_unused_columns=False, disable_tqdm=True,
    )


def check_run_config(cfg) -> None:
    """The warm start's launch rules for a run config (`sirius train` / `sirius sft` call it right after loading
    it): its DeepSpeed config must fit the training arguments, when the SFT uses one; its LoRA target modules must
    be modules the model has."""
    from sirius_train.lora import check_run

    check_run(cfg)
    if cfg.sft.enabled and cfg.sft.deepspeed:
        check_sft_deepspeed(cfg.sft, seed=cfg.seed, device=cfg.device, dtype=cfg.model.dtype)


def check_sft_deepspeed(sft, *, seed: int = 0, device: str = "auto", world_size: int | None = None,
                        dtype: str = "auto") -> dict:
    """`check_deepspeed_config` for a run config's `sft` section, with the arguments `train_sft` will use
    (`dtype`: the run's `model.dtype`).

    `world_size` defaults to the launch's (`WORLD_SIZE`, 1 outside a launcher).
    """
    from sirius_train.local.precision import compute_dtype

    on_gpu = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    options = SFTOptions(epochs=sft.epochs, lr=sft.lr, batch_size=sft.batch_size, warmup_ratio=sft.warmup_ratio,
                         weight_decay=sft.weight_decay, deepspeed=sft.deepspeed, seed=seed,
                         gradient_accumulation_steps=sft.gradient_accumulation_steps,
                         gradient_checkpointing=sft.gradient_checkpointing,
                         bf16=compute_dtype(dtype, "cuda" if on_gpu else "cpu") == torch.bfloat16)
    args = training_arguments("unused", options, on_gpu)
    return check_deepspeed_config(sft.deepspeed, args, world_size or ranks.launch_world_size())


def _fit(model, pad_id: int, data: list[dict], output_dir: str | Path, options: SFTOptions, callbacks, report_to,
         resume: str | None):
    """The one training code path of every rank: a `Trainer` (under DeepSpeed when configured), resumed from
    rank 0's `resume_point`."""
    from transformers import PrinterCallback, Trainer

    from sirius_train.local.sft_preemption import RecordCheckpoints, StopOnPreemption

    output_dir = Path(output_dir)
    callbacks = [*callbacks, RecordCheckpoints()]  # retention happens there, after the record
    if ranks.launch_world_size() <= 1:  # one process: a preemption checkpoints the step (ranks could not follow)
        callbacks.append(StopOnPreemption())
    on_gpu = next(model.parameters()).is_cuda
    with _deepspeed_process_group(options.deepspeed):
        ds_config = None
        if options.deepspeed:
            plain = training_arguments(output_dir, options, on_gpu, report_to)
            ds_config = check_deepspeed_config(options.deepspeed, plain, world_size=ranks.launch_world_size())
        args = training_arguments(output_dir, options, on_gpu, report_to, deepspeed=ds_config)
        trainer = Trainer(model=model, args=args, train_dataset=data, data_collator=PadCollator(pad_id),
                          callbacks=list(callbacks))
        trainer.remove_callback(PrinterCallback)  # progress and loss are shown by the caller's callbacks
        result = trainer.train(resume_from_checkpoint=resume)
        if ds_config is not None:
            _release_deepspeed(trainer, model, zero3=ds_config.get("zero_optimization", {}).get("stage") == 3)
    return result


def resume_point(output_dir: Path) -> str | None:
    """The newest complete `checkpoint-N` of `output_dir` (its record written last), or None. Each newer one is
    incomplete (a kill during its save): it is removed with a warning, since the steps after the resume point are
    redone and the Trainer would otherwise write into it. Rank 0 decides, before the other ranks are handed the
    spec (which names it)."""
    from sirius_train.local.checkpoint import latest_checkpoint, list_checkpoints
    from sirius_train.local.sft_preemption import SFT_CHECKPOINTS, TRAINER_WRITES_LAST
    from sirius_train.progress import stderr

    last = latest_checkpoint(output_dir, pattern=SFT_CHECKPOINTS, hashes=False, writer_last=TRAINER_WRITES_LAST,
                             warn=lambda message: stderr.print(f"[yellow]warning:[/] SFT {message}: removed"))
    found = list_checkpoints(output_dir, SFT_CHECKPOINTS)
    for newer in found[found.index(last) + 1 if last else 0:]:
        shutil.rmtree(newer)
    if last is not None:
        stderr.print(f"resuming SFT from {last}")
    return str(last) if last else None


@contextmanager
def _deepspeed_process_group(deepspeed: str | None):
    """DeepSpeed always trains in a process group. Outside a launcher this process is a group of one for the
    training, and a plain process again afterwards (environment restored, group destroyed); in any case the
    flag accelerate leaves in the environment (`ACCELERATE_USE_DEEPSPEED`) is restored, so that a later
    training in the same process does not silently run under DeepSpeed."""
    if not deepspeed:
        yield
        return
    env = {}
    launched = "RANK" in os.environ or "LOCAL_RANK" in os.environ
    if not launched:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    saved = {key: os.environ.get(key) for key in [*env, "ACCELERATE_USE_DEEPSPEED"]}
    os.environ.update(env)
    try:
        yield
    finally:
        import torch.distributed as dist

        if not launched and dist.is_initialized():
            dist.destroy_process_group()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _release_deepspeed(trainer, model, zero3: bool) -> None:
    """Leave `model` an ordinary module: ZeRO-3 shards gathered back (whole on rank 0), DeepSpeed's hooks removed,
    and transformers told ZeRO-3 is over (else `generate` would wait for the other ranks at every token).

    Parameters are gathered one at a time into CPU memory, so the peak is one parameter beyond the sharded
    training state, and go back to the device as fresh parameters once the engine and its optimizer shards
    are gone; a parameter shared by two modules (tied embeddings) stays shared.
    """
    from accelerate.state import AcceleratorState
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    engine = trainer.model_wrapped
    device = engine.device
    whole: dict[int, torch.Tensor] = {}
    if zero3:
        import deepspeed

        for param in model.parameters():
            with deepspeed.zero.GatheredParameters([param], modifier_rank=None):
                if ranks.launch_rank() == 0:
                    whole[id(param)] = param.data.to("cpu", copy=True)
    engine.destroy()
    trainer.model_wrapped = trainer.deepspeed = None
    unset_hf_deepspeed_config()
    # accelerate keeps its DeepSpeed state in process-wide singletons: a later Trainer in this process would
    # inherit it (and this run's process group). Resetting them is how accelerate's own tests start over.
    AcceleratorState._reset_state(reset_partial_state=True)
    if zero3:
        fresh: dict[int, torch.nn.Parameter] = {}
        for module in model.modules():
            for key, param in module._parameters.items():
                if param is not None and id(param) in whole:
                    if id(param) not in fresh:
                        fresh[id(param)] = torch.nn.Parameter(whole[id(param)].to(device),
                                                              requires_grad=param.requires_grad)
                    module._parameters[key] = fresh[id(param)]


def _write_handoff(model, pad_id: int, data: list[dict], output_dir: str | Path, options: SFTOptions,
                   report_to, resume: str | None) -> dict:
    """Rank 0: the files and settings the other ranks train with (paths absolute: they may run elsewhere)."""
    from sirius_train.lora import spec_of

    handoff = Path(output_dir).resolve() / "handoff"
    lora = spec_of(model)
    init = Path(model.name_or_path or "")
    if lora is not None and not (init / "config.json").is_file():
        raise ValueError("a LoRA warm start on several ranks starts from a model folder (the base's weights, which "
                         "every rank adapts afresh); this model was built in memory")
    if not (init / "config.json").is_file():  # built in memory (the nano model): write it out
        init = handoff / "init"
        model.save_pretrained(init)
    write_jsonl(handoff / "data.jsonl", data)
    return {"init": str(init.resolve()), "data": str(handoff / "data.jsonl"), "pad_id": pad_id,
            "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
            "output_dir": str(Path(output_dir).resolve()), "options": asdict(options), "report_to": list(report_to),
            "resume": resume and str(Path(resume).resolve()), "lora": lora and asdict(lora)}
