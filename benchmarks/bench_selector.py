"""Selector benchmark on both open candidate pools (431 Spider dev questions, 18 systems each).

    PYTHONPATH=. python benchmarks/bench_selector.py [--spider-root ../shared/data/spider] [--out FILE.md]

Pool A is `dev_candidate_pools.jsonl`, pool B `dev_candidate_pools_b.jsonl` (the same questions
answered by 18 other, weaker systems). Per pool, overall and per database, in both `bird` and
`spider` equivalence (answer classes are formed with the same equivalence as the evaluation):

1. majority voting over execution results (`selector.majority_vote`), the LLM-free hybrid as `sirius select`
   ships it, and the oracle (some candidate is correct);
2. every extra rule, switched against the shipped selector, with its effect per database on both
   pools: the empty-result admission rule (shipped), the grounding rule (ungrounded candidates out of
   the vote; removed), literal re-binding of queries that return rows (lifecycle; off), and partial
   agreement at each weight. A rule ships only if it gains on both pools and never costs a database more
   than 2 points on either;
3. leave-one-pool-out choice of the partial-agreement weight: chosen on one pool, applied to the other;
4. the structural gate where provenance repeats: each pool's systems grouped into the families they come
   from (`FAMILIES`; a coarser grouping by backbone, `BACKBONES`, as a check), so that a provenance group is
   a family and the gate opens; its wins and losses against the gate off, per database;
5. the lifecycle's verdicts (filter refusals, unanalysable candidates) on both pools.
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

from _baselines import SPIDER, SPIDER_HELP  # noqa: E402
from rewards.executor import Executor  # noqa: E402
from rewards.outcome import Status  # noqa: E402
from rewards.scoring import ScoreItem  # noqa: E402
from sirius_train.inference.candidates import given  # noqa: E402
from sirius_train.inference.lifecycle import Lifecycle, LifecycleConfig  # noqa: E402
from sirius_train.inference.pipeline import make_task  # noqa: E402
from sirius_train.inference.selector import SelectorConfig, majority_vote, select  # noqa: E402

MODES = ("bird", "spider")
POOLS = {"A": "dev_candidate_pools.jsonl", "B": "dev_candidate_pools_b.jsonl"}
WEIGHTS = (0.0, 0.25, 0.5, 1.0)  # partial-agreement weights compared (leave-one-pool-out)
MAX_DB_COST = 2.0  # points: the most a rule may cost one database on either pool

# Provenance groups for the gate. Each pool gives one candidate per system, so the gate (which counts the
# distinct groups behind a SQL shape) only opens once systems are grouped. FAMILIES: the same model line or
# method at another size, prompt or amount of fine-tuning; a system not named is a family of its own.
FAMILIES = {
    "A": {"CodeS": ("SFT_CodeS_15B", "SFT_CodeS_7B", "SFT_CodeS_1B"),
          "RESDSQL": ("RESDSQL_NatSQL_3B", "RESDSQL_3B"),
          "DAIL-SQL": ("DAILSQL_SC", "DAILSQL"),
          "Llama 3": ("SFT_Llama3_8B", "Llama3-8B")},
    "B": {"CodeLlama": ("SFT_CodeLlama_7B", "CodeLlama-7B-1000", "pretrained_codellama_7b"),
          "Llama 2": ("SFT_Llama2_7B", "Llama2-7B-5000"),
          "Llama 3": ("Llama3-8B-3000", "pretrained_llama3_8b", "llama3_8b_7000_train_samples"),
          "StarCoder": ("SFT_StarCoder_7B", "StarCoder-7B-4000", "pretrained_starcoder_7b"),
          "DeepSeek-Coder": ("Deepseek-Coder-7B-2000", "pretrained_deepseek_coder_7b",
                             "deepseek_coder_7b_7000_train_samples"),
          "RESDSQL": ("resdsql_text2natsql_base", "resdsql_text2natsql_large", "resdsql_text2sql_base",
                      "resdsql_text2sql_large")},
}
# BACKBONES: coarser, by the model underneath (as the systems' papers report it): a check that the verdict
# does not hang on where the family lines are drawn.
BACKBONES = {
    "A": {"GPT-4 prompting": ("SuperSQL", "DINSQL", "DAILSQL_SC", "DAILSQL", "GPT4_zero_shot"),
          "GPT-3.5 / Codex prompting": ("C3_SQL", "CodeX_few_shot"),
          "T5-3B fine-tuned": ("RESDSQL_NatSQL_3B", "RESDSQL_3B", "Graphix_PICARD_3B"),
          "CodeS": ("SFT_CodeS_15B", "SFT_CodeS_7B", "SFT_CodeS_1B"),
          "Llama": ("SFT_Llama3_8B", "Llama3-8B", "CodeLlama-7B"),
          "DeepSeek": ("SFT_Deepseek_Coder_7B", "DeepSeek_chat")},
    "B": {"Llama": ("SFT_CodeLlama_7B", "CodeLlama-7B-1000", "pretrained_codellama_7b", "SFT_Llama2_7B",
                    "Llama2-7B-5000", "Llama3-8B-3000", "pretrained_llama3_8b", "llama3_8b_7000_train_samples"),
          "StarCoder": FAMILIES["B"]["StarCoder"], "DeepSeek-Coder": FAMILIES["B"]["DeepSeek-Coder"],
          "RESDSQL": FAMILIES["B"]["RESDSQL"]},
}
GROUPINGS = {"families": FAMILIES, "backbones": BACKBONES}


def group_of(groups: dict[str, tuple[str, ...]], systems: set[str]) -> dict[str, str]:
    """Each system's provenance group; refuses a grouping that names a system the pool does not have (a typo
    would silently leave that system a group of its own)."""
    named = {system: group for group, members in groups.items() for system in members}
    assert set(named) <= systems, f"not in the pool: {sorted(set(named) - systems)}"
    return {system: named.get(system, system) for system in systems}


class Judge:
    """Correctness of (question, sql) by the reward's own scorer, computed once per distinct pair."""

    def __init__(self, executor: Executor, pools: list[dict]):
        self.executor, self.pools = executor, {p["id"]: p for p in pools}
        self.cache: dict[tuple, bool] = {}

    def add(self, pairs: set[tuple]) -> None:
        todo = [(qid, sql, mode) for qid, sql in sorted(pairs) for mode in MODES if (qid, sql, mode) not in self.cache]
        items = [ScoreItem(self.pools[q]["db_id"], self.pools[q]["gold_sql"], sql, mode, id=(q, sql, mode))
                 for q, sql, mode in todo]
        for result in self.executor.score(items):
            self.cache[result.id] = result.match

    def __call__(self, qid, sql: str | None, mode: str) -> bool:
        return bool(sql) and self.cache[(qid, sql, mode)]


# ------------------------------------------------------------------------------------------ rule variants
def without_empty_rule(ballots):
    """Every empty result votes (as majority voting counts it): empty ballots as rows-less OK results."""
    return [replace(b, status=Status.OK) if b.status == Status.EMPTY else b for b in ballots]


def with_grounding_rule(ballots, ungrounded: set[int]):
    """The removed rule: candidates comparing a column with a value it never holds vote only when no
    grounded candidate returned rows."""
    grounded_rows = any(b.status == Status.OK and i not in ungrounded for i, b in enumerate(ballots))
    if not grounded_rows:
        return ballots
    return [replace(b, status=Status.REJECTED) if b.status == Status.OK and i in ungrounded else b
            for i, b in enumerate(ballots)]


def run_pool(executor: Executor, db_root: Path, pools: list[dict], config: LifecycleConfig):
    """Tasks after the lifecycle: ballots, the ungrounded candidates' indices, the lifecycle's summary."""
    tasks = [make_task(db_root, p["id"], p["db_id"], p["question"], given(p["candidates"])) for p in pools]
    lifecycle = Lifecycle(executor, config=config)
    lifecycle.run(tasks)
    ballots = {t.question.id: t.ballots() for t in tasks}
    ungrounded = {t.question.id: {i for i, c in enumerate(t.candidates) if c.ungrounded} for t in tasks}
    return ballots, ungrounded, lifecycle, tasks


# ------------------------------------------------------------------------------------------ the run
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spider-root", "--spider", dest="spider", type=Path, default=SPIDER, help=SPIDER_HELP)
    parser.add_argument("--out", type=Path, default=None, help="also write the markdown here")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    db_root = args.spider / "databases"
    out: list[str] = []
    say = out.append
    shipped = LifecycleConfig(structural_repair=False)  # what `sirius select` runs without --repair
    lifecycles = {"shipped": shipped, "rebind rows": replace(shipped, rebind_rows=True),
                  "--repair": replace(shipped, structural_repair=True)}

    results: dict[tuple, dict] = {}  # (pool, method, mode) -> {qid: correct}
    db_of: dict[str, dict] = {}
    notes: dict[str, list[str]] = {}
    decided: dict[tuple, tuple] = {}  # (pool, grouping) -> (groups, Counter of decided_by under bird)
    t_all = time.perf_counter()
    with Executor(db_root, workers=args.workers) as executor:
        for pool_name, file in POOLS.items():
            pools = [json.loads(line) for line in (args.spider / file).open()]
            db_of[pool_name] = {p["id"]: p["db_id"] for p in pools}
            judge = Judge(executor, pools)
            runs = {}
            for name, config in lifecycles.items():
                t0 = time.perf_counter()
                runs[name] = run_pool(executor, db_root, pools, config)
                notes.setdefault(pool_name, []).append(
                    f"lifecycle `{name}` ({time.perf_counter() - t0:.1f}s): `{runs[name][2].summary()}`")
                judge.add({(q, b.sql) for q, bs in runs[name][0].items() for b in bs if b.sql})
            ballots, ungrounded, _, tasks = runs["shipped"]
            rebound = runs["rebind rows"][0]
            refused_but_ran = sum(1 for t in tasks for c in t.candidates if c.dropped and c.dropped.startswith("filtered")
                                  and c.sql and executor.execute(t.question.db_id, c.sql).executed)
            notes[pool_name].append(f"candidates refused by the filter that SQLite would have run: {refused_but_ran}")
            notes[pool_name].append(operators_line(tasks, runs["--repair"][3], judge))
            notes[pool_name].append(unanalysable_line(tasks, judge))
            repaired = runs["--repair"][0]
            methods = {
                "majority vote": lambda q, m: majority_vote(ballots[q], m).index,
                "**hybrid, LLM-free (shipped)**": lambda q, m: select(ballots[q], SelectorConfig(compare=m)).index,
                "hybrid without the empty-result rule": lambda q, m: select(without_empty_rule(ballots[q]),
                                                                          SelectorConfig(compare=m)).index,
                "hybrid + grounding rule (removed)": lambda q, m: select(with_grounding_rule(ballots[q], ungrounded[q]),
                                                                       SelectorConfig(compare=m)).index,
                "hybrid + re-binding queries with rows (off)": lambda q, m: select(rebound[q],
                                                                                 SelectorConfig(compare=m)).index,
                "majority vote + re-binding queries with rows": lambda q, m: majority_vote(rebound[q], m).index,
                "hybrid after --repair (structural operators on empty results)": lambda q, m: select(
                    repaired[q], SelectorConfig(compare=m)).index,
                "previous default (grounding + re-binding rows, partial 0)": lambda q, m: select(
                    with_grounding_rule(rebound[q], runs["rebind rows"][1][q]),
                    SelectorConfig(compare=m, partial_weight=0.0)).index,
            }
            systems = {b.source for bs in ballots.values() for b in bs}
            for grouping, groups in GROUPINGS.items():
                group = group_of(groups[pool_name], systems)
                regrouped = {q: [replace(b, source=group[b.source]) for b in bs] for q, bs in ballots.items()}
                decided[pool_name, grouping] = (len(set(group.values())), Counter(
                    select(bs, SelectorConfig(compare="bird", rerank="auto")).decided_by for bs in regrouped.values()))
                methods[f"hybrid, gate on {grouping}"] = (lambda q, m, regrouped=regrouped: select(
                    regrouped[q], SelectorConfig(compare=m, rerank="auto")).index)
            methods["hybrid, gate forced on, one group per system"] = (
                lambda q, m: select(ballots[q], SelectorConfig(compare=m, rerank="always")).index)
            for w in WEIGHTS:
                methods[f"hybrid, partial_weight={w}"] = (
                    lambda q, m, w=w: select(ballots[q], SelectorConfig(compare=m, partial_weight=w)).index)
            source = {name: rebound if "re-binding" in name else repaired if "--repair" in name else ballots
                      for name in methods}
            for name, method in methods.items():
                for mode in MODES:
                    picks = {q: method(q, mode) for q in ballots}
                    results[pool_name, name, mode] = {q: judge(q, source[name][q][i].sql if i is not None else None,
                                                               mode) for q, i in picks.items()}
            for mode in MODES:
                results[pool_name, "oracle", mode] = {q: any(judge(q, b.sql, mode) for b in bs)
                                                      for q, bs in ballots.items()}
    t_all = time.perf_counter() - t_all

    def ex(pool, res, db=None) -> float:
        chosen = [q for q in res if db is None or db_of[pool][q] == db]
        return 100 * sum(res[q] for q in chosen) / len(chosen)

    def per_db_delta(pool, res, base) -> dict[str, float]:
        return {db: ex(pool, res, db) - ex(pool, base, db) for db in sorted(set(db_of[pool].values()))}

    def questions(pool, res, base) -> int:
        return sum(res[q] - base[q] for q in res)

    say("# Selector benchmark: both open pools (431 Spider dev questions x 18 systems each)\n")
    say(f"Whole run {t_all:.0f}s ({args.workers} sandboxed workers): every lifecycle, scoring every distinct "
        "candidate in both equivalences, every selection.\n")
    shown = ["majority vote", "**hybrid, LLM-free (shipped)**", "hybrid, gate on families", "oracle"]
    say("## EX overall\n")
    say("`vs majority`: points and (questions); `worst db`: the largest drop against majority on one database.\n")
    say("| pool | method | EX bird | vs majority | worst db | EX spider | vs majority | worst db |")
    say("|---|---|---:|---:|---:|---:|---:|---:|")
    names = results_names(results)
    for pool in POOLS:
        for name in names:
            cells = []
            for mode in MODES:
                base, res = results[pool, "majority vote", mode], results[pool, name, mode]
                worst = min(per_db_delta(pool, res, base).values())
                cells += [f"{ex(pool, res):.2f}", f"{ex(pool, res) - ex(pool, base):+.2f} ({questions(pool, res, base):+d})",
                          f"{worst:+.1f}"]
            say(f"| {pool} | {name} | " + " | ".join(cells) + " |")
    say("")

    say("## EX per database\n")
    for pool in POOLS:
        say(f"Pool {pool} (`{POOLS[pool]}`):\n")
        say("| database | n | " + " | ".join(f"{m.strip('*').replace(', LLM-free (shipped)', '')} {mode}"
                                            for mode in MODES for m in shown) + " |")
        say("|---|---:|" + "---:|" * (len(shown) * len(MODES)))
        n_db = Counter(db_of[pool].values())
        for db in sorted(n_db):
            say(f"| {db} | {n_db[db]} | " + " | ".join(f"{ex(pool, results[pool, m, mode], db):.1f}"
                                                     for mode in MODES for m in shown) + " |")
        say("")

    say("## Does each rule earn its place? (per database, both pools)\n")
    say(f"Each rule against the shipped hybrid without it (or, for a rule that is off, the shipped hybrid "
        f"with it added). `gain`: questions won minus lost overall; `worst db`: the largest drop on one "
        f"database, in points. A rule ships only if it gains on both pools and costs no database more than "
        f"{MAX_DB_COST:g} points on either.\n")
    hybrid = "**hybrid, LLM-free (shipped)**"
    rules = [("empty-result admission (shipped)", hybrid, "hybrid without the empty-result rule"),
             ("grounding: ungrounded candidates out of the vote (removed)", "hybrid + grounding rule (removed)", hybrid),
             ("re-binding literals of queries that return rows (off)", "hybrid + re-binding queries with rows (off)",
              hybrid)]
    rule_table(say, rules, results, db_of, per_db_delta, questions, verdict=True)
    say("")
    say("Partial agreement (SPEC's S_maj counts it): each weight against none at all (votes alone, shipped):\n")
    rule_table(say, [(f"partial agreement {w} vs 0", f"hybrid, partial_weight={w}", "hybrid, partial_weight=0.0")
                     for w in WEIGHTS[1:]], results, db_of, per_db_delta, questions, verdict=True)
    say("")

    gate_section(say, results, db_of, decided, per_db_delta, questions, ex)

    say("## Leave-one-pool-out: the partial-agreement weight\n")
    say(f"Weights {list(WEIGHTS)}. Chosen on one pool by EX, applied to the other pool. `best there` lists every "
        "weight tied for the best EX on the pool it is chosen on; a tie goes to the smallest (a weight the data "
        "does not ask for stays out).\n")
    say("| mode | chosen on | best there | weight | EX on the other pool | majority there | vs majority | "
        "worst db there |")
    say("|---|---|---|---:|---:|---:|---:|---:|")
    for mode in MODES:
        for train, test in (("A", "B"), ("B", "A")):
            correct = {w: sum(results[train, f"hybrid, partial_weight={w}", mode].values()) for w in WEIGHTS}
            tied = [w for w in WEIGHTS if correct[w] == max(correct.values())]
            res, base = results[test, f"hybrid, partial_weight={tied[0]}", mode], results[test, "majority vote", mode]
            worst = min(per_db_delta(test, res, base).values())
            say(f"| {mode} | {train} | {', '.join(map(str, tied))} | {tied[0]} | {ex(test, res):.2f} | "
                f"{ex(test, base):.2f} | {ex(test, res) - ex(test, base):+.2f} | {worst:+.1f} |")
    say("")

    say("## Lifecycle verdicts\n")
    for pool in POOLS:
        for line in notes[pool]:
            say(f"- {pool}: {line}")
    say("")
    text = "\n".join(out)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


def gate_section(say, results, db_of, decided, per_db_delta, questions, ex) -> None:
    """The gate on family provenance groups against the gate off (the shipped hybrid here), per database."""
    hybrid = "**hybrid, LLM-free (shipped)**"
    say("## The structural gate where provenance repeats\n")
    say("Both pools give one candidate per system, so `rerank=\"auto\"` never opens the gate on them. Here each "
        "pool's systems are grouped into provenance groups, so that the groups repeat and the gate opens on near "
        "ties (S_coarse lead < `margin` = 0.1): `families` (the same model line or method at another size, prompt "
        "or amount of fine-tuning), `backbones` (coarser: the model underneath), and, for reference, the gate "
        "forced on with every system its own group. Against the shipped hybrid (gate off): questions won / "
        "lost, points, and the gated hybrid's standing against majority voting.\n")
    for pool in POOLS:
        for grouping, groups in GROUPINGS.items():
            shown = ", ".join(f"{g} ({len(m)})" for g, m in groups[pool].items())
            n_groups, by = decided[pool, grouping]
            say(f"- Pool {pool}, `{grouping}`: {shown}, every other system a group of its own: 18 systems in "
                f"{n_groups} groups; the gate decides {by['structure']} of {sum(by.values())} questions (bird).")
    say("")
    say("| pool | grouping | mode | won | lost | net | vs shipped | worst db vs shipped | vs majority | "
        "worst db vs majority |")
    say("|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    names = {g: f"hybrid, gate on {g}" for g in GROUPINGS}
    names["forced, per system"] = "hybrid, gate forced on, one group per system"
    for pool in POOLS:
        for label, name in names.items():
            for mode in MODES:
                res, off, base = results[pool, name, mode], results[pool, hybrid, mode], results[pool, "majority vote", mode]
                won = sum(res[q] and not off[q] for q in res)
                lost = sum(off[q] and not res[q] for q in res)
                say(f"| {pool} | {label} | {mode} | {won} | {lost} | {won - lost:+d} | "
                    f"{ex(pool, res) - ex(pool, off):+.2f} | {min(per_db_delta(pool, res, off).values()):+.1f} | "
                    f"{ex(pool, res) - ex(pool, base):+.2f} | {min(per_db_delta(pool, res, base).values()):+.1f} |")
    say("")
    say("Per database, gate on `families` against the shipped hybrid: questions won / lost (bird; spider).\n")
    say("| database | n A | A bird | A spider | n B | B bird | B spider |")
    say("|---|---:|---:|---:|---:|---:|---:|")
    name = names["families"]
    for db in sorted(set(db_of["A"].values()) | set(db_of["B"].values())):
        cells = []
        for pool in POOLS:
            qs = [q for q, d in db_of[pool].items() if d == db]
            cells.append(str(len(qs)))
            for mode in MODES:
                res, off = results[pool, name, mode], results[pool, hybrid, mode]
                cells.append(f"+{sum(res[q] and not off[q] for q in qs)} / -{sum(off[q] and not res[q] for q in qs)}")
        say(f"| {db} | " + " | ".join(cells) + " |")
    say("")


def operators_line(tasks, repaired_tasks, judge) -> str:
    """What the structural operators (`--repair`, no model call) do to the real empty-result candidates."""
    empty = [(t, k) for t in tasks for k, c in enumerate(t.candidates)
             if c.outcome is not None and c.outcome.status == Status.EMPTY]
    by_id = {t.question.id: t for t in repaired_tasks}
    fixed = [(t.question.id, by_id[t.question.id].candidates[k]) for t, k in empty
             if by_id[t.question.id].candidates[k].outcome.status == Status.OK]
    right = {mode: sum(judge(q, c.sql, mode) for q, c in fixed) for mode in MODES}
    harm = sum(judge(t.question.id, t.candidates[k].sql, "bird") for t, k in empty
               if by_id[t.question.id].candidates[k].outcome.status == Status.OK)
    return (f"structural operators (`--repair`, no model call) on the {len(empty)} empty-result candidates: "
            f"{len(fixed)} made non-empty, {right['bird']} of them correct (bird), {right['spider']} (spider); "
            f"{harm} of them had an empty gold (harm)")


def unanalysable_line(tasks, judge) -> str:
    """What SPEC 4.1's "unparsable SQL is removed" would cost: the candidates our analysis cannot read (sqlglot
    does not parse them, or its scope analysis fails), each run by SQLite instead, and how many are right."""
    cases = [(t.question.id, c) for t in tasks for c in t.candidates
             if c.events and c.events[0]["step"] == "filter" and c.events[0].get("kind") == "unanalysable"]
    kinds = Counter(c.events[0]["reason"].split(":", 1)[0] for _, c in cases)
    ran = [(q, c) for q, c in cases if c.outcome is not None and c.outcome.executed]
    right = {mode: sum(judge(q, c.sql, mode) for q, c in ran) for mode in MODES}
    return (f"unanalysable candidates ({', '.join(f'{k} {v}' for k, v in kinds.most_common())}): {len(cases)}, "
            f"{len(ran)} run by SQLite, {right['bird']} of them correct (bird), {right['spider']} (spider)")


def rule_table(say, rules, results, db_of, per_db_delta, questions, verdict: bool) -> None:
    """One row per rule and mode: its gain and worst database on each pool, the databases it moves."""
    say("| rule | mode | A gain | A worst db | B gain | B worst db | databases it changes (points, A / B) |"
        + (" passes the open-pool bar |" if verdict else ""))
    say("|---|---|---:|---:|---:|---:|---|" + ("---|" if verdict else ""))
    for label, with_rule, without in rules:
        for mode in MODES:
            cells, changed, earns = [], [], True
            for pool in POOLS:
                res, base = results[pool, with_rule, mode], results[pool, without, mode]
                deltas = per_db_delta(pool, res, base)
                gain, worst = questions(pool, res, base), min(deltas.values())
                earns = earns and gain > 0 and worst >= -MAX_DB_COST
                cells += [f"{gain:+d}", f"{worst:+.1f}"]
                changed.append(", ".join(f"{db} {d:+.1f}" for db, d in deltas.items() if d) or "none")
            say(f"| {label} | {mode} | " + " | ".join(cells) + f" | {' / '.join(changed)} |"
                + (f" {'yes' if earns else 'no'} |" if verdict else ""))


def results_names(results: dict) -> list[str]:
    """Method names in first-seen order (the oracle last)."""
    names = list(dict.fromkeys(name for _pool, name, _mode in results if name != "oracle"))
    return names + ["oracle"]


if __name__ == "__main__":
    main()
