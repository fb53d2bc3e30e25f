"""Selector benchmark on the real candidate pools (18 text-to-SQL systems x 431 Spider dev questions).

    PYTHONPATH=. python benchmarks/bench_selector.py [--spider ../shared/data/spider] [--out FILE.md]

Side by side, in one run, overall and per database, in both `bird` and `spider` equivalence:
  1. majority voting over execution results (`selector.majority_vote`: executed candidates, rows or empty,
     grouped into result-equivalence classes; the biggest class wins; a tie goes to the class holding the
     earliest candidate in pool order; the winner is that class's earliest candidate);
  2. S_maj alone (admission rule + tuple-level consensus, no reranker);
  3. the LLM-free hybrid selector (library defaults; and with the structural reranker forced on);
  4. the oracle (some candidate is correct);
each on the pools as given and after the deterministic lifecycle (pre-filter, literal re-binding and
predicate relaxation -- no model call). Then leave-one-database-out cross-validation of the selector's
constants, a taxonomy of the questions majority voting misses, the structural operators on the real
empty-result candidates, and the pre-execution filter's verdicts. Answer classes are formed with the
same equivalence as the evaluation.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rewards.compare import results_match  # noqa: E402
from rewards.executor import Executor  # noqa: E402
from rewards.outcome import Status  # noqa: E402
from rewards.scoring import ScoreItem  # noqa: E402
from sirius_train.inference.candidates import given  # noqa: E402
from sirius_train.inference.lifecycle import Lifecycle, LifecycleConfig  # noqa: E402
from sirius_train.inference.pipeline import make_task  # noqa: E402
from sirius_train.inference.selector import Ballot, SelectorConfig, majority_vote, select  # noqa: E402

MODES = ("bird", "spider")
CV_PARTIAL = (0.0, 0.1, 0.25, 0.5, 1.0)
CV_MARGIN = (0.0, 0.03, 0.06, 0.1, 0.15, 0.2)


class Judge:
    """Correctness of (question, sql) by the reward's own scorer, computed once per distinct pair."""

    def __init__(self, executor: Executor, pools: list[dict]):
        self.executor, self.pools = executor, {p["id"]: p for p in pools}
        self.cache: dict[tuple, bool] = {}

    def add(self, pairs: set[tuple]) -> None:
        todo = [(qid, sql, mode) for qid, sql in pairs for mode in MODES if (qid, sql, mode) not in self.cache]
        items = [ScoreItem(self.pools[q]["db_id"], self.pools[q]["gold_sql"], sql, mode, id=(q, sql, mode))
                 for q, sql, mode in todo]
        for result in self.executor.score(items):
            self.cache[result.id] = result.match

    def __call__(self, qid, sql: str, mode: str) -> bool:
        return self.cache[(qid, sql, mode)]


def train_gold_check(spider: Path, executor: Executor) -> str:
    """The filter on Spider's train gold SQL (valid by construction): how many that run would it refuse?"""
    from data_synthesis.schema import read_schema
    from rewards.databases import resolve_db_path
    from sirius_train.inference.prefilter import prefilter

    pairs = []
    for line in (spider / "train_gold.sql").read_text().splitlines():
        sql, sep, db_id = line.rpartition("\t")
        if sep and (spider / "databases" / db_id / f"{db_id}.sqlite").is_file():
            pairs.append((db_id, sql))
    pairs = sorted(set(pairs))
    schemas = {db: read_schema(resolve_db_path(spider / "databases", db), n_samples=0) for db in {d for d, _ in pairs}}
    ran = [(db, sql) for (db, sql), o in zip(pairs, executor.execute_many(pairs)) if o.executed]
    refused = [(db, sql) for db, sql in ran if not prefilter(sql, schemas[db]).admitted]
    return (f"On Spider's train gold ({len(pairs)} distinct queries on {len(schemas)} databases, {len(ran)} of which "
            f"run): {len(refused)} refused by the filter.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spider", type=Path, default=ROOT.parent / "shared" / "data" / "spider")
    parser.add_argument("--out", type=Path, default=None, help="also write the markdown here")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    db_root = args.spider / "databases"
    pools = [json.loads(line) for line in (args.spider / "dev_candidate_pools.jsonl").open()]
    out: list[str] = []
    say = out.append

    with Executor(db_root, workers=args.workers) as executor:
        # ---------------------------------------------------------------- raw pools: execute every candidate
        t0 = time.perf_counter()
        distinct = sorted({(p["db_id"], c["sql"]) for p in pools for c in p["candidates"]})
        outcomes = dict(zip(distinct, executor.execute_many(distinct)))
        t_exec = time.perf_counter() - t0
        raw = {p["id"]: [Ballot(c["source"], c["sql"], outcomes[p["db_id"], c["sql"]].status,
                                outcomes[p["db_id"], c["sql"]].rows) for c in p["candidates"]] for p in pools}
        # ---------------------------------------------------------------- deterministic lifecycle
        t0 = time.perf_counter()
        tasks = {p["id"]: make_task(db_root, p["id"], p["db_id"], p["question"], given(p["candidates"])) for p in pools}
        lifecycle = Lifecycle(executor, config=LifecycleConfig())
        lifecycle.run(list(tasks.values()))
        t_life = time.perf_counter() - t0
        repaired = {qid: task.ballots() for qid, task in tasks.items()}
        judge = Judge(executor, pools)
        judge.add({(qid, b.sql) for pool in (raw, repaired) for qid, ballots in pool.items() for b in ballots if b.sql})

        say(f"# Selector benchmark: {len(pools)} questions x {len(pools[0]['candidates'])} systems (Spider dev pools)\n")
        say(f"Executed {len(distinct)} distinct candidate queries in {t_exec:.2f}s; deterministic lifecycle over "
            f"{sum(len(p['candidates']) for p in pools)} candidates in {t_life:.2f}s "
            f"({executor.workers} sandboxed workers).\n")
        methods = {
            "majority vote": lambda b, mode: majority_vote(b, mode),
            "S_maj alone": lambda b, mode: select(b, SelectorConfig(compare=mode, rerank="never")),
            "hybrid, LLM-free (defaults)": lambda b, mode: select(b, SelectorConfig(compare=mode)),
            "hybrid, reranker forced on": lambda b, mode: select(b, SelectorConfig(compare=mode, rerank="always")),
        }
        t0 = time.perf_counter()
        table = {}
        for pool_name, pool in (("as given", raw), ("after lifecycle", repaired)):
            for name, method in methods.items():
                for mode in MODES:
                    table[pool_name, name, mode] = {p["id"]: judge(p["id"], pool[p["id"]][method(pool[p["id"]], mode).index].sql, mode)
                                                    for p in pools}
            for mode in MODES:
                table[pool_name, "oracle", mode] = {p["id"]: any(judge(p["id"], b.sql, mode) for b in pool[p["id"]] if b.sql)
                                                    for p in pools}
        t_select = time.perf_counter() - t0
        dbs = sorted({p["db_id"] for p in pools})
        n_db = Counter(p["db_id"] for p in pools)

        def ex(result, db=None) -> float:
            ids = [p["id"] for p in pools if db is None or p["db_id"] == db]
            return 100 * sum(result[i] for i in ids) / len(ids)

        say("## EX overall (answer classes and evaluation in the same equivalence)\n")
        say("| pool | method | EX bird | vs majority | worst db | EX spider | vs majority | worst db |")
        say("|---|---|---:|---:|---:|---:|---:|---:|")
        for pool_name in ("as given", "after lifecycle"):
            for name in list(methods) + ["oracle"]:
                cells = []
                for mode in MODES:
                    base = table["as given", "majority vote", mode]
                    res = table[pool_name, name, mode]
                    worst = min(ex(res, d) - ex(base, d) for d in dbs)
                    cells += [f"{ex(res):.2f}", f"{ex(res) - ex(base):+.2f}", f"{worst:+.1f}"]
                say(f"| {pool_name} | {name} | " + " | ".join(cells) + " |")
        calls = len(methods) * 2 * len(MODES) * len(pools)
        say(f"\nSelection itself: {calls / t_select:.0f} selections/s ({calls} selections incl. scoring lookups, "
            f"{t_select:.1f}s).\n")

        say("## EX per database (pools as given)\n")
        say("| database | n | majority bird | hybrid bird | oracle bird | majority spider | hybrid spider | oracle spider |")
        say("|---|---:|---:|---:|---:|---:|---:|---:|")
        for db in dbs:
            cells = [f"{ex(table['as given', m, mode], db):.1f}" for mode in MODES
                     for m in ("majority vote", "hybrid, LLM-free (defaults)", "oracle")]
            say(f"| {db} | {n_db[db]} | " + " | ".join(cells) + " |")
        say("")

        # ---------------------------------------------------------------- leave-one-database-out CV
        say("## Leave-one-database-out cross-validation of the selector's constants\n")
        say(f"Grid: partial_weight in {list(CV_PARTIAL)}, margin in {list(CV_MARGIN)}, rerank in (never, always); "
            "for each held-out database the constants with the best EX on the other nine are applied to it "
            "(ties go to the simpler setting: smaller margin, then smaller weight).\n")
        grid = [SelectorConfig(partial_weight=w, margin=m, rerank=r) for r in ("never", "always")
                for w in CV_PARTIAL for m in CV_MARGIN if not (r == "never" and m != CV_MARGIN[0])]
        say("| mode | CV EX | majority EX | CV - majority | constants chosen (folds) |")
        say("|---|---:|---:|---:|---|")
        for mode in MODES:
            correct = {}
            for k, config in enumerate(grid):
                config = replace(config, compare=mode)
                correct[k] = {p["id"]: judge(p["id"], raw[p["id"]][select(raw[p["id"]], config).index].sql, mode) for p in pools}
            total, chosen = 0, Counter()
            for db in dbs:
                train = [p["id"] for p in pools if p["db_id"] != db]
                best = max(range(len(grid)), key=lambda k: (sum(correct[k][i] for i in train),
                                                            grid[k].rerank == "never", -grid[k].margin,
                                                            -grid[k].partial_weight))
                total += sum(correct[best][p["id"]] for p in pools if p["db_id"] == db)
                g = grid[best]
                chosen[f"w={g.partial_weight}, margin={g.margin}, rerank={g.rerank}"] += 1
            cv = 100 * total / len(pools)
            base = ex(table["as given", "majority vote", mode])
            say(f"| {mode} | {cv:.2f} | {base:.2f} | {cv - base:+.2f} | "
                + "; ".join(f"{k} ({v})" for k, v in chosen.most_common()) + " |")
        say("")

        # ---------------------------------------------------------------- what majority voting misses
        say("## Where majority voting is wrong but a correct candidate exists (bird)\n")
        kinds = Counter()
        for p in pools:
            qid = p["id"]
            if table["as given", "majority vote", "bird"][qid] or not table["as given", "oracle", "bird"][qid]:
                continue
            ballots = raw[qid]
            mv = majority_vote(ballots, "bird")
            winner = mv.classes[0]
            right = [c for c in mv.classes if judge(qid, ballots[c.members[0]].sql, "bird")]
            if ballots[winner.members[0]].status == Status.EMPTY:
                kinds["an empty result holds the plurality"] += 1
            elif right and any(results_match(ballots[winner.members[0]].rows, ballots[c.members[0]].rows, "spider")
                               for c in right):
                kinds["winner differs from a correct class only in column order"] += 1
            elif right and len(right[0].members) >= len(winner.members) - 1:
                kinds["near tie (correct class within one vote)"] += 1
            else:
                kinds["correct class outvoted by 2+ votes"] += 1
        say("| case | questions |")
        say("|---|---:|")
        for kind, n in kinds.most_common():
            say(f"| {kind} | {n} |")
        say("")

        # ---------------------------------------------------------------- structural operators on real empties
        say("## Structural operators on the real empty-result candidates (no model call)\n")
        gold_runs = dict(zip([p["id"] for p in pools],
                             executor.execute_many([(p["db_id"], p["gold_sql"]) for p in pools])))
        empties, ops = 0, Counter()
        for p in pools:
            task = tasks[p["id"]]
            for cand in task.candidates:
                first = next((e for e in cand.events if e["step"] == "execute"), None)
                if first is None or first["status"] != "empty":
                    continue
                empties += 1
                gold_is_empty = gold_runs[p["id"]].status is Status.EMPTY
                ops["gold empty too (the empty answer was right)" if gold_is_empty else "wrong empty"] += 1
                fixed = [e for e in cand.events if e["step"] == "repair" and e.get("kind") == "empty" and e["readmitted"]]
                if fixed:
                    ops[f"made non-empty by {fixed[0]['operator']}"] += 1
                    ops["made non-empty"] += 1
                    ops["of which the gold was empty (harm)"] += gold_is_empty
                    for mode in MODES:
                        ops[f"became correct ({mode})"] += judge(p["id"], cand.sql, mode)
        say(f"{empties} candidates returned no rows.\n")
        say("| outcome | candidates |")
        say("|---|---:|")
        for key in ("wrong empty", "gold empty too (the empty answer was right)", "made non-empty",
                    "made non-empty by rebind_literal", "made non-empty by relax_case",
                    "made non-empty by relax_containment", "became correct (bird)", "became correct (spider)",
                    "of which the gold was empty (harm)"):
            say(f"| {key} | {ops[key]} |")
        say("")
        rebound = Counter()
        for p in pools:
            for cand in tasks[p["id"]].candidates:
                ev = [e for e in cand.events if e["step"] == "repair" and e.get("kind") == "ungrounded_literal"
                      and e["readmitted"]]
                if ev:
                    before = next(e["sql"] for e in cand.events if e["step"] == "execute")
                    for mode in MODES:
                        rebound[(mode, judge(p["id"], before, mode), judge(p["id"], cand.sql, mode))] += 1
        say("Literal re-binding on candidates that returned rows with a literal absent from its column:")
        for mode in MODES:
            say(f"- {mode}: {rebound[(mode, False, True)]} wrong -> correct, {rebound[(mode, True, False)]} "
                f"correct -> wrong, {rebound[(mode, True, True)] + rebound[(mode, False, False)]} unchanged")
        say("")
        say("## Pre-execution filter on the same candidates\n")
        say("`" + lifecycle.summary() + "`\n")
        refused_but_ran = sum(1 for p in pools for cand, entry in zip(tasks[p["id"]].candidates, p["candidates"])
                              if (cand.dropped or "").startswith("filtered")
                              and outcomes[p["db_id"], entry["sql"]].executed)
        say(f"Candidates refused by the filter that SQLite would have run: {refused_but_ran}.")
        say(train_gold_check(args.spider, executor))
    text = "\n".join(out) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
