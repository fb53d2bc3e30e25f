"""Why RL helps (or not) in a finished nano run: per phase, greedy / sampled / pass@k / maj@k, and the taught mistakes.

For every finished phase of a run (SFT, each DAPO stage) and its question sets -- each of the run's held-out
sets (`data.eval_sets`: databases no phase saw) and fresh questions synthesized on the *training* databases with
a new seed (none of them in any pool) -- it reports greedy EX, the mean EX of k samples at temperature T, pass@k
(some sample right) and maj@k (the answer of the largest class of samples that agree on their result is right).
On each held-out set it also counts, per kind of mistake the SFT demonstrations were given (`data.sft_flaws`, see
`data_synthesis/sqlgen/flaws.py`), how many greedy answers reproduce that mistake: same result as the flawed
gold, not the correct one. Each wrong greedy answer is also told apart by what differs from the gold (its
tables, columns, literals, or the skeleton left when those are blanked), and greedy EX is split by whether the
gold has a literal to copy from the question. Everything is scored by the reward's executor, as the schedule's
evaluation is.

    python benchmarks/nano_phases.py runs/demo --k 8 --temperature 1.0 --json runs/demo/phases.json
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from data_synthesis.difficulty import prompt_for  # noqa: E402
from data_synthesis.records import Example  # noqa: E402
from data_synthesis.sqlgen.flaws import FLAWS, flawed_variants  # noqa: E402
from data_synthesis.sqlgen.trees import parse  # noqa: E402
from rewards.executor import Executor  # noqa: E402
from rewards.extract import extract_sql  # noqa: E402
from rewards.scoring import ScoreItem  # noqa: E402


def fresh_questions(cfg, data, n: int, seed: int) -> list[Example]:
    """`n` new questions on the training databases, synthesized like the pools but absent from all of them."""
    from data_synthesis.sqlgen.rules import RULES
    from data_synthesis.sqlgen.synthesize import synthesize

    d = cfg.data
    rules = tuple(r for r in RULES if not d.synth_rules or r.name in d.synth_rules)
    seen = {e.question for e in data.sft_pool + data.rl_pool + [e for s in data.eval_sets.values() for e in s]}
    seen |= {e.meta.get("clean_sql", e.gold_sql) for e in data.sft_pool} | {e.gold_sql for e in data.rl_pool}
    dbs = d.all_train_dbs()
    per_db = -(-2 * n // len(dbs))
    pool = [e for db in dbs for e in synthesize(data.db_root / db / f"{db}.sqlite", per_db, seed=seed, db_id=db,
                                                rules=rules, joins=d.synth_joins, where_scale=d.synth_where)
            if e.question not in seen and e.gold_sql not in seen]
    random.Random(seed).shuffle(pool)
    return pool[:n]


PARTS = ("table", "column", "literal", "structure")


def sql_parts(sql: str) -> dict | None:
    """Tables, columns and literals of a query (sorted), and its skeleton with all three blanked; None: unparsable.

    Example:
        >>> sql_parts("SELECT name FROM t WHERE age > 30")["skeleton"]
        'SELECT c FROM t WHERE c > 0'
    """
    from sqlglot import exp
    from sqlglot.errors import SqlglotError

    try:
        tree = parse(sql)
    except SqlglotError:
        return None
    out = {"table": sorted(t.name for t in tree.find_all(exp.Table)),
           "column": sorted(c.name for c in tree.find_all(exp.Column)),
           # `LIMIT 1` says "the highest", not a value from the question; `LIMIT 5` is copied from "the 5 ..."
           "literal": sorted(str(v.this) for v in tree.find_all(exp.Literal)
                             if not (isinstance(v.parent, exp.Limit) and str(v.this) == "1"))}
    for node in list(tree.find_all(exp.Literal, exp.Column, exp.Table)):
        node.replace(exp.Literal.number(0) if isinstance(node, exp.Literal) else
                     exp.column("c") if isinstance(node, exp.Column) else exp.table_("t"))
    out["skeleton"] = tree.sql()
    return out


def failure_kinds(gold: str, pred: str | None) -> list[str]:
    """What a wrong answer got wrong, by part (several can be): table, column, literal, structure; or unparsable.

    Example:
        >>> failure_kinds("SELECT name FROM t WHERE age > 30", "SELECT name FROM t WHERE age > 25")
        ['literal']
        >>> failure_kinds("SELECT name FROM t ORDER BY age DESC LIMIT 1", "SELECT city FROM t ORDER BY age ASC LIMIT 1")
        ['column', 'structure']
    """
    g, p = sql_parts(gold), sql_parts(pred or "")
    if p is None:
        return ["unparsable"]
    return [k for k in PARTS if g[k if k != "structure" else "skeleton"] != p[k if k != "structure" else "skeleton"]]


def failures(examples: list[Example], preds: list[str | None], ok: list[bool]) -> dict:
    """Wrong greedy answers per part they got wrong, and greedy EX with / without a literal in the gold."""
    kinds = Counter(k for e, p, o in zip(examples, preds, ok) if not o for k in failure_kinds(e.gold_sql, p))
    has_literal = [bool((sql_parts(e.gold_sql) or {}).get("literal")) for e in examples]
    split = {name: [o for o, lit in zip(ok, has_literal) if lit == want] for name, want in (("literal", True),
                                                                                          ("no literal", False))}
    return {"wrong": len(ok) - sum(ok), "kinds": dict(kinds),
            "by_literal": {name: [sum(v), len(v)] for name, v in split.items()}}


def result_key(outcome) -> tuple | None:
    """What two answers must share to be one class for maj@k: their rows as a multiset (None: no result)."""
    if not outcome.executed:
        return None
    return tuple(sorted(Counter(map(repr, outcome.rows)).items()))


def phase_figures(model, tokenizer, examples: list[Example], data, executor: Executor, *, k: int, temperature: float,
                  max_new_tokens: int, flaw_kinds: list[str]) -> dict:
    from data_synthesis.generation import generate

    prompts = [prompt_for(e, data.db_root, data.prompt_format) for e in examples]
    greedy = [extract_sql(t) for t in generate(model, tokenizer, prompts, n=1, temperature=0.0,
                                               max_new_tokens=max_new_tokens).texts]
    compare = data.compare
    g_ok = [r.match for r in executor.score([ScoreItem(e.db_id, e.gold_sql, p, compare)
                                             for e, p in zip(examples, greedy)])]
    n = len(examples)
    out = {"n": n, "greedy": sum(g_ok) / n, "failures": failures(examples, greedy, g_ok)}
    if flaw_kinds:
        out["flaws"] = taught_mistakes(examples, greedy, g_ok, executor, compare, flaw_kinds)
    if k == 0:
        return out
    sampled = [extract_sql(t) for t in generate(model, tokenizer, prompts, n=k, temperature=temperature,
                                                max_new_tokens=max_new_tokens).texts]
    s_ok = [r.match for r in executor.score([ScoreItem(examples[i // k].db_id, examples[i // k].gold_sql, p, compare)
                                             for i, p in enumerate(sampled)])]
    outcomes = executor.execute_many([(examples[i // k].db_id, p or "") for i, p in enumerate(sampled)])
    maj = []
    for q in range(len(examples)):
        votes = Counter()
        first = {}
        for j in range(q * k, q * k + k):
            key = result_key(outcomes[j])
            if key is not None and sampled[j]:
                votes[key] += 1
                first.setdefault(key, j)
        maj.append(bool(votes) and s_ok[first[votes.most_common(1)[0][0]]])
    out.update(sampled=sum(s_ok) / len(s_ok), pass_at_k=sum(any(s_ok[q * k:q * k + k]) for q in range(n)) / n,
               maj_at_k=sum(maj) / n)
    return out


def taught_mistakes(examples, preds, ok, executor: Executor, compare: str, kinds: list[str]) -> dict:
    """Per flaw kind: questions it applies to, greedy answers right, and greedy answers reproducing the flaw."""
    rows = []
    for i, e in enumerate(examples):
        for kind, sql in flawed_variants(e.gold_sql, kinds).items():
            rows.append((i, kind, sql))
    flawed = executor.score([ScoreItem(examples[i].db_id, sql, preds[i], compare) for i, _, sql in rows])
    table = {kind: {"questions": 0, "right": 0, "mistake": 0} for kind in kinds}
    for (i, kind, _), r in zip(rows, flawed):
        table[kind]["questions"] += 1
        table[kind]["right"] += ok[i]
        table[kind]["mistake"] += r.match and not ok[i]
    return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--k", type=int, default=8, help="samples per question (0: greedy answers only)")
    ap.add_argument("--temperature", type=float, default=None, help="default: stage 1's training temperature")
    ap.add_argument("--fresh", type=int, default=200, help="fresh questions on the training databases (0: none)")
    ap.add_argument("--phases", nargs="+", default=None, help="default: every finished phase")
    ap.add_argument("--held-out", nargs="+", default=None, metavar="SET", help="default: every held-out set of the run")
    ap.add_argument("--flaws", nargs="+", default=None, choices=list(FLAWS),
                    help="mistake kinds to count (default: the run's data.sft_flaws, or all when it has none)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

    import torch

    from sirius_train.config import load_config
    from data_synthesis.checkpoints import load_model
    from sirius_train.schedule import prepare_data

    cfg = load_config(args.run_dir / "config.yaml", [f"output_dir={args.run_dir.parent}", f"name={args.run_dir.name}"])
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    data = prepare_data(cfg)
    temperature = cfg.stages[0].temperature if args.temperature is None else args.temperature
    max_new = max(s.max_new_tokens for s in cfg.stages)
    kinds = args.flaws or list(cfg.data.sft_flaws) or list(FLAWS)
    sets = {name: data.eval_sets[name] for name in args.held_out or data.eval_sets}
    if args.fresh:
        sets["fresh train-db"] = fresh_questions(cfg, data, args.fresh, cfg.seed + 20_000)
    phases = args.phases or ["sft", *(f"stage{i}" for i in range(1, len(cfg.stages) + 1))]
    report = {"run": str(args.run_dir), "k": args.k, "temperature": temperature, "phases": {}}
    with Executor(cfg.data.db_root, workers=0) as executor:
        for phase in phases:
            done = args.run_dir / phase / "DONE.json"
            if not done.is_file():
                continue
            model, tokenizer = load_model(Path(json.loads(done.read_text())["model"]), device="cpu",
                                          dtype=torch.float32)
            report["phases"][phase] = {
                name: phase_figures(model, tokenizer, examples, data, executor, k=args.k, temperature=temperature,
                                    max_new_tokens=max_new, flaw_kinds=kinds if name in data.eval_sets else [])
                for name, examples in sets.items()}
            print(phase, json.dumps(report["phases"][phase]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    print(markdown(report))


def markdown(report: dict) -> str:
    k, t = report["k"], report["temperature"]
    keys = ("greedy", "sampled", "pass_at_k", "maj_at_k") if k else ("greedy",)
    heads = ["greedy EX", f"sampled EX (T = {t})", f"pass@{k}", f"maj@{k}"][:len(keys)]
    lines = ["| phase | questions | " + " | ".join(heads) + " |", "|---|---|" + "---:|" * len(keys)]
    for phase, sets in report["phases"].items():
        for name, f in sets.items():
            lines.append(f"| {phase} | {name} | " + " | ".join(f"{100 * f[key]:.1f}" for key in keys) + " |")
    lines += ["", "| phase | questions | wrong | " + " | ".join(f"{k} wrong" for k in (*PARTS, "unparsable"))
              + " | right with a literal to copy | right without |", "|---|---|" + "---:|" * 8]
    for phase, sets in report["phases"].items():
        for name, f in sets.items():
            fail = f["failures"]
            (a, n_a), (b, n_b) = fail["by_literal"]["literal"], fail["by_literal"]["no literal"]
            lines.append(f"| {phase} | {name} | {fail['wrong']} | "
                         + " | ".join(str(fail["kinds"].get(k, 0)) for k in (*PARTS, "unparsable"))
                         + f" | {a} / {n_a} | {b} / {n_b} |")
    phases = list(report["phases"])
    held_out = [name for name, f in report["phases"][phases[0]].items() if "flaws" in f] if phases else []
    if held_out:
        lines += ["", "| taught mistake | held-out set | questions | "
                  + " | ".join(f"{p}: right / mistake" for p in phases) + " |", "|---|---|---:|" + "---:|" * len(phases)]
        for name in held_out:
            for kind, first in report["phases"][phases[0]][name]["flaws"].items():
                row = [f"{report['phases'][p][name]['flaws'][kind]['right']} / "
                       f"{report['phases'][p][name]['flaws'][kind]['mistake']}" for p in phases]
                lines.append(f"| {kind} | {name} | {first['questions']} | " + " | ".join(row) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
