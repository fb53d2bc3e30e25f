"""Every `sirius` command, option and argument says what it is for in `--help` (issue 39: a new user met flags
with a type and a default but no word on what they do)."""

from __future__ import annotations

import typer.main
from typer.testing import CliRunner

from sirius_train.cli import app


def walk(command, path: tuple[str, ...] = ("sirius",)):
    """(path, command) of every command in the tree, groups included (typer's click objects: a group has
    `.commands`; typer vendors click, so no isinstance against click's own classes)."""
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        yield from walk(sub, (*path, name))


TREE = list(walk(typer.main.get_command(app)))


def test_the_walk_reaches_every_command():
    names = {" ".join(path) for path, _ in TREE}
    assert {"sirius train", "sirius demo", "sirius evaluate", "sirius benchmark", "sirius synth estimate",
            "sirius synth curriculum", "sirius infer", "sirius doctor"} <= names
    assert sum(len(c.params) for _, c in TREE) > 150  # options and arguments, not only commands


def test_every_command_has_help():
    missing = [" ".join(path) for path, command in TREE if not (command.help or "").strip()]
    assert not missing, f"commands without a docstring or help: {missing}"


def test_every_option_and_argument_has_help():
    missing = [f"{' '.join(path)} {'/'.join(p.opts) if p.param_type_name == 'option' else p.name.upper()}"
               for path, command in TREE for p in command.params if not (getattr(p, "help", None) or "").strip()]
    assert not missing, f"parameters without a help string: {missing}"


def test_a_help_string_shows_in_help_output():
    """The help strings reach what a user reads (one option of a shared declaration and one of its own)."""
    out = CliRunner().invoke(app, ["synth", "curriculum", "--help"], terminal_width=200)
    assert out.exit_code == 0
    text = " ".join(out.output.replace("│", " ").split())
    assert "gap-filling rounds at most" in text and "seed of the selection" in text
