"""`sirius demo`: the first thing a newcomer runs (`make demo`).

Builds the project's demo databases, then scores a handful of predictions against gold SQL -- correct,
reordered, wrong, broken and hostile ones -- to show the sandboxed execution reward at work.
"""

from __future__ import annotations

from pathlib import Path

import typer

DEMO_PAIRS = [
    ("retail", "SELECT count(*) FROM customers WHERE city = 'Paris'",
     "SELECT count(*) FROM customers WHERE city = 'Paris'"),
    ("retail", "SELECT category, count(*) FROM products GROUP BY category",
     "SELECT count(*), category FROM products GROUP BY category"),
    ("university", "SELECT name FROM departments ORDER BY budget DESC LIMIT 3",
     "SELECT name FROM departments ORDER BY budget ASC LIMIT 3"),
    ("library", "SELECT genre, avg(pages) FROM books GROUP BY genre", "SELECT genre, avg(page) FROM books GROUP BY genre"),
    ("clinic", "SELECT count(*) FROM appointments WHERE status = 'cancelled'", "DROP TABLE appointments"),
    ("flights", "SELECT max(distance) FROM flights",
     "WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r) SELECT max(x) FROM r"),
    ("clinic", "SELECT name FROM doctors WHERE specialty = 'neurology'", None),
]


def register(app: typer.Typer) -> None:
    @app.command()
    def demo(
        out: Path = typer.Option(Path("demo_data"), "--out", help="where demo databases and files go"),
        compare: str = typer.Option("spider", "--compare"),
    ):
        """Build the demo databases and score a few predictions with the sandboxed execution reward."""
        from data_synthesis.demo_dbs import build_demo_dbs
        from sirius_train.commands.score import print_summary, score_file
        from sirius_train.jsonl import read_jsonl, write_jsonl
        from sirius_train.progress import stderr

        db_root = out / "dbs"
        paths = build_demo_dbs(db_root)
        stderr.print(f"demo databases: {', '.join(p.parent.name for p in paths)} under {db_root}")
        write_jsonl(out / "demo_preds.jsonl", ({"id": i, "db_id": db, "gold_sql": gold, "pred_sql": pred}
                                               for i, (db, gold, pred) in enumerate(DEMO_PAIRS)))
        summary = score_file(db_root, out / "demo_preds.jsonl", out / "demo_scores.jsonl", compare, timeout=2.0)
        for row, (db, _, pred) in zip(read_jsonl(out / "demo_scores.jsonl"), DEMO_PAIRS):
            error = f"  ({row['pred_error'][:60]})" if "pred_error" in row else ""
            stderr.print(f"{'MATCH' if row['match'] else 'miss ':5} {row['pred_status']:9} {db:10} {pred}{error}")
        print_summary(summary)
