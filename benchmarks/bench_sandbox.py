"""Per-item CPU cost of the sandbox and the scorer, beside plain sqlite3, on the real pool queries.

    python benchmarks/bench_sandbox.py                     # 9 rounds, ../shared/data/spider

What `bench_executor.py` sums up over a whole run, item by item: the distinct queries of
`dev_candidate_pools.jsonl` (every candidate and every gold query, once each: 4,280) run by

- raw: plain `sqlite3` opened `mode=ro`, `execute` + `fetchall`;
- raw-locked: raw, with the connection keeping its shared lock between queries (the sandbox's locking mode);
- sandbox: `Sandbox.run` (authorizer, deadline, caps, typed `Outcome`);

and the 4,166 distinct (candidate, gold) pairs scored by `Scorer.score` (its gold cache runs each gold
query once). Each round opens fresh connections for every contender (opening and loading the schema
are not timed), then times one pass in CPU seconds (`time.process_time`: what a busy neighbour does
not change); the contenders take turns round by round. Run it with another `rewards` package on
PYTHONPATH to measure that version (both only use `Sandbox.run` and `Scorer.score`).
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from _baselines import SPIDER, SPIDER_HELP, _connect_ro, db_path, load_pool_pairs, warm_page_cache

from rewards.sandbox import Sandbox
from rewards.scoring import Scorer

SCHEMA_PROBE = "SELECT 1 FROM sqlite_master LIMIT 1"  # loads the schema outside the timed pass


def contenders(db_root: Path, queries: list[tuple[str, str]], pairs: list) -> dict[str, Callable[[], Callable]]:
    """name -> set-up function returning the timed pass (fresh connections each call)."""
    dbs = sorted({db_id for db_id, _ in queries})

    def raw(locked: bool) -> Callable:
        conns = {db_id: _connect_ro(db_path(db_root, db_id)) for db_id in dbs}
        for conn in conns.values():
            if locked:
                conn.execute("PRAGMA locking_mode = EXCLUSIVE")
            conn.execute(SCHEMA_PROBE).fetchall()

        def run():
            for db_id, sql in queries:
                try:
                    conns[db_id].execute(sql).fetchall()
                except sqlite3.Error:
                    pass
        return run

    def sandbox() -> Callable:
        boxes = {db_id: Sandbox(db_path(db_root, db_id)) for db_id in dbs}
        for box in boxes.values():
            box.run(SCHEMA_PROBE)

        def run():
            for db_id, sql in queries:
                boxes[db_id].run(sql)
        return run

    def scorer() -> Callable:
        scorer = Scorer(db_root)
        for db_id in dbs:
            scorer.execute(db_id, SCHEMA_PROBE)

        def run():
            for item in pairs:
                scorer.score(item)
        return run

    return {"raw": lambda: raw(False), "raw-locked": lambda: raw(True), "sandbox": sandbox, "scorer": scorer}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spider-root", type=Path, default=SPIDER, help=SPIDER_HELP)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    items = load_pool_pairs(args.spider_root)
    db_root = args.spider_root / "databases"
    warm_page_cache(db_root, items)
    queries = sorted({(it.db_id, it.pred_sql) for it in items} | {(it.db_id, it.gold_sql) for it in items})
    pairs = list({(it.db_id, it.gold_sql, it.pred_sql): it for it in items}.values())
    plan = contenders(db_root, queries, pairs)
    seconds: dict[str, list[float]] = {name: [] for name in plan}
    for _ in range(args.rounds):
        for name, setup in plan.items():
            timed = setup()
            t0 = time.process_time()
            timed()
            seconds[name].append(time.process_time() - t0)
    raw = statistics.median(seconds["raw"]) / len(queries)
    print(f"{len(queries)} distinct queries, {len(pairs)} distinct pairs, {args.rounds} rounds, CPU time per item\n")
    print("| contender | per | median µs | best µs | cost vs raw |\n|---|---|---:|---:|---:|")
    for name, values in seconds.items():
        n, per = (len(pairs), "pair") if name == "scorer" else (len(queries), "query")
        median = statistics.median(values) / n
        print(f"| {name} | {per} | {median * 1e6:.1f} | {min(values) / n * 1e6:.1f} | {median / raw:.2f}x |")


if __name__ == "__main__":
    main()
