"""Synthesized examples over every Spider database, side by side with Spider's own train gold SQL.

    python benchmarks/bench_synth.py                              # 50 per database, seed 0
    python benchmarks/bench_synth.py --per-db 50 --seed 1 --markdown docs/benchmarks/synth.md

Method. For every database folder under --db-root, `data_synthesis.sqlgen.synthesize` makes --per-db examples.
Then, independently of the synthesizer's own check, every gold SQL -- ours and Spider's `train_gold.sql`
on the same databases -- is executed again through the sandboxed `rewards.executor.Executor` (worker
processes, 5 s per query) to measure the share that executes and the share with a non-empty result.
Duplicates are counted per database (same SQL text; same question). SQL features are counted on both sides
by one function, `data_synthesis.sqlgen.features.sql_features` (sqlglot trees). Targets: >= 99% execute,
>= 90% non-empty, no duplicate SQL, every feature share within a factor of 2 of Spider's.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

from data_synthesis.sqlgen.features import FEATURES, feature_shares
from data_synthesis.sqlgen.synthesize import Synthesizer
from rewards.executor import Executor
from rewards.sandbox import Limits

SPIDER = Path(__file__).resolve().parents[2] / "shared" / "data" / "spider"


def execution_shares(db_root: Path, queries: list[tuple[str, str]], workers: int) -> tuple[float, float]:
    """(share that executes, share with at least one row) of `(db_id, sql)` queries, run sandboxed."""
    with Executor(db_root, workers=workers, limits=Limits(timeout_s=5.0)) as executor:
        outcomes = executor.execute_many(queries)
    n = len(outcomes) or 1
    return sum(o.executed for o in outcomes) / n, sum(bool(o.rows) for o in outcomes) / n


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db-root", type=Path, default=SPIDER / "databases")
    parser.add_argument("--gold", type=Path, default=SPIDER / "train_gold.sql", help="Spider's SQL<TAB>db_id file")
    parser.add_argument("--per-db", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--markdown", type=Path, help="also write the tables to this file")
    args = parser.parse_args()
    if not args.db_root.is_dir():
        print(f"no databases at {args.db_root}: pass --db-root", file=sys.stderr)
        return 2

    folders = sorted(p for p in args.db_root.iterdir() if p.is_dir())
    present = [p.name for p in folders if (p / f"{p.name}.sqlite").is_file()]
    t0 = time.perf_counter()
    examples, short, rules, rejected = [], {}, Counter(), Counter()
    for db_id in present:
        synth = Synthesizer(args.db_root / db_id / f"{db_id}.sqlite", db_id=db_id)
        made = synth.run(args.per_db, args.seed)
        examples += made
        rules.update(synth.stats.by_rule)
        rejected.update(synth.stats.rejected)
        if len(made) < args.per_db:
            short[db_id] = (len(made), ", ".join(sorted(synth.stats.rejected)) or "-")
    synth_s = time.perf_counter() - t0

    ours = [(e.db_id, e.gold_sql) for e in examples]
    spider = [(db, sql) for sql, db in (line.rstrip("\n").split("\t") for line in args.gold.open(encoding="utf-8")
                                        if "\t" in line) if db in set(present)]
    ours_exec, ours_rows = execution_shares(args.db_root, ours, args.workers)
    spider_exec, spider_rows = execution_shares(args.db_root, spider, args.workers)
    per_db = Counter()
    dup_sql = dup_q = 0
    seen_sql, seen_q = set(), set()
    for e in examples:
        per_db[e.db_id] += 1
        dup_sql += (e.db_id, e.gold_sql) in seen_sql
        dup_q += (e.db_id, e.question) in seen_q
        seen_sql.add((e.db_id, e.gold_sql))
        seen_q.add((e.db_id, e.question))
    ours_f, ours_n, ours_bad = feature_shares(sql for _, sql in ours)
    spider_f, spider_n, spider_bad = feature_shares(sql for _, sql in spider)

    lines = [
        f"Databases: {len(folders)} listed, {len(present)} with a SQLite file; {len(present) - len(short)} gave "
        f"{args.per_db} examples, {len(short)} fewer. Synthesis: {len(examples)} examples in {synth_s:.1f} s "
        f"({len(examples) / synth_s:.0f}/s, profiling included), seed {args.seed}.",
        "",
        "| measure | synthesized (ours) | Spider train gold, same databases | target | met |",
        "|---|---:|---:|---|:-:|",
        f"| queries | {len(ours)} | {len(spider)} | | |",
        f"| gold executes | {ours_exec:.2%} | {spider_exec:.2%} | >= 99% | {_ok(ours_exec >= 0.99)} |",
        f"| result non-empty | {ours_rows:.2%} | {spider_rows:.2%} | >= 90% | {_ok(ours_rows >= 0.90)} |",
        f"| duplicate SQL (within a database) | {dup_sql} | | 0 | {_ok(dup_sql == 0)} |",
        f"| duplicate question (within a database) | {dup_q} | | | |",
        f"| unparsable by sqlglot | {ours_bad} | {spider_bad} | | |",
        "",
        "| SQL feature (share of queries) | synthesized | Spider train gold | ratio | within 2x |",
        "|---|---:|---:|---:|:-:|",
    ]
    for f in FEATURES:
        ratio = ours_f[f] / spider_f[f] if spider_f[f] else float("inf")
        lines.append(f"| {f} | {ours_f[f]:.1%} | {spider_f[f]:.1%} | {ratio:.2f} | {_ok(0.5 <= ratio <= 2.0)} |")
    lines += ["", "Rules kept: " + ", ".join(f"{r} {n}" for r, n in rules.most_common()) + ".",
              "Candidates rejected: " + ", ".join(f"{r} {n}" for r, n in rejected.most_common()) + "."]
    if short:
        lines.append("Databases with fewer examples: " + "; ".join(
            f"{db} {n} ({why})" for db, (n, why) in sorted(short.items())) + ".")
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n", encoding="utf-8")
    return 0


def _ok(flag: bool) -> str:
    return "yes" if flag else "**no**"


if __name__ == "__main__":
    sys.exit(main())
