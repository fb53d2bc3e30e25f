"""`sirius score` as a user runs it -- a fresh process, start-up included -- beside raw single-core sqlite3.

    python benchmarks/bench_cli_score.py                   # 5 rounds, ../shared/data/spider

The job: one JSONL file of every (candidate, gold) pair of `dev_candidate_pools.jsonl` (431 Spider dev
questions x 18 systems = 7,758 lines `{"id", "db_id", "pred_sql", "gold_sql"}`) scored into an output
JSONL file. Each contender is a fresh `python` process, timed from its start to its exit:

- raw: read the file with `json`, `_baselines.raw_sqlite_score` (plain sqlite3 in this one process, no
  sandbox, no timeout, each distinct gold query once), write `{"id", "match"}` lines. The limit.
- sirius score: the real command line (`python -m sirius_train.cli score --quiet`), once with its default
  2 sandboxed workers and once in-process (`--workers 0`, one core like raw).
- sirius --help: the start-up alone.

The database files are read once beforehand (warm OS page cache for everyone); the contenders take
turns round by round and the ratios compare medians, so a busy neighbour slows all of them alike. CPU s
is user + system time of the process and everything it started. Every contender's 1/0 per pair must
agree with raw's (checked).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _baselines import SPIDER, SPIDER_HELP, load_pool_pairs, raw_sqlite_score, warm_page_cache

ROOT = Path(__file__).resolve().parents[1]


def write_pairs(spider_root: Path, path: Path) -> int:
    items = load_pool_pairs(spider_root)
    with path.open("w", encoding="utf-8") as f:
        for it in items:
            f.write(json.dumps({"id": it.id, "db_id": it.db_id, "pred_sql": it.pred_sql, "gold_sql": it.gold_sql})
                    + "\n")
    warm_page_cache(spider_root / "databases", items)
    return len(items)


def raw_main(db_root: str, input_path: str, output_path: str) -> None:
    """The raw contender's whole process: read, score with plain sqlite3, write."""
    from rewards.scoring import ScoreItem

    with open(input_path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    items = [ScoreItem(r["db_id"], r["gold_sql"], r["pred_sql"], "bird", id=r["id"]) for r in rows]
    match = raw_sqlite_score(Path(db_root), items)
    with open(output_path, "w", encoding="utf-8") as f:
        for r, m in zip(rows, match):
            f.write(json.dumps({"id": r["id"], "match": bool(m)}) + "\n")


def commands(db_root: Path, pairs: Path, out: Path) -> dict[str, list[str]]:
    py = sys.executable
    score = [py, "-m", "sirius_train.cli", "score", "--db-root", str(db_root), "--input", str(pairs), "--quiet"]
    return {
        "raw": [py, __file__, "--raw", str(db_root), str(pairs), str(out / "raw.jsonl")],
        "sirius score": [*score, "--output", str(out / "score.jsonl")],
        "sirius score --workers 0": [*score, "--output", str(out / "score0.jsonl"), "--workers", "0"],
        "sirius --help": [py, "-m", "sirius_train.cli", "--help"],
    }


def timed(argv: list[str]) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT, check=False)
    seconds = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{argv} failed ({done.returncode}):\n{done.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"seconds": seconds, "cpu_seconds": cpu}


def matches(path: Path) -> list[bool]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line)["match"] for line in f]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spider-root", type=Path, default=SPIDER, help=SPIDER_HELP)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        n = write_pairs(args.spider_root, out / "pairs.jsonl")
        plan = commands(args.spider_root / "databases", out / "pairs.jsonl", out)
        load = os.getloadavg()
        runs: dict[str, list[dict]] = {name: [] for name in plan}
        for round_ in range(args.rounds):
            for name, argv in plan.items():
                runs[name].append(timed(argv))
            print(f"round {round_ + 1}/{args.rounds}: "
                  + ", ".join(f"{k} {v[-1]['seconds']:.2f}s" for k, v in runs.items()), file=sys.stderr)
        load += os.getloadavg()
        truth = matches(out / "raw.jsonl")
        differ = {name: sum(a != b for a, b in zip(matches(out / file), truth))
                  for name, file in (("sirius score", "score.jsonl"), ("sirius score --workers 0", "score0.jsonl"))}
    print(report(runs, n, load, differ))


def report(runs: dict[str, list[dict]], n: int, load: tuple, differ: dict[str, int]) -> str:
    med = {k: statistics.median(r["seconds"] for r in rs) for k, rs in runs.items()}
    cpu = {k: statistics.median(r["cpu_seconds"] for r in rs) for k, rs in runs.items()}
    rounds = len(next(iter(runs.values())))
    lines = [f"{n} pairs, {rounds} rounds, {os.cpu_count()} CPUs, load average before/after "
             f"{load[0]:.1f}/{load[3]:.1f}", "",
             "| contender | median s | best s | CPU s | speed vs raw | CPU vs raw |", "|---|---:|---:|---:|---:|---:|"]
    for name, rs in runs.items():
        lines.append(f"| {name} | {med[name]:.3f} | {min(r['seconds'] for r in rs):.3f} | {cpu[name]:.3f} | "
                     f"{med['raw'] / med[name]:.2f}x | {cpu['raw'] / cpu[name]:.2f}x |")
    lines += ["", "pairs whose match differs from raw's: " + ", ".join(f"{k} {v}" for k, v in differ.items())]
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--raw"]:
        raw_main(*sys.argv[2:5])
    else:
        main()
