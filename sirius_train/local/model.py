"""Models and tokenizers for the local backend: load a local Hugging Face checkpoint, or build a nano one.

The nano default trains its tokenizer on the spot (byte-level BPE from `tokenizers`, so any text
encodes) and builds a small Llama-architecture model from a config: nothing is downloaded, and the
result is an ordinary HF checkpoint that every other tool (HFSampler, `sirius infer`, verl) loads.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

# A compact chat template: the nano model has no room for verbose role headers.
NANO_CHAT_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'system' %}<|system|>{{ m['content'] }}\n"
    "{% elif m['role'] == 'user' %}<|user|>{{ m['content'] }}\n"
    "{% else %}<|assistant|>{{ m['content'] }}<|eos|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIAL_TOKENS = ["<|pad|>", "<|eos|>", "<|system|>", "<|user|>", "<|assistant|>"]


@dataclass(frozen=True)
class NanoModelConfig:
    """Shape of the nano Llama. Defaults: ~1.6M parameters, trains on 2 CPU cores in minutes."""

    vocab_size: int = 2048
    hidden_size: int = 128
    intermediate_size: int = 384
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 4
    max_position_embeddings: int = 1024
    tie_word_embeddings: bool = True


def train_tokenizer(texts: Iterable[str], vocab_size: int = 2048):
    """A byte-level BPE tokenizer trained on `texts`, wrapped as a `PreTrainedTokenizerFast` with a chat template."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    # Identifiers stay whole (`signup_year` is one pre-token, not three), so BPE can make a schema name a
    # single token and copying it from the prompt is one step for a small model.
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r" ?\w+| ?[^\w\s]+|\s+"), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<|pad|>", eos_token="<|eos|>",
                                        bos_token=None, additional_special_tokens=SPECIAL_TOKENS[2:])
    tokenizer.chat_template = NANO_CHAT_TEMPLATE
    return tokenizer


def build_nano_model(config: NanoModelConfig, tokenizer, seed: int = 0):
    """A randomly initialised `LlamaForCausalLM` sized by `config` and matched to `tokenizer`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    llama = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers, num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads, max_position_embeddings=config.max_position_embeddings,
        tie_word_embeddings=config.tie_word_embeddings, pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.eos_token_id,
    )
    model = LlamaForCausalLM(llama)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def load_model(path: str | Path, device: str = "cpu", dtype: torch.dtype = torch.float32, gguf_file: str | None = None):
    """Load a local HF causal LM and its tokenizer (`gguf_file=` for a GGUF checkpoint in `path`)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sirius_train.local.quiet import quiet_loading, without_bpe_cleanup

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"model path not found: {path} (models are never downloaded at run time; "
                                "point model.path at a local folder)")
    kwargs = {"local_files_only": True}
    if gguf_file:
        kwargs["gguf_file"] = gguf_file
    with quiet_loading():
        tokenizer = without_bpe_cleanup(AutoTokenizer.from_pretrained(path, **kwargs))
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **kwargs).to(device)
    if gguf_file:  # transformers' GGUF tokenizer converter gives a byte-level BPE vocabulary bos as eos
        # (SmolLM2: <|im_start|>, so answers ran past <|im_end|>); the file's own ids are in the model config
        for role in ("bos", "eos", "pad"):
            token_id = getattr(model.config, f"{role}_token_id", None)
            if isinstance(token_id, int):
                setattr(tokenizer, f"{role}_token", tokenizer.convert_ids_to_tokens(token_id))
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def count_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())
