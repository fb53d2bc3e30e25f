"""End-to-end throughput and batch latency of the reward server over HTTP, beside the in-process executor
and the BIRD evaluator's way, on the real pool pairs.

    python benchmarks/bench_server.py                       # 5 rounds, 2 workers, 256-item batches, 4 clients

The job: score the 7,758 (candidate, gold) pairs of `dev_candidate_pools.jsonl` with BIRD's rule.
The server contender starts `sirius reward-server --workers 2` as its own process on 127.0.0.1
(`rewards.launch.spawn`), and `--clients` threads of one `RewardClient` (the load generator, in
another process on the same 2 cores) each send the next 256-item batch until none is left -- like
rollout workers sharing a node's server. The in-process executor gets the very same batches from
the same number of threads (`executor-batches`) and, separately, all pairs in one call
(`executor`). A latency-only row repeats the server with one client. Each pass is cold (fresh
server / workers, empty caches); a second, warm pass follows. Every contender runs in a fresh
process, they take turns round by round, and all must give the same 1/0 per pair (checked).
"""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path

import numpy as np
from _baselines import (SPIDER, SPIDER_HELP, disagreements, load_pool_pairs, medians, run_rounds, save_runs,
                        setup_line)


def contenders(clients: int) -> dict[str, tuple[str, int, str]]:
    """label -> (contender name, client threads, what it does)."""
    return {
        "server": ("server", clients, f"HTTP: sirius reward-server (2 workers), {clients} client threads of a "
                                      "RewardClient, 256-item batches"),
        "server, 1 client": ("server", 1, "the same, one batch at a time (latency without queueing)"),
        "executor-batches": ("executor-batches", clients, f"in-process Executor (2 workers), the same batches from "
                                                          f"{clients} threads"),
        "executor": ("executor", 1, "in-process Executor (2 workers), all pairs in one call"),
        "bird": ("bird", 1, "BIRD evaluation.py scheme: mp.Pool(2), func_timeout, fresh connection, gold re-run"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spider-root", type=Path, default=SPIDER, help=SPIDER_HELP)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path, help="also write every run here")
    args = parser.parse_args()
    n = len(load_pool_pairs(args.spider_root))
    table = contenders(args.clients)
    load = os.getloadavg()
    plan = {label: {"name": name, "workers": args.workers, "batch_size": args.batch_size, "concurrency": clients}
            for label, (name, clients, _) in table.items()}
    runs = run_rounds(plan, args.spider_root, args.rounds)
    print(report(runs, table, n, args, load + os.getloadavg()))
    print(disagreements(runs, "executor"))
    save_runs(args.json, runs)


def report(runs: dict, table: dict, n: int, args, load: tuple) -> str:
    med = medians(runs)
    lines = [setup_line(runs, n, args.workers, load, f", batches of {args.batch_size}"), "",
             "| contender | what it does | cold pass s (median) | pairs/s | batch p50 ms | batch p99 ms | warm pass s "
             "| CPU s | vs executor-batches | vs executor | vs BIRD way |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for label, rs in runs.items():
        latencies = [x for r in rs for x in r.get("latencies", [])]
        p50, p99 = (f"{np.percentile(latencies, q) * 1e3:.0f}" for q in (50, 99)) if latencies else ("-", "-")
        warm = f"{statistics.median(r['warm_seconds'] for r in rs):.3f}" if "warm_seconds" in rs[0] else "-"
        lines.append(f"| {label} | {table[label][2]} | {med[label]:.3f} | {n / med[label]:,.0f} | {p50} | {p99} | "
                     f"{warm} | {statistics.median(r['cpu_seconds'] for r in rs):.3f} | "
                     f"{med['executor-batches'] / med[label]:.2f}x | {med['executor'] / med[label]:.2f}x | "
                     f"{med['bird'] / med[label]:.1f}x |")
    timeouts = {label: sum(r.get("timeouts", 0) for r in rs) for label, rs in runs.items() if "timeouts" in rs[0]}
    lines += ["",
              "items that timed out (gold or prediction): " + ", ".join(f"{k} {v}" for k, v in timeouts.items()),
              "batch latency percentiles pool the cold passes of all rounds "
              f"({sum(len(r['latencies']) for r in runs['server'])} batches per server row)."]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
