"""`sirius score`: execution match of predicted vs gold SQL, one JSONL line per pair.

Contract (used by other tools): input lines `{"id", "db_id", "pred_sql", "gold_sql"}`; output lines in
the same order `{"id", "match", "pred_status", "gold_status", "pred_error"?}`. `pred_sql: null` counts
as a format failure.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import typer

from rewards.compare import CompareMode
from sirius_train.commands import one_line_errors
from sirius_train.progress import progress_bar, stderr

INPUT_FIELDS = {"id": None, "db_id": (str, int), "pred_sql": (str, type(None)), "gold_sql": str}  # None: any type


def score_file(db_root: Path, input_path: Path, output_path: Path, compare: str = "bird", timeout: float = 5.0,
               workers: int = 2, show_progress: bool = True) -> dict:
    """Score every line of `input_path` into `output_path`; returns the summary."""
    from rewards.executor import Executor
    from rewards.sandbox import Limits
    from rewards.scoring import ScoreItem
    from data_synthesis.jsonl import read_jsonl, write_jsonl

    from rewards.databases import require_db_ids

    rows = read_jsonl(input_path, required=INPUT_FIELDS)
    require_db_ids(db_root, [str(r["db_id"]) for r in rows], f"line(s) of {input_path}")
    items = [ScoreItem(db_id=str(r["db_id"]), gold_sql=r["gold_sql"], pred_sql=r["pred_sql"], compare=compare,
                       id=r["id"]) for r in rows]
    with Executor(db_root, workers=workers, limits=Limits(timeout_s=timeout)) as executor, \
            progress_bar("scoring", len(items), show_progress) as advance:
        results = executor.score(items, on_result=lambda i, r: advance())
    write_jsonl(output_path, ({"id": r.id, "match": r.match, "pred_status": r.pred_status,
                               "gold_status": r.gold_status,
                               **({"pred_error": r.pred_error} if r.pred_error else {})} for r in results))
    n = len(results)
    return {
        "n": n,
        "ex": sum(r.match for r in results) / n if n else 0.0,
        "pred_status": dict(Counter(r.pred_status for r in results)),
        "gold_status": dict(Counter(r.gold_status for r in results)),
        "compare": compare,
    }


def print_summary(summary: dict) -> None:
    from rich.table import Table

    table = Table(title=f"EX ({summary['compare']}) = {summary['ex']:.2%} over {summary['n']} pairs")
    table.add_column("status")
    table.add_column("predictions", justify="right")
    table.add_column("gold", justify="right")
    for status in ("ok", "empty", "error", "timeout", "rejected"):
        table.add_row(status, str(summary["pred_status"].get(status, 0)), str(summary["gold_status"].get(status, 0)))
    stderr.print(table)
    if summary["gold_status"].get("error") or summary["gold_status"].get("timeout"):
        stderr.print("[yellow]warning:[/] some gold queries did not execute; those pairs count as no match")


def register(app: typer.Typer) -> None:
    @app.command()
    def score(
        db_root: Path = typer.Option(..., "--db-root", help="folder with <db_id>/<db_id>.sqlite", exists=True,
                                     file_okay=False),
        input: Path = typer.Option(..., "--input", help="JSONL with id, db_id, pred_sql, gold_sql"),
        output: Path = typer.Option(..., "--output", help="JSONL with id, match, pred_status, gold_status"),
        compare: CompareMode = typer.Option(CompareMode.BIRD, "--compare", help="result equivalence rule"),
        timeout: float = typer.Option(5.0, "--timeout", help="seconds per query, enforced inside SQLite"),
        workers: int = typer.Option(2, "--workers", help="sandboxed worker processes (0 = in-process)"),
        quiet: bool = typer.Option(False, "--quiet", help="no progress bar"),
    ):
        """Score predicted SQL against gold SQL by execution (BIRD or Spider result semantics)."""
        with one_line_errors():
            summary = score_file(db_root, input, output, compare.value, timeout, workers, not quiet)
        print_summary(summary)
