"""`sirius`: the command line of the framework. Each command group lives in `sirius_train.commands`."""

from __future__ import annotations

import typer

from sirius_train.commands import benchmark, demo, doctor, evaluate, infer, reward_server, score, select, synth, train

app = typer.Typer(
    name="sirius",
    help="Train and validate a SIRIUS-style text-to-SQL specialist.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    add_completion=False,
)

for module in (train, demo, score, reward_server, synth, select, infer, evaluate, doctor, benchmark):
    module.register(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
