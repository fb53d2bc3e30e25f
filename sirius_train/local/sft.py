"""Supervised warm start (the usual cold start before RL): next-token loss on the answer tokens only.

Built on the Hugging Face `Trainer`, so the same code runs the nano warm start on a laptop CPU and a
32B cold start under DeepSpeed ZeRO-2/3 (`deepspeed=` a JSON config, launched with `deepspeed` or
`accelerate`) on a cluster. The answer is the SQL in the format the reward extracts (a ```sql block),
followed by the chat template's end-of-turn, so the model learns where to stop.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from data_synthesis.prompts import chat_text

IGNORE = -100


def answer_text(sql: str) -> str:
    """The target answer for `sql`: what `rewards.extract.extract_sql` reads back.

    Example:
        >>> answer_text("SELECT 1")
        '```sql\\nSELECT 1\\n```'
    """
    return f"```sql\n{sql.strip()}\n```"


def encode_example(tokenizer, prompt: list[dict], answer: str, max_len: int) -> dict | None:
    """input_ids with labels masked to the answer; None if the prompt alone does not fit."""
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


def train_sft(model, tokenizer, pairs: list[tuple[list[dict], str]], output_dir: str | Path, *, epochs: float = 3.0,
              lr: float = 2e-3, batch_size: int = 32, warmup_ratio: float = 0.05, weight_decay: float = 0.0,
              max_len: int = 512, packing: bool = False, deepspeed: str | None = None, seed: int = 0,
              callbacks=(), report_to=()) -> dict:
    """Fine-tune `model` on (prompt messages, answer text) pairs; resumes from `output_dir` checkpoints."""
    from transformers import PrinterCallback, Trainer, TrainingArguments
    from transformers.trainer_utils import get_last_checkpoint

    encoded = [e for e in (encode_example(tokenizer, p, a, max_len) for p, a in pairs) if e is not None]
    dropped = len(pairs) - len(encoded)
    if not encoded:
        raise ValueError(f"no SFT example fits in max_len={max_len} tokens; raise sft.max_len")
    data = pack(encoded, max_len) if packing else encoded
    output_dir = Path(output_dir)
    on_gpu = torch.cuda.is_available() and next(model.parameters()).is_cuda
    args = TrainingArguments(
        output_dir=str(output_dir), num_train_epochs=epochs, learning_rate=lr, per_device_train_batch_size=batch_size,
        warmup_steps=warmup_ratio, weight_decay=weight_decay, lr_scheduler_type="cosine", logging_steps=10,
        save_strategy="steps", save_steps=200, save_total_limit=1, report_to=list(report_to), seed=seed,
        data_seed=seed, use_cpu=not on_gpu, bf16=on_gpu and torch.cuda.is_bf16_supported(), deepspeed=deepspeed,
        dataloader_num_workers=0, remove_unused_columns=False, disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=data, data_collator=PadCollator(tokenizer.pad_token_id),
                      callbacks=list(callbacks))
    trainer.remove_callback(PrinterCallback)  # progress and loss are shown by the caller's callbacks
    last = get_last_checkpoint(str(output_dir)) if output_dir.is_dir() else None
    result = trainer.train(resume_from_checkpoint=last)
    return {"sft_loss": result.training_loss, "sft_steps": result.global_step, "sft_examples": len(encoded),
            "sft_sequences": len(data), "sft_dropped_too_long": dropped}
