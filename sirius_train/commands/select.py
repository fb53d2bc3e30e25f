"""`sirius select`: one SQL per question from a pool of candidates, by execution-grounded hybrid selection.

Contract (used by other tools): input lines `{"id", "db_id", "question", "candidates": [{"source", "sql"}]}`,
output lines in the same order `{"id", "sql", "source", "score"}`. Without `--llm-url` the result is fully
deterministic; with it, an LLM judge adds S_rm (and, with `--repair`, the corrector repairs failures and a
pool with no clean candidate left is asked afresh with condensed negative feedback: SPEC 4, step 4).
"""

from __future__ import annotations

from pathlib import Path

import typer

from rewards.compare import CompareMode
from sirius_train.commands import choices, one_line_errors
from sirius_train.progress import progress_bar, stderr

METHOD = choices("Method", ("hybrid", "majority"))  # pipeline.METHODS
RERANK = choices("Rerank", ("auto", "always", "never"))  # selector.RERANK_MODES
POOL_FIELDS = {"id": (str, int), "db_id": (str, int), "question": str, "candidates": list}


def read_pools(path: Path) -> list[dict]:
    """Pool lines, validated: every candidate needs a string `source` and a `sql` (string or null); ids unique.
    A bad line raises JsonlError naming the file and line."""
    from data_synthesis.jsonl import read_jsonl

    seen = set()

    def check(row: dict) -> dict:
        for k, cand in enumerate(row["candidates"]):
            if not isinstance(cand, dict) or not isinstance(cand.get("source"), str) or "sql" not in cand:
                raise ValueError(f"candidate {k} must be an object with 'source' and 'sql' ('source' a string), "
                                 f"got {cand!r:.80}")
            if cand["sql"] is not None and not isinstance(cand["sql"], str):
                raise ValueError(f"candidate {k}: 'sql' must be a string or null, got {cand['sql']!r:.40}")
        key = repr(row["id"])
        if key in seen:
            raise ValueError(f"duplicate id {row['id']!r}; ids must be unique so picks can be joined back")
        seen.add(key)
        return row

    return read_jsonl(path, required=POOL_FIELDS, parse=check)


def select_file(db_root: Path, input_path: Path, output_path: Path, *, config, method: str = "hybrid",
                llm_url: str | None = None, llm_model: str = "default", repair: bool = False,
                trace_path: Path | None = None, workers: int = 2, timeout: float = 5.0,
                show_progress: bool = True) -> list:
    """Run filter -> execute -> (repair) -> select over a pool file; writes picks (and traces); returns answers."""
    from data_synthesis.chat_client import ChatClient
    from rewards.executor import Executor
    from rewards.sandbox import Limits
    from sirius_train.inference.candidates import given
    from sirius_train.inference.corrector import Corrector
    from sirius_train.inference.judge import PairwiseJudge
    from sirius_train.inference.lifecycle import Lifecycle, LifecycleConfig
    from sirius_train.inference.pipeline import answer, make_task
    from data_synthesis.jsonl import write_jsonl

    pools = read_pools(input_path)
    tasks = [make_task(db_root, p["id"], str(p["db_id"]), str(p["question"]), given(p["candidates"]),
                       p.get("evidence")) for p in pools]
    client = ChatClient(llm_url, llm_model) if llm_url else None
    corrector = Corrector(client) if (client and repair) else None
    lifecycle_config = LifecycleConfig(structural_repair=repair)
    with Executor(db_root, workers=workers, limits=Limits(timeout_s=timeout)) as executor:
        stderr.print(f"select: {len(tasks)} questions, {sum(len(t.candidates) for t in tasks)} candidates; "
                     f"method={method}, compare={config.compare}, margin={config.margin}, "
                     f"partial_weight={config.partial_weight}, judge={'on' if client else 'off'}, "
                     f"repair={'on' if repair else 'off'}")
        lifecycle = Lifecycle(executor, corrector, recovery(corrector) if corrector else None, config=lifecycle_config)
        with stderr.status("filter, execute" + (", repair" if repair else "")):
            lifecycle.run(tasks)
        stderr.print(f"lifecycle: {lifecycle.summary()}")
        with progress_bar("selecting", len(tasks), show_progress) as advance:
            answers = answer(tasks, config, method, PairwiseJudge(client) if client else None, advance)
    if unjudged := sum(a.judge_error is not None for a in answers):
        stderr.print(f"[yellow]warning:[/] the judge at {llm_url} failed on {unjudged} of {len(answers)} questions; "
                     "those were selected with S_rm = 0 (the trace's judge_error says why)")
    write_jsonl(output_path, (a.pick() for a in answers))
    if trace_path is not None:
        write_jsonl(trace_path, (a.trace() for a in answers))
    return answers


RECOVERY_SOURCE = "recovery_llm"  # provenance of the candidates the LLM writes when a pool has collapsed


def recovery(corrector):
    """The lifecycle's recovery step for given pools (SPEC 4, step 4): when no clean candidate is left, the
    LLM behind `--llm-url` is asked afresh with condensed negative feedback on what failed and how."""
    from sirius_train.inference.candidates import Candidate

    def recover(question, feedback: str, n: int):
        sqls = corrector.recover(question, feedback, n)
        candidates = [Candidate(RECOVERY_SOURCE, k, sql, "recovery") for k, sql in enumerate(sqls)]
        for c in candidates:
            c.record("generate", source=RECOVERY_SOURCE, origin="recovery", sql_found=True)
        return candidates

    return recover


def register(app: typer.Typer) -> None:
    @app.command()
    def select(
        db_root: Path = typer.Option(..., "--db-root", help="folder with <db_id>/<db_id>.sqlite", exists=True,
                                     file_okay=False),
        input: Path = typer.Option(..., "--input", help='JSONL pools: {"id","db_id","question","candidates":[{"source","sql"}]}'),
        output: Path = typer.Option(..., "--output", help='JSONL picks: {"id","sql","source","score"}'),
        llm_url: str = typer.Option(None, "--llm-url", help="OpenAI-compatible endpoint for the S_rm judge (and --repair)"),
        llm_model: str = typer.Option("default", "--llm-model", help="model name sent to --llm-url"),
        compare: CompareMode = typer.Option(CompareMode.BIRD, "--compare", help="result equivalence for answer classes"),
        method: METHOD = typer.Option(METHOD("hybrid"), "--method",
                                      help="hybrid (S_maj + S_rm + gated reranker) or majority"),
        margin: float = typer.Option(None, "--margin", help="gate: near-tie margin of S_coarse (0 = reranker off)"),
        partial_weight: float = typer.Option(None, "--partial-weight", help="weight of partial row agreement in S_maj"),
        rerank: RERANK = typer.Option(None, "--rerank", help="structural reranker: never (default, docs/INFERENCE.md) "
                                      "| auto (when some source gave several candidates) | always"),
        repair: bool = typer.Option(False, "--repair/--no-repair",
                                    help="typed repair before selecting: structural operators, plus the LLM with --llm-url "
                                         "(corrector, and recovery when no clean candidate is left)"),
        trace: Path = typer.Option(None, "--trace", help="also write per-question traces (JSONL)"),
        timeout: float = typer.Option(5.0, "--timeout", help="seconds per query, enforced inside SQLite"),
        workers: int = typer.Option(2, "--workers", help="sandboxed worker processes (0 = in-process)"),
        quiet: bool = typer.Option(False, "--quiet", help="no progress bars"),
    ):
        """Pick one SQL per question from candidate pools (execution-grounded hybrid selection)."""
        from collections import Counter

        from sirius_train.inference.selector import SelectorConfig

        with one_line_errors():
            defaults = SelectorConfig()
            config = SelectorConfig(compare=compare.value,
                                    margin=defaults.margin if margin is None else margin,
                                    partial_weight=defaults.partial_weight if partial_weight is None else partial_weight,
                                    rerank=defaults.rerank if rerank is None else rerank.value)
            answers = select_file(db_root, input, output, config=config, method=method.value, llm_url=llm_url,
                                  llm_model=llm_model, repair=repair, trace_path=trace, workers=workers,
                                  timeout=timeout, show_progress=not quiet)
        decided = Counter(a.selection.decided_by for a in answers)
        stderr.print(f"wrote {len(answers)} picks to {output}; decided by: "
                     + ", ".join(f"{k} {v}" for k, v in decided.most_common()))
