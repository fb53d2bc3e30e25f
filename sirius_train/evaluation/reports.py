"""Execution accuracy (EX) of prediction files: overall, per difficulty bucket, per database.

Predictions are scored by `rewards.executor.Executor` -- the same sandbox, the same equivalence
(`bird` or `spider`), the same code path as the training reward -- so a number in a report and a reward
in training can never disagree. Three input layouts:

- ours (JSONL): prediction lines `{"id", "sql"}` (also `pred_sql`; `sirius select` / `sirius infer`
  output works as is), gold lines `{"id", "db_id", "gold_sql"}` (also `sql` / `SQL` / `query`),
  optionally `difficulty`; joined by `id`.
- BIRD: `predict_dev.json` (`{"0": "SQL\\t----- bird -----\\tdb_id", ...}`), gold `dev.json` (with
  `difficulty`) or `dev.sql` (`SQL\\tdb_id` lines); paired by position -- the entries' order in the file, whatever
  their keys, as BIRD's `package_sqls` reads them.
- Spider: `pred.sql` (one query a line), gold `dev_gold.sql` (`SQL\\tdb_id` lines); paired by position.

The official layouts are read as the official scripts read them, quirks included (docs/METRICS.md): in BIRD's a
null entry runs as " " and an entry with no statement (empty, comments only) gives no rows, so it is right where
the gold's result is empty; an entry with the separator twice runs whole (and fails). In Spider's each line is cut
at its first TAB and ` value ` becomes ` 1 `.

Buckets: the gold's `difficulty` (BIRD: simple / moderate / challenging) when there is one, from the
gold file or `difficulty_file` (paired by id where the gold and the file both have ids, else by position, as
BIRD's scripts pair mini-dev's JSONL; a file that leaves a question out is refused, never silently replaced);
otherwise Spider's hardness of the gold SQL (`sirius_train.evaluation.hardness`).
Reports are written as JSON, Markdown and a PNG chart. Beside EX, a report carries the official metrics it
was given per question (`sirius_train.evaluation.official_metrics`): R-VES and Soft-F1 (BIRD), test-suite accuracy,
EX on variant databases -- each overall, per bucket and per database.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from data_synthesis.jsonl import JsonlError, read_json, read_jsonl, read_text
from rewards.scoring import ScoreItem, ScoreResult
from sirius_train.evaluation.hardness import BUCKETS as SPIDER_BUCKETS, spider_hardness
from sirius_train.evaluation.official_metrics import printed

BIRD_SEPARATOR = "\t----- bird -----\t"
NO_ROWS_SQL = "SELECT 1 WHERE 0"  # what sqlite3 gives for a string without a statement: no rows
BIRD_BUCKETS = ("simple", "moderate", "challenging")
FORMATS = ("jsonl", "bird", "spider")
GOLD_SQL_KEYS = ("gold_sql", "sql", "SQL", "query")
ID_FIELD = {"id": (str, int)}  # predictions are joined to gold by id: it must be hashable and comparable


class EvaluationInputError(ValueError):
    """A prediction or gold file that cannot be read as the format says; the message names file and line."""


@dataclass(frozen=True)
class EvalItem:
    id: object
    db_id: str
    gold_sql: str
    pred_sql: str | None  # None: no prediction for this question (counts as wrong)
    bucket: str


def detect_format(pred_path: Path) -> str:
    """`jsonl` for .jsonl, `bird` for .json, `spider` otherwise (.sql / .txt).

    Example:
        >>> detect_format(Path("predict_dev.json")), detect_format(Path("pred.sql")), detect_format(Path("p.jsonl"))
        ('bird', 'spider', 'jsonl')
    """
    suffix = pred_path.suffix.lower()
    return {".jsonl": "jsonl", ".json": "bird"}.get(suffix, "spider")


def load_items(pred_path: Path, gold_path: Path, fmt: str = "auto", difficulty_path: Path | None = None) -> list[EvalItem]:
    """Pair predictions with gold in any of the three layouts; buckets attached."""
    fmt = detect_format(pred_path) if fmt == "auto" else fmt
    if fmt not in FORMATS:
        raise EvaluationInputError(f"unknown format {fmt!r}; use one of {FORMATS} or 'auto'")
    gold = _read_gold(gold_path)
    difficulty = _pair_difficulty(gold, gold_path, difficulty_path) if difficulty_path else {}
    if fmt == "jsonl":
        preds = _read_jsonl_predictions(pred_path)
        known = {g["id"] for g in gold}
        stray = [k for k in preds if k not in known]
        if stray:
            raise EvaluationInputError(f"{pred_path}: {len(stray)} prediction id(s) not in {gold_path}, e.g. {stray[:3]}")
        pairs = [(g, preds.get(g["id"])) for g in gold]
    else:
        preds = _read_bird_predictions(pred_path) if fmt == "bird" else [_spider_line(line) for line in _read_lines(pred_path)]
        if len(preds) > len(gold):
            raise EvaluationInputError(f"{pred_path}: {len(preds)} predictions for {len(gold)} gold queries in {gold_path}")
        pairs = [(g, preds[i] if i < len(preds) else None) for i, g in enumerate(gold)]
    items = []
    for g, pred in pairs:
        bucket = difficulty.get(g["id"]) or g.get("difficulty") or spider_hardness(g["sql"])
        items.append(EvalItem(g["id"], g["db_id"], g["sql"], pred, str(bucket)))
    return items


def score_items(items: list[EvalItem], db_root: Path, compare: str, *, workers: int = 2, timeout_s: float = 30.0,
                on_result=None, limits=None) -> list[ScoreResult]:
    """Execute and compare every item in the sandboxed executor (None predictions are format failures); `limits`
    (`official_eval.official_limits` for the official layouts) default to the reward's, with `timeout_s`."""
    from rewards.executor import Executor
    from rewards.sandbox import Limits

    score = [ScoreItem(it.db_id, it.gold_sql, it.pred_sql, compare, id=k) for k, it in enumerate(items)]
    with Executor(db_root, workers=workers, limits=limits or Limits(timeout_s=timeout_s)) as executor:
        return executor.score(score, on_result=on_result)


# per-question metrics a report may carry, by name -> title (means shown as the official scripts print them:
# official_metrics.printed, as `sirius benchmark` shows them too)
METRICS = {"ex_official": "EX (official)", "r_ves": "R-VES", "soft_f1": "Soft-F1", "ts": "TS",
           "ex_variants": "EX+variants"}


def ex_report(items: list[EvalItem], results: list[ScoreResult], compare: str,
              metrics: dict[str, list[float]] | None = None) -> dict:
    """EX overall, per bucket and per database, with execution status counts; with `metrics` (per question: R-VES's
    sqrt(reward), Soft-F1, test-suite or variant match), their means beside EX. Pure.

    Example:
        >>> items = [EvalItem(1, "a", "q", "q", "easy"), EvalItem(2, "a", "q", None, "hard"), EvalItem(3, "b", "q", "x", "easy")]
        >>> results = [ScoreResult(0, True, 1.0, "ok", "ok"), ScoreResult(1, False, -1.0, "rejected", "ok", format_ok=False),
        ...            ScoreResult(2, False, 0.0, "error", "ok")]
        >>> r = ex_report(items, results, "bird")
        >>> r["ex"], r["buckets"]["easy"], r["databases"]["b"]["ex"], r["missing"]
        (0.3333333333333333, {'n': 2, 'correct': 1, 'ex': 0.5}, 0.0, 1)
    """
    metrics = metrics or {}

    def summary(at: list[int]) -> dict:  # means unrounded: a report rounds once, where it prints
        n = len(at)
        correct = sum(results[k].match for k in at)
        out = {"n": n, "correct": correct, "ex": correct / n if n else 0.0}
        for name, values in metrics.items():
            out[name] = sum(values[k] for k in at) / n if n else 0.0
        return out

    everyone = range(len(items))
    buckets = {b: summary([k for k in everyone if items[k].bucket == b])
               for b in _bucket_order({it.bucket for it in items})}
    databases = {db: summary([k for k in everyone if items[k].db_id == db]) for db in sorted({it.db_id for it in items})}
    overall = summary(list(everyone))
    return {"compare": compare, **overall, "missing": sum(it.pred_sql is None for it in items),
            "buckets": buckets, "databases": databases,
            "pred_status": dict(Counter(r.pred_status for r in results)),
            "gold_failures": sum(r.gold_status not in ("ok", "empty") for r in results)}


def write_report(report: dict, out_dir: Path, name: str = "eval") -> list[Path]:
    """`<name>.json`, `<name>.md` and `<name>.png` under `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{name}.json", out_dir / f"{name}.md", out_dir / f"{name}.png"]
    paths[0].write_text(json.dumps(report, indent=2) + "\n")
    paths[1].write_text(markdown_report(report))
    _plot(report, paths[2])
    return paths


def markdown_report(report: dict) -> str:
    """A readable report: the headline, then a table per bucket and per database.

    Example:
        >>> print(markdown_report({"compare": "bird", "n": 2, "correct": 1, "ex": 0.5, "missing": 0, "gold_failures": 0,
        ...     "buckets": {"easy": {"n": 2, "correct": 1, "ex": 0.5}}, "databases": {}}).splitlines()[0])
        # Execution accuracy (bird): 50.00% (1/2)
    """
    lines = [f"# Execution accuracy ({report['compare']}): {100 * report['ex']:.2f}% ({report['correct']}/{report['n']})",
             ""]
    shown = [m for m in METRICS if m in report]
    if shown:
        lines += [", ".join(f"{METRICS[m]} {printed(report[m])}" for m in shown), ""]
    if report.get("missing"):
        lines += [f"{report['missing']} question(s) had no prediction and count as wrong.", ""]
    if report.get("gold_failures"):
        lines += [f"Warning: {report['gold_failures']} gold query(ies) did not execute; those count as wrong.", ""]
    for title, key in (("Difficulty", "buckets"), ("Database", "databases")):
        if not report[key]:
            continue
        lines += [f"| {title} | n | correct | EX |" + "".join(f" {METRICS[m]} |" for m in shown),
                  "|---|---:|---:|---:|" + "---:|" * len(shown)]
        lines += [f"| {k} | {v['n']} | {v['correct']} | {100 * v['ex']:.2f}% |" +
                  "".join(f" {printed(v[m])} |" for m in shown) for k, v in report[key].items()]
        lines.append("")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- readers
def _read_gold(path: Path) -> list[dict]:
    """Gold as dicts with id, db_id, sql (+ difficulty when present), from any supported layout."""
    if not path.is_file():
        raise EvaluationInputError(f"{path}: no such gold file")
    if path.suffix.lower() == ".jsonl":
        try:
            return read_jsonl(path, required=ID_FIELD | {"db_id": None}, parse=lambda r: _gold_row(r, r["id"]))
        except JsonlError as e:
            raise EvaluationInputError(str(e)) from None
    if path.suffix.lower() == ".json":
        data = _read_json(path)
        if not isinstance(data, list):
            raise EvaluationInputError(f"{path}: expected a JSON list of questions (BIRD dev.json layout)")
        gold = []
        for k, r in enumerate(data):
            try:
                gold.append(_gold_row(r, r.get("question_id", k) if isinstance(r, dict) else k))
            except ValueError as e:
                raise EvaluationInputError(f"{data.where(k)}: {e}") from None
        return gold
    gold = []
    for k, line in enumerate(_read_lines(path)):
        sql, sep, db_id = line.rstrip("\n").rpartition("\t")
        if not sep or not sql.strip() or not db_id.strip():
            raise EvaluationInputError(f"{path}:{k + 1}: expected 'SQL<TAB>db_id', got {line[:80]!r}")
        gold.append({"id": k, "db_id": db_id.strip(), "sql": sql.strip()})
    return gold


def _gold_row(row, ident) -> dict:
    """One gold entry; a ValueError names what is missing (the caller adds file and line)."""
    if not isinstance(row, dict):
        raise ValueError(f"a gold entry is an object, got {type(row).__name__}")
    sql = next((row[k] for k in GOLD_SQL_KEYS if isinstance(row.get(k), str)), None)
    if sql is None or "db_id" not in row:
        raise ValueError(f"a gold entry needs db_id and one of {list(GOLD_SQL_KEYS)} as a string")
    if not isinstance(ident, (str, int)) or isinstance(ident, bool):
        raise ValueError(f"an id is a string or an integer (predictions are joined by it), got {ident!r:.40}")
    out = {"id": ident, "db_id": str(row["db_id"]), "sql": sql}
    if row.get("difficulty"):
        out["difficulty"] = str(row["difficulty"])
    return out


def _read_jsonl_predictions(path: Path) -> dict:
    preds = {}

    def add(r: dict) -> None:
        sql = r.get("sql", r.get("pred_sql"))
        if sql is not None and not isinstance(sql, str):
            raise ValueError(f"'sql' must be a string or null, got {type(sql).__name__}")
        if r["id"] in preds:
            raise ValueError(f"duplicate prediction id {r['id']!r}")
        preds[r["id"]] = sql

    try:
        read_jsonl(path, required=ID_FIELD, parse=add)
    except JsonlError as e:
        raise EvaluationInputError(str(e)) from None
    return preds


def _read_bird_predictions(path: Path) -> list[str]:
    """The entries' SQL in file order, as BIRD's `package_sqls` reads them: the part before the one separator
    (unstripped), else the whole entry stripped; a non-string entry is " ". No statement: `NO_ROWS_SQL`."""
    data = _read_json(path)
    if not isinstance(data, dict):
        raise EvaluationInputError(f"{path}: expected a JSON object {{\"0\": \"SQL\\t----- bird -----\\tdb_id\"}}")
    preds = []
    for value in data.values():
        if not isinstance(value, str):
            value = " "
        parts = value.split(BIRD_SEPARATOR)
        sql = parts[0] if len(parts) == 2 else value.strip()
        preds.append(NO_ROWS_SQL if _no_statement(sql) else sql)
    return preds


def _spider_line(line: str) -> str | None:
    """A prediction line as the test-suite evaluator reads it: stripped, cut at its first TAB, ` value ` -> ` 1 `."""
    sql = line.strip().split("\t")[0].replace(" value ", " 1 ")
    return sql or None


def _no_statement(sql: str) -> bool:
    """True for a string sqlite3 runs as nothing (whitespace, comments, semicolons): it returns no rows.

    Example:
        >>> [_no_statement(s) for s in (" ", "-- none", "/* x */ ;", "SELECT 1", "SELECT '--'")]
        [True, True, True, False, False]
    """
    from sqlglot.dialects.sqlite import SQLite
    from sqlglot.errors import SqlglotError
    from sqlglot.tokens import TokenType

    try:
        return all(t.token_type is TokenType.SEMICOLON for t in SQLite().tokenize(sql))
    except (SqlglotError, ValueError):
        return False


def _pair_difficulty(gold: list[dict], gold_path: Path, path: Path) -> dict:
    """gold id -> difficulty from a BIRD dev.json or a JSONL (mini-dev's): by id (`question_id` / `id`) where the gold
    file and every entry have one, else by position; a question left without one is refused."""
    entries = _read_difficulty(path)
    by_id = gold_path.suffix.lower() in (".json", ".jsonl") and all(key is not None for key, _ in entries)
    if by_id:
        difficulty = dict(entries)
        missing = [g["id"] for g in gold if g["id"] not in difficulty]
        if missing:
            raise EvaluationInputError(f"{path}: no difficulty for {len(missing)} gold question(s) of {gold_path}, "
                                       f"e.g. id {missing[0]!r}")
        return difficulty
    if len(entries) != len(gold):
        raise EvaluationInputError(f"{path}: {len(entries)} difficulties for {len(gold)} gold queries in {gold_path} "
                                   "(they pair by position, as BIRD's scripts pair them)")
    return {g["id"]: d for g, (_, d) in zip(gold, entries)}


def _read_difficulty(path: Path) -> list[tuple[object, str]]:
    """(id or None, difficulty) per entry, in file order: a BIRD dev.json, or a JSONL with `difficulty`."""
    if path.suffix.lower() == ".jsonl":
        try:
            rows = read_jsonl(path, required=("difficulty",))
        except JsonlError as e:
            raise EvaluationInputError(str(e)) from None
    else:
        rows = _read_json(path)
        if not isinstance(rows, list) or not all(isinstance(r, dict) and "difficulty" in r for r in rows):
            raise EvaluationInputError(f"{path}: expected a JSON list of objects with 'difficulty' (BIRD dev.json)")
    return [(r.get("question_id", r.get("id")), str(r["difficulty"])) for r in rows]


def _read_json(path: Path):
    try:
        return read_json(path)
    except JsonlError as e:
        raise EvaluationInputError(str(e)) from None


def _read_lines(path: Path) -> list[str]:
    try:
        return read_text(path).splitlines()
    except JsonlError as e:
        raise EvaluationInputError(str(e)) from None


def _bucket_order(buckets: set[str]) -> list[str]:
    known = [b for b in SPIDER_BUCKETS + BIRD_BUCKETS if b in buckets]
    return known + sorted(buckets - set(known))


def _plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = [("by difficulty", report["buckets"]), ("by database", report["databases"])]
    widths = [max(len(g), 1) for _, g in groups]
    fig, axes = plt.subplots(1, 2, figsize=(4 + 0.6 * sum(widths), 4), gridspec_kw={"width_ratios": widths})
    for ax, (title, group) in zip(axes, groups):
        names = list(group)
        values = [100 * group[k]["ex"] for k in names]
        bars = ax.bar(range(len(names)), values, color="#4C72B0")
        for bar, k in zip(bars, names):
            ax.text(bar.get_x() + bar.get_width() / 2, bar.get_height() + 1, f"n={group[k]['n']}", ha="center",
                    fontsize=7)
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, rotation=45, ha="right", fontsize=8)
        ax.set_ylim(0, 110)
        ax.set_title(f"EX {title}")
        ax.axhline(100 * report["ex"], color="gray", linestyle="--", linewidth=1)
    axes[0].set_ylabel(f"EX (%), {report['compare']} equivalence")
    fig.suptitle(f"Execution accuracy {100 * report['ex']:.2f}% over {report['n']} questions")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
