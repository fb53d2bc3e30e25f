"""`sirius demo` (what `make demo` runs): the nano embedded default, end to end, on a laptop CPU.

Generated demo databases, synthesized questions, a tokenizer trained on the spot, a small Llama built from
a config, a supervised warm start, two DAPO stages on smoothed curricula, then held-out evaluation.
"""

from __future__ import annotations

from pathlib import Path

import typer

NANO = Path(__file__).resolve().parents[2] / "configs" / "nano.yaml"


def register(app: typer.Typer) -> None:
    @app.command(context_settings={"allow_extra_args": True})
    def demo(overrides: list[str] = typer.Argument(None, help="key=value overrides of configs/nano.yaml")):
        """Train and evaluate the nano model (configs/nano.yaml) in minutes on CPU."""
        from sirius_train.commands.train import _load, print_summary, run_schedule

        cfg = _load(NANO, ["name=demo", *(overrides or [])])
        print_summary(run_schedule(cfg))
