"""Variant databases (rewards.variants) on the real pools: what they catch, and what they cost.

    python benchmarks/bench_variants.py pools --k 3 10           # per system: EX, EX on variants, share caught
    python benchmarks/bench_variants.py pools --sample 30        # + 30 caught candidates, seeded, to read by hand
    python benchmarks/bench_variants.py cost                      # build time per database, reward K=3 vs K=0

`pools`: every candidate of both open pools (18 systems x 431 Spider dev questions each) is scored with
Spider's equivalence on the shipped database (EX) and, when right there, on the shipped database plus K
variants (the reward with `reward.variants: K`). "Caught" is the share of EX-correct candidates that are
wrong on some variant. Variants are built fresh in a temporary cache (seed 0, the default). `TS-sem` scores
every candidate as the official test-suite evaluator would on a folder holding the shipped database and the
largest K's variants (DISTINCT removed, no tie rule): our variants under the published metric's semantics;
`EX-sem` the same evaluator on the shipped database alone (the published EX).

`cost`: (1) building K = 3 variants of each of the 10 Spider dev databases from scratch, timed per database;
(2) the reward's throughput on the same pairs (all 15,516 pool pairs) with K = 3 and K = 0: one in-process
`Scorer` per round (cold connection and gold caches, variants already on disk), the two settings taking turns
round by round, medians compared. Run it with no other heavy job on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from _baselines import SPIDER, SPIDER_HELP

from rewards.scoring import ScoreItem, Scorer
from rewards.suites import Suite
from rewards.variants import VariantCache
from sirius_train.evaluation.official_eval import ts_matches

POOLS = ("dev_candidate_pools.jsonl", "dev_candidate_pools_b.jsonl")
DEV_DBS = ("concert_singer", "course_teach", "cre_Doc_Template_Mgt", "dog_kennels", "museum_visit", "network_1",
           "pets_1", "poker_player", "real_estate_properties", "singer")


def pool_items(spider_root: Path) -> list[tuple[str, dict, dict]]:
    """(pool, question, candidate) for every candidate of both pools."""
    out = []
    for pool in POOLS:
        for line in (spider_root / pool).read_text().splitlines():
            question = json.loads(line)
            out += [(pool, question, c) for c in question["candidates"]]
    return out


def pools(spider_root: Path, ks: list[int], sample: int, seed: int) -> dict:
    db_root = spider_root / "databases"
    items = pool_items(spider_root)
    plain = Scorer(db_root)
    with tempfile.TemporaryDirectory() as cache:
        scorers = {k: Scorer(db_root, suite=Suite(variants=k, cache_dir=cache)) for k in ks}
        counts: dict = defaultdict(lambda: {"n": 0, "ex": 0, **{f"ex_v{k}": 0 for k in ks}, "ex_sem": 0, "ts_sem": 0})
        caught = []
        for pool, q, c in items:
            row = counts[(pool, c["source"])]
            row["n"] += 1
            args = (q["db_id"], q["gold_sql"], c["sql"], "spider")
            if not plain.score(ScoreItem(*args)).match:
                continue
            row["ex"] += 1
            for k in ks:
                if scorers[k].score(ScoreItem(*args)).match:
                    row[f"ex_v{k}"] += 1
                elif k == ks[0]:
                    caught.append({"pool": pool, "id": q["id"], "db_id": q["db_id"], "question": q["question"],
                                   "gold": q["gold_sql"], "source": c["source"], "sql": c["sql"]})
        ts_sem = _official_semantics(db_root, Path(cache), items, max(ks))
    ex_sem = ts_matches(db_root, [(q["db_id"], q["gold_sql"], c["sql"]) for _, q, c in items], workers=0)
    for (pool, _, c), ex_match, ts_match in zip(items, ex_sem, ts_sem):
        counts[(pool, c["source"])]["ex_sem"] += ex_match
        counts[(pool, c["source"])]["ts_sem"] += ts_match
    distinct = {}
    for case in caught:
        distinct.setdefault((case["id"], " ".join(case["sql"].lower().split())), case)
    keys = sorted(distinct)
    random.Random(seed).shuffle(keys)
    return {"ks": ks, "systems": {f"{pool}:{source}": row for (pool, source), row in counts.items()},
            "caught": len(caught), "caught_distinct": len(distinct),
            "sample": [distinct[k] for k in keys[:sample]]}


def _official_semantics(db_root: Path, cache: Path, items: list, k: int) -> list[bool]:
    """TS as the official evaluator computes it, on a folder of the shipped databases and their first k variants."""
    folder = cache / "ts_folder"
    for db_id in sorted({q["db_id"] for _, q, _ in items}):
        original = db_root / db_id / f"{db_id}.sqlite"
        (folder / db_id).mkdir(parents=True, exist_ok=True)
        (folder / db_id / original.name).symlink_to(original)
        for path in VariantCache(cache).paths(original, k):
            (folder / db_id / path.name).symlink_to(path)
    return ts_matches(folder, [(q["db_id"], q["gold_sql"], c["sql"]) for _, q, c in items], workers=0)


def pools_markdown(result: dict) -> str:
    ks = result["ks"]
    lines = ["| pool | system | n | EX | " + " | ".join(f"EX+V{k}" for k in ks) + " | " +
             " | ".join(f"caught (K={k})" for k in ks) + f" | EX-sem | TS-sem V{max(ks)} |",
             "|---|---|---:|---:|" + "---:|" * (2 * len(ks) + 2)]
    totals: dict = defaultdict(lambda: defaultdict(int))
    for name, row in sorted(result["systems"].items()):
        pool, source = name.split(":", 1)
        for key, value in row.items():
            totals[pool][key] += value
        lines.append(_row(_label(pool), source, row, ks))
    for pool, row in totals.items():
        lines.append(_row(f"**{_label(pool)}**", "**all**", row, ks))
    return "\n".join(lines)


def _label(pool: str) -> str:
    return "A" if pool == POOLS[0] else "B"


def _row(pool: str, source: str, row: dict, ks: list[int]) -> str:
    n, ex = row["n"], row["ex"]
    return (f"| {pool} | {source} | {n} | {100 * ex / n:.1f} | " +
            " | ".join(f"{100 * row[f'ex_v{k}'] / n:.1f}" for k in ks) + " | " +
            " | ".join(f"{100 * (ex - row[f'ex_v{k}']) / max(ex, 1):.1f}%" for k in ks) +
            f" | {100 * row['ex_sem'] / n:.1f} | {100 * row['ts_sem'] / n:.1f} |")


def cost(spider_root: Path, rounds: int, k: int) -> dict:
    db_root = spider_root / "databases"
    build = {}
    with tempfile.TemporaryDirectory() as fresh:
        for db_id in DEV_DBS:
            t0 = time.perf_counter()
            VariantCache(fresh).paths(db_root / db_id / f"{db_id}.sqlite", k)
            build[db_id] = time.perf_counter() - t0
    items = [ScoreItem(q["db_id"], q["gold_sql"], c["sql"], "spider") for _, q, c in pool_items(spider_root)]
    runs: dict = {0: [], k: []}
    with tempfile.TemporaryDirectory() as cache:
        Scorer(db_root, suite=Suite(variants=k, cache_dir=cache)).suite_paths("concert_singer")  # warm-up import
        for db_id in DEV_DBS:  # built before timing: the reward builds once, then reads from the cache
            VariantCache(cache).paths(db_root / db_id / f"{db_id}.sqlite", k)
        for _ in range(rounds):
            for setting in (0, k):
                scorer = Scorer(db_root, suite=Suite(variants=setting, cache_dir=cache))
                t0 = time.perf_counter()
                matches = sum(scorer.score(it).match for it in items)
                runs[setting].append({"seconds": time.perf_counter() - t0, "matches": matches})
                scorer.close()
    med = {s: statistics.median(r["seconds"] for r in rs) for s, rs in runs.items()}
    return {"k": k, "build_s": build, "pairs": len(items), "rounds": rounds, "runs": runs, "median_s": med,
            "pairs_per_s": {s: len(items) / m for s, m in med.items()}, "ratio": med[0] / med[k],
            "load": os.getloadavg()}


def cost_markdown(result: dict) -> str:
    k, build = result["k"], result["build_s"]
    lines = [f"Building K = {k} variants per database (fresh cache): " + ", ".join(
        f"{db} {1000 * s:.0f} ms" for db, s in build.items()) + f"; median {1000 * statistics.median(build.values()):.0f} ms, "
        f"max {1000 * max(build.values()):.0f} ms.", "",
        f"| reward | median s ({result['rounds']} rounds) | pairs/s | matches |", "|---|---:|---:|---:|"]
    for setting, runs in result["runs"].items():
        lines.append(f"| K = {setting} | {result['median_s'][setting]:.3f} | {result['pairs_per_s'][setting]:,.0f} | "
                     f"{runs[0]['matches']} |")
    lines += ["", f"Throughput with K = {k} is **{result['ratio']:.2f}x** that with K = 0 on the same "
              f"{result['pairs']:,} pairs (load average {', '.join(f'{x:.1f}' for x in result['load'])} at the end)."]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("pools", "cost"))
    parser.add_argument("--spider-root", type=Path, default=SPIDER, help=SPIDER_HELP)
    parser.add_argument("--k", type=int, nargs="+", default=[3])
    parser.add_argument("--sample", type=int, default=0, help="caught candidates to print (distinct question + SQL)")
    parser.add_argument("--seed", type=int, default=30, help="of the sample")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args()
    if args.what == "pools":
        result = pools(args.spider_root, args.k, args.sample, args.seed)
        print(pools_markdown(result))
        print(f"\n{result['caught']} caught candidates ({result['caught_distinct']} distinct question + SQL) at "
              f"K = {args.k[0]}")
        for i, case in enumerate(result["sample"], 1):
            print(f"\n[{i}] #{case['id']} {case['db_id']} ({case['source']}) | {case['question']}\n"
                  f"    gold: {case['gold']}\n    cand: {' '.join(case['sql'].split())}")
    else:
        result = cost(args.spider_root, args.rounds, args.k[0])
        print(cost_markdown(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
