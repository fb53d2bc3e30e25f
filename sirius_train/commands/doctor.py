"""`sirius doctor [CONFIG]`: one screen, in seconds, of what this machine and this config would hit first.

GPUs, CUDA and the package versions against the tested set (constraints/verl-0.9.1.txt); the model folder;
every database opening read-only; the reward server being ours for `data.db_root`; the Ray cluster; the
budgets' slack for dynamic sampling; free disk against the checkpoint plan; and for `backend: verl` the
memory plan of every phase of every stage. Each failed check says the fix. Exit code 1 when one fails.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

STYLE = {"ok": "green", "warn": "yellow", "FAIL": "bold red", "-": "dim"}


@dataclass
class Report:
    checks: list  # preflight.Check
    plans: list | None  # per stage: (name, [PhasePlan]) for backend: verl
    shape_source: str  # where the model's sizes came from
    gpu_gib: float  # the GPU size the plans are for
    gpus_seen: bool  # measured here (else assumed)
    subject: str  # what was checked, for the title

    @property
    def failed(self) -> bool:
        return any(c.status == "FAIL" for c in self.checks) or any(not p.fits for _, ps in self.plans or [] for p in ps)


def doctor_report(cfg, gpu_gib: float | None = None, environment_only: bool = False) -> Report:
    from sirius_train import preflight
    from sirius_train.verl_backend.plans import DEFAULT_GPU_GIB, model_shape, stage_memory

    gpus = preflight.query_gpus()
    if environment_only:  # no config: this machine for what it can run (a CPU machine: the local backend)
        subject = "this machine against the verl tested set"
        if not gpus.names:
            cfg = replace(cfg, backend="local")
            subject = ("this machine: no GPU visible, so the local backend on the CPU (verl needs GPUs; `sirius "
                       "doctor configs/verl_cpu_smoke.yaml` checks verl's CPU platform)")
        checks = [*preflight.gpu_checks(cfg, gpus),
                  *preflight.version_checks(cfg, preflight.tested_set(preflight.constraints_of(cfg)))]
        return Report(checks, None, "", gpu_gib or DEFAULT_GPU_GIB, bool(gpus.memory_gib), subject)
    found = model_shape(cfg)
    checks = [*preflight.gpu_checks(cfg, gpus), *preflight.cheap_checks(cfg), *preflight.budget_checks(cfg),
              *preflight.cost_checks(cfg), preflight.disk_check(cfg, found[1] if found else None)]
    planned = gpu_gib or (min(gpus.memory_gib) if gpus.memory_gib else DEFAULT_GPU_GIB)
    plans = stage_memory(cfg, found[1], planned) if cfg.backend == "verl" and found else None
    if cfg.backend == "verl" and not found:
        checks.append(preflight.Check("memory plan", "FAIL", f"no shape for {cfg.model.path}",
                                      "give model.path a config.json (the plan reads its sizes)"))
    return Report(checks, plans, found[0] if found else "", planned, bool(gpus.memory_gib) and gpu_gib is None,
                  f"{cfg.name} (backend: {cfg.backend})")


def render(console: Console, cfg, report: Report) -> None:
    table = Table(title=f"sirius doctor -- {report.subject}")
    for column in ("check", "status", "detail", "fix"):
        table.add_column(column, overflow="fold")
    for c in report.checks:
        table.add_row(c.name, f"[{STYLE[c.status]}]{c.status}[/]", escape(c.detail), escape(c.fix))
    console.print(table)
    plans = report.plans
    if plans is None:
        return
    from sirius_train.verl_backend.plans import estimation_engine

    where = "this node's GPUs" if report.gpus_seen else "assumed: no GPU measured here; --gpu-gib to change"
    memory = Table(title=f"memory plan per GPU ({report.gpu_gib:.0f} GiB, {where}); model shape from "
                         f"{report.shape_source}")
    for column in ("stage", "phase", "parts (GiB)", "total", "fits"):
        memory.add_column(column, overflow="fold")
    for stage, phases in plans:
        for plan in phases:
            parts = ", ".join(f"{name} {gib:.1f}" for name, gib in plan.parts)
            verdict = "[green]yes[/]" if plan.fits else "[bold red]NO[/]"
            memory.add_row(stage, plan.phase, escape(parts), f"{plan.total_gib:.1f}",
                           f"{verdict} ({escape(plan.note)})")
    console.print(memory)
    console.print(f"pass rates + evaluation engine: {estimation_engine(cfg).describe()}")


def register(app: typer.Typer) -> None:
    @app.command()
    def doctor(
        config: Path = typer.Argument(None, help="run config YAML (none: this machine, against the verl tested set "
                                      "on a GPU node, for the local backend on a CPU-only one)"),
        overrides: list[str] = typer.Argument(None, help="key=value overrides, as for `sirius train`"),
        gpu_gib: float = typer.Option(None, "--gpu-gib", help="GPU memory to plan for (default: this node's GPUs, "
                                      "or 80 GiB when none is visible)"),
    ):
        """Preflight: versions, GPUs, model, databases, reward server, Ray, disk, memory plan; each failure's fix."""
        from sirius_train.commands.train import read_config

        cfg = read_config(config, overrides or [], **({} if config else {"backend": "verl"}))
        report = doctor_report(cfg, gpu_gib, environment_only=config is None)
        render(Console(), cfg, report)
        if report.failed:
            raise typer.Exit(1)
