"""`sirius benchmark`: evaluate checkpoints end to end with the prompt, sampler and scorer of training.

For each model: the questions rendered in the model's own training format (its `sirius.json`, or
`--config`), one greedy answer and n sampled ones per question through the same samplers training uses
(HF generate with one prefill per prompt, vLLM, or any OpenAI-compatible server), every answer scored by
the reward's scorer (`rewards.executor`), the majority vote over execution results by the selector's own
`majority_vote`, and with `lifecycle` the full candidates -> lifecycle -> hybrid selector path. Figures:
`sirius_train.evaluation.figures`. Work is cached per chunk of questions, so a killed benchmark resumes where it stopped.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from data_synthesis.prompts import PromptFormat
from sirius_train.evaluation.figures import QuestionScore, breakdown, score_samples

ENGINES = ("hf", "vllm", "openai")
FORMATS = ("auto", "jsonl", "spider", "bird")
BUCKET_ORDER = ("easy", "medium", "hard", "extra", "simple", "moderate", "challenging")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


class BenchmarkError(ValueError):
    """Input the benchmark cannot run on; the message names what and the fix."""


@dataclass(frozen=True)
class BenchQuestion:
    id: object
    db_id: str
    question: str
    gold_sql: str
    evidence: str
    bucket: str


@dataclass
class ModelSpec:
    """One model to benchmark and how to ask it."""

    label: str
    source: str  # a local folder or an OpenAI-compatible base URL
    engine: str
    prompt_format: PromptFormat
    temperature: float
    max_new_tokens: int
    served_model: str | None = None
    card: dict | None = None
    extra: dict = field(default_factory=dict)


def load_questions(path: Path, fmt: str = "auto") -> list[BenchQuestion]:
    """Questions from our JSONL, Spider `dev.json` or BIRD `dev.json` (evidence and difficulty kept);
    buckets: the dataset's difficulty, else Spider's hardness of the gold SQL."""
    from data_synthesis.loaders import DatasetError, load_dataset
    from sirius_train.evaluation.hardness import spider_hardness

    if fmt not in FORMATS:
        raise BenchmarkError(f"--format {fmt!r}: use one of {', '.join(FORMATS)}")
    if fmt == "jsonl" and path.suffix != ".jsonl":
        raise BenchmarkError(f"--format jsonl: {path} is not a .jsonl file")
    try:
        examples = load_dataset(path)
    except DatasetError as e:
        raise BenchmarkError(str(e)) from None
    if fmt in ("spider", "bird") and any(e.source != fmt for e in examples):
        raise BenchmarkError(f"--format {fmt}: {path} reads as {examples[0].source if examples else 'empty'}")
    if not examples:
        raise BenchmarkError(f"{path}: no questions")
    return [BenchQuestion(e.id, e.db_id, e.question, e.gold_sql, e.evidence, e.level or spider_hardness(e.gold_sql))
            for e in examples]


def check_databases(questions: list[BenchQuestion], db_root: Path) -> None:
    """Every question's database exists and SQLite can read it, before any answer is generated."""
    from data_synthesis.schema import read_schema
    from rewards.databases import UnknownDatabase, resolve_db_path

    missing, paths = {}, {}
    for q in questions:
        try:
            paths.setdefault(q.db_id, resolve_db_path(db_root, q.db_id))
        except UnknownDatabase:
            missing.setdefault(q.db_id, q.id)
    if missing:
        first = ", ".join(f"{db} (question {qid})" for db, qid in list(missing.items())[:5])
        raise BenchmarkError(f"no database under {db_root} for {first}: every question needs "
                             f"{db_root}/<db_id>/<db_id>.sqlite (check --db-root)")
    for db_id, path in paths.items():
        read_schema(path, n_samples=0, db_id=db_id)  # UnreadableDatabase names the file


def run_phases(run_dir: Path) -> list[tuple[str, Path]]:
    """(phase, model folder) of every finished phase of a run, in schedule order (base, sft, stage1, ...)."""
    if not (run_dir / "config.yaml").is_file():
        raise BenchmarkError(f"--run {run_dir}: not a run folder (no config.yaml)")
    phases = []
    for marker in sorted(run_dir.glob("*/DONE.json"), key=lambda p: _phase_order(p.parent.name)):
        info = json.loads(marker.read_text())
        phases.append((info["phase"], Path(info["model"])))
    if not phases:
        raise BenchmarkError(f"--run {run_dir}: no finished phase (no */DONE.json)")
    return phases


def run_inputs(run_dir: Path) -> tuple[Path, Path]:
    """(questions, db_root) a run was evaluated on: its first held-out set (the one `eval_exec_acc` is on) and
    its config's databases, for `--run` without `--questions` / `--db-root`."""
    from sirius_train.run_folder import read_record

    cfg = read_record(run_dir)
    if cfg is None:
        raise BenchmarkError(f"--run {run_dir}: not a run folder (no config.yaml)")
    questions = run_dir / "data" / "eval.jsonl"
    if not questions.is_file():
        raise BenchmarkError(f"--run {run_dir}: no held-out set ({questions}); give --questions")
    db_root = Path(cfg.data.db_root)
    if not db_root.is_dir():
        raise BenchmarkError(f"--run {run_dir}: its databases ({db_root}, data.db_root, relative to where it was "
                             "trained) are not here; give --db-root")
    return questions, db_root


def _phase_order(name: str) -> tuple:
    fixed = {"base": 0, "sft": 1}
    return (fixed.get(name, 2), int(name[5:]) if name.startswith("stage") and name[5:].isdigit() else 0, name)


def check_model_folder(path: Path) -> None:
    """A local checkpoint every loader accepts (`data_synthesis.checkpoints.locate`), with its tokenizer."""
    from data_synthesis.checkpoints import CheckpointError, locate

    try:
        folder, gguf = locate(path)
    except CheckpointError as e:
        raise BenchmarkError(str(e)) from None
    if gguf is None and not any((folder / f).is_file() for f in TOKENIZER_FILES):
        raise BenchmarkError(f"model folder {path} has no tokenizer ({' / '.join(TOKENIZER_FILES)}): save the "
                             "tokenizer beside the weights (tokenizer.save_pretrained)")


def make_sampler(spec: ModelSpec, batch_size: int):
    from data_synthesis.samplers import HFSampler, OpenAISampler

    if spec.engine == "openai":
        if not spec.served_model:
            raise BenchmarkError(f"{spec.source} is a server: also give --served-model (the name it serves)")
        return OpenAISampler(spec.source, spec.served_model)
    if spec.engine == "vllm":
        from data_synthesis.vllm_sampler import VLLMSampler

        return VLLMSampler(spec.source)
    return HFSampler(spec.source, batch_size=batch_size)  # a model folder or a .gguf file


def episodes(sampler, max_turns: int, db_root: Path):
    """`sampler` answering in multi-turn episodes of up to `max_turns` probes (0: `sampler` itself)."""
    if not max_turns:
        return sampler
    from data_synthesis.interaction import ProbeLimits
    from data_synthesis.samplers import EpisodeSampler

    return EpisodeSampler(sampler, ProbeLimits(max_turns=max_turns), db_root)


@dataclass(frozen=True)
class Settings:
    k: int
    n: int
    seed: int
    compare: str
    lifecycle: bool
    batch_size: int  # questions per chunk (the greedy batch; the unit of resumption)
    top_p: float = 1.0
    multi_turn: int = 0  # probes an episode may run before its answer (0: single-turn answers)


def cache_path(out: Path, name: str, spec: ModelSpec, questions_file: Path, db_root: Path,
               questions: list[BenchQuestion], settings: Settings, timeout_s: float) -> Path:
    """One cache file per (model, questions, databases, prompts, sampling, scoring), each known by its contents:
    editing the questions file, retraining into the same folder, another `--db-root`, rows changed under a kept
    size and mtime (`cp -p`, `rsync -a`, another release unpacked), or prompt-building code that renders other
    prompts never reuses old answers. Files are hashed once while untouched (`Digests`). A server is known by
    its URL and served name only (nothing to fingerprint)."""
    from rewards.databases import resolve_db_path

    digests = Digests(out / f"{name}.digests")  # JSON lines, beside the cache folder (which holds answers only)
    key = json.dumps({"model": model_fingerprint(spec.source, digests), "served": spec.served_model,
                      "engine": spec.engine, "temperature": spec.temperature, "max_new_tokens": spec.max_new_tokens,
                      "questions": file_digest(questions_file),
                      "prompts": prompts_digest(spec, questions, db_root, settings.multi_turn),
                      "databases": {db: digests(resolve_db_path(db_root, db))
                                    for db in sorted({q.db_id for q in questions})},
                      "timeout_s": timeout_s, **asdict(settings)}, sort_keys=True)
    digests.save()
    return out / f"{name}.cache" / f"{spec.label}-{hashlib.sha256(key.encode()).hexdigest()[:12]}.jsonl"


def prompts_digest(spec: ModelSpec, questions: list[BenchQuestion], db_root: Path, multi_turn: int = 0) -> str:
    """The hash of every prompt as the model will get it (rendered by the prompt-building code of today, with the
    probe instructions of a multi-turn episode): a change of that code that changes one prompt changes the key."""
    from rewards.databases import resolve_db_path

    h = hashlib.sha256()
    for q in questions:
        messages = _prompt(spec, q, resolve_db_path(db_root, q.db_id))
        if multi_turn:
            from data_synthesis.interaction import ProbeLimits, with_probe_instructions

            messages = with_probe_instructions(messages, ProbeLimits(max_turns=multi_turn))
        h.update(json.dumps([str(q.id), messages], sort_keys=True).encode() + b"\n")
    return h.hexdigest()


def _prompt(spec: ModelSpec, q: BenchQuestion, db_path: Path) -> list[dict]:
    return spec.prompt_format.render(q.question, db_path, q.evidence or None, q.db_id)


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class Digests:
    """Content hashes of files, remembered in a JSON file by (device, inode, size, ctime): a file written, copied
    or unpacked onto gets a new ctime (the kernel sets it; `cp -p` and `rsync -a` keep the mtime, not the ctime),
    so it is hashed again; an untouched file, a BIRD database of gigabytes included, is hashed once."""

    def __init__(self, path: Path):
        from data_synthesis.jsonl import JsonlError, read_jsonl

        self.path, self.changed = path, False
        try:
            rows = read_jsonl(path, required={"file": str, "sha256": str}) if path.is_file() else []
        except JsonlError:
            rows = []  # a torn or foreign file: hash again
        self.known = {r["file"]: r["sha256"] for r in rows}

    def __call__(self, path: Path) -> str:
        st = path.stat()
        key = f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_ctime_ns}"
        if self.known.get(key) is None:
            self.known[key] = file_digest(path)
            self.changed = True
        return self.known[key]

    def save(self) -> None:
        if self.changed:
            from data_synthesis.jsonl import write_jsonl

            write_jsonl(self.path, [{"file": k, "sha256": v} for k, v in self.known.items()])
            self.changed = False


def model_fingerprint(source: str, digests: Digests) -> object:
    """A URL as given; a local model by the content of every file of its folder (weights, tokenizer, card) or of
    its GGUF file."""
    path = Path(source)
    if source.startswith(("http://", "https://")) or not path.exists():
        return source
    if path.is_file():
        return {path.name: digests(path)}
    return {str(f.relative_to(path)): digests(f) for f in sorted(path.rglob("*")) if f.is_file()}


def file_label(text: str) -> str:
    """`text` as a file-name part: a served name such as `Qwen/Qwen2.5-7B` becomes `Qwen_Qwen2.5-7B`.

    >>> file_label("Qwen/Qwen2.5-7B-Instruct"), file_label("../a b:c"), file_label("///")
    ('Qwen_Qwen2.5-7B-Instruct', 'a_b_c', 'model')
    """
    return re.sub(r"[^A-Za-z0-9._+-]+", "_", text).strip("._") or "model"


def benchmark_model(spec: ModelSpec, questions: list[BenchQuestion], db_root: Path, settings: Settings, *,
                    cache: Path, executor, advance=lambda n: None) -> tuple[list[dict], int]:
    """One row per question (greedy SQL, sample matches, majority, selected, tokens), from the cache where it has
    them; and how many questions were generated now (not read from the cache)."""
    done = _read_cache(cache)
    rows: dict[object, dict] = {}
    sampler, generated = None, 0
    cache.parent.mkdir(parents=True, exist_ok=True)
    with cache.open("a") as sink:
        for start in range(0, len(questions), settings.batch_size):
            chunk = questions[start:start + settings.batch_size]
            if all(str(q.id) in done for q in chunk):
                rows.update({q.id: done[str(q.id)] for q in chunk})
                advance(len(chunk))
                continue
            sampler = sampler or episodes(make_sampler(spec, settings.batch_size), settings.multi_turn, db_root)
            fresh = _run_chunk(spec, sampler, chunk, db_root, settings, executor, seed=settings.seed + start)
            for row in fresh:
                sink.write(json.dumps(row, default=str) + "\n")
            sink.flush()
            rows.update({q.id: r for q, r in zip(chunk, fresh)})
            generated += len(chunk)
            advance(len(chunk))
    return [rows[q.id] for q in questions], generated


def _read_cache(path: Path) -> dict[str, dict]:
    from data_synthesis.jsonl import JsonlError, read_jsonl

    if not path.is_file():
        return {}
    data = path.read_bytes()
    complete = data[:data.rfind(b"\n") + 1]  # a torn last line (a kill mid-write) is dropped
    if len(complete) != len(data):
        with path.open("r+b") as f:
            f.truncate(len(complete))
    try:
        rows = read_jsonl(path, required=("id",))
    except JsonlError as e:
        raise BenchmarkError(f"corrupt benchmark cache: {e}; delete {path} to generate its answers again") from None
    return {str(r["id"]): r for r in rows}


def _run_chunk(spec: ModelSpec, sampler, chunk: list[BenchQuestion], db_root: Path, settings: Settings, executor,
               seed: int) -> list[dict]:
    from rewards.databases import resolve_db_path
    from rewards.extract import extract_sql
    from rewards.scoring import ScoreItem

    prompts = [_prompt(spec, q, resolve_db_path(db_root, q.db_id)) for q in chunk]
    databases = {"db_ids": [q.db_id for q in chunk]} if settings.multi_turn else {}  # where episodes probe
    greedy = [texts[0] for texts in sampler.sample(prompts, 1, temperature=0.0, max_new_tokens=spec.max_new_tokens,
                                                   seed=seed, **databases)]
    usage = sampler.last_usage
    sampled = sampler.sample(prompts, settings.n, temperature=spec.temperature, top_p=settings.top_p,
                             max_new_tokens=spec.max_new_tokens, seed=seed, **databases)
    usage = [g + s for g, s in zip(usage, sampler.last_usage)]
    greedy_sql = [extract_sql(t) for t in greedy]
    sample_sql = [[extract_sql(t) for t in texts] for texts in sampled]
    greedy_match = [r.match for r in executor.score([ScoreItem(q.db_id, q.gold_sql, sql, settings.compare)
                                                     for q, sql in zip(chunk, greedy_sql)])]
    scored = score_samples(executor, [(q.db_id, q.gold_sql) for q in chunk], sample_sql, settings.compare,
                           settings.k)
    rows = [{"id": q.id, "greedy_sql": g_sql, "greedy": g, "samples": matches, "majority": majority,
             "tokens": asdict(tokens)}
            for q, g_sql, g, (matches, majority), tokens in zip(chunk, greedy_sql, greedy_match, scored, usage)]
    if settings.lifecycle:
        for row, sql in zip(rows, _selected(chunk, sampled, db_root, settings, executor)):
            row["selected_sql"] = sql
        picks = [ScoreItem(q.db_id, q.gold_sql, r["selected_sql"], settings.compare) for q, r in zip(chunk, rows)]
        for row, result in zip(rows, executor.score(picks)):
            row["selected"] = result.match
    return rows


def _selected(chunk, sampled, db_root: Path, settings: Settings, executor) -> list[str | None]:
    """The hybrid selector's pick after the lifecycle (model-free repair), with the samples as candidates."""
    from rewards.extract import extract_sql
    from sirius_train.inference.candidates import Candidate
    from sirius_train.inference.lifecycle import Lifecycle
    from sirius_train.inference.pipeline import answer, make_task
    from sirius_train.inference.selector import SelectorConfig

    tasks = [make_task(db_root, q.id, q.db_id, q.question,
                       [Candidate("specialist", j, extract_sql(t), raw=t) for j, t in enumerate(texts[:settings.k])],
                       q.evidence or None) for q, texts in zip(chunk, sampled)]
    Lifecycle(executor).run(tasks)
    return [a.pick()["sql"] for a in answer(tasks, SelectorConfig(compare=settings.compare), "hybrid")]


def scores(questions: list[BenchQuestion], rows: list[dict]) -> list[QuestionScore]:
    return [QuestionScore(q.id, q.db_id, q.bucket, bool(r["greedy"]), tuple(bool(s) for s in r["samples"]),
                          bool(r["majority"]), None if "selected" not in r else bool(r["selected"]))
            for q, r in zip(questions, rows)]


def model_report(spec: ModelSpec, questions, rows, settings: Settings, seconds: float, generated: int,
                 official: dict[str, list[float]] | None = None) -> dict:
    """The model's figures; `generated` of the questions were answered now (the rest came from the cache), so
    `questions_per_s` is their rate (None when none was); `tokens` sums every question's greedy and sampled
    answers (TokenUsage: prompt tokens once per request, answer tokens, answers, answers at max_new_tokens).
    `official` adds per-question official metrics of its greedy answers (OFFICIAL), as means overall, per bucket
    and per database."""
    from data_synthesis.samplers import TokenUsage

    tokens = sum((TokenUsage(**r["tokens"]) for r in rows), TokenUsage())
    report = {"model": spec.label, "source": spec.source, "engine": spec.engine,
              **({"served_model": spec.served_model} if spec.served_model else {}),
              "prompt_format": asdict(spec.prompt_format), "temperature": spec.temperature,
              "max_new_tokens": spec.max_new_tokens, "seconds": round(seconds, 1), "generated": generated,
              "questions_per_s": round(generated / seconds, 3) if generated and seconds > 0 else None,
              "tokens": {"prompt": tokens.prompt, "answer": tokens.answer, "answers": tokens.answers,
                         "at_max_new_tokens": tokens.at_limit},
              **breakdown(scores(questions, rows), settings.k, BUCKET_ORDER)}
    for name, values in (official or {}).items():
        from sirius_train.evaluation.official_metrics import group_means

        report["overall"][name] = sum(values) / len(values) if values else 0.0
        for group, key in (("buckets", "bucket"), ("databases", "db_id")):
            for g, mean in group_means(values, [getattr(q, key) for q in questions]).items():
                report[group][g][name] = mean
    if spec.card:
        report["phase"] = spec.card.get("phase")
        report["run_eval_exec_acc"] = spec.card.get("figures", {}).get("eval_exec_acc")
    return report


def write_predictions(out: Path, stem: str, questions: list[BenchQuestion], rows: list[dict]) -> list[Path]:
    """Greedy answers as Spider's `pred.sql` (one query a line) and BIRD's `predict_dev.json`."""
    from sirius_train.evaluation.reports import BIRD_SEPARATOR

    def one_line(sql: str | None) -> str:
        return " ".join((sql or "").split())

    spider = out / f"{stem}.pred.sql"
    spider.write_text("".join(one_line(r["greedy_sql"]) + "\n" for r in rows))
    bird = out / f"{stem}.predict_dev.json"
    bird.write_text(json.dumps({str(i): one_line(r["greedy_sql"]) + BIRD_SEPARATOR + q.db_id
                                for i, (q, r) in enumerate(zip(questions, rows))}, indent=2))
    return [spider, bird]


SHOWN = ("greedy_ex", "mean_sampled_ex", "maj_at_k", "pass_at_k", "headroom", "selected_ex")
# of the greedy answers (sirius_train.evaluation.official_metrics): BIRD's R-VES (the mean of sqrt(reward); x100 is R-VES) and
# Soft-F1 with --compare bird, test-suite accuracy with --test-suite; shown as the official scripts print them and as
# `sirius evaluate` shows them (official_metrics.printed: x100, two decimals, no %: R-VES is no share, up to 111.80)
OFFICIAL = ("greedy_r_ves", "greedy_soft_f1", "greedy_ts")


def _cell(field: str, mean: float) -> str:
    """A figure of the overall table: a share of questions as a %, an official metric as its scripts print it."""
    from sirius_train.evaluation.official_metrics import printed

    return printed(mean) if field in OFFICIAL else f"{100 * mean:.1f}%"


def markdown(report: dict) -> str:
    """The overall table (one row per model), then greedy EX / pass@k per bucket and per database."""
    k = report["k"]
    names = {"maj_at_k": f"maj@{k}", "pass_at_k": f"pass@{k}", "greedy_r_ves": "R-VES", "greedy_soft_f1": "Soft-F1",
             "greedy_ts": "TS"}
    shown = [f for f in SHOWN + OFFICIAL if any(f in m["overall"] for m in report["models"])]
    lines = [f"# Benchmark {report['name']}: {report['n']} questions from {report['questions']}",
             "", f"greedy and n={report['n_samples']} samples (temperature per model below); compare={report['compare']}"
             + (f"; multi-turn episodes, up to {report['multi_turn']} probes" if report.get("multi_turn") else ""),
             "", "| model | T | " + " | ".join(names.get(f, f) for f in shown)
             + " | run eval_exec_acc | q/s | prompt tokens | answer tokens | answers at max_new_tokens |",
             "|---|---:|" + "---:|" * (len(shown) + 5)]
    for m in report["models"]:
        run_acc, tokens, rate = m.get("run_eval_exec_acc"), m["tokens"], m["questions_per_s"]
        lines.append(f"| {m['model']} | {m['temperature']:g} | " + " | ".join(
            _cell(f, m["overall"][f]) if f in m["overall"] else "" for f in shown)
            + f" | {'' if run_acc is None else f'{100 * run_acc:.1f}%'} | {'cached' if rate is None else rate} | "
            f"{tokens['prompt']} | {tokens['answer']} | {tokens['at_max_new_tokens']} of {tokens['answers']} |")
    for title, key in (("Difficulty", "buckets"), ("Database", "databases")):
        groups = list(dict.fromkeys(g for m in report["models"] for g in m[key]))
        lines += ["", f"| {title} | n | " + " | ".join(f"{m['model']} greedy / pass@{k}" for m in report["models"])
                  + " |", "|---|---:|" + "---:|" * len(report["models"])]
        for g in groups:
            cells = [f"{100 * m[key][g]['greedy_ex']:.1f}% / {100 * m[key][g]['pass_at_k']:.1f}%"
                     + "".join(f"; {names[f]} {_cell(f, m[key][g][f])}" for f in OFFICIAL if f in m[key][g])
                     if g in m[key] else "" for m in report["models"]]
            n = next(m[key][g]["n"] for m in report["models"] if g in m[key])
            lines.append(f"| {g} | {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(report: dict, path: Path) -> Path:
    """Bars per figure (models side by side), and greedy EX / pass@k per bucket."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = report["models"]
    shown = [f for f in SHOWN if f != "headroom" and any(f in m["overall"] for m in models)]
    buckets = list(dict.fromkeys(b for m in models for b in m["buckets"]))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    width = 0.8 / max(len(models), 1)
    for j, m in enumerate(models):
        axes[0].bar([i + j * width for i in range(len(shown))], [m["overall"].get(f, 0) for f in shown], width,
                    label=m["model"])
        axes[1].bar([i + j * width for i in range(len(buckets))],
                    [m["buckets"].get(b, {}).get("pass_at_k", 0) for b in buckets], width, alpha=0.35,
                    color=f"C{j}")
        axes[1].bar([i + j * width for i in range(len(buckets))],
                    [m["buckets"].get(b, {}).get("greedy_ex", 0) for b in buckets], width, color=f"C{j}",
                    label=m["model"])
    k = report["k"]
    axes[0].set_xticks([i + 0.4 - width / 2 for i in range(len(shown))],
                       [f.replace("_at_k", f"@{k}") for f in shown])
    axes[0].set_title("overall")
    axes[1].set_xticks([i + 0.4 - width / 2 for i in range(len(buckets))], buckets)
    axes[1].set_title(f"per bucket: greedy EX (solid), pass@{k} (light)")
    for ax in axes:
        ax.set_ylim(0, 1)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
