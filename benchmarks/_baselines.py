"""What the executor and the reward server are measured against, and the real pairs they are measured on.

- `raw_sqlite_score`: the limit of scoring in one process -- plain `sqlite3`, no sandbox, no timeout,
  no caps; one connection per database and each distinct gold query run once (the same caching the
  executor does), then `set(pred) == set(gold)`. With `dedup=True` it also skips a pair identical to
  one already scored (db, gold, prediction), as the executor does within a batch. With `locked=True`
  its connections keep their shared lock between queries (`PRAGMA locking_mode = EXCLUSIVE`), the
  one SQLite setting of the sandbox that makes queries cheaper.
- `bird_way_score`: the BIRD evaluator's scheme (`evaluation.py` of the BIRD benchmark), rewritten
  here from its description: a `multiprocessing.Pool` of `num_cpus` processes, one `apply_async` per
  pair, each call wrapped in `func_timeout(meta_time_out, ...)`, which opens a fresh connection,
  executes the prediction and then the gold query (gold re-run every time), fetches all rows of both,
  and compares `set(pred) == set(gold)`; any exception or timeout counts as 0; results are sorted
  back by index. The one deliberate change: files are opened `mode=ro` (BIRD opens them read-write),
  so a benchmark can never modify the shared Spider data.

Both report 1/0 per pair, so they can be checked against the executor's `match` pair by pair.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import sqlite3
import sys
from pathlib import Path

from rewards.scoring import ScoreItem

# Spider in the layout docs/BENCHMARKS.md describes ("Spider data"): SIRIUS_SPIDER_ROOT (as for the tests), else the
# shared copy beside the clone; every benchmark that reads it also takes --spider-root PATH
SPIDER = Path(os.environ.get("SIRIUS_SPIDER_ROOT") or Path(__file__).resolve().parents[2] / "shared" / "data" / "spider")
SPIDER_HELP = ("Spider in the layout of docs/BENCHMARKS.md, 'Spider data' (default: $SIRIUS_SPIDER_ROOT, else "
               "../shared/data/spider)")


def load_pool_pairs(spider_root: Path = SPIDER) -> list[ScoreItem]:
    """Every (candidate, gold) pair of the real pools: 431 Spider dev questions x 18 systems = 7,758."""
    pools = spider_root / "dev_candidate_pools.jsonl"
    if not pools.is_file():
        sys.exit(f"Spider pools not found at {pools}: pass --spider-root PATH (or set SIRIUS_SPIDER_ROOT); the "
                 "layout: docs/BENCHMARKS.md, 'Spider data'")
    items = []
    with pools.open() as f:
        for line in f:
            row = json.loads(line)
            for candidate in row["candidates"]:
                items.append(ScoreItem(row["db_id"], row["gold_sql"], candidate["sql"], "bird", id=len(items)))
    return items


def db_path(db_root: Path, db_id: str) -> Path:
    return Path(db_root) / db_id / f"{db_id}.sqlite"


def _connect_ro(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True)


def warm_page_cache(db_root: Path, items: list[ScoreItem]) -> None:
    """Read every database file once, so that no contender pays for the first read from disk."""
    for db_id in sorted({it.db_id for it in items}):
        db_path(db_root, db_id).read_bytes()


# ---------------------------------------------------------------------------------------- the raw limit
def raw_sqlite_score(db_root: Path, items: list[ScoreItem], dedup: bool = False, locked: bool = False) -> list[int]:
    connections: dict[str, sqlite3.Connection] = {}
    gold_rows: dict[tuple[str, str], set | None] = {}
    seen: dict[tuple, int] = {}

    def run(db_id: str, sql: str) -> set | None:
        conn = connections.get(db_id)
        if conn is None:
            conn = connections[db_id] = _connect_ro(db_path(db_root, db_id))
            if locked:
                conn.execute("PRAGMA locking_mode = EXCLUSIVE")
        try:
            return set(conn.execute(sql).fetchall())
        except Exception:
            return None

    out = []
    for it in items:
        pair = (it.db_id, it.gold_sql, it.pred_sql)
        if dedup and pair in seen:
            out.append(seen[pair])
            continue
        key = (it.db_id, it.gold_sql)
        if key not in gold_rows:
            gold_rows[key] = run(it.db_id, it.gold_sql)
        pred, gold = run(it.db_id, it.pred_sql), gold_rows[key]
        out.append(int(pred is not None and gold is not None and pred == gold))
        seen[pair] = out[-1]
    for conn in connections.values():
        conn.close()
    return out


# ---------------------------------------------------------------------------------------- the BIRD way
def _bird_execute_sql(predicted_sql: str, ground_truth: str, path: str) -> int:
    conn = _connect_ro(Path(path))
    cursor = conn.cursor()
    cursor.execute(predicted_sql)
    predicted_res = cursor.fetchall()
    cursor.execute(ground_truth)
    ground_truth_res = cursor.fetchall()
    return 1 if set(predicted_res) == set(ground_truth_res) else 0


def _bird_execute_model(predicted_sql: str, ground_truth: str, path: str, idx: int, meta_time_out: float) -> dict:
    from func_timeout import FunctionTimedOut, func_timeout

    try:
        res = func_timeout(meta_time_out, _bird_execute_sql, args=(predicted_sql, ground_truth, path))
    except FunctionTimedOut:
        res = 0
    except Exception:
        res = 0
    return {"sql_idx": idx, "res": res}


def bird_way_score(db_root: Path, items: list[ScoreItem], num_cpus: int = 2, meta_time_out: float = 30.0) -> list[int]:
    results: list[dict] = []
    pool = mp.Pool(processes=num_cpus)
    for i, it in enumerate(items):
        pool.apply_async(_bird_execute_model, args=(it.pred_sql, it.gold_sql, str(db_path(db_root, it.db_id)), i,
                                                    meta_time_out), callback=results.append)
    pool.close()
    pool.join()
    return [r["res"] for r in sorted(results, key=lambda r: r["sql_idx"])]


# ---------------------------------------------------------------------------------------- isolated runs
def _raw_two_processes(db_root: Path, items: list[ScoreItem]) -> list[int]:
    """The raw limit with both cores: the pairs cut in two halves at a question boundary, one process each."""
    cut = len(items) // 2
    while 0 < cut < len(items) and items[cut].gold_sql == items[cut - 1].gold_sql:
        cut += 1
    with mp.Pool(2) as pool:
        first, second = pool.starmap(raw_sqlite_score, [(db_root, items[:cut]), (db_root, items[cut:])])
    return first + second


def cpu_seconds(live_pids=()) -> float:
    """CPU time (user + system) of this process, its reaped children and the live processes named."""
    import resource

    import psutil

    usage = [resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)]
    total = sum(u.ru_utime + u.ru_stime for u in usage)
    return total + sum(sum(psutil.Process(pid).cpu_times()[:2]) for pid in live_pids)


def drive_batches(score, items: list[ScoreItem], batch_size: int, concurrency: int) -> dict:
    """`concurrency` client threads, each scoring the next `batch_size` slice until none is left (like rollout
    workers sharing one scorer): wall seconds, per-batch latencies, and the results in order."""
    import itertools
    import threading
    import time

    batches = [items[i:i + batch_size] for i in range(0, len(items), batch_size)]
    results: list = [None] * len(batches)
    latencies: list[float] = []
    turns = itertools.count()

    def client():
        while (k := next(turns)) < len(batches):
            t = time.perf_counter()
            results[k] = score(batches[k])
            latencies.append(time.perf_counter() - t)

    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    t0 = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {"seconds": time.perf_counter() - t0, "latencies": latencies,
            "results": [r for part in results for r in part]}


def run_contender(name: str, db_root: Path, items: list[ScoreItem], workers: int = 2, batch_size: int = 256,
                  concurrency: int = 4) -> dict:
    """Time one contender on `items` in *this* process (call it in a fresh one): wall and CPU seconds, 1/0 per pair.

    Batched contenders (`executor-batches`, `server`) make two passes, cold (fresh workers) then warm."""
    import time

    import psutil

    from rewards.client import RewardClient
    from rewards.executor import Executor
    from rewards.launch import spawn
    from rewards.service import ServerConfig

    warm_page_cache(db_root, items)
    t0, c0 = time.perf_counter(), cpu_seconds()
    if name in ("raw", "raw-dedup", "raw-locked"):
        match = raw_sqlite_score(db_root, items, dedup=name == "raw-dedup", locked=name == "raw-locked")
    elif name == "raw-2proc":
        match = _raw_two_processes(db_root, items)
    elif name == "bird":
        match = bird_way_score(db_root, items, num_cpus=workers)
    elif name == "scorer":
        with Executor(db_root, workers=0) as executor:
            match = [int(r.match) for r in executor.score(items)]
    elif name == "executor":
        with Executor(db_root, workers=workers) as executor:
            pids = [w.proc.pid for w in executor._workers]
            started, c1 = time.perf_counter(), cpu_seconds(pids)
            match = [int(r.match) for r in executor.score(items)]
            cold, c2 = time.perf_counter(), cpu_seconds(pids)
            executor.score(items)
            warm = time.perf_counter()
        return {"seconds": cold - started, "cpu_seconds": c2 - c1, "warm_seconds": warm - cold,
                "startup_seconds": started - t0, "match": match}
    elif name in ("executor-batches", "server"):
        if name == "server":
            server = spawn(ServerConfig(db_root, workers=workers, max_queue_items=max(16_384, len(items))))
            client = RewardClient(server.url, batch_size=batch_size)
            score, pids = client.score, [server.proc.pid]
            pids += [p.pid for p in psutil.Process(server.proc.pid).children(recursive=True)]
        else:
            executor = Executor(db_root, workers=workers)
            score, pids = executor.score, [w.proc.pid for w in executor._workers]
        try:
            c1 = cpu_seconds(pids)
            cold = drive_batches(score, items, batch_size, concurrency)
            c2 = cpu_seconds(pids)
            warm = drive_batches(score, items, batch_size, concurrency)
        finally:
            (client.close(), server.stop()) if name == "server" else executor.close()
        return {"seconds": cold["seconds"], "cpu_seconds": c2 - c1, "latencies": cold["latencies"],
                "warm_seconds": warm["seconds"], "warm_latencies": warm["latencies"],
                "timeouts": sum(r.pred_status == "timeout" or r.gold_status == "timeout" for r in cold["results"]),
                "match": [int(r.match) for r in cold["results"]]}
    else:
        raise ValueError(f"unknown contender {name!r}")
    return {"seconds": time.perf_counter() - t0, "cpu_seconds": cpu_seconds() - c0, "match": match}


def isolated(name: str, spider_root: Path, workers: int = 2, batch_size: int = 256, concurrency: int = 4) -> dict:
    """`run_contender` in a fresh Python process: cold caches, nothing left over from another contender."""
    import os
    import subprocess

    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1]) + os.pathsep + env.get("PYTHONPATH", "")
    argv = [sys.executable, __file__, name, str(spider_root), str(workers), str(batch_size), str(concurrency)]
    out = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"contender {name} failed:\n{out.stderr}")
    return json.loads(out.stdout)


def run_rounds(plan: dict[str, dict], spider_root: Path, rounds: int) -> dict[str, list[dict]]:
    """Every contender of `plan` (label -> `isolated` keyword arguments) once per round, taking turns,
    so that a busy neighbour slows all of them alike; progress on stderr."""
    runs: dict[str, list[dict]] = {label: [] for label in plan}
    for round_ in range(rounds):
        for label, kwargs in plan.items():
            runs[label].append(isolated(spider_root=spider_root, **kwargs))
        print(f"round {round_ + 1}/{rounds}: " + ", ".join(f"{k} {v[-1]['seconds']:.3f}s" for k, v in runs.items()),
              file=sys.stderr)
    return runs


def disagreements(runs: dict[str, list[dict]], reference: str) -> str:
    """How many pairs, over all runs, each contender scored differently from the reference's first run."""
    truth = runs[reference][0]["match"]
    counts = {k: sum(sum(a != b for a, b in zip(r["match"], truth)) for r in rs) for k, rs in runs.items()}
    return f"pairs whose 1/0 differs from {reference}'s: " + ", ".join(f"{k} {v}" for k, v in counts.items())


def medians(runs: dict[str, list[dict]], field: str = "seconds") -> dict[str, float]:
    import statistics

    return {k: statistics.median(r[field] for r in rs) for k, rs in runs.items()}


def setup_line(runs: dict[str, list[dict]], n: int, workers: int, load: tuple, extra: str = "") -> str:
    """What the run was: pairs, rounds, workers, CPUs, and how busy the machine was before/after."""
    import os

    rounds = len(next(iter(runs.values())))
    return (f"{n} pairs, {rounds} rounds, {workers} workers{extra}, {os.cpu_count()} CPUs, "
            f"load average before/after {load[0]:.1f}/{load[3]:.1f}")


def save_runs(path: Path | None, runs: dict[str, list[dict]]) -> None:
    if path is not None:
        path.write_text(json.dumps({k: [{f: v for f, v in r.items() if f != "match"} for r in rs]
                                    for k, rs in runs.items()}, indent=1))


if __name__ == "__main__":
    name, root, *numbers = sys.argv[1:]
    print(json.dumps(run_contender(name, Path(root) / "databases", load_pool_pairs(Path(root)), *map(int, numbers))))
