"""`sirius.json`: a model folder that says how it was trained, as HF folders do with their tokenizer.

Every model the project writes (the SFT warm start, each stage's final model, a merged verl export) gets
one. It holds the prompt format the model was trained on (schema style, sample values, system prompt,
chat template), the run, phase and config it came from, and its held-out figures. Whatever loads a model
(`sirius synth`, `sirius infer`, `sirius benchmark`, the samplers, a run that starts from it) asks it the
way it was trained unless told otherwise: explicit flags > `--config` > the card > the default format.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, fields
from pathlib import Path

from data_synthesis.prompts import PromptFormat

CARD_FILE = "sirius.json"
CARD_VERSION = 1


class CardError(ValueError):
    """A `sirius.json` that cannot be read as a card; the message names the file and the fix."""


def write_card(folder: str | Path, prompt_format: PromptFormat, *, phase: str | None = None,
               run: str | None = None, config: dict | None = None, figures: dict | None = None,
               compare: str | None = None, sampling: dict | None = None, lora: dict | None = None) -> Path:
    """Write `folder/sirius.json` atomically; returns its path.

    `chat_template` records what rendered the chat at training time: "tokenizer" (the folder's tokenizer
    carries its own template) or "fallback" (`prompts.FALLBACK_TEMPLATE`); both are reproduced by `chat_text`.
    `lora`: a phase that trained adapters (merged into this folder's weights) names its base and its adapter.
    """
    folder = Path(folder)
    card = {"sirius_card": CARD_VERSION, "prompt_format": asdict(prompt_format),
            "chat_template": "tokenizer" if _has_chat_template(folder) else "fallback",
            "phase": phase, "run": run, "compare": compare, "sampling": sampling or {},
            "figures": figures or {}, "config": config or {}, **({"lora": lora} if lora else {})}
    tmp = folder / (CARD_FILE + ".tmp")
    tmp.write_text(json.dumps(card, indent=2, default=str))
    os.replace(tmp, folder / CARD_FILE)
    return folder / CARD_FILE


def read_card(folder: str | Path) -> dict | None:
    """The card of a model folder, or None when it has none (a URL, a foreign model)."""
    path = Path(folder) / CARD_FILE
    if not path.is_file():
        return None
    try:
        card = json.loads(path.read_text())
        card["prompt_format"] = PromptFormat(**card["prompt_format"])
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise CardError(f"{path}: not a sirius model card ({e}); delete it to use the default prompt format, "
                        "or pass the format explicitly (--config / --schema-style ...)") from None
    return card


def card_format(folder: str | Path) -> PromptFormat | None:
    """The prompt format a model folder's card names, or None without a card."""
    card = read_card(folder) if Path(folder).is_dir() else None
    return card["prompt_format"] if card else None


def resolve_prompt_format(model: str | Path | None, base: PromptFormat | None = None, notice=print,
                          **overrides) -> PromptFormat:
    """The format to ask `model` with: `base` (from a run config) or the model's card, else the default;
    then the explicit `overrides` (PromptFormat fields; None means "not given") on top.

    `notice` gets one line when nothing says how the model was trained and the default format is used.
    """
    given = {k: v for k, v in overrides.items() if v is not None}
    unknown = set(given) - {f.name for f in fields(PromptFormat)}
    if unknown:
        raise TypeError(f"not PromptFormat fields: {sorted(unknown)}")
    if base is None:
        base = card_format(model) if model is not None else None
        if base is None:
            base = PromptFormat()
            if not given:
                source = f"{model} has no {CARD_FILE}" if model is not None else "no model folder names the format"
                notice(f"note: {source}; using the default prompt format "
                       f"({_describe(base)}); pass --config or --schema-style/--schema-samples/--system-prompt "
                       "if it was trained otherwise")
    return PromptFormat(**{**asdict(base), **given})


def _describe(fmt: PromptFormat) -> str:
    system = "default system prompt" if fmt.system == PromptFormat().system else (
        "no system prompt" if not fmt.system else "custom system prompt")
    return f"{fmt.schema_style} schema, {fmt.schema_samples} sample values, {system}"


def _has_chat_template(folder: Path) -> bool:
    for name in ("chat_template.jinja", "chat_template.json"):
        if (folder / name).is_file():
            return True
    config = folder / "tokenizer_config.json"
    return config.is_file() and bool(json.loads(config.read_text()).get("chat_template"))
