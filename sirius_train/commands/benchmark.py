"""`sirius benchmark`: greedy EX, maj@k, pass@k (and selected EX) of checkpoints, per bucket and database.

    sirius benchmark --run runs/demo
    sirius benchmark --model runs/demo/stage2/model --model http://127.0.0.1:8000/v1 --served-model qwen \\
        --questions dev.json --db-root dev_databases --format bird --k 8 --lifecycle

Outputs under `--out`: `<name>.json` / `.md` / `.png`, and per model the greedy answers in the official
layouts (`<name>.<model>.pred.sql`, `<name>.<model>.predict_dev.json`) for `sirius evaluate` or the
official evaluators. Cached per chunk of questions (`<name>.cache/`): a killed benchmark resumes.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from pathlib import Path

import typer

from sirius_train.commands import one_line_errors
from sirius_train.commands.prompt_options import (CONFIG, MULTI_TURN, SCHEMA_SAMPLES, SCHEMA_STYLE, SYSTEM_PROMPT,
                                                  resolve_format)
from sirius_train.commands.threads import THREADS, torch_threads
from sirius_train.progress import heartbeat, progress_bar, stderr

DEFAULT_TEMPERATURE = 0.8  # for a model whose card names no training temperature
DEFAULT_MAX_NEW_TOKENS = 512


def model_specs(models: list[str], run: Path | None, engine: str, served_model: str | None, config: Path | None,
                temperature: float | None, max_new_tokens: int | None, prompt_flags: dict, base: bool = False):
    """What to benchmark: every trained phase of `--run` (and its untrained `base` with `base`), then each
    `--model`, each with its prompt format and sampling."""
    from data_synthesis.model_card import read_card
    from sirius_train.evaluation.benchmark import ENGINES, BenchmarkError, ModelSpec, check_model_folder, file_label, run_phases

    if engine not in ENGINES:
        raise BenchmarkError(f"--engine {engine!r}: use one of {', '.join(ENGINES)}")
    sources = [(phase, str(path)) for phase, path in run_phases(run) if base or phase != "base"] if run else []
    sources += [(None, m) for m in models]
    if not sources:
        raise BenchmarkError("nothing to benchmark: give --model PATH|URL (repeatable) or --run RUN_DIR")
    specs, labels = [], set()
    for phase, source in sources:
        is_url = source.startswith(("http://", "https://"))
        this_engine = "openai" if is_url else ("hf" if engine == "openai" else engine)
        card = None
        if not is_url:
            check_model_folder(Path(source))
            card = read_card(source)
        label = file_label(phase or (card or {}).get("phase") or (served_model if is_url else Path(source).name)
                           or "model")
        unique, i = label, 1
        while unique in labels:
            i += 1
            unique = f"{label}-{i}"
        labels.add(unique)
        sampling = (card or {}).get("sampling", {})
        specs.append(ModelSpec(
            unique, source, this_engine, resolve_format(source, config, **prompt_flags),
            temperature if temperature is not None else sampling.get("temperature", DEFAULT_TEMPERATURE),
            max_new_tokens or sampling.get("eval_max_new_tokens", DEFAULT_MAX_NEW_TOKENS),
            served_model if is_url else None, card))
    return specs


def register(app: typer.Typer) -> None:
    @app.command()
    def benchmark(
        questions: Path = typer.Option(None, "--questions", help="our JSONL, Spider dev.json or BIRD dev.json "
                                                                 "(default with --run: its held-out set)"),
        db_root: Path = typer.Option(None, "--db-root", help="folder with <db_id>/<db_id>.sqlite (default with "
                                                             "--run: its databases)"),
        model: list[str] = typer.Option([], "--model", help="local HF folder or OpenAI-compatible URL (repeatable)"),
        run: Path = typer.Option(None, "--run", help="a run folder: benchmark every finished phase's model"),
        fmt: str = typer.Option("auto", "--format", help="auto | jsonl | spider | bird"),
        k: int = typer.Option(8, "--k", min=1, help="k of maj@k and pass@k"),
        n: int = typer.Option(None, "--n", min=1, help="samples per question (>= k; default k)"),
        temperature: float = typer.Option(None, "--temperature", min=0.0,
                                          help=f"sampling temperature (default: the model's training temperature "
                                               f"from its sirius.json, else {DEFAULT_TEMPERATURE})"),
        max_new_tokens: int = typer.Option(None, "--max-new-tokens", min=1,
                                           help="answer length (default: the run's held-out evaluation length, "
                                                f"else {DEFAULT_MAX_NEW_TOKENS})"),
        engine: str = typer.Option("hf", "--engine", help="hf | vllm (local folders); a URL is always openai"),
        served_model: str = typer.Option(None, "--served-model", help="model name at a --model URL"),
        lifecycle: bool = typer.Option(False, "--lifecycle", help="also selected_ex: samples -> lifecycle -> hybrid "
                                                                  "selector"),
        compare: str = typer.Option("auto", "--compare", help="bird | spider | auto (spider for Spider questions, "
                                                              "else the model card's, else bird)"),
        out: Path = typer.Option(Path("benchmarks_out"), "--out", help="output folder"),
        name: str = typer.Option("benchmark", "--name", help="output file stem"),
        workers: int = typer.Option(2, "--workers", min=0, help="sandboxed scoring processes (0 = in-process)"),
        batch_size: int = typer.Option(64, "--batch-size", min=1, help="questions per generation chunk"),
        seed: int = typer.Option(0, "--seed", help="seed of the n sampled answers per question"),
        threads: int = THREADS,
        base: bool = typer.Option(False, "--base", help="with --run, also its untrained base model (the starting "
                                                        "point; the nano base answers nothing right)"),
        timeout: float = typer.Option(30.0, "--timeout", help="seconds per query"),
        ves_repeats: int = typer.Option(100, "--ves-repeats", min=0, help="R-VES timings per correct greedy answer "
                                        "(BIRD's evaluator: 100; 0: no R-VES); with compare bird only"),
        test_suite: Path = typer.Option(None, "--test-suite", exists=True, file_okay=False,
                                        help="a test-suite folder (<db_id>/*.sqlite): also greedy test-suite accuracy"),
        config: Path = CONFIG, schema_style: str = SCHEMA_STYLE, schema_samples: int = SCHEMA_SAMPLES,
        system_prompt: str = SYSTEM_PROMPT, multi_turn: int = MULTI_TURN,
        quiet: bool = typer.Option(False, "--quiet", help="no progress bars: a line per model every 30 s and at "
                                                          "its end"),
    ):
        """Evaluate checkpoints end to end: greedy EX, maj@k, pass@k, selected EX; overall, per bucket, per db."""
        import json

        from rewards.executor import Executor
        from rewards.sandbox import Limits
        from sirius_train.evaluation.benchmark import (BenchmarkError, Settings, benchmark_model, cache_path, check_databases,
                                            file_label, load_questions, markdown, model_report, plot,
                                            run_inputs, write_predictions)

        with one_line_errors():
            if file_label(name) != name:
                raise BenchmarkError(f"--name {name!r}: a file stem (letters, digits, . _ + -), such as "
                                     f"{file_label(name)!r}; the folder is --out")
            if n is not None and n < k:
                raise BenchmarkError(f"--n {n} < --k {k}: pass@k needs at least k samples per question")
            if questions is None or db_root is None:
                if run is None:
                    raise BenchmarkError("give --questions and --db-root (or --run RUN_DIR: its held-out set and "
                                         "databases)")
                run_questions, run_db_root = run_inputs(run)
                questions, db_root = questions or run_questions, db_root or run_db_root
            items = load_questions(questions, fmt)
            check_databases(items, db_root)
            specs = model_specs(model, run, engine, served_model, config, temperature, max_new_tokens,
                                {"schema_style": schema_style, "schema_samples": schema_samples,
                                 "system_prompt": system_prompt}, base)
            mode = compare
            if mode == "auto":
                spider = questions.suffix == ".json" and fmt in ("auto", "spider") and \
                    str(items[0].id).startswith("spider")
                mode = "spider" if spider else next((s.card["compare"] for s in specs if s.card and
                                                     s.card.get("compare")), "bird")
            if multi_turn and (servers := [s.label for s in specs if s.engine != "hf"]):
                raise BenchmarkError(f"--multi-turn: {', '.join(servers)} not on engine hf; multi-turn episodes need a "
                                     "local HF model: an OpenAI-compatible server or vLLM cannot run probes between "
                                     "turns yet")
            settings = Settings(k=k, n=n or k, seed=seed, compare=mode, lifecycle=lifecycle, batch_size=batch_size,
                                multi_turn=multi_turn)
            out.mkdir(parents=True, exist_ok=True)
            reports = []
            local = any(s.engine == "hf" for s in specs)
            with torch_threads(threads) if local else nullcontext() as set_to, \
                    Executor(db_root, workers=workers, limits=Limits(timeout_s=timeout)) as executor:
                if local:
                    stderr.print(f"torch threads: {set_to}")
                for spec in specs:
                    stderr.print(f"benchmark {spec.label}: {spec.source} ({spec.engine}), T={spec.temperature:g}, "
                                 f"{len(items)} questions x (greedy + {settings.n})")
                    t0 = time.monotonic()
                    progress = heartbeat(f"benchmark {spec.label}", len(items)) if quiet else \
                        progress_bar(spec.label, len(items))
                    with progress as advance:
                        rows, generated = benchmark_model(
                            spec, items, db_root, settings, executor=executor, advance=advance,
                            cache=cache_path(out, name, spec, questions, db_root, items, settings, timeout))
                    seconds = time.monotonic() - t0
                    official = greedy_official(items, rows, db_root, settings.compare, executor, ves_repeats,
                                               test_suite, workers, timeout)
                    reports.append(model_report(spec, items, rows, settings, seconds, generated, official))
                    write_predictions(out, f"{name}.{spec.label}", items, rows)
        report = {"name": name, "questions": str(questions), "n": len(items), "k": k, "n_samples": settings.n,
                  "compare": settings.compare, "lifecycle": lifecycle, "seed": seed, "multi_turn": multi_turn,
                  "models": reports}
        (out / f"{name}.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
        (out / f"{name}.md").write_text(markdown(report))
        plot(report, out / f"{name}.png")
        typer.echo(markdown(report))
        stderr.print(f"wrote {out / name}.json / .md / .png and the greedy predictions (.pred.sql, .predict_dev.json)")


def greedy_official(items, rows, db_root: Path, compare: str, executor, ves_repeats: int, test_suite: Path | None,
                    workers: int, timeout: float) -> dict:
    """The official metrics of the greedy answers, per question: R-VES's sqrt(reward) and Soft-F1 with BIRD's
    equivalence, TS with a test-suite folder (docs/METRICS.md)."""
    import math

    from rewards.sandbox import Limits
    from sirius_train.evaluation import official_eval

    pairs = [(q.db_id, q.gold_sql, r["greedy_sql"]) for q, r in zip(items, rows)]
    official = {}
    if compare == "bird":
        official["greedy_soft_f1"] = official_eval.soft_f1_scores(executor, pairs)
        if ves_repeats:
            rewards = official_eval.ves_rewards(db_root, pairs, [bool(r["greedy"]) for r in rows], ves_repeats,
                                                limits=Limits(timeout_s=timeout))
            official["greedy_r_ves"] = [math.sqrt(x) for x in rewards]
    if test_suite is not None:
        official["greedy_ts"] = [float(m) for m in official_eval.ts_matches(test_suite, pairs, workers=workers,
                                                                            timeout_s=timeout)]
    return official
