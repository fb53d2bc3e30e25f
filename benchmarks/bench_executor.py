"""Scoring throughput of the executor on the real pool pairs, beside raw sqlite3 and the BIRD evaluator's way.

    python benchmarks/bench_executor.py                    # 5 rounds, 2 workers, ../shared/data/spider

The job: score all 7,758 (candidate, gold) pairs of `dev_candidate_pools.jsonl` (431 Spider dev
questions x 18 real systems) with BIRD's rule, `set(pred) == set(gold)`. Every contender gets the
same pairs and must give the same 1/0 per pair (checked). What each one does is in `_baselines.py`
and in the table. Every run is a fresh Python process (cold caches, nothing shared), the database
files are read once beforehand (warm OS page cache for everyone), and the contenders take turns
round by round, so a busy neighbour on the machine slows all of them alike. The ratios compare
medians of the same rounds.
"""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path

from _baselines import (SPIDER, SPIDER_HELP, disagreements, load_pool_pairs, medians, run_rounds, save_runs,
                        setup_line)

CONTENDERS = {
    "raw": "plain sqlite3, 1 process, no sandbox: gold once per question, every prediction run (the limit)",
    "raw-dedup": "as raw, and a pair identical to one already scored is not run again (the executor's dedup)",
    "raw-locked": "as raw, connections keep their shared lock between queries (the sandbox's locking mode)",
    "raw-2proc": "raw in 2 forked processes, pairs split at a question boundary",
    "scorer": "rewards Scorer in-process: the sandbox, typed outcomes, no worker processes",
    "executor": "rewards Executor, 2 sandboxed workers, cold caches (startup not counted)",
    "bird": "BIRD evaluation.py scheme: mp.Pool(2), func_timeout per pair, fresh connection, gold re-run",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spider-root", type=Path, default=SPIDER, help=SPIDER_HELP)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path, help="also write every run here")
    args = parser.parse_args()
    n = len(load_pool_pairs(args.spider_root))
    load = os.getloadavg()
    runs = run_rounds({name: {"name": name, "workers": args.workers} for name in CONTENDERS}, args.spider_root,
                      args.rounds)
    print(report(runs, n, args.workers, load + os.getloadavg()))
    print(disagreements(runs, "raw"))
    save_runs(args.json, runs)


def report(runs: dict[str, list[dict]], n: int, workers: int, load: tuple) -> str:
    med, cpu = medians(runs), medians(runs, "cpu_seconds")
    lines = [setup_line(runs, n, workers, load), "",
             "| contender | what it does | median s | best s | pairs/s | CPU s | speed vs raw | CPU vs raw "
             "| vs raw-dedup | vs raw-locked | vs BIRD way |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, rs in runs.items():
        lines.append(f"| {name} | {CONTENDERS[name]} | {med[name]:.3f} | {min(r['seconds'] for r in rs):.3f} | "
                     f"{n / med[name]:,.0f} | {cpu[name]:.3f} | {med['raw'] / med[name]:.2f}x | "
                     f"{cpu['raw'] / cpu[name]:.2f}x | {med['raw-dedup'] / med[name]:.2f}x | "
                     f"{med['raw-locked'] / med[name]:.2f}x | {med['bird'] / med[name]:.1f}x |")
    ex = runs["executor"]
    lines += ["",
              f"executor warm pass (gold results cached): median {statistics.median(r['warm_seconds'] for r in ex):.3f} s;"
              f" worker start-up: median {statistics.median(r['startup_seconds'] for r in ex):.3f} s."]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
