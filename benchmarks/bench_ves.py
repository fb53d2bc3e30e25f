"""What R-VES times: the official `execute; fetchall; close` against our timing, before (the sandbox) and now.

    python benchmarks/bench_ves.py [--spider-root ../shared/data/spider] [--repeats 100] [--rounds 5]

BIRD's evaluation_ves.py times each run of a pair as `cursor(); execute(sql); fetchall(); close()` on a fresh
connection, in C. Until issue 36 ours timed the sandbox (`rewards.sandbox`: a Python text factory, chunked fetches
with byte accounting, an authorizer, a progress handler); now `official_eval.time_pair` times a plain read-only
connection. Measured on real Spider databases (chinook_1's Track: 3,503 rows):

- per run, the median time of one query three ways (official loop written here from the script, the sandbox
  path as it was, `time_pair` now), for a one-row and a 3,503-row result: the ratio to the official time;
- a pair that differs only by DISTINCT (prediction `SELECT Composer FROM Track`, gold `SELECT DISTINCT Composer
  FROM Track`: equal as sets, 3,503 rows against 853): the gold/prediction ratio R-VES maps to a reward (>= 1: 1,
  [0.5, 1): 0.75), three ways.

Rounds alternate the three ways; medians over rounds. Run it with no other heavy job on the machine.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import time
from pathlib import Path

from _baselines import SPIDER, SPIDER_HELP

from rewards.sandbox import Limits, Sandbox
from sirius_train.evaluation.official_eval import time_pair
from sirius_train.evaluation.official_metrics import time_ratio

ONE_ROW = "SELECT count(*) FROM Track"
MANY_ROWS = "SELECT Name FROM Track"
PAIR = ("SELECT Composer FROM Track", "SELECT DISTINCT Composer FROM Track")  # (prediction, gold)


def official_times(db: Path, pred: str, gold: str, repeats: int) -> tuple[list[float], list[float]]:
    """evaluation_ves.py's loop: connect, then time cursor/execute/fetchall/close, prediction then gold."""
    out: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeats):
        for sql, times in zip((pred, gold), out):
            conn = sqlite3.connect(db)
            start = time.perf_counter()
            cursor = conn.cursor()
            cursor.execute(sql)
            cursor.fetchall()
            conn.close()
            times.append(time.perf_counter() - start)
    return out


def sandbox_times(db: Path, pred: str, gold: str, repeats: int) -> tuple[list[float], list[float]]:
    """The timing before issue 36: a fresh sandbox per run, `run` timed, `close` inside."""
    out: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeats):
        for sql, times in zip((pred, gold), out):
            sandbox = Sandbox(db, Limits(timeout_s=30.0))
            start = time.perf_counter()
            sandbox.run(sql)
            sandbox.close()
            times.append(time.perf_counter() - start)
    return out


WAYS = {"official": official_times, "sandbox (before)": sandbox_times,
        "time_pair (now)": lambda db, p, g, n: time_pair(db, p, g, n, limits=Limits(timeout_s=30.0))}


def measure(db: Path, repeats: int, rounds: int) -> dict:
    per_run: dict = {name: {ONE_ROW: [], MANY_ROWS: []} for name in WAYS}
    ratios: dict = {name: [] for name in WAYS}
    for _ in range(rounds):
        for name, way in WAYS.items():
            for sql in (ONE_ROW, MANY_ROWS):
                pred_times, _ = way(db, sql, sql, repeats)
                per_run[name][sql].append(statistics.median(pred_times))
            ratios[name].append(time_ratio(*way(db, *PAIR, repeats)))
    return {"per_run": {n: {q: statistics.median(v) for q, v in d.items()} for n, d in per_run.items()},
            "ratio": {n: (min(v), statistics.median(v), max(v)) for n, v in ratios.items()}}


def markdown(result: dict, repeats: int, rounds: int) -> str:
    official = result["per_run"]["official"]
    lines = [f"| timing | 1 row: ms per run | x official | 3,503 rows: ms per run | x official | DISTINCT pair: "
             f"gold/pred ratio, min / median / max of {rounds} |", "|---|---:|---:|---:|---:|---|"]
    for name, times in result["per_run"].items():
        low, mid, high = result["ratio"][name]
        lines.append(f"| {name} | {1000 * times[ONE_ROW]:.3f} | {times[ONE_ROW] / official[ONE_ROW]:.2f} | "
                     f"{1000 * times[MANY_ROWS]:.3f} | {times[MANY_ROWS] / official[MANY_ROWS]:.2f} | "
                     f"{low:.2f} / {mid:.2f} / {high:.2f} |")
    return "\n".join(lines) + f"\n\n{repeats} repetitions per pair, {rounds} rounds; load average " \
        f"{', '.join(f'{x:.1f}' for x in os.getloadavg())} at the end."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spider-root", type=Path, default=SPIDER, help=SPIDER_HELP)
    parser.add_argument("--repeats", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    db = args.spider_root / "databases" / "chinook_1" / "chinook_1.sqlite"
    print(markdown(measure(db, args.repeats, args.rounds), args.repeats, args.rounds))


if __name__ == "__main__":
    main()
