"""Other libraries' noise kept out of our output, where we call them (our own lines stay). Transformers' loading
bars and its BPE clean-up warning are quieted by the one checkpoint loader (`data_synthesis.checkpoints`).

DeepSpeed says "Setting accelerator to CPU ..." on every import where no GPU is found: on a CPU machine that is what
it should do, not news.
"""

from __future__ import annotations

import logging


class _NotNews(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Setting accelerator to CPU")


def quiet_deepspeed() -> None:
    """Drop DeepSpeed's CPU-fallback warning (its logger is made at import; a filter set before survives it)."""
    logger = logging.getLogger("DeepSpeed")
    if not any(isinstance(f, _NotNews) for f in logger.filters):
        logger.addFilter(_NotNews())
