"""Other libraries' noise kept out of our output, where we call them (our own lines stay).

- transformers de-quantizes a GGUF behind a raw `tqdm` bar that ignores its own `disable_progress_bar`: in a log
  file that is hundreds of carriage-return updates on one line. Its "Loading weights" bar is another.
- A GGUF's tokenizer comes with `clean_up_tokenization_spaces=True`, which a byte-level BPE ignores, warning so on
  the first decode of every run. False decodes the same text, without the warning.
- DeepSpeed says "Setting accelerator to CPU ..." on every import where no GPU is found: on a CPU machine that is
  what it should do, not news.
"""

from __future__ import annotations

import functools
import logging
from contextlib import contextmanager


@contextmanager
def quiet_loading():
    """Load a model without transformers' progress bars (the GGUF de-quantization bar included)."""
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


def without_bpe_cleanup(tokenizer):
    """`tokenizer` with `clean_up_tokenization_spaces` off when it is a BPE, which ignores it anyway (and warns)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and type(backend.model).__name__ == "BPE":
        tokenizer.clean_up_tokenization_spaces = False
    return tokenizer


class _NotNews(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Setting accelerator to CPU")


def quiet_deepspeed() -> None:
    """Drop DeepSpeed's CPU-fallback warning (its logger is made at import; a filter set before survives it)."""
    logger = logging.getLogger("DeepSpeed")
    if not any(isinstance(f, _NotNews) for f in logger.filters):
        logger.addFilter(_NotNews())
