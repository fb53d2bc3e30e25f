"""`sirius demo` (what `make demo` runs): the nano embedded default, end to end, on a laptop CPU.

Generated demo databases, synthesized questions, a tokenizer trained on the spot, a small Llama built from
a config, a supervised warm start, two DAPO stages on smoothed curricula, then held-out evaluation.
"""

from __future__ import annotations

from pathlib import Path

import typer

from sirius_train.commands import train

NANO = Path(__file__).resolve().parents[2] / "configs" / "nano.yaml"


def register(app: typer.Typer) -> None:
    @app.command(context_settings={"allow_extra_args": True})
    def demo(overrides: list[str] = typer.Argument(None, help="key=value overrides of configs/nano.yaml"),
             resume_anyway: bool = typer.Option(False, "--resume-anyway", help=train.RESUME_ANYWAY_HELP),
             fresh: bool = typer.Option(False, "--fresh", help=train.FRESH_HELP)):
        """Train and evaluate the nano model (configs/nano.yaml) in minutes on CPU."""
        cfg = train._load(NANO, ["name=demo", *(overrides or [])])
        train.print_summary(train.run_or_fail(cfg, on_change=train.on_config_change(resume_anyway, fresh)))
