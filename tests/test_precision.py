"""Mixed precision on the local backend (sirius_train/local/precision.py): bf16 weights lose RL-sized updates, so
weights and AdamW state stay float32 and the forward passes run under bf16 autocast -- in SFT and in DAPO."""

from __future__ import annotations

import torch


def _tiny(dtype=torch.float32):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64)
    return LlamaForCausalLM(config).to(dtype)


def _moved_after_one_step(model, lr: float) -> float:
    """Share of weights that one AdamW step of `lr` changes (Adam moves every weight by about lr)."""
    x = torch.randint(0, 128, (2, 16))
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(input_ids=x, labels=x).loss
    loss.backward()
    optimizer.step()
    changed = sum(int((p != b).sum()) for p, b in zip(model.parameters(), before))
    return changed / sum(b.numel() for b in before)


def test_bf16_weights_lose_an_rl_sized_step_float32_weights_keep_it():
    """Why the weights are float32: at lr 1e-5 (a DAPO stage's) bf16 rounds most of a step away."""
    assert _moved_after_one_step(_tiny(torch.float32), 1e-5) > 0.9  # all but the embeddings of unseen tokens
    assert _moved_after_one_step(_tiny(torch.bfloat16), 1e-5) < 0.25


def test_the_local_backend_trains_float32_weights_with_bf16_matmuls(tmp_path):
    from sirius_train.config import load_config
    from sirius_train.local.backend import LocalBackend

    folder = tmp_path / "tiny"
    model = _tiny()
    model.save_pretrained(folder)
    from sirius_train.local.model import train_tokenizer

    train_tokenizer(["SELECT count(*) FROM t"] * 4, vocab_size=300).save_pretrained(folder)
    backend = LocalBackend(load_config(None, [f"model.path={folder}", "model.dtype=bfloat16",
                                              f"output_dir={tmp_path}"]))
    try:
        loaded, _ = backend.load(folder)
        assert backend.dtype == torch.bfloat16
        assert all(p.dtype == torch.float32 for p in loaded.parameters())
        with backend.precision():
            logits = loaded(input_ids=torch.randint(0, 128, (1, 8))).logits
        assert logits.dtype == torch.bfloat16  # the matmuls ran in bf16
    finally:
        backend.close()


def test_sft_in_bf16_keeps_float32_weights_and_moves_them(tmp_path):
    from sirius_train.local.model import train_tokenizer
    from sirius_train.local.sft import train_sft

    tokenizer = train_tokenizer(["How many rows?", "SELECT count(*) FROM t"] * 8, vocab_size=300)
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                                         max_position_embeddings=128, pad_token_id=tokenizer.pad_token_id))
    before = [p.detach().clone() for p in model.parameters()]
    pairs = [([{"role": "user", "content": "How many rows?"}], "```sql\nSELECT count(*) FROM t\n```")] * 4
    figures = train_sft(model, tokenizer, pairs, tmp_path / "sft", epochs=1, lr=1e-5, batch_size=2, warmup_ratio=0.0,
                        max_len=64, bf16=True)
    assert figures["sft_steps"] == 2
    assert all(p.dtype == torch.float32 for p in model.parameters())
    changed = sum(int((p != b).sum()) for p, b in zip(model.parameters(), before))
    assert changed / sum(b.numel() for b in before) > 0.8  # bf16 weights: about 0.15 (the first test)
