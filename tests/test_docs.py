"""Every code block in README.md and docs/*.md works as pasted, so the docs cannot drift from the code.

Each block is tagged: `bash` (commands), `python`, `json`, `yaml`, or `text` (diagrams, output, layouts).
- bash: lines are well formed (no comment after a `\\` continuation); every `sirius ...` command, also under
  torchrun / deepspeed / accelerate, names a real command with real flags and its required ones (typer's own
  click tree), its run config and `key=value` overrides load; `make` targets and `scripts/` exist.
- python: compiles; its project imports import.
- json / yaml: parse; a run-config fragment loads as a RunConfig.
- A block right after `<!-- doctest: run -->` is run for real (bash -e, or python), in order, from the root of
  a clone after `make demo` -- here a tiny run laid out the same way (`tests/tiny_demo.py`).
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TAGS = {"bash", "python", "json", "yaml", "text"}
RUN_MARK = "<!-- doctest: run -->"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
PROJECT_PACKAGES = ("rewards", "data_synthesis", "sirius_train")
LAUNCHERS = {"torchrun", "deepspeed", "accelerate"}


@dataclass(frozen=True)
class Block:
    file: Path
    line: int
    lang: str
    text: str
    run: bool

    @property
    def where(self) -> str:
        return f"{self.file.relative_to(ROOT)}:{self.line}"


def doc_blocks() -> list[Block]:
    out = []
    for path in DOCS:
        text = path.read_text()
        for m in FENCE.finditer(text):
            before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
            out.append(Block(path, text[:m.start()].count("\n") + 1, m.group(1), m.group(2), before == RUN_MARK))
    return out


BLOCKS = doc_blocks()


def _by(lang: str) -> list:
    return [pytest.param(b, id=b.where) for b in BLOCKS if b.lang == lang]


def shell_commands(block: Block) -> list[list[str]]:
    """The block's commands as argv lists: continuations joined, comments dropped, env assignments and
    redirections removed."""
    commands, current, heredoc = [], "", None
    for raw in block.text.splitlines():
        stripped = raw.rstrip()
        if heredoc is not None:  # the body of `cat > f <<'EOF'`: data, not commands
            heredoc = None if stripped == heredoc else heredoc
            continue
        if m := re.search(r"<<-?\s*'?(\w+)'?", stripped):
            heredoc = m.group(1)
            stripped = stripped[:m.start()]
        if re.search(r"\\\s+#", stripped):
            raise AssertionError(f"{block.where}: a comment after `\\` ends the command: {raw.strip()!r}")
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        current += stripped
        if current.strip():
            commands.append(current)
        current = ""
    assert not current.strip(), f"{block.where}: the block ends inside a `\\` continuation"
    argvs = []
    for command in commands:
        argv = shlex.split(command, comments=True)
        while argv and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", argv[0]):
            argv = argv[1:]
        kept, skip = [], False
        for a in argv:  # `cmd > file`: drop the redirection and its target
            if skip or a in (">", ">>", "<", "2>"):
                skip = not skip and a in (">", ">>", "<", "2>")
                continue
            if not a.startswith((">", "2>", "<")):
                kept.append(a)
        if kept:
            argvs.append(kept)
    return argvs


def sirius_args(argv: list[str]) -> list[str] | None:
    """The arguments after `sirius` (or `-m sirius_train.cli` / `--module sirius_train.cli`), else None."""
    if argv[0] == "sirius":
        return argv[1:]
    if argv[0] in LAUNCHERS and "sirius_train.cli" in argv:
        return argv[argv.index("sirius_train.cli") + 1:]
    return None


def check_sirius(args: list[str], where: str) -> None:
    import typer.main

    from sirius_train.cli import app

    command = typer.main.get_command(app)
    path = ["sirius"]
    while hasattr(command, "commands") and args and not args[0].startswith("-"):
        assert args[0] in command.commands, f"{where}: `{' '.join(path)}` has no command {args[0]!r}"
        command = command.commands[args[0]]
        path.append(args.pop(0))
    assert not hasattr(command, "commands"), f"{where}: `{' '.join(path)}` needs a subcommand"
    options = {name: p for p in command.params for name in (*p.opts, *p.secondary_opts) if name.startswith("-")}
    given, positional, i = set(), [], 0
    while i < len(args):
        token = args[i]
        if token.startswith("--") or (token.startswith("-") and len(token) == 2):
            name = token.split("=", 1)[0]
            assert name in options, f"{where}: `{' '.join(path)}` has no option {name} (see --help)"
            assert "..." not in args[i:i + 2], f"{where}: a placeholder `...` instead of a value for {name}"
            given.add(options[name].name)
            takes_value = not options[name].is_flag and "=" not in token
            i += 2 if takes_value else 1
        else:
            positional.append(token)
            i += 1
    missing = [p.opts[0] for p in command.params if getattr(p, "required", False) and p.param_type_name == "option"
               and p.name not in given]
    assert not missing, f"{where}: `{' '.join(path)}` needs {missing}"
    if path[1] in ("train", "sft", "demo"):
        check_run_config(path[1], positional, where)


def check_run_config(command: str, positional: list[str], where: str) -> None:
    """The config file exists and the `key=value` overrides load (types, keys and invariants)."""
    from sirius_train.config import load_config

    if command == "demo":
        config, overrides = ROOT / "configs" / "nano.yaml", positional
    else:
        assert positional, f"{where}: sirius {command} needs a config file"
        config, overrides = ROOT / positional[0], positional[1:]
    assert config.is_file(), f"{where}: no config {config.relative_to(ROOT)}"
    load_config(config, overrides)


def check_other(argv: list[str], where: str) -> None:
    program = argv[0]
    if program == "make":
        targets = re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M)
        assert set(argv[1:]) <= set(targets), f"{where}: Makefile has no target {set(argv[1:]) - set(targets)}"
    elif program.startswith("scripts/"):
        assert (ROOT / program).is_file() and os.access(ROOT / program, os.X_OK), f"{where}: {program} missing"
    elif program == "sbatch":
        script = next(a for a in argv[1:] if not a.startswith("-"))
        assert (ROOT / script).is_file(), f"{where}: {script} missing"
    else:
        assert program in ("pip", "echo", "cat", "ls"), f"{where}: no check for `{program}`; add one"


def test_every_block_is_tagged():
    untagged = [f"{b.where} ({b.lang or 'no tag'})" for b in BLOCKS if b.lang not in TAGS]
    assert not untagged, f"tag each block with one of {sorted(TAGS)}: {untagged}"


@pytest.mark.parametrize("block", _by("bash"))
def test_shell_block_commands_match_the_cli(block):
    for argv in shell_commands(block):
        args = sirius_args(argv)
        if args is not None:
            check_sirius(args, block.where)
        else:
            check_other(argv, block.where)


@pytest.mark.parametrize("block", _by("python"))
def test_python_block_compiles_and_its_imports_import(block):
    import importlib

    tree = ast.parse(block.text, filename=block.where)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module.split(".")[0] in PROJECT_PACKAGES:
            module = importlib.import_module(node.module)
            for alias in node.names:
                assert hasattr(module, alias.name), f"{block.where}: {node.module} has no {alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in PROJECT_PACKAGES:
                    importlib.import_module(alias.name)


@pytest.mark.parametrize("block", _by("json"))
def test_json_block_parses(block):
    from data_synthesis.records import Example

    value = json.loads(block.text)
    if {"id", "db_id", "question", "gold_sql"} <= set(value):  # a pool line is a valid Example
        Example.from_json(value)


def _leaves(value: dict, prefix: str = "") -> list[str]:
    return [leaf for k, v in value.items()
            for leaf in (_leaves(v, f"{prefix}{k}.") if isinstance(v, dict) and v else [f"{prefix}{k}"])]


def _check_verl_fragment(value: dict) -> None:
    """The fragment as verl overrides (`+` for keys verl's config lacks): our key rules, then verl's own Hydra
    composition, reject a key verl would not read."""
    pytest.importorskip("verl")
    import verl
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from sirius_train.verl_backend.translate import check_overrides, hydra_value

    with initialize_config_dir(config_dir=str(Path(verl.__file__).parent / "trainer" / "config"), version_base=None):
        base = compose(config_name="ppo_trainer")
        overrides = []
        for key in _leaves(value):
            leaf = OmegaConf.select(OmegaConf.create(value), key)
            new = OmegaConf.select(base, key, default="<missing>") == "<missing>"
            overrides.append(f"{'+' if new else ''}{key}={hydra_value(leaf)}")
        check_overrides(overrides)
        compose(config_name="ppo_trainer", overrides=overrides)


@pytest.mark.parametrize("block", _by("yaml"))
def test_yaml_block_is_a_run_config_or_verl_config_fragment(block, tmp_path):
    from sirius_train.config import ConfigError, load_config

    value = yaml.safe_load(block.text)
    assert isinstance(value, dict), block.where
    (tmp_path / "fragment.yaml").write_text(block.text)
    try:
        load_config(tmp_path / "fragment.yaml")
    except ConfigError:  # not ours: then it must be verl's
        _check_verl_fragment(value)


@pytest.mark.timeout(2400)  # builds the shared tiny run unless another module did
def test_run_blocks_run_as_pasted_in_a_clone_after_make_demo(tmp_path):
    from tiny_demo import tiny_demo

    root = tiny_demo()[2]
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "sirius").write_text(f"#!/bin/sh\nexec {sys.executable} -m sirius_train.cli \"$@\"\n")
    (shim / "sirius").chmod(0o755)
    env = {**os.environ, "PATH": f"{shim}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT)}
    ran = []
    for block in (b for b in BLOCKS if b.run):
        argv = ["bash", "-euo", "pipefail", "-c", block.text] if block.lang == "bash" else [sys.executable, "-c", block.text]
        done = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, f"{block.where} failed as pasted:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        ran.append(block.where)
    assert len(ran) >= 4, ran
    # every path into the demo's run that any block names (run or not) is one `make demo` writes
    for block in BLOCKS:
        for path in re.findall(r"(?<![\w/.])runs/[\w.-]+(?:/[\w.-]+)*", block.text):
            name = path.split("/")[1]
            assert name in ("demo", "x") and (name == "x" or (root / path).exists()), \
                f"{block.where}: {path} is not in a clone after `make demo` (it writes runs/demo/<phase>/model)"
