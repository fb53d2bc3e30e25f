"""`sirius synth pool|estimate|curriculum`: build the example pool, measure its difficulty, write a stage.

    sirius synth pool --db-root dbs --dataset dev.json --synthesize 50 --out pool.jsonl
    sirius synth estimate --pool pool.jsonl --db-root dbs --model ckpt/ --out rates.jsonl
    sirius synth estimate ... --model ckpt/ --engine vllm --ray-actors 8    # one vLLM engine per GPU
    sirius synth curriculum --pool pool.jsonl --rates rates.jsonl --db-root dbs --budget 2048 \\
        --model ckpt/ --out-dir runs/x/curriculum --stage stage1

Files: the pool is Example JSONL (`data_synthesis.records`); rates are JSONL `{"id", "pass_rate", "correct",
"k", "format_failures", "statuses", "gold_status"}`; a stage is `<stage>.parquet` (verl layout),
`<stage>.report.json`, `<stage>.histogram.png`, `<stage>.jsonl` and `<stage>.new_examples.jsonl`.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import typer
from rich.markup import escape

from rewards.compare import CompareMode
from sirius_train.commands import choices, one_line_errors
from sirius_train.commands.prompt_options import CONFIG, SCHEMA_SAMPLES, SCHEMA_STYLE, SYSTEM_PROMPT, resolve_format
from sirius_train.progress import progress_bar, stderr

# Options shared by `estimate` and `curriculum` (one declaration each; typer reuses them as defaults).
MODEL = typer.Option(None, "--model", help="local Hugging Face model folder to sample from (HF generate)")
URL = typer.Option(None, "--url", help="OpenAI-compatible endpoint to sample from, e.g. http://host:8000/v1")
SERVED = typer.Option(None, "--served-model", help="model name at --url")
K = typer.Option(8, "--k", min=1, help="answers sampled per example")
TEMPERATURE = typer.Option(1.0, "--temperature", min=0.0, help="sampling temperature of the k answers")
TOP_P = typer.Option(1.0, "--top-p", min=0.0, max=1.0, help="nucleus sampling: keep the top-p probability mass "
                     "(1 = off)")
MAX_NEW = typer.Option(512, "--max-new-tokens", min=1, help="longest answer, in tokens")
SEED = typer.Option(0, "--seed", help="seed of the sampled answers (a part of the cache key)")
BATCH = typer.Option(8, "--batch-size", min=1, help="examples per sampler call")
COMPARE = typer.Option(CompareMode.BIRD, "--compare", help="result equivalence: bird | spider")
POLICY = typer.Option("", "--policy", help="tag naming the policy in the cache key (e.g. checkpoint + step)")
WORKERS = typer.Option(0, "--workers", min=0, help="sandboxed scoring processes (0 = in-process)")
DB_ROOT = typer.Option(..., "--db-root", help="folder with <db_id>/<db_id>.sqlite")
LLM_URL = typer.Option(None, "--llm-url", help="OpenAI-compatible endpoint that writes questions")
LLM_MODEL = typer.Option(None, "--llm-model", help="model name at --llm-url")
QUIET = typer.Option(False, "--quiet", help="no progress bars")
ENGINES = choices("Engine", ("hf", "vllm"))  # sampler_factory's engines
ENGINE = typer.Option(ENGINES("hf"), "--engine", help="with --model: hf (transformers generate) or vllm (offline "
                                                     "vLLM engine, CUDA; pip install 'sirius-sql\\[vllm]')")  # "\\[": rich would read [vllm] as markup
TENSOR_PARALLEL = typer.Option(1, "--tensor-parallel", min=1, help="vllm: GPUs one engine spans (2-4 for 32B)")
RAY_ACTORS = typer.Option(0, "--ray-actors", min=0, help="generate on N Ray actors, one engine each (ray.init: "
                                                         "RAY_ADDRESS or a local cluster); 0: in this process")
GPUS_PER_ACTOR = typer.Option(None, "--gpus-per-actor", min=0.0, help="GPUs each Ray actor reserves (default: "
                                                                      "--tensor-parallel with vllm, 0 with hf)")


def make_sampler(model: Path | None, url: str | None, served_model: str | None, generate_batch: int,
                 engine: str = "hf", tensor_parallel: int = 1):
    """The sampler the options name: `--model` (HF generate, or vLLM with `--engine vllm`) or `--url` +
    `--served-model` (OpenAI HTTP)."""
    return sampler_factory(model, url, served_model, generate_batch, engine, tensor_parallel)()


def sampler_factory(model: Path | None, url: str | None, served_model: str | None, generate_batch: int,
                    engine: str = "hf", tensor_parallel: int = 1):
    """A picklable factory of that sampler: Ray actors (`--ray-actors`) each build their own from it."""
    from functools import partial

    from data_synthesis.samplers import HFSampler, OpenAISampler

    if (model is None) == (url is None):
        raise ValueError("name exactly one policy to sample from: --model <local HF folder> or --url <endpoint>")
    if url is not None:
        if not served_model:
            raise ValueError("--url needs --served-model (the model name the endpoint serves)")
        return partial(OpenAISampler, url, served_model)
    if engine == "vllm":
        from data_synthesis.vllm_sampler import VLLMSampler

        return partial(VLLMSampler, str(model), tensor_parallel_size=tensor_parallel)
    if engine != "hf":
        raise ValueError(f"--engine {engine!r}: use hf (transformers generate) or vllm (offline vLLM engine)")
    return partial(HFSampler, str(model), batch_size=generate_batch)


def make_writer(llm_url: str | None, llm_model: str | None):
    if llm_url is None:
        return None
    if not llm_model:
        raise ValueError("--llm-url needs --llm-model (the model name the endpoint serves)")
    from data_synthesis.chat_client import ChatClient
    from data_synthesis.sqlgen.llm_writer import LLMQuestionWriter

    return LLMQuestionWriter(ChatClient(llm_url, llm_model))


def build_pool(db_root: Path, datasets: list[Path], tables: Path | None, synthesize_n: int, synth_dbs: list[str],
               seed: int, writer, skip_missing: bool, show_progress: bool) -> tuple[list, dict]:
    """Load datasets and synthesize over databases; returns (examples, report parts)."""
    from data_synthesis.loaders import load_dataset
    from data_synthesis.records import check_unique_ids
    from data_synthesis.sqlgen.synthesize import Synthesizer
    from data_synthesis.validate import missing_databases, require_databases
    from rewards.databases import list_db_ids, resolve_db_path

    examples, report = [], {"datasets": {}, "synthesized": {}, "skipped_missing_db": {}}
    for path in datasets:
        loaded = load_dataset(path, tables=tables)
        report["datasets"][str(path)] = len(loaded)
        examples += loaded
    if skip_missing:
        missing = missing_databases(examples, db_root)
        report["skipped_missing_db"] = missing
        examples = [e for e in examples if e.db_id not in missing]
    require_databases(examples, db_root)  # before any slow work: a wrong --db-root fails at once
    if synthesize_n:
        db_ids = synth_dbs or list_db_ids(db_root)
        with progress_bar("synthesizing", len(db_ids), show_progress) as advance:
            for db_id in db_ids:
                synth = Synthesizer(resolve_db_path(db_root, db_id), db_id=db_id, writer=writer)
                made = synth.run(synthesize_n, seed)
                report["synthesized"][db_id] = {"made": len(made), "attempts": synth.stats.attempts,
                                                "rejected": dict(synth.stats.rejected)}
                examples += made
                advance()
    check_unique_ids(examples, "pool")
    return examples, report


def write_rates(path: Path, estimates) -> None:
    from data_synthesis.jsonl import write_jsonl

    write_jsonl(path, ({k: v for k, v in e.to_json().items() if k != "key"} for e in estimates))


def read_rates(path: Path) -> tuple[dict[str, float], int | None]:
    """`{id: pass rate}` of the examples whose gold ran, and the k behind them (None: not one k, or not recorded)."""
    from data_synthesis.jsonl import read_jsonl

    rows = [r for r in read_jsonl(path, required={"id": (str, int), "pass_rate": float})
            if r.get("gold_status", "ok") in ("ok", "empty")]
    ks = {r.get("k") for r in rows}
    return {str(r["id"]): float(r["pass_rate"]) for r in rows}, ks.pop() if len(ks) == 1 else None


def print_counts(title: str, counts: dict) -> None:
    from rich.table import Table

    stderr.print(title)
    table = Table()
    table.add_column("")
    table.add_column("count", justify="right")
    for key, value in counts.items():
        table.add_row(str(key), str(value))
    stderr.print(table)


def register(app: typer.Typer) -> None:
    synth = typer.Typer(help="Build example pools, estimate difficulty, write difficulty-smoothed curricula.",
                        no_args_is_help=True)
    app.add_typer(synth, name="synth")

    @synth.command()
    def pool(
        db_root: Path = DB_ROOT,
        out: Path = typer.Option(..., "--out", help="pool JSONL to write (a .report.json is written beside it)"),
        dataset: list[Path] = typer.Option([], "--dataset", help="Spider/BIRD .json or pool .jsonl (repeatable)"),
        tables: Path = typer.Option(None, "--tables", help="tables.json to check the datasets' db_ids against"),
        synthesize: int = typer.Option(0, "--synthesize", min=0, help="examples to synthesize per database"),
        synth_db: list[str] = typer.Option([], "--synth-db", help="synthesize over these db_ids (default: all)"),
        seed: int = typer.Option(0, "--seed", help="seed of the synthesized examples"),
        llm_url: str = LLM_URL,
        llm_model: str = LLM_MODEL,
        timeout: float = typer.Option(5.0, "--timeout", help="seconds per gold query"),
        drop_empty: bool = typer.Option(False, "--drop-empty", help="also drop examples whose gold returns no rows"),
        skip_missing_dbs: bool = typer.Option(False, "--skip-missing-dbs",
                                              help="drop examples whose database is absent instead of failing"),
        workers: int = WORKERS,
        quiet: bool = QUIET,
    ):
        """Build and validate a pool: datasets plus examples synthesized over a directory of databases."""
        from data_synthesis.export import write_report
        from data_synthesis.records import write_examples
        from data_synthesis.validate import validate_examples

        if not dataset and not synthesize:
            stderr.print("[red]error:[/] nothing to pool: pass --dataset FILE and/or --synthesize N")
            raise typer.Exit(2)
        with one_line_errors():
            if not db_root.is_dir():
                raise FileNotFoundError(f"--db-root {db_root} is not a directory")
            writer = make_writer(llm_url, llm_model)
            examples, report = build_pool(db_root, dataset, tables, synthesize, synth_db, seed, writer,
                                          skip_missing_dbs, not quiet)
            with progress_bar("validating gold SQL", len(examples), not quiet) as advance:
                kept, dropped = validate_examples(examples, db_root, timeout_s=timeout, drop_empty=drop_empty,
                                                  workers=workers, progress=advance)
            write_examples(out, kept)
            reasons = Counter(reason.split(":")[0] for _, reason in dropped)
            report.update({"loaded": len(examples), "kept": len(kept), "dropped": dict(reasons),
                           "dropped_examples": [{"id": e.id, "db_id": e.db_id, "reason": r} for e, r in dropped]})
            write_report(report, out.with_suffix(".report.json"))
        print_counts(f"pool: {len(kept)} kept of {len(examples)} -> {out}",
                     {"kept": len(kept), **{f"dropped: {k}": v for k, v in reasons.items()}})

    @synth.command()
    def estimate(
        pool: Path = typer.Option(..., "--pool", help="pool JSONL"),
        db_root: Path = DB_ROOT,
        out: Path = typer.Option(..., "--out", help="rates JSONL to write"),
        model: Path = MODEL, url: str = URL, served_model: str = SERVED, k: int = K,
        temperature: float = TEMPERATURE, top_p: float = TOP_P, max_new_tokens: int = MAX_NEW, seed: int = SEED,
        batch_size: int = BATCH, compare: CompareMode = COMPARE, policy: str = POLICY, workers: int = WORKERS,
        cache: Path = typer.Option(None, "--cache", help="resume cache (default: <out>.cache.jsonl)"),
        engine: ENGINES = ENGINE, tensor_parallel: int = TENSOR_PARALLEL, ray_actors: int = RAY_ACTORS,
        gpus_per_actor: float = GPUS_PER_ACTOR,
        config: Path = CONFIG, schema_style: str = SCHEMA_STYLE, schema_samples: int = SCHEMA_SAMPLES,
        system_prompt: str = SYSTEM_PROMPT,
        quiet: bool = QUIET,
    ):
        """Pass rate of every pool example under a policy (k samples, execution reward); resumable."""
        from data_synthesis.difficulty import estimate as run_estimate
        from data_synthesis.export import histogram_counts
        from data_synthesis.records import read_examples
        from data_synthesis.smoothing import bin_label, bins_for

        compare, engine = compare.value, engine.value
        with one_line_errors():
            examples = read_examples(pool)
            factory = sampler_factory(model, url, served_model, batch_size * k, engine, tensor_parallel)
            cache = cache or out.with_name(out.name + ".cache.jsonl")
            stderr.print(f"estimating {len(examples)} examples x k={k} (cache: {cache})")
            fmt = resolve_format(model or url, config, schema_style, schema_samples, system_prompt)
            options = dict(cache_path=cache, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens,
                           seed=seed, batch_size=batch_size, compare=compare, workers=workers, policy=policy,
                           prompt_format=fmt)
            if ray_actors and url is not None:
                raise ValueError("--ray-actors fans out local engines (--model); an endpoint (--url) serves "
                                 "concurrent requests itself")
            with progress_bar("estimating", len(examples), not quiet) as advance:
                if ray_actors:
                    from data_synthesis.ray_sampler import distributed_estimate

                    gpus = gpus_per_actor if gpus_per_actor is not None else (
                        tensor_parallel if engine == "vllm" else 0)
                    estimates = distributed_estimate(examples, factory, db_root, k, actors=ray_actors,
                                                     num_gpus=gpus, progress=advance, **options)
                else:
                    estimates = run_estimate(examples, factory(), db_root, k, progress=advance, **options)
            write_rates(out, estimates)
        n = bins_for(k) if k > 1 else 1
        counts = histogram_counts([e.pass_rate for e in estimates], n)
        labels = ["p = 0", *(bin_label(b, n, k) for b in range(n)), "p = 1"]
        print_counts(f"pass rates of {len(estimates)} examples -> {out}", dict(zip(labels, counts)))

    @synth.command()
    def curriculum(
        pool: Path = typer.Option(..., "--pool", help="pool JSONL"),
        rates: Path = typer.Option(..., "--rates", help="rates JSONL from `sirius synth estimate`"),
        db_root: Path = DB_ROOT,
        budget: int = typer.Option(..., "--budget", min=1, help="training examples in the stage (repeats count)"),
        out_dir: Path = typer.Option(..., "--out-dir", help="where the stage files go"),
        stage: str = typer.Option("stage1", "--stage", help="stage name: the output files' stem"),
        bins: int = typer.Option(None, "--bins", min=1, help="pass-rate bins; default: one per rate j/k the rates' "
                                 "k can produce in (0, 1), at most 4 (more than k - 1 is refused: a bin would stay "
                                 "empty)"),
        max_repeats: int = typer.Option(3, "--max-repeats", min=1, help="most uses of one example in the stage"),
        keep_zero_share: float = typer.Option(0.0, "--keep-zero-share", help="budget share for p = 0 examples"),
        fill: bool = typer.Option(None, "--fill/--no-fill", help="fill short bins by mutation (default: on when "
                                                                 "a sampler is given)"),
        fill_rounds: int = typer.Option(2, "--fill-rounds", min=1, help="gap-filling rounds at most (each re-plans "
                                        "the stage with what the previous one added)"),
        model: Path = MODEL, url: str = URL, served_model: str = SERVED, k: int = K,
        temperature: float = TEMPERATURE, top_p: float = TOP_P, max_new_tokens: int = MAX_NEW,
        seed: int = typer.Option(0, "--seed", help="seed of the selection, and of gap filling's mutations and "
                                 "sampled answers"),
        batch_size: int = BATCH, compare: CompareMode = COMPARE, policy: str = POLICY, workers: int = WORKERS,
        llm_url: str = LLM_URL, llm_model: str = LLM_MODEL,
        config: Path = CONFIG, schema_style: str = SCHEMA_STYLE, schema_samples: int = SCHEMA_SAMPLES,
        system_prompt: str = SYSTEM_PROMPT,
        quiet: bool = QUIET,
    ):
        """Smooth the pool's difficulty histogram into one stage (verl parquet, report, histogram)."""
        from data_synthesis.curriculum import MutationFiller, build_curriculum
        from data_synthesis.export import write_stage
        from data_synthesis.records import read_examples
        from data_synthesis.smoothing import SmoothingConfig, bin_label, bins_for

        compare = compare.value
        with one_line_errors():
            examples = read_examples(pool)
            pass_rates, rates_k = read_rates(rates)
            try:
                smoothing = SmoothingConfig(n_bins=bins_for(rates_k, bins), max_repeats=max_repeats,
                                            keep_zero_share=keep_zero_share, k=rates_k)
            except ValueError as e:
                raise ValueError(f"--bins {bins} with the rates of {rates} (k={rates_k}): {e}; pass --bins <= "
                                 f"{rates_k - 1} or leave it out" if bins else f"{rates}: {e}") from None
            fmt = resolve_format(model or url, config, schema_style, schema_samples, system_prompt)
            has_sampler = model is not None or url is not None
            fill = has_sampler if fill is None else fill
            filler = None
            if fill:
                if not has_sampler:
                    raise ValueError("gap filling estimates the new examples: pass --model or --url (or --no-fill)")
                cache = out_dir / f"{stage}.fill_cache.jsonl"
                filler = MutationFiller(db_root, make_sampler(model, url, served_model, batch_size * k), k, seed=seed,
                                        writer=make_writer(llm_url, llm_model), cache_path=cache,
                                        temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens,
                                        batch_size=batch_size, compare=compare, workers=workers, policy=policy,
                                        prompt_format=fmt)
            stderr.print(f"stage {stage}: budget {budget}, {smoothing.n_bins} bins"
                         f"{f' over the pass rates of k={rates_k}' if rates_k else ''}, max {max_repeats} repeats, "
                         f"p = 0 share {keep_zero_share}, gap filling {'on' if filler else 'off'}")
            result = build_curriculum(examples, pass_rates, budget, config=smoothing, seed=seed, filler=filler,
                                      max_fill_rounds=fill_rounds)
            paths = write_stage(result, out_dir, stage, db_root, config=smoothing, compare=compare, prompt_format=fmt)
        report = result.report
        print_counts(f"stage {stage}: {report['selected']} of budget {budget} "
                     f"({report['unique_selected']} distinct) -> {paths['parquet']}",
                     {**{bin_label(b, smoothing.n_bins, rates_k): f"{r['selected']}/{r['target']} ({r['unique']} "
                         "distinct)" for b, r in enumerate(report["bins"])},
                      **{f"dropped: {k}": v for k, v in report["dropped"].items()},
                      "new examples (mutations)": report["new_examples"]})
        for note in report["notes"]:
            stderr.print(f"[yellow]note:[/] {escape(note)}", soft_wrap=True)
        if not report["selected"]:  # exit 1: the command ran, but a pipeline must not train on an empty stage
            dropped = ", ".join(f"{k}: {v}" for k, v in report["dropped"].items()) or "nothing rated"
            stderr.print(f"[yellow]warning:[/] stage {stage} kept 0 of its budget of {budget} ({escape(dropped)}): "
                         "nothing to train on. Give p = 0 examples a share (--keep-zero-share), estimate with more "
                         "samples (--k), or use a pool closer to the policy's level", soft_wrap=True)
            raise typer.Exit(1)
