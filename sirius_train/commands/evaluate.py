"""`sirius evaluate`: EX of a prediction file -- ours (JSONL), BIRD's or Spider's official layout --
overall, per difficulty bucket and per database, as JSON, Markdown and a PNG chart; beside it the official
metrics: R-VES and Soft-F1 with BIRD's equivalence, test-suite accuracy with `--test-suite`, and EX on
variant databases with `--variants` (docs/METRICS.md)."""

from __future__ import annotations

from pathlib import Path

import typer

from sirius_train.commands import choices, one_line_errors
from sirius_train.progress import progress_bar, stderr

LAYOUT = choices("Layout", ("auto", "jsonl", "bird", "spider"))  # evaluation.FORMATS and auto
COMPARE = choices("Compare", ("auto", "bird", "spider"))  # rewards.compare.CompareMode and auto


def register(app: typer.Typer) -> None:
    @app.command()
    def evaluate(
        db_root: Path = typer.Option(..., "--db-root", help="folder with <db_id>/<db_id>.sqlite", exists=True,
                                     file_okay=False),
        pred: Path = typer.Option(..., "--pred", help="predictions: picks.jsonl | predict_dev.json (BIRD) | pred.sql (Spider)"),
        gold: Path = typer.Option(..., "--gold", help="gold: JSONL with id, db_id, gold_sql | BIRD dev.json / dev.sql | Spider dev_gold.sql"),
        fmt: LAYOUT = typer.Option(LAYOUT("auto"), "--format",
                                   help="jsonl | bird | spider | auto (from --pred's extension)"),
        compare: COMPARE = typer.Option(COMPARE("auto"), "--compare",
                                        help="bird | spider | auto (spider for the Spider layout, bird otherwise)"),
        difficulty_file: Path = typer.Option(None, "--difficulty-file",
                                             help="BIRD dev.json or JSONL {id, difficulty}: buckets from the dataset"),
        out: Path = typer.Option(Path("eval"), "--out", help="folder for <name>.json / .md / .png"),
        name: str = typer.Option("eval", "--name", help="report file stem"),
        timeout: float = typer.Option(30.0, "--timeout", help="seconds per query (BIRD's evaluator allows 30)"),
        workers: int = typer.Option(2, "--workers", help="sandboxed worker processes (0 = in-process)"),
        ves_repeats: int = typer.Option(100, "--ves-repeats", min=0,
                                        help="R-VES timings per correct prediction (BIRD's evaluator: 100; 0: no "
                                             "R-VES); with --compare bird only"),
        test_suite: Path = typer.Option(None, "--test-suite", exists=True, file_okay=False,
                                        help="a test-suite folder in the official layout (<db_id>/*.sqlite): "
                                             "also test-suite accuracy (TS)"),
        keep_distinct: bool = typer.Option(False, "--keep-distinct",
                                           help="TS: keep DISTINCT (the official evaluator drops it by default)"),
        variants: int = typer.Option(0, "--variants", min=0,
                                     help="also EX on the shipped database plus K variants (rewards.variants)"),
        quiet: bool = typer.Option(False, "--quiet", help="no progress bar"),
    ):
        """Execution accuracy per difficulty bucket and per database (our JSONL, BIRD or Spider files)."""
        from rewards.databases import require_db_ids
        from sirius_train.evaluation.official_eval import official_limits
        from sirius_train.evaluation.reports import (detect_format, ex_report, load_items, markdown_report, score_items,
                                                     write_report)

        with one_line_errors():
            layout = detect_format(pred) if fmt.value == "auto" else fmt.value
            mode = ("spider" if layout == "spider" else "bird") if compare.value == "auto" else compare.value
            items = load_items(pred, gold, layout, difficulty_file)
            require_db_ids(db_root, [it.db_id for it in items], "question(s)")
            stderr.print(f"evaluate: {len(items)} questions, format={layout}, compare={mode}")
            limits = official_limits(layout, timeout)
            with progress_bar("scoring", len(items), not quiet) as advance:
                results = score_items(items, db_root, mode, workers=workers, limits=limits,
                                      on_result=lambda i, r: advance())
            metrics = official_metrics(items, results, db_root, mode, ves_repeats=ves_repeats, test_suite=test_suite,
                                       keep_distinct=keep_distinct, variants=variants, workers=workers,
                                       limits=limits, show=not quiet, layout=layout)
            report = ex_report(items, results, mode, metrics)
            report["inputs"] = {"pred": str(pred), "gold": str(gold), "format": layout}
            paths = write_report(report, out, name)
        typer.echo(markdown_report(report))
        stderr.print("wrote " + ", ".join(str(p) for p in paths))


def official_metrics(items, results, db_root: Path, mode: str, *, ves_repeats: int, test_suite: Path | None,
                     keep_distinct: bool, variants: int, workers: int, limits, show: bool, layout: str = "jsonl") -> dict:
    """Per question: Soft-F1 and R-VES's sqrt(reward) (BIRD equivalence), TS (a test-suite folder), EX on variants;
    for the Spider layout also EX as its official evaluator computes it (DISTINCT dropped: ours keeps it)."""
    import math

    from rewards.executor import Executor
    from sirius_train.evaluation import official_eval

    timeout_s = limits.timeout_s
    pairs = [(it.db_id, it.gold_sql, it.pred_sql) for it in items]
    matches = [r.match for r in results]
    metrics = {}
    if layout == "spider":
        metrics["ex_official"] = [float(m) for m in official_eval.ts_matches(
            db_root, pairs, keep_distinct=keep_distinct, workers=workers, timeout_s=timeout_s)]
    if mode == "bird":
        with Executor(db_root, workers=workers, limits=limits) as executor:
            metrics["soft_f1"] = official_eval.soft_f1_scores(executor, pairs)
        if ves_repeats:
            with progress_bar(f"R-VES timings (x{ves_repeats})", len(items), show) as advance:
                rewards = official_eval.ves_rewards(db_root, pairs, matches, ves_repeats, limits=limits,
                                                    advance=advance)
            metrics["r_ves"] = [math.sqrt(r) for r in rewards]
    if test_suite is not None:
        with progress_bar("test suite", len(items), show) as advance:
            metrics["ts"] = [float(m) for m in official_eval.ts_matches(
                test_suite, pairs, keep_distinct=keep_distinct, workers=workers, timeout_s=timeout_s,
                on_result=lambda i, r: advance())]
    if variants:
        stderr.print(f"EX on {variants} variant databases each (built once, cached)")
        metrics["ex_variants"] = [float(m) for m in official_eval.variant_matches(
            db_root, pairs, matches, mode, variants, workers=workers, timeout_s=timeout_s)]
    return metrics
