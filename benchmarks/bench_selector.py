"""Selector benchmark on the real candidate pools (18 text-to-SQL systems x 431 Spider dev questions).

    PYTHONPATH=. python benchmarks/bench_selector.py [--spider ../shared/data/spider] [--out FILE.md]

Side by side, in one run, overall and per database, in both `bird` and `spider` equivalence:
  1. majority voting over execution results (`selector.majority_vote`: executed candidates, rows or empty,
     grouped into result-equivalence classes; the biggest class wins; a tie goes to the class holding the
     earliest candidate in pool order; the winner is that class's earliest candidate);
  2. S_maj alone (the admission rules + tuple-level consensus, no reranker);
  3. the LLM-free hybrid selector: library defaults; the same without the grounding rule (the previous
     default); with the structural reranker forced on;
  4. alternatives evaluated and *not* shipped: votes weighted by source reliability estimated without
     labels (one-coin Dawid-Skene), votes weighted by model family (a naming rule), and a fan-out repair
     (a join used only as an existence test rewritten as a semi-join);
  5. the oracle (some candidate is correct);
each on the pools as given (filtered, executed and grounded, nothing repaired) and after the
deterministic lifecycle (literal re-binding and predicate relaxation too -- no model call). Then
leave-one-database-out cross-validation of every constant, what the hybrid still misses and why, the
evidence for the grounding rule (its flag on these pools and on Spider's train gold), the structural
operators on the real empty-result candidates, and the pre-execution filter's verdicts. Answer classes
are formed with the same equivalence as the evaluation.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from collections import Counter, defaultdict
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sqlglot import exp  # noqa: E402

from rewards.compare import results_match  # noqa: E402
from rewards.executor import Executor  # noqa: E402
from rewards.outcome import Status  # noqa: E402
from rewards.scoring import ScoreItem  # noqa: E402
from sirius_train.inference.candidates import given  # noqa: E402
from sirius_train.inference.lifecycle import ColumnValues, Lifecycle, LifecycleConfig  # noqa: E402
from sirius_train.inference.operators import literal_uses  # noqa: E402
from sirius_train.inference.pipeline import make_task  # noqa: E402
from sirius_train.inference.resolve import Resolution, resolve_columns  # noqa: E402
from sirius_train.inference.selector import (Ballot, SelectorConfig, admitted, majority_vote,  # noqa: E402
                                             result_classes, select)
from sirius_train.inference.sql import SqlParseError, parse_sql, to_sql  # noqa: E402

MODES = ("bird", "spider")
CV_PARTIAL = (0.0, 0.1, 0.25, 0.5, 1.0)
CV_MARGIN = (0.0, 0.03, 0.06, 0.1, 0.15, 0.2)
DS_PRIOR = (2.0, 1.0)  # Beta pseudo-votes (right, wrong) per source: a weak prior at 2/3 reliability
DS_ITERATIONS = 30


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

    def __call__(self, qid, sql: str | None, mode: str) -> bool:
        return bool(sql) and self.cache[(qid, sql, mode)]


# ------------------------------------------------------------------------------------------ alternatives
def weighted_vote(ballots: list[Ballot], mode: str, weights: dict[str, float]) -> int | None:
    """S_maj with each vote weighted by its source (same admission and classes as the selector)."""
    voters = admitted(ballots)
    if not voters:
        return majority_vote(ballots, mode).index
    classes = result_classes(ballots, voters, mode)
    mass = lambda c: round(sum(weights.get(ballots[i].source, 1.0) for i in c.members), 9)
    return max(classes, key=lambda c: (mass(c), -c.members[0])).members[0]


def votes_by_class(ballots: list[Ballot], mode: str) -> list[list[str]]:
    """The sources behind each admitted result class of one question (no labels involved)."""
    voters = admitted(ballots)
    return [[ballots[i].source for i in c.members] for c in result_classes(ballots, voters, mode)] if voters else []


def reliability(questions: list[list[list[str]]], prior=DS_PRIOR, iterations=DS_ITERATIONS) -> dict[str, float]:
    """One-coin Dawid-Skene (1979) by EM, without labels: source s names the true class with probability
    p_s, otherwise one of the other K-1 classes at random; returns p_s under a Beta prior."""
    sources = {s for q in questions for c in q for s in c}
    p = {s: prior[0] / (prior[0] + prior[1]) for s in sources}
    for _ in range(iterations):
        right, seen = Counter(), Counter()
        for classes in questions:
            k = max(len(classes), 2)
            log_like = [sum(math.log(p[s]) if d is c else math.log((1 - p[s]) / (k - 1)) for d in classes for s in d)
                        for c in classes]
            top = max(log_like)
            z = sum(math.exp(v - top) for v in log_like)
            for c, v in zip(classes, log_like):
                for s in c:
                    right[s] += math.exp(v - top) / z
                    seen[s] += 1
        p = {s: (right[s] + prior[0]) / (seen[s] + prior[0] + prior[1]) for s in sources}
    return p


def log_odds(p: dict[str, float]) -> dict[str, float]:
    """The one-coin model's optimal vote weights (clipped: a worse-than-chance source gets ~no say)."""
    return {s: max(math.log(v / (1 - v)), 1e-3) for s, v in p.items()}


def family(source: str) -> str:
    """Model family by a naming rule: drop 'SFT' and size tokens, keep the first word
    (SFT_CodeS_1B/7B/15B -> codes, DAILSQL(_SC) -> dailsql, (SFT_)Llama3(-)8B -> llama3)."""
    tokens = [t for t in re.split(r"[_\-\s]+", source.lower()) if t and t != "sft" and not re.fullmatch(r"\d+(\.\d+)?b", t)]
    return tokens[0] if tokens else source


def semijoin(sql: str, schema) -> str | None:
    """`SELECT avg(a.x) FROM a JOIN b ON a.k = b.k` (b used nowhere else) -> `... FROM a WHERE a.k IN
    (SELECT k FROM b)`: the fan-out repair. Two tables, AVG/SUM only, no subquery; None if it does not apply."""
    try:
        tree = parse_sql(sql)
    except SqlParseError:
        return None
    joins, source = tree.args.get("joins") or [], tree.args.get("from") or tree.args.get("from_")
    if not isinstance(tree, exp.Select) or source is None or len(joins) != 1 or any(
            joins[0].args.get(k) for k in ("kind", "side", "using")):
        return None
    left, right, on = source.this, joins[0].this, joins[0].args.get("on")
    aggregates = list(tree.find_all(exp.AggFunc))
    if (not (isinstance(left, exp.Table) and isinstance(right, exp.Table)) or not isinstance(on, exp.EQ)
            or not all(isinstance(side, exp.Column) for side in (on.this, on.expression))
            or not any(isinstance(a, (exp.Avg, exp.Sum)) for a in aggregates)
            or any(isinstance(a, exp.Count) for a in aggregates)
            or any(s is not tree for s in tree.find_all(exp.Select))):
        return None
    refs = {id(r.node): r for r in resolve_columns(tree, schema)}
    names = {t.alias_or_name.lower(): t for t in (left, right)}

    def table_of(column: exp.Column) -> str | None:
        if column.table:
            return column.table.lower()
        ref = refs.get(id(column))
        if ref is None or ref.resolution is not Resolution.TABLE or len(ref.tables) != 1:
            return None
        return next((n for n, t in names.items() if t.name.lower() == ref.tables[0].lower()), None)

    in_on = {id(c) for c in on.find_all(exp.Column)}
    used = {table_of(c) for c in tree.find_all(exp.Column) if id(c) not in in_on}
    if None in used:
        return None
    for keep, drop in ((left, right), (right, left)):
        if drop.alias_or_name.lower() in used or keep.alias_or_name.lower() not in used:
            continue
        mine, theirs = (on.this, on.expression) if table_of(on.this) == keep.alias_or_name.lower() else (on.expression, on.this)
        if table_of(theirs) != drop.alias_or_name.lower():
            return None
        probe = exp.In(this=mine.copy(), query=exp.Subquery(
            this=exp.select(exp.column(theirs.name)).from_(exp.Table(this=exp.to_identifier(drop.name)))))
        new = tree.copy()
        new.set("joins", None)
        new.set("from" if "from" in new.args else "from_", exp.From(this=keep.copy()))
        where = new.args.get("where")
        new.set("where", exp.Where(this=exp.and_(where.this, probe) if where else probe))
        return to_sql(new)
    return None


def fanout_repaired(pool: dict, tasks: dict, executor: Executor) -> dict:
    """Each pool with every fan-out candidate replaced by its semi-join rewrite when that changes the result."""
    trials = [(qid, k, rewrite) for qid, ballots in pool.items() for k, b in enumerate(ballots)
              if b.status == Status.OK and (rewrite := semijoin(b.sql, tasks[qid].schema))]
    outcomes = executor.execute_many([(tasks[qid].question.db_id, sql) for qid, _, sql in trials])
    out = {qid: list(ballots) for qid, ballots in pool.items()}
    for (qid, k, sql), outcome in zip(trials, outcomes):
        before = out[qid][k]
        if outcome.status == Status.OK and not results_match(outcome.rows, before.rows, "spider"):
            out[qid][k] = replace(before, sql=sql, rows=outcome.rows)
    return out


# ------------------------------------------------------------------------------------------ Spider train gold
def train_gold_check(spider: Path, executor: Executor) -> list[str]:
    """Spider's train gold SQL (correct by construction): would the filter refuse it, the grounding rule
    flag it, the fan-out repair change it?"""
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
    outcomes = executor.execute_many(pairs)
    ran = [(db, sql, o) for (db, sql), o in zip(pairs, outcomes) if o.executed]
    refused = [(db, sql) for db, sql, _ in ran if not prefilter(sql, schemas[db]).admitted]
    values = ColumnValues(executor, LifecycleConfig().value_cap)
    with_rows = [(db, sql) for db, sql, o in ran if o.status == Status.OK]
    flagged = []
    for db, sql in with_rows:
        slips = [f"{u.column} vs '{u.value}'" for u in literal_uses(sql, schemas[db], values.lookup(db))
                 if u.grounded is False]
        if slips:
            flagged.append(f"{db}: {', '.join(slips)}")
    trials = [(db, sql, o, rewrite) for db, sql, o in ran if (rewrite := semijoin(sql, schemas[db]))]
    rewritten = executor.execute_many([(db, rewrite) for db, _, _, rewrite in trials])
    changed = [(db, sql) for (db, sql, o, _), r in zip(trials, rewritten) if not (r.executed and results_match(r.rows, o.rows, "spider"))]
    return [f"On Spider's train gold ({len(pairs)} distinct queries on {len(schemas)} databases, {len(ran)} of which "
            f"run): {len(refused)} refused by the filter.",
            f"Grounding rule on the same gold: {len(flagged)} of the {len(with_rows)} gold queries that return rows "
            f"({100 * len(flagged) / len(with_rows):.1f}%) compare a column with a value it never holds, e.g. "
            + "; ".join(flagged[:6]) + ".",
            f"Fan-out repair on the same gold: the pattern occurs in {len(trials)} gold queries and the rewrite changes "
            f"the result of {len(changed)}: " + "; ".join(f"{db}: `{' '.join(sql.split())}`" for db, sql in changed) + "."]


# ------------------------------------------------------------------------------------------ the run
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spider", type=Path, default=ROOT.parent / "shared" / "data" / "spider")
    parser.add_argument("--out", type=Path, default=None, help="also write the markdown here")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    db_root = args.spider / "databases"
    pools = [json.loads(line) for line in (args.spider / "dev_candidate_pools.jsonl").open()]
    ids = [p["id"] for p in pools]
    db_of = {p["id"]: p["db_id"] for p in pools}
    dbs = sorted(set(db_of.values()))
    out: list[str] = []
    say = out.append

    with Executor(db_root, workers=args.workers) as executor:
        # ---------------------------------------------------------------- every candidate, executed once as given
        t0 = time.perf_counter()
        distinct = sorted({(p["db_id"], c["sql"]) for p in pools for c in p["candidates"]})
        outcomes = dict(zip(distinct, executor.execute_many(distinct)))
        t_exec = time.perf_counter() - t0
        # ---------------------------------------------------------------- pools: as given, after the lifecycle
        def lifecycle_pool(config: LifecycleConfig):
            tasks = {p["id"]: make_task(db_root, p["id"], p["db_id"], p["question"], given(p["candidates"]))
                     for p in pools}
            lifecycle = Lifecycle(executor, config=config)
            lifecycle.run(list(tasks.values()))
            return tasks, lifecycle

        t0 = time.perf_counter()
        tasks, lifecycle = lifecycle_pool(LifecycleConfig())
        t_life = time.perf_counter() - t0
        given_tasks, _ = lifecycle_pool(LifecycleConfig(rebind_rows=False, structural_repair=False))
        pool_sets = {"as given": {q: t.ballots() for q, t in given_tasks.items()},
                     "after lifecycle": {q: t.ballots() for q, t in tasks.items()}}
        fanout = {name: fanout_repaired(pool, tasks, executor) for name, pool in pool_sets.items()}
        judge = Judge(executor, pools)
        judge.add({(q, b.sql) for sets in (pool_sets, fanout) for pool in sets.values()
                   for q, ballots in pool.items() for b in ballots if b.sql})

        say(f"# Selector benchmark: {len(pools)} questions x {len(pools[0]['candidates'])} systems (Spider dev pools)\n")
        say(f"Executed {len(distinct)} distinct candidate queries in {t_exec:.2f}s; the deterministic lifecycle "
            f"(filter, execute, model-free repair, ground) over {sum(len(p['candidates']) for p in pools)} candidates "
            f"in {t_life:.2f}s ({executor.workers} sandboxed workers).\n")

        # ---------------------------------------------------------------- methods side by side
        t0 = time.perf_counter()
        weights = {(name, mode): log_odds(reliability([votes_by_class(pool[q], mode) for q in ids]))
                   for name, pool in pool_sets.items() for mode in MODES}
        sizes = Counter(family(b.source) for b in pool_sets["as given"][ids[0]])
        by_family = {b.source: 1 / sizes[family(b.source)] for b in pool_sets["as given"][ids[0]]}
        t_weights = time.perf_counter() - t0
        methods = {
            "majority vote": lambda pool, name, q, mode: majority_vote(pool[q], mode).index,
            "S_maj alone": lambda pool, name, q, mode: select(pool[q], SelectorConfig(compare=mode, rerank="never")).index,
            "**hybrid, LLM-free (defaults)**": lambda pool, name, q, mode: select(pool[q], SelectorConfig(compare=mode)).index,
            "hybrid without the grounding rule (previous default)": lambda pool, name, q, mode: select(
                [replace(b, grounded=True) for b in pool[q]], SelectorConfig(compare=mode)).index,
            "hybrid, reranker forced on": lambda pool, name, q, mode: select(
                pool[q], SelectorConfig(compare=mode, rerank="always")).index,
            "not shipped: S_maj, source-reliability weights (Dawid-Skene, no labels)": lambda pool, name, q, mode:
                weighted_vote(pool[q], mode, weights[name, mode]),
            "not shipped: S_maj, family weights (1 / family size)": lambda pool, name, q, mode:
                weighted_vote(pool[q], mode, by_family),
            "not shipped: hybrid after the fan-out repair": lambda pool, name, q, mode: select(
                fanout[name][q], SelectorConfig(compare=mode)).index,
        }
        table = {}
        for pool_name, pool in pool_sets.items():
            for name, method in methods.items():
                source = fanout[pool_name] if "fan-out" in name else pool
                for mode in MODES:
                    picks = {q: method(pool, pool_name, q, mode) for q in ids}
                    table[pool_name, name, mode] = {q: judge(q, source[q][i].sql if i is not None else None, mode)
                                                    for q, i in picks.items()}
            for mode in MODES:
                table[pool_name, "oracle", mode] = {q: any(judge(q, b.sql, mode) for b in pool[q]) for q in ids}
        t_select = time.perf_counter() - t0
        n_db = Counter(db_of.values())

        def ex(result, db=None) -> float:
            chosen = [q for q in ids if db is None or db_of[q] == db]
            return 100 * sum(result[q] for q in chosen) / len(chosen)

        def delta(result, base, db=None) -> int:
            return sum(result[q] - base[q] for q in ids if db is None or db_of[q] == db)

        say("## EX overall (answer classes and evaluation in the same equivalence)\n")
        say("`vs majority` in points and (questions); `worst db`: the largest drop on one database, in points.\n")
        say("| pool | method | EX bird | vs majority | worst db | EX spider | vs majority | worst db |")
        say("|---|---|---:|---:|---:|---:|---:|---:|")
        for pool_name in pool_sets:
            for name in list(methods) + ["oracle"]:
                cells = []
                for mode in MODES:
                    base, res = table["as given", "majority vote", mode], table[pool_name, name, mode]
                    worst = min(ex(res, d) - ex(base, d) for d in dbs)
                    cells += [f"{ex(res):.2f}", f"{ex(res) - ex(base):+.2f} ({delta(res, base):+d})", f"{worst:+.1f}"]
                say(f"| {pool_name} | {name} | " + " | ".join(cells) + " |")
        calls = len(pool_sets) * len(methods) * len(MODES) * len(ids)
        say(f"\nSelection itself: {calls / t_select:.0f} selections/s ({calls} selections incl. scoring lookups and "
            f"fitting the reliability weights, {t_select:.1f}s; the weights alone {t_weights:.1f}s).\n")

        hybrid = "**hybrid, LLM-free (defaults)**"
        say("Questions that change against majority voting (pools after the lifecycle, bird / spider):\n")
        for name in methods:
            if name == "majority vote":
                continue
            cells = []
            for mode in MODES:
                base, res = table["as given", "majority vote", mode], table["after lifecycle", name, mode]
                won = [q for q in ids if res[q] and not base[q]]
                lost = [q for q in ids if base[q] and not res[q]]
                cells.append(f"{mode} +{won} -{lost}")
            say(f"- {name}: " + "; ".join(cells))
        say("")

        say("## EX per database (pools after the lifecycle)\n")
        say("| database | n | majority bird | hybrid bird | oracle bird | majority spider | hybrid spider | oracle spider |")
        say("|---|---:|---:|---:|---:|---:|---:|---:|")
        for db in dbs:
            cells = [f"{ex(table[pool, m, mode], db):.1f}" for mode in MODES
                     for pool, m in (("as given", "majority vote"), ("after lifecycle", hybrid), ("after lifecycle", "oracle"))]
            say(f"| {db} | {n_db[db]} | " + " | ".join(cells) + " |")
        say("")

        # ---------------------------------------------------------------- leave-one-database-out CV
        pool = pool_sets["after lifecycle"]
        say("## Leave-one-database-out cross-validation of the selector's constants\n")
        say(f"Candidates: the selector with partial_weight in {list(CV_PARTIAL)}, margin in {list(CV_MARGIN)}, rerank "
            "in (never, always); and S_maj with source-reliability weights fitted (without labels) on the nine "
            "training databases' pools. For each held-out database the candidate with the best EX on the other nine "
            "is applied to it (ties go to the simpler setting: no weights, smaller margin, smaller weight). The "
            "grounding rule has no constant; its effect is the ablation row of the table above.\n")
        grid = [SelectorConfig(partial_weight=w, margin=m, rerank=r) for r in ("never", "always")
                for w in CV_PARTIAL for m in CV_MARGIN if not (r == "never" and m != CV_MARGIN[0])]
        say("| mode | CV EX | majority EX | CV - majority | chosen (folds) |")
        say("|---|---:|---:|---:|---|")
        for mode in MODES:
            correct = {k: {q: judge(q, pool[q][select(pool[q], replace(config, compare=mode)).index].sql, mode)
                           for q in ids} for k, config in enumerate(grid)}
            total, chosen = 0, Counter()
            for db in dbs:
                train = [q for q in ids if db_of[q] != db]
                fold_weights = log_odds(reliability([votes_by_class(pool[q], mode) for q in train]))
                weighted = {q: judge(q, pool[q][i].sql if (i := weighted_vote(pool[q], mode, fold_weights)) is not None
                                     else None, mode) for q in ids}
                options = [(sum(correct[k][q] for q in train), 1, -grid[k].margin, -grid[k].partial_weight,
                            grid[k].rerank == "never", k) for k in correct]
                options.append((sum(weighted[q] for q in train), 0, 0, 0, 0, "weights"))
                best = max(options)[-1]
                result = weighted if best == "weights" else correct[best]
                total += sum(result[q] for q in ids if db_of[q] == db)
                chosen["reliability weights" if best == "weights" else
                       f"w={grid[best].partial_weight}, margin={grid[best].margin}, rerank={grid[best].rerank}"] += 1
            cv = 100 * total / len(ids)
            base = ex(table["as given", "majority vote", mode])
            say(f"| {mode} | {cv:.2f} | {base:.2f} | {cv - base:+.2f} | "
                + "; ".join(f"{k} ({v})" for k, v in chosen.most_common()) + " |")
        say("")

        # ---------------------------------------------------------------- what the hybrid still misses
        say("## Where the hybrid is wrong but a correct candidate exists (bird, after the lifecycle)\n")
        kinds: dict[str, list] = defaultdict(list)
        for q in ids:
            if table["after lifecycle", hybrid, "bird"][q] or not table["after lifecycle", "oracle", "bird"][q]:
                continue
            ballots = pool[q]
            chosen = select(ballots, SelectorConfig())
            winner = chosen.classes[0] if chosen.classes else None
            right = [c for c in chosen.classes if judge(q, ballots[c.members[0]].sql, "bird")]
            if winner is None or not right:
                kinds["no correct candidate among the voters"].append(q)
            elif ballots[winner.members[0]].status == Status.EMPTY:
                kinds["an empty result holds a majority"].append(q)
            elif any(results_match(ballots[winner.members[0]].rows, ballots[c.members[0]].rows, "spider") for c in right):
                kinds["differs from a correct class only in column order"].append(q)
            elif table["after lifecycle", "not shipped: hybrid after the fan-out repair", "bird"][q]:
                kinds["a join fan-out duplicates what is averaged (fixed by the fan-out repair)"].append(q)
            elif len(right[0].members) >= len(winner.members) - 1:
                kinds["near tie (correct class within one vote)"].append(q)
            else:
                kinds["correct class outvoted by 2+ votes"].append(q)
        say("| case | questions | ids |")
        say("|---|---:|---|")
        for kind, qs in sorted(kinds.items(), key=lambda kv: -len(kv[1])):
            say(f"| {kind} | {len(qs)} | {', '.join(map(str, qs))} |")
        say("")
        say("Questions whose winning content comes in several column orders (bird splits them, spider does not):\n")
        gold_order, other_order = [], []
        for q in ids:
            merged = sorted(result_classes(pool[q], admitted(pool[q]), "spider"), key=lambda c: (-len(c.members), c.members[0]))
            split = result_classes(pool[q], merged[0].members, "bird") if merged else []
            if len(split) > 1:
                top = max(split, key=lambda c: (len(c.members), -c.members[0]))
                (gold_order if judge(q, pool[q][top.members[0]].sql, "bird") else other_order).append(q)
        say(f"- the most voted order is the gold's: {len(gold_order)} ({', '.join(map(str, gold_order))})")
        say(f"- it is not: {len(other_order)} ({', '.join(map(str, other_order))})")
        say("")

        # ---------------------------------------------------------------- the grounding rule's evidence
        say("## The grounding flag on the pools (after the lifecycle)\n")
        flag = Counter()
        for q in ids:
            for b in pool[q]:
                if b.status == Status.OK:
                    key = "grounded" if b.grounded else "ungrounded"
                    flag[key] += 1
                    for mode in MODES:
                        flag[key, mode] += judge(q, b.sql, mode)
        say("| candidates with rows | n | correct (bird) | correct (spider) |")
        say("|---|---:|---:|---:|")
        for key in ("grounded", "ungrounded"):
            say(f"| {key} | {flag[key]} | {100 * flag[key, 'bird'] / flag[key]:.1f}% | "
                f"{100 * flag[key, 'spider'] / flag[key]:.1f}% |")
        say("")

        # ---------------------------------------------------------------- structural operators on real empties
        say("## Structural operators on the real empty-result candidates (no model call)\n")
        gold_runs = dict(zip(ids, executor.execute_many([(p["db_id"], p["gold_sql"]) for p in pools])))
        empties, ops = 0, Counter()
        for p in pools:
            for cand in tasks[p["id"]].candidates:
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
                    judge.add({(p["id"], before)})
                    for mode in MODES:
                        rebound[(mode, judge(p["id"], before, mode), judge(p["id"], cand.sql, mode))] += 1
        say("Literal re-binding on candidates that returned rows with a literal absent from its column:")
        for mode in MODES:
            say(f"- {mode}: {rebound[(mode, False, True)]} wrong -> correct, {rebound[(mode, True, False)]} "
                f"correct -> wrong, {rebound[(mode, True, True)] + rebound[(mode, False, False)]} unchanged")
        swaps = Counter()
        for q, repaired in fanout["after lifecycle"].items():
            for b, before in zip(repaired, pool[q]):
                if b.sql != before.sql:
                    for mode in MODES:
                        swaps[(mode, judge(q, before.sql, mode), judge(q, b.sql, mode))] += 1
        say("\nFan-out repair (not shipped) on candidates whose result it changes:")
        for mode in MODES:
            say(f"- {mode}: {swaps[(mode, False, True)]} wrong -> correct, {swaps[(mode, True, False)]} "
                f"correct -> wrong, {swaps[(mode, False, False)] + swaps[(mode, True, True)]} unchanged")
        say("")
        say("## Pre-execution filter on the same candidates\n")
        say("`" + lifecycle.summary() + "`\n")
        refused_but_ran = sum(1 for p in pools for cand, entry in zip(tasks[p["id"]].candidates, p["candidates"])
                              if (cand.dropped or "").startswith("filtered")
                              and outcomes[p["db_id"], entry["sql"]].executed)
        say(f"Candidates refused by the filter that SQLite would have run: {refused_but_ran}.\n")
        say("## Spider's train gold: the rules against queries known to be right\n")
        for line in train_gold_check(args.spider, executor):
            say(f"- {line}")
    text = "\n".join(out) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
