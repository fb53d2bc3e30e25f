"""`sirius infer`: question(s) + database -> complementary candidates -> lifecycle -> hybrid selection.

The specialist is a local Hugging Face model folder or any OpenAI-compatible server (vLLM); the
generalist is any OpenAI-compatible chat model, prompted with worked examples. The LLM behind
`--llm-url` (by default the generalist) repairs failed candidates and judges near-equal answers.
Output lines: `{"id", "sql", "source", "score", "db_id", "question", "decided_by", "why", "status",
"row_count", "preview"}`; the trace file holds every candidate's lifecycle and the selector's scores.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path

import typer

from rewards.compare import CompareMode
from sirius_train.commands import one_line_errors
from sirius_train.commands.prompt_options import (CONFIG, MULTI_TURN, SCHEMA_SAMPLES, SCHEMA_STYLE, SYSTEM_PROMPT,
                                                  resolve_format)
from sirius_train.commands.threads import THREADS, torch_threads
from sirius_train.progress import progress_bar, stderr

QUESTION_FIELDS = {"db_id": str, "question": str}
GENERATION_CHUNK = 16  # questions per sampler call: big enough to batch, small enough for a live progress bar


def read_questions(path: Path | None, db_id: str | None, question: str | None) -> list[dict]:
    """Questions from `--input` (JSONL with db_id, question, optional id / evidence) or one from the flags."""
    from data_synthesis.jsonl import read_jsonl

    if (path is None) == (question is None):
        raise ValueError("give either --input QUESTIONS.jsonl or --question TEXT (with --db-id), not both")
    if path is not None:
        rows = read_jsonl(path, required=QUESTION_FIELDS, parse=_evidence_checked)
        return [{"id": r.get("id", k), "db_id": r["db_id"], "question": r["question"],
                 "evidence": r.get("evidence")} for k, r in enumerate(rows)]
    if not db_id:
        raise ValueError("--question needs --db-id (the database under --db-root to ask)")
    return [{"id": 0, "db_id": db_id, "question": question, "evidence": None}]


def _evidence_checked(row: dict) -> dict:
    if not isinstance(row.get("evidence") or "", str):
        raise ValueError(f"field 'evidence' must be a string or null, got {row['evidence']!r:.40}")
    return row


def read_few_shot(path: Path | None):
    """Worked examples for the generalist: JSONL {question, schema, sql}; the built-in ones by default."""
    from sirius_train.inference.candidates import DEFAULT_FEW_SHOT, Example
    from data_synthesis.jsonl import read_jsonl

    if path is None:
        return DEFAULT_FEW_SHOT
    return tuple(Example(str(r["question"]), str(r["schema"]), str(r["sql"]))
                 for r in read_jsonl(path, required={"question": str, "schema": str, "sql": str}))


def specialist_sampler(specialist: str, model_name: str | None):
    """A URL means an OpenAI-compatible server (vLLM); anything else is a local HF model folder (a run folder
    is named as one, with its phases' models)."""
    from data_synthesis.samplers import HFSampler, OpenAISampler
    from sirius_train.evaluation.benchmark import BenchmarkError, check_model_folder, run_phases

    if specialist.startswith(("http://", "https://")):
        if not model_name:
            raise ValueError("--specialist is a URL: also give --specialist-model (the name the server serves)")
        return OpenAISampler(specialist, model_name)
    if (Path(specialist) / "config.yaml").is_file():
        try:
            phases = run_phases(Path(specialist))
        except BenchmarkError:
            phases = []
        models = "; ".join(f"{phase}: {path}" for phase, path in phases) or "none finished yet"
        raise ValueError(f"--specialist {specialist} is a run folder, not a model; its phase models are {models} "
                         "(the last phase's is the trained specialist)")
    check_model_folder(Path(specialist))
    return HFSampler(specialist)


def too_long(generator, question) -> str | None:
    """Why `question`'s prompt cannot go to `generator`'s local model (None when it fits or the context is
    unknown, as behind a server): it would fill the model's context before the first answer token (a 23k-character
    question ran 2 minutes on the nano model for a null answer)."""
    from data_synthesis.prompts import chat_text
    from data_synthesis.samplers import EpisodeSampler, HFSampler
    from sirius_train.inference.candidates import build_prompt

    sampler = generator.sampler.sampler if isinstance(generator.sampler, EpisodeSampler) else generator.sampler
    context = getattr(sampler.model.config, "max_position_embeddings", None) if isinstance(sampler, HFSampler) \
        else None
    if context is None:
        return None
    prompt = build_prompt(question, generator.few_shot, None, generator.prompt_format)
    text = chat_text(sampler.tokenizer, prompt)  # verbose=False: no transformers warning, this check says it
    tokens = len(sampler.tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])
    if tokens < context:
        return None
    return (f"the prompt is {tokens} tokens, the {generator.name}'s context {context}: no room for an answer "
            "(shorten the question or its evidence)")


def infer_questions(db_root: Path, questions: list[dict], generators, *, config, llm_url: str | None,
                    llm_model: str | None, seed: int, workers: int, timeout: float, recovery: bool = True,
                    show_progress: bool = True, quiet: bool = False):
    """Generate, run the lifecycle and select for every question that fits its generators; returns
    (`pipeline.Answer`s, {position: why} of the questions whose prompt a local model cannot hold)."""
    from data_synthesis.chat_client import ChatClient
    from rewards.executor import Executor
    from rewards.sandbox import Limits
    from sirius_train.inference.candidates import generate
    from sirius_train.inference.corrector import Corrector
    from sirius_train.inference.judge import PairwiseJudge
    from sirius_train.inference.lifecycle import Lifecycle
    from sirius_train.inference.pipeline import answer, make_task

    tasks = [make_task(db_root, q["id"], q["db_id"], q["question"], [], q.get("evidence")) for q in questions]
    # a generator whose local model cannot hold a question's prompt skips it; no generator at all: refused
    skips = [{id(t): why for t in tasks if (why := too_long(g, t.question))} for g in generators]
    refused = {i: "; ".join(s[id(t)] for s in skips) for i, t in enumerate(tasks) if all(id(t) in s for s in skips)}
    tasks = [t for i, t in enumerate(tasks) if i not in refused]
    with progress_bar("generating", len(generators) * len(tasks), show_progress) as advance:
        for generator, skip in zip(generators, skips):
            for start in range(0, len(tasks), GENERATION_CHUNK):
                chunk = [t for t in tasks[start:start + GENERATION_CHUNK] if id(t) not in skip]
                for task, pool in zip(chunk, generate([generator], [t.question for t in chunk], seed + start)):
                    task.candidates.extend(pool)
                advance(len(tasks[start:start + GENERATION_CHUNK]))
    client = ChatClient(llm_url, llm_model or "default") if llm_url else None

    def recover(question, feedback: str, n: int):
        fewer = [replace(g, n=n) for g in generators if too_long(g, question) is None]
        return generate(fewer, [question], seed + 7, {0: feedback}, origin="recovery")[0] if fewer else []

    with Executor(db_root, workers=workers, limits=Limits(timeout_s=timeout)) as executor:
        lifecycle = Lifecycle(executor, Corrector(client) if client else None, recover if recovery else None)
        with nullcontext() if quiet else stderr.status("lifecycle: filter, execute, repair, recovery"):
            lifecycle.run(tasks)
        if not quiet:
            stderr.print(f"lifecycle: {lifecycle.summary()}")
    with progress_bar("selecting", len(tasks), show_progress) as advance:
        return answer(tasks, config, "hybrid", PairwiseJudge(client) if client else None, advance), refused


def refused_line(q: dict, why: str) -> dict:
    """The output line of a question no generator could take: the documented fields, no SQL, status too_long."""
    return {"id": q["id"], "sql": None, "source": None, "score": 0.0, "db_id": q["db_id"], "question": q["question"],
            "decided_by": "too_long", "why": why, "status": "too_long", "row_count": None, "preview": None}


def register(app: typer.Typer) -> None:
    @app.command()
    def infer(
        db_root: Path = typer.Option(..., "--db-root", help="folder with <db_id>/<db_id>.sqlite", exists=True,
                                     file_okay=False),
        output: Path = typer.Option(..., "--output", help="answers JSONL (one line per question)"),
        specialist: str = typer.Option(..., "--specialist", help="local HF model folder, or an OpenAI-compatible URL"),
        input: Path = typer.Option(None, "--input", help="questions JSONL: {id?, db_id, question, evidence?}"),
        db_id: str = typer.Option(None, "--db-id", help="database of --question"),
        question: str = typer.Option(None, "--question", help="one question (with --db-id)"),
        specialist_model: str = typer.Option(None, "--specialist-model", help="model name when --specialist is a URL"),
        n_specialist: int = typer.Option(4, "--n-specialist", help="specialist samples per question"),
        generalist_url: str = typer.Option(None, "--generalist-url", help="OpenAI-compatible endpoint of the generalist"),
        generalist_model: str = typer.Option("default", "--generalist-model", help="generalist model name"),
        n_generalist: int = typer.Option(2, "--n-generalist", help="generalist samples per question"),
        few_shot: Path = typer.Option(None, "--few-shot", help="JSONL {question, schema, sql} worked examples"),
        llm_url: str = typer.Option(None, "--llm-url", help="corrector + judge endpoint (default: the generalist's)"),
        llm_model: str = typer.Option(None, "--llm-model", help="corrector + judge model (default: the generalist's)"),
        temperature: float = typer.Option(0.7, "--temperature", help="sampling temperature of both generators"),
        max_new_tokens: int = typer.Option(512, "--max-new-tokens", help="longest candidate, in tokens"),
        compare: CompareMode = typer.Option(CompareMode.BIRD, "--compare", help="result equivalence for answer classes"),
        margin: float = typer.Option(None, "--margin", help="gate: near-tie margin of S_coarse (0 = reranker off)"),
        trace: Path = typer.Option(None, "--trace", help="trace JSONL (default: <output>.trace.jsonl)"),
        recovery: bool = typer.Option(True, "--recovery/--no-recovery", help="re-ask when a question's pool collapses"),
        seed: int = typer.Option(0, "--seed", help="seed of the sampled candidates (recovery's included)"),
        timeout: float = typer.Option(5.0, "--timeout", help="seconds per query, enforced inside SQLite"),
        workers: int = typer.Option(2, "--workers", help="sandboxed worker processes (0 = in-process)"),
        quiet: bool = typer.Option(False, "--quiet", help="errors and the final line only"),
        threads: int = THREADS,
        config: Path = CONFIG, schema_style: str = SCHEMA_STYLE, schema_samples: int = SCHEMA_SAMPLES,
        system_prompt: str = SYSTEM_PROMPT, multi_turn: int = MULTI_TURN,
    ):
        """Answer questions end to end: specialist + generalist candidates, typed repair, hybrid selection."""
        from data_synthesis.jsonl import write_jsonl
        from data_synthesis.samplers import OpenAISampler
        from sirius_train.inference.candidates import Generator
        from sirius_train.inference.selector import SelectorConfig

        with one_line_errors():
            questions = read_questions(input, db_id, question)
            fmt = resolve_format(specialist, config, schema_style, schema_samples, system_prompt)
            if quiet and not specialist.startswith(("http://", "https://")):
                from transformers.utils import logging as hf_logging

                hf_logging.disable_progress_bar()  # its "Loading weights" bar is 3 lines on a pipe
            sampler = specialist_sampler(specialist, specialist_model)
            if multi_turn:
                from data_synthesis.interaction import ProbeLimits
                from data_synthesis.samplers import EpisodeSampler

                sampler = EpisodeSampler(sampler, ProbeLimits(max_turns=multi_turn), db_root)
            generators = [Generator("specialist", sampler, n_specialist, temperature, max_new_tokens=max_new_tokens,
                                    prompt_format=fmt)]
            if generalist_url:
                generators.append(Generator("generalist", OpenAISampler(generalist_url, generalist_model), n_generalist,
                                            temperature, max_new_tokens=max_new_tokens, few_shot=read_few_shot(few_shot)))
            config = SelectorConfig(compare=compare.value, margin=SelectorConfig().margin if margin is None else margin)
            if not quiet:
                stderr.print(f"infer: {len(questions)} question(s); generators: "
                             + ", ".join(f"{g.name} x{g.n}" for g in generators)
                             + f"; corrector/judge: {llm_url or generalist_url or 'none (LLM repair and S_rm off)'}")
            local = not specialist.startswith(("http://", "https://"))
            with torch_threads(threads) if local else nullcontext():
                answers, refused = infer_questions(
                    db_root, questions, generators, config=config, llm_url=llm_url or generalist_url,
                    llm_model=llm_model or (generalist_model if generalist_url else None), seed=seed, workers=workers,
                    timeout=timeout, recovery=recovery, show_progress=not quiet, quiet=quiet)
            results, traces = iter([a.result() for a in answers]), iter([a.trace() for a in answers])
            lines = [refused_line(q, refused[i]) if i in refused else next(results) for i, q in enumerate(questions)]
            trace_lines = [{**refused_line(q, refused[i]), "candidates": []} if i in refused else next(traces)
                           for i, q in enumerate(questions)]
            trace_path = trace or output.with_name(output.stem + ".trace.jsonl")
            write_jsonl(output, lines)
            write_jsonl(trace_path, trace_lines)
        if not quiet:
            for line in lines:
                stderr.print(f"[bold]{line['id']}[/] {line['sql']}\n    {line['why']}")
        stderr.print(f"wrote {output} ({len(lines)} answers, {len(refused)} too long for the model) and {trace_path}",
                     soft_wrap=True)
