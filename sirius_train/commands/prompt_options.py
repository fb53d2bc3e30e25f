"""The prompt-format options every command that asks a model shares, and how they resolve.

Precedence: `--schema-style` / `--schema-samples` / `--system-prompt` > `--config RUN.yaml` > the model's
`sirius.json` > the default format (with a one-line notice). So `sirius synth estimate --model
runs/demo/stage2/model` asks the model exactly as the trainer did, with no flag.
"""

from __future__ import annotations

from pathlib import Path

import typer

CONFIG = typer.Option(None, "--config", help="run config whose data.schema_style/schema_samples/system_prompt "
                                             "render the prompts (default: the model's sirius.json)")
SCHEMA_STYLE = typer.Option(None, "--schema-style", help="ddl | compact (overrides the model's sirius.json)")
SCHEMA_SAMPLES = typer.Option(None, "--schema-samples", min=0, help="sample values per column in the prompt")
SYSTEM_PROMPT = typer.Option(None, "--system-prompt", help="system message ('' for none)")


def resolve_format(model, config: Path | None, schema_style: str | None, schema_samples: int | None,
                   system_prompt: str | None):
    """The `PromptFormat` to ask `model` (a folder, a URL, or None) with; prints the notice when it guesses."""
    from data_synthesis.model_card import resolve_prompt_format
    from sirius_train.progress import stderr

    if schema_style is not None and schema_style not in ("ddl", "compact"):
        raise ValueError(f"--schema-style {schema_style!r}: use ddl or compact")
    base = None
    if config is not None:
        from sirius_train.config import load_config
        from sirius_train.schedule import prompt_format

        if not config.is_file():
            raise FileNotFoundError(f"--config {config} not found")
        base = prompt_format(load_config(config))
    return resolve_prompt_format(model, base, notice=lambda line: stderr.print(line, soft_wrap=True, markup=False),
                                 schema_style=schema_style, schema_samples=schema_samples, system=system_prompt)


MULTI_TURN = typer.Option(0, "--multi-turn", min=0, metavar="MAX_TURNS",
                          help="answer in episodes: up to MAX_TURNS <sql> probes on the question's database before "
                               "the final answer, as rollout.multi_turn trains (local HF models; 0 = single-turn; "
                               "the other probe limits are rollout.multi_turn's defaults)")

