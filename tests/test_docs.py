"""Every code block in README.md, docs/*.md and docs/benchmarks/*.md works as pasted, so the docs cannot drift
from the code.

Each fenced block is tagged: `bash` (commands), `python`, `json`, `yaml`, or `text` (diagrams, output, layouts).
An indented block that starts with a `sirius` or `python` command counts as a bash block.
- bash: lines are well formed (no comment after a `\\` continuation); every `sirius ...` command, also under
  torchrun / deepspeed / accelerate or `python -m sirius_train.cli`, names a real command with real flags and
  its required ones, and every value it gives an option is one the option accepts (typer's own parameters
  convert it: types, ranges, choices; paths are the reader's, so only their existence goes unchecked); its run
  config and `key=value` overrides load. A `python benchmarks/X.py ...` command's arguments parse with the
  script's own argparse parser. `make` targets and `scripts/` exist.
- python: compiles; its project imports import.
- json / yaml: parse; a run-config fragment loads as a RunConfig.
- A block right after `<!-- doctest: run -->` is run for real (bash -e, or python), in order. One that needs
  no trained model (it names nothing under runs/demo) runs in the default suite, from a folder holding the
  demo databases; the rest run (slow) from the root of a clone after `make demo` -- here a tiny run laid out
  the same way (`tests/tiny_demo.py`).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import runpy
import shlex
import subprocess
import sys
from dataclasses import dataclass
from unittest import mock
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docs" / "benchmarks").glob("*.md"))]
TAGS = {"bash", "python", "json", "yaml", "text"}
RUN_MARK = "<!-- doctest: run -->"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
# an indented code block (after a blank line) whose first line is a command
INDENTED = re.compile(r"(?<=\n\n)((?: {4}(?:PYTHONPATH=\S+ )?(?:python|sirius) .*\n)(?: {4}.*\n)*)")
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
        unfenced = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)  # same line numbers
        for m in INDENTED.finditer(unfenced):
            body = "".join(line[4:] + "\n" for line in m.group(1).splitlines())
            out.append(Block(path, unfenced[:m.start()].count("\n") + 1, "bash", body, False))
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
    if (argv[0] in LAUNCHERS or argv[:2] == ["python", "-m"]) and "sirius_train.cli" in argv:
        return argv[argv.index("sirius_train.cli") + 1:]
    return None


def check_value(command, param, value: str, where: str) -> None:
    """`value` is one the parameter accepts: typer's own conversion (type, range, choices) decides. A path is
    not looked up: it names the reader's files (runs/demo after `make demo`, data/bird/...)."""
    import typer

    if param.type_descriptor.is_path:
        return
    ctx = command.make_context(command.name, [], resilient_parsing=True)
    try:
        param.process_value(ctx, [value] if param.multiple else value)
    except typer.BadParameter as e:
        raise AssertionError(f"{where}: {e.format_message()}") from None


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
            if options[name].is_flag:
                i += 1
                continue
            value = token.split("=", 1)[1] if "=" in token else args[i + 1]
            check_value(command, options[name], value, where)
            i += 1 if "=" in token else 2
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
    elif program == "python" and argv[1].startswith("benchmarks/"):
        check_script(argv[1], argv[2:], where)
    elif program == "sbatch":
        script = next(a for a in argv[1:] if not a.startswith("-"))
        assert (ROOT / script).is_file(), f"{where}: {script} missing"
    else:
        assert program in ("pip", "echo", "cat", "ls", "mkdir", "ln", "cp"), f"{where}: no check for `{program}`; add one"


class Parsed(Exception):
    """Raised once a script's own parser accepted the arguments: the script itself does not run."""


def check_script(script: str, args: list[str], where: str) -> None:
    """The script exists and its argparse parser accepts `args` (its module runs as __main__ up to parse_args)."""
    path = ROOT / script
    assert path.is_file(), f"{where}: {script} missing"
    real_parse_args = argparse.ArgumentParser.parse_args

    def parse_then_stop(parser, *a, **kw):
        real_parse_args(parser, *a, **kw)
        raise Parsed

    errors = []
    with mock.patch.object(argparse.ArgumentParser, "parse_args", parse_then_stop), \
            mock.patch.object(argparse.ArgumentParser, "error", lambda parser, message: errors.append(message) or
                              sys.exit(2)), mock.patch.object(sys, "argv", [str(path), *args]), \
            mock.patch.object(sys, "path", [str(path.parent), *sys.path]):  # as `python script` sets it
        try:
            runpy.run_path(str(path), run_name="__main__")
        except Parsed:
            return
        except SystemExit:
            pass
    raise AssertionError(f"{where}: {script} refuses {' '.join(args)!r}: {'; '.join(errors) or 'it did not parse'}")


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


def needs_the_demo_run(block: Block) -> bool:
    """The block reads what `make demo` trains (runs/demo/...), not only the demo databases."""
    return "runs/demo" in block.text


def run_blocks(blocks: list[Block], root: Path, tmp_path: Path) -> list[str]:
    """Run each block as pasted from `root`, `sirius` on the PATH as the installed entry point."""
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "sirius").write_text(f"#!/bin/sh\nexec {sys.executable} -m sirius_train.cli \"$@\"\n")
    (shim / "sirius").chmod(0o755)
    env = {**os.environ, "PATH": f"{shim}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT)}
    ran = []
    for block in blocks:
        argv = ["bash", "-euo", "pipefail", "-c", block.text] if block.lang == "bash" else [sys.executable, "-c", block.text]
        done = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, f"{block.where} failed as pasted:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        ran.append(block.where)
    return ran


def test_model_free_run_blocks_run_as_pasted_beside_the_demo_databases(tmp_path):
    """The run blocks that need no trained model, from a folder holding what `make demo` builds first."""
    from data_synthesis.demo_dbs import build_demo_dbs

    root = tmp_path / "clone"
    build_demo_dbs(root / "demo_data" / "dbs")
    (root / "configs").symlink_to(ROOT / "configs")  # the shipped configs, as in a clone
    ran = run_blocks([b for b in BLOCKS if b.run and not needs_the_demo_run(b)], root, tmp_path)
    assert len(ran) >= 3, ran


@pytest.mark.slow  # runs the demo's models: minutes on 2 busy cores
@pytest.mark.timeout(2400)  # builds the shared tiny run unless another module did
def test_run_blocks_run_as_pasted_in_a_clone_after_make_demo(tmp_path):
    from tiny_demo import tiny_demo

    root = tiny_demo()[2]
    ran = run_blocks([b for b in BLOCKS if b.run and needs_the_demo_run(b)], root, tmp_path)
    assert len(ran) >= 4, ran
    # every path into the demo's run that any block names (run or not) is one `make demo` writes
    for block in BLOCKS:
        for path in re.findall(r"(?<![\w/.])runs/[\w.-]+(?:/[\w.-]+)*", block.text):
            name = path.split("/")[1]
            assert name in ("demo", "x") and (name == "x" or (root / path).exists()), \
                f"{block.where}: {path} is not in a clone after `make demo` (it writes runs/demo/<phase>/model)"


WRONG_VALUES = [
    ("sirius select --db-root d --input i --output o --compare birdd", "'birdd' is not one of"),
    ("sirius select --db-root d --input i --output o --rerank sometimes", "'sometimes' is not one of"),
    ("sirius select --db-root d --input i --output o --workers two", "--workers"),
    ("sirius synth estimate --pool p --db-root d --out o --model m --k eight", "--k"),
    ("sirius synth estimate --pool p --db-root d --out o --model m --engine tpu", "'tpu' is not one of"),
    ("sirius infer --db-root d --output o --db-id x --question q --specialist m --multi-turn -3", "--multi-turn"),
    ("sirius evaluate --db-root d --pred p --gold g --format csv", "'csv' is not one of"),
    ("python benchmarks/bench_selector.py --workers two", "invalid int value: 'two'"),
    ("python benchmarks/bench_variants.py pool --k 3", "invalid choice: 'pool'"),
]


@pytest.mark.parametrize("command, says", WRONG_VALUES, ids=[c for c, _ in WRONG_VALUES])
def test_a_documented_value_the_option_refuses_fails_the_docs(command, says):
    """The checks behind the bash blocks read option values too, not only names (the same commands with
    right values pass)."""
    wrong = Block(ROOT / "README.md", 1, "bash", command + "\n", False)
    with pytest.raises(AssertionError, match=re.escape(says)):
        test_shell_block_commands_match_the_cli(wrong)


def test_the_same_commands_with_values_the_options_accept_pass():
    right = ("sirius select --db-root d --input i --output o --compare spider --rerank never --workers 0\n"
             "sirius synth estimate --pool p --db-root d --out o --model m --k 8 --engine vllm\n"
             "sirius infer --db-root d --output o --db-id x --question q --specialist m --multi-turn 3\n"
             "sirius evaluate --db-root d --pred p --gold g --format spider --compare auto\n"
             "python benchmarks/bench_selector.py --workers 2\n"
             "python benchmarks/bench_variants.py pools --k 3 10\n")
    test_shell_block_commands_match_the_cli(Block(ROOT / "README.md", 1, "bash", right, False))


def test_clusters_dry_run_sample_is_what_the_dry_run_prints():
    """CLUSTER.md shows stage 1's plan from `sirius train configs/sirius32b.yaml --dry-run`: every line of it must be
    a line the dry run prints today (the plan's figures move with the planner and the configs)."""
    from conftest import import_verl

    import_verl("verl")
    text = (ROOT / "docs" / "CLUSTER.md").read_text()
    sample = next(b.group(2) for b in FENCE.finditer(text) if b.group(1) == "text" and "stage 1: stage1 -- plan"
                  in b.group(2))
    out = subprocess.run([sys.executable, "-m", "sirius_train.cli", "train", str(ROOT / "configs" / "sirius32b.yaml"),
                          "--dry-run"], capture_output=True, text=True, timeout=600, cwd=ROOT,
                         env={**os.environ, "COLUMNS": "400"})
    assert out.returncode == 0, out.stderr[-3000:]
    printed = set(out.stdout.splitlines())
    assert [line for line in sample.splitlines() if line not in printed] == []
