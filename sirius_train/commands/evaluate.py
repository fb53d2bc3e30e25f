"""`sirius evaluate`: EX of a prediction file -- ours (JSONL), BIRD's or Spider's official layout --
overall, per difficulty bucket and per database, as JSON, Markdown and a PNG chart."""

from __future__ import annotations

from pathlib import Path

import typer

from sirius_train.commands import one_line_errors
from sirius_train.progress import progress_bar, stderr


def register(app: typer.Typer) -> None:
    @app.command()
    def evaluate(
        db_root: Path = typer.Option(..., "--db-root", help="folder with <db_id>/<db_id>.sqlite", exists=True,
                                     file_okay=False),
        pred: Path = typer.Option(..., "--pred", help="predictions: picks.jsonl | predict_dev.json (BIRD) | pred.sql (Spider)"),
        gold: Path = typer.Option(..., "--gold", help="gold: JSONL with id, db_id, gold_sql | BIRD dev.json / dev.sql | Spider dev_gold.sql"),
        fmt: str = typer.Option("auto", "--format", help="jsonl | bird | spider | auto (from --pred's extension)"),
        compare: str = typer.Option("auto", "--compare",
                                    help="bird | spider | auto (spider for the Spider layout, bird otherwise)"),
        difficulty_file: Path = typer.Option(None, "--difficulty-file",
                                             help="BIRD dev.json or JSONL {id, difficulty}: buckets from the dataset"),
        out: Path = typer.Option(Path("eval"), "--out", help="folder for <name>.json / .md / .png"),
        name: str = typer.Option("eval", "--name", help="report file stem"),
        timeout: float = typer.Option(30.0, "--timeout", help="seconds per query (BIRD's evaluator allows 30)"),
        workers: int = typer.Option(2, "--workers", help="sandboxed worker processes (0 = in-process)"),
        quiet: bool = typer.Option(False, "--quiet", help="no progress bar"),
    ):
        """Execution accuracy per difficulty bucket and per database (our JSONL, BIRD or Spider files)."""
        from rewards.compare import parse_mode
        from sirius_train.evaluation import (detect_format, ex_report, load_items, markdown_report, score_items,
                                             write_report)

        with one_line_errors():
            layout = detect_format(pred) if fmt == "auto" else fmt
            mode = ("spider" if layout == "spider" else "bird") if compare == "auto" else parse_mode(compare).value
            items = load_items(pred, gold, layout, difficulty_file)
            stderr.print(f"evaluate: {len(items)} questions, format={layout}, compare={mode}")
            with progress_bar("scoring", len(items), not quiet) as advance:
                results = score_items(items, db_root, mode, workers=workers, timeout_s=timeout,
                                      on_result=lambda i, r: advance())
            report = ex_report(items, results, mode)
            report["inputs"] = {"pred": str(pred), "gold": str(gold), "format": layout}
            paths = write_report(report, out, name)
        typer.echo(markdown_report(report))
        stderr.print("wrote " + ", ".join(str(p) for p in paths))
