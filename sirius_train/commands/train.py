"""`sirius train CONFIG [key=value ...]` and `sirius sft CONFIG [key=value ...]`: the schedule from a YAML config."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from sirius_train.commands import choices, fail
from sirius_train.progress import stderr


def read_config(config: Path | None, overrides: list[str], **forced):
    """The run config, or exit 2 with its error (light: imports no backend; `sirius doctor` reads it so)."""
    from sirius_train.config import ConfigError, load_config

    try:
        return load_config(config, [*(overrides or []), *(f"{k}={v}" for k, v in forced.items() if v is not None)])
    except (ConfigError, FileNotFoundError) as e:
        raise fail(e) from None


def _load(config: Path | None, overrides: list[str], **forced):
    from sirius_train.config import ConfigError
    from sirius_train.local.sft import check_run_config

    cfg = read_config(config, overrides, **forced)
    try:
        check_run_config(cfg)  # the warm start's DeepSpeed rules, before anything starts
    except (ConfigError, FileNotFoundError) as e:
        raise fail(e) from None
    return cfg


def preflight(cfg) -> None:
    """The cheap checks of `sirius doctor` before anything starts: a failure is an error with its fix."""
    from sirius_train.preflight import FAIL, WARN, cheap_checks

    checks = cheap_checks(cfg)
    for c in checks:
        if c.status == WARN:
            stderr.print(f"[yellow]warning:[/] {escape(c.name)}: {escape(c.detail)}" + (f" -- {escape(c.fix)}" if c.fix
                                                                                        else ""), soft_wrap=True)
    failed = [c for c in checks if c.status == FAIL]
    for c in failed:  # each one line, as `fail` prints it
        stderr.print(f"[red]error:[/] {escape(c.name)}: {escape(c.detail)}" + (f" -- fix: {escape(c.fix)}" if c.fix
                                                                               else ""), soft_wrap=True)
    if failed:
        stderr.print("nothing was started; `sirius doctor CONFIG` shows every check")
        raise typer.Exit(2)


def run_schedule(cfg, sft_only: bool = False, on_change: str = "refuse") -> dict:
    """The schedule on `cfg.run_dir`, claimed first (`run_folder.claim`: its lock, its config record)."""
    from sirius_train.run_folder import claim
    from sirius_train.schedule import run

    with claim(cfg, on_change, notice=lambda text: stderr.print(f"[yellow]notice:[/] {escape(text)}")):
        if cfg.backend != "local":
            from sirius_train.verl_backend import VerlBackend  # noqa: F401 -- needs the [verl] extra

            backend = VerlBackend(cfg)
        else:
            from sirius_train.local.backend import LocalBackend

            backend = LocalBackend(cfg)
        try:
            return run(cfg, backend, sft_only=sft_only)
        finally:
            backend.close()


def run_or_fail(cfg, sft_only: bool = False, on_change: str = "refuse") -> dict:
    """`run_schedule`, where a stop with a reason is its one line (exit 2) and a preemption the resume line."""
    from rewards.client import RewardServerUnavailable
    from sirius_train.config import ConfigError
    from sirius_train.halts import Preempted, TrainingHalted
    from sirius_train.local.checkpoint import CheckpointWriteError

    try:
        return run_schedule(cfg, sft_only, on_change)
    except Preempted as e:  # the cluster asked for the node back, or Ctrl-C: a clean stop, resumable
        raise preempted_exit(e) from None
    except (ConfigError, FileNotFoundError, TrainingHalted, CheckpointWriteError, RewardServerUnavailable) as e:
        raise fail(e) from None  # a config the data cannot satisfy, a missing file, a diverged run, a full disk, ...


def on_config_change(resume_anyway: bool, fresh: bool) -> str:
    """What the run-folder flags ask for when the recorded config differs (see `run_folder`)."""
    if resume_anyway and fresh:
        raise fail("--resume-anyway and --fresh exclude each other: continue the run, or start it over")
    return "resume-anyway" if resume_anyway else "fresh" if fresh else "refuse"


BACKEND = choices("Backend", ("local", "verl"))  # RunConfig.backend
RESUME_ANYWAY_HELP = ("continue a run folder whose recorded config differs from this one (the changes apply to the "
                      "phases not yet done; the old record is kept beside it)")
FRESH_HELP = "start the run over: an existing run folder is moved aside to RUN.replaced-TIME (nothing is deleted)"


def preempted_exit(e) -> typer.Exit:
    """A preemption is a clean stop: its reason and the command that resumes, on stderr; exit code 0 (a batch
    script requeues on it). A stop the user asked for with Ctrl-C is as clean but exits 130, as an interrupted
    command does, so `sirius train ... && next` does not go on."""
    import shlex
    import sys

    what = "interrupted" if e.interrupted else "preempted"
    stderr.print(f"{what} -- {escape(str(e))}; resume with: {escape(shlex.join(resume_argv(sys.argv[1:])))}")
    return typer.Exit(130 if e.interrupted else 0)


def resume_argv(args: list[str]) -> list[str]:
    """The command that resumes a stopped run: its own, less `--fresh` (which would start it over again) and
    `--resume-anyway` (the record now holds this config, so a plain rerun continues it).

    >>> resume_argv(["train", "configs/nano.yaml", "--fresh", "seed=1"])
    ['sirius', 'train', 'configs/nano.yaml', 'seed=1']
    """
    return ["sirius", *(a for a in args if a not in ("--fresh", "--resume-anyway"))]


def print_cost(cfg) -> None:
    """What the run will generate, per stage (`sirius_train.cost`), on stdout."""
    from sirius_train.cost import cost_rows

    (_, head), *rows = cost_rows(cfg)
    typer.echo(f"# ---- generations: {head}")
    for what, detail in rows:
        typer.echo(f"{what}: {detail}")


def print_verl_plan(cfg) -> None:
    """Each stage's exact verl command and resolved config on stdout; a key verl would not read is an error."""
    from sirius_train.config import ConfigError

    try:
        from omegaconf import OmegaConf

        from sirius_train.verl_backend import plan_run
        from sirius_train.verl_backend.compose import compose_verl_config
        from sirius_train.verl_backend.plans import require_positions

        require_positions(cfg)
        memory = _memory_plans(cfg)
        for index, plan in enumerate(plan_run(cfg), start=1):
            resolved = compose_verl_config(plan.overrides, plan.tool_config)
            typer.echo(f"# ---- stage {index}: {plan.name} -- command\n{_multiline(plan.argv)}\n")
            typer.echo(f"# ---- stage {index}: {plan.name} -- resolved verl config\n{OmegaConf.to_yaml(resolved)}")
            if plan.tool_config:  # multi-turn: the SQL tool's config, written beside the stage when it runs
                typer.echo(f"# ---- stage {index}: {plan.name} -- tool config ({plan.paths.tool_config})\n"
                           f"{OmegaConf.to_yaml(OmegaConf.create(plan.tool_config))}")
            typer.echo(f"# ---- stage {index}: {plan.name} -- plan\n{memory[1][index - 1]}\n")
    except (ConfigError, ImportError) as e:
        stderr.print(f"[red]error:[/] {e}")
        raise typer.Exit(2) from None
    if memory[0]:
        stderr.print(f"[red]error:[/] {'; '.join(memory[0])} does not fit (see the plan above; `sirius doctor CONFIG`)")
        raise typer.Exit(2)
    stderr.print(f"[green]ok:[/] {len(cfg.stages)} stage(s) compose with verl's own config and fit the memory plan; "
                 "model and data paths are not opened by a dry run")


def _memory_plans(cfg) -> tuple[list[str], list[str]]:
    """(phases that do not fit, one text block per stage): the engines and every phase's per-GPU memory."""
    from sirius_train.verl_backend.plans import DEFAULT_GPU_GIB, estimation_engine, model_shape, stage_memory

    engine = f"pass rates + evaluation: {estimation_engine(cfg).describe()}"
    found = model_shape(cfg)
    if found is None:
        missing = f"{engine}\nmemory plan: no model shape ({cfg.model.path} has no readable config.json or GGUF here)"
        return [], [missing] * len(cfg.stages)
    head = f"{engine}\nmemory per GPU ({DEFAULT_GPU_GIB:.0f} GiB assumed; model shape from {found[0]}):"
    blocks, bad = [], []
    for stage, plans in stage_memory(cfg, found[1], DEFAULT_GPU_GIB):
        lines = [head]
        for p in plans:
            lines.append(f"  {p.phase:<26} {p.total_gib:5.1f} GiB  {'fits' if p.fits else 'DOES NOT FIT'}: {p.note}")
            lines.append("      " + ", ".join(f"{name} {gib:.1f}" for name, gib in p.parts))
            bad += [] if p.fits else [f"{stage}: {p.phase}"]
        blocks.append("\n".join(lines))
    return bad, blocks


def _multiline(argv: list[str]) -> str:
    """A copy-pasteable shell command, one override per line."""
    import shlex

    return " \\\n    ".join([shlex.join(argv[:3]), *(shlex.quote(a) for a in argv[3:])])


def print_summary(summary: dict) -> None:
    from rich.table import Table

    table = Table(title=f"held-out execution accuracy -- {summary['run']}")
    sets = list(summary["phases"][0].get("eval_sets", {})) if summary["phases"] else []  # several held-out sets
    table.add_column("after")
    for name in sets or ["EX"]:
        table.add_column(name, justify="right")
    table.add_column("seconds", justify="right")
    for phase in summary["phases"]:
        accs = [phase["eval_sets"][name] for name in sets] or [phase["eval_exec_acc"]]
        table.add_row(phase["phase"], *(f"{acc:.1%}" for acc in accs), f"{phase.get('seconds', 0):.0f}")
    stderr.print(table)
    stderr.print(f"final model: {summary['final_model']}")


def register(app: typer.Typer) -> None:
    @app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": False})
    def train(
        config: Path = typer.Argument(..., help="run config YAML (configs/nano.yaml, configs/qwen7b_8gpu.yaml, ...)"),
        overrides: list[str] = typer.Argument(None, help="key=value overrides, e.g. stages.0.steps=10 seed=1"),
        backend: BACKEND = typer.Option(None, "--backend", help="local | verl (default: the config's)"),
        dry_run: bool = typer.Option(False, "--dry-run", help="print what each stage will generate (pass rates "
                                     "beside DAPO) and, for verl, each stage's command and resolved verl config, "
                                     "validated against the installed verl; run nothing"),
        resume_anyway: bool = typer.Option(False, "--resume-anyway", help=RESUME_ANYWAY_HELP),
        fresh: bool = typer.Option(False, "--fresh", help=FRESH_HELP),
    ):
        """Two-stage DAPO: curriculum from the current policy, train, re-estimate, train again; resumable."""
        from sirius_train.local.ranks import launch_world_size

        cfg = _load(config, overrides, backend=backend and backend.value)
        if dry_run:
            print_cost(cfg)
            if cfg.backend == "verl":
                typer.echo("")
                print_verl_plan(cfg)
            else:
                stderr.print("[green]ok:[/] the config loads; nothing was run (with --backend verl a dry run also "
                             "prints each stage's verl command and memory plan)")
            return
        if launch_world_size() > 1:
            stderr.print("[red]error:[/] `sirius train` runs in one process (backend=verl starts its own Ray "
                         "cluster); launch only `sirius sft` with torchrun/deepspeed/accelerate")
            raise typer.Exit(2)
        on_change = on_config_change(resume_anyway, fresh)
        preflight(cfg)
        print_summary(run_or_fail(cfg, on_change=on_change))

    @app.command()
    def sft(
        config: Path = typer.Argument(..., help="run config YAML"),
        overrides: list[str] = typer.Argument(None, help="key=value overrides"),
        resume_anyway: bool = typer.Option(False, "--resume-anyway", help=RESUME_ANYWAY_HELP),
        fresh: bool = typer.Option(False, "--fresh", help=FRESH_HELP),
    ):
        """The supervised warm start alone (loss on answer tokens), evaluated by execution accuracy.

        Under a launcher (torchrun, deepspeed, accelerate launch) rank 0 runs it and the other ranks join its SFT.
        """
        from sirius_train.local import ranks
        from sirius_train.local.sft import follow_sft

        cfg = _load(config, overrides)
        if not cfg.sft.enabled:
            stderr.print("[red]error:[/] sft.enabled=false in this config; nothing to do")
            raise typer.Exit(2)
        on_change = on_config_change(resume_anyway, fresh)
        try:
            if ranks.launch_rank() > 0:
                follow_sft()
                return
            with ranks.leading():  # on any exit, ranks still waiting are released
                preflight(cfg)
                print_summary(run_or_fail(cfg, sft_only=True, on_change=on_change))
        finally:
            ranks.finish()
