"""A real tiny Llama (built from a config, weights set by hand) that follows a script of tokens, for multi-turn
tests that need a policy which probes: each token's successor is fixed, so greedy decoding (and, nearly always,
sampling) writes the scripted episode, whatever sits in between (observations are teacher-forced anyway).

The script is a bigram map carried by the residual stream: embeddings are orthonormal, every layer's output
projections are small random matrices (`noise`), and the head maps each token to its successor with a large
margin. With noise > 0 the logits still depend on the whole context through attention, so a KV cache that
dropped or misplaced observation tokens would change the recorded log-probs (the tests compare them with a
full forward).
"""

from __future__ import annotations

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

CHARS = [chr(i) for i in range(32, 127)] + ["\n"]
TEMPLATE = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}="  # every prompt ends with the token '='


def scripted_policy(words: list[str], successor: dict[str, str | list[str]], *, margin: float = 12.0,
                    noise: float = 0.02, seed: int = 0):
    """(model, tokenizer): characters plus the multi-character tokens `words`; after token a the model
    prefers `successor[a]` (or each of a list of them, equally) by `margin` nats over every other token
    (tokens without a successor predict near-uniformly)."""
    specials = ["<pad>", "<eos>"]
    vocab = {t: i for i, t in enumerate(specials + sorted(set(words), key=len, reverse=True) + CHARS)}
    pattern = "|".join(_escape(w) for w in sorted(set(words), key=len, reverse=True)) + r"|[\s\S]"
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(pattern), "isolated")
    tok.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")
    tokenizer.chat_template = TEMPLATE
    V = len(vocab)
    hidden = ((V + 7) // 8) * 8
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=V, hidden_size=hidden, intermediate_size=2 * hidden,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                                         max_position_embeddings=2048, pad_token_id=0, eos_token_id=1,
                                         bos_token_id=1, tie_word_embeddings=False))
    with torch.no_grad():
        basis = torch.eye(hidden)[:V]  # (V, hidden) orthonormal embeddings
        model.model.embed_tokens.weight.copy_(basis)
        for layer in model.model.layers:
            for proj in (layer.self_attn.o_proj, layer.mlp.down_proj):
                proj.weight.normal_(0.0, noise)
        head = torch.zeros(V, hidden)
        for a, bs in successor.items():
            for b in [bs] if isinstance(bs, str) else bs:
                head[vocab[b]] += basis[vocab[a]] * margin / hidden ** 0.5  # RMSNorm scales a unit vector by sqrt(h)
        model.lm_head.weight.copy_(head)
    return model, tokenizer


def _escape(word: str) -> str:
    return "".join("\\" + c if not c.isalnum() and c not in " \n" else c for c in word)
