"""The two-stage schedule of SPEC section 3, independent of the backend that trains.

    data   -> pool (datasets + synthesis over the train databases), held-out eval set (other databases)
    model  -> a local checkpoint, or the nano model built on the spot
    sft    -> supervised warm start (optional)
    stage k-> pass rates under the current policy -> smoothed curriculum (verl parquet) -> train -> eval

Each phase ends in files: an HF checkpoint folder and a `DONE.json` with its figures. A rerun of the same
run skips finished phases and resumes the unfinished one from its last checkpoint, so a killed run
loses at most the steps since that checkpoint. Stage 2 starts from stage 1's weights and re-estimates
difficulty with them, so what stage 1 solved drops out of its curriculum.
"""

from __future__ import annotations

import json
import os
import random
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Protocol

from rich.markup import escape

from data_synthesis.model_card import CARD_FILE, read_card, write_card
from data_synthesis.prompts import SYSTEM_PROMPT, PromptFormat
from data_synthesis.records import Example, read_examples, write_examples
from sirius_train.config import ConfigError, RunConfig, StageConfig, to_yaml
from sirius_train.halts import preemption_signals, stop_if_preempted
from sirius_train.local.ranks import launch_world_size
from sirius_train.progress import stderr


class Backend(Protocol):
    """What the schedule needs from a trainer; `local.backend.LocalBackend` and `verl_backend` implement it."""

    def prepare_base(self, data: RunData, out: Path) -> Path:
        """The starting checkpoint (load `model.path`, or build and save the nano model); returns its folder."""

    def sft(self, data: RunData, init: Path, out: Path) -> tuple[Path, dict]:
        """Supervised warm start from `init`; returns the new checkpoint and its figures."""

    def pass_rates(self, examples: list[Example], model: Path, stage: StageConfig, data: RunData, out: Path
                   ) -> tuple[dict[str, float], object, dict]:
        """Pass rates of `examples` under `model`, with the sampler and the estimation options used (all but the
        cache, seed and progress): gap filling rates its new examples with exactly these, so they are comparable."""

    def train_stage(self, index: int, stage: StageConfig, curriculum: Path, init: Path, data: RunData, out: Path
                    ) -> Path:
        """Train one DAPO stage on the curriculum parquet; returns the final checkpoint folder."""

    def evaluate(self, model: Path, data: RunData, stage: str) -> dict:
        """Execution accuracy of `model` on `data.eval_set` (`eval_exec_acc`, ...)."""


@dataclass
class RunData:
    db_root: Path
    sft_pool: list[Example]
    rl_pool: list[Example]
    eval_set: list[Example]
    prompt_format: PromptFormat
    compare: str
    eval_sets: dict[str, list[Example]] = field(default_factory=dict)  # every held-out set; the first is eval_set


def prompt_format(cfg: RunConfig) -> PromptFormat:
    """The run's prompt format. A run that starts from a model with a card (one of ours) and leaves the
    format at its defaults keeps asking the model the way it was trained."""
    system = SYSTEM_PROMPT if cfg.data.system_prompt is None else cfg.data.system_prompt
    fmt = PromptFormat(schema_style=cfg.data.schema_style, schema_samples=cfg.data.schema_samples, system=system)
    card = read_card(cfg.model.path) if cfg.model.path and Path(cfg.model.path).is_dir() else None
    if card is not None and fmt == PromptFormat() and card["prompt_format"] != fmt:
        stderr.print(f"prompt format from {cfg.model.path}/{CARD_FILE} (set data.schema_style/schema_samples/"
                     "system_prompt to override)")
        return card["prompt_format"]
    return fmt


def write_phase_card(cfg: RunConfig, data: RunData, info: dict) -> None:
    """`sirius.json` in a phase's model folder (one this run wrote: never into a user's `model.path`)."""
    model = Path(info["model"])
    if not model.is_dir() or (cfg.model.path and model == Path(cfg.model.path)) or (model / CARD_FILE).is_file():
        return
    stages = {s.name: s for s in cfg.stages}
    stage = stages.get(info["phase"]) or (cfg.stages[0] if cfg.stages else None)
    sampling = {"temperature": stage.temperature, "top_p": stage.top_p, "max_new_tokens": stage.max_new_tokens,
                "estimate_k": stage.estimate_k} if stage else {}
    sampling["eval_max_new_tokens"] = eval_max_new_tokens(cfg)
    write_card(model, data.prompt_format, phase=info["phase"], run=str(cfg.run_dir), config=asdict(cfg),
               figures={k: v for k, v in info.items() if k.startswith("eval_")}, compare=data.compare,
               sampling=sampling, lora=phase_lora(cfg, info))


def phase_lora(cfg: RunConfig, info: dict) -> dict | None:
    """A LoRA phase's record: the base it adapted, its adapter folder (beside the merged model) and shape."""
    from sirius_train.lora import ADAPTER_DIR, LoraSpec

    spec = LoraSpec.of(cfg.model)
    adapter = Path(info["model"]).parent / ADAPTER_DIR
    if spec is None or "init" not in info or not adapter.is_dir():
        return None
    return {**spec.record(info["init"]), "adapter": str(adapter)}


def eval_max_new_tokens(cfg: RunConfig) -> int:
    """The answer length held-out evaluation allows: the longest any stage trains with."""
    return max([s.max_new_tokens for s in cfg.stages] or [96])


def prepare_data(cfg: RunConfig) -> RunData:
    """Build (or reload) the pools and held-out sets: written once under `run_dir/data` (`eval.jsonl` the first
    held-out set, `eval-<set>.jsonl` the others), so a resumed run trains and is evaluated on the same data."""
    from data_synthesis.demo_dbs import build_demo_dbs
    from data_synthesis.sqlgen.flaws import check_kinds, inject_flaws
    from data_synthesis.sqlgen.rules import RULES
    from data_synthesis.sqlgen.synthesize import synthesize

    d = cfg.data
    db_root = Path(d.db_root)
    train_dbs, eval_dbs, held_out = d.all_train_dbs(), d.all_eval_dbs(), d.held_out_sets()
    if d.build_demo_dbs:
        build_demo_dbs(db_root, db_ids=[*train_dbs, *eval_dbs], seed=0)
    missing = [db for db in [*train_dbs, *eval_dbs] if not (db_root / db / f"{db}.sqlite").is_file()]
    if missing:
        raise FileNotFoundError(f"no database file for {missing} under {db_root} (expected <db_id>/<db_id>.sqlite; "
                                "set data.db_root, or data.build_demo_dbs=true for the demo databases)")
    data_dir = cfg.run_dir / "data"
    files = {name: data_dir / f"{name}.jsonl" for name in ("sft", "rl")}
    set_files = {name: data_dir / ("eval.jsonl" if i == 0 else f"eval-{name}.jsonl") for i, name in enumerate(held_out)}
    if not all(f.is_file() for f in [*files.values(), *set_files.values()]):
        unknown = set(d.synth_rules) - {r.name for r in RULES}
        if unknown:
            raise ValueError(f"data.synth_rules has unknown rule(s) {sorted(unknown)}; known: {[r.name for r in RULES]}")
        rules = tuple(r for r in RULES if not d.synth_rules or r.name in d.synth_rules)
        check_kinds(d.sft_flaws)

        def synth(db: str, n: int, seed: int, avoid: set[str] = frozenset()) -> list[Example]:
            return synthesize(db_root / db / f"{db}.sqlite", n, seed=seed, db_id=db, rules=rules, joins=d.synth_joins,
                              avoid=avoid, where_scale=d.synth_where)

        pool = [e for db in train_dbs for e in synth(db, d.synth_per_db, cfg.seed)]
        for path in d.pool_files:
            pool += read_examples(path)
        random.Random(cfg.seed).shuffle(pool)
        # the split does not depend on sft.enabled: RL from a warm start another run made (SFT skipped here) must
        # not train on its demos, nor be held out against other questions (data.sft_share=0: no split)
        sft, rest = split_pool(pool, d.sft_share, d.sft_split, cfg.seed)
        sft = inject_flaws(sft, d.sft_flaw_share, d.sft_flaws, cfg.seed)  # RL and held-out gold stay correct
        # held out means no training query or question either: a question asked of a training database (the
        # same entity table can occur in both) would be answered from memory, not by reading the schema; a
        # flawed demo's SQL counts as trained too (MIN written for "maximum" is the gold of "minimum")
        trained = ({e.gold_sql for e in pool + sft}, {e.question for e in pool})
        write_examples(files["sft"], sft)
        write_examples(files["rl"], pool if d.rl_pool == "all" else rest)
        draws = draw_held_out(held_out, d.validation_sets(),
                              lambda db, seed, avoid: synth(db, d.eval_per_db, cfg.seed + seed, avoid), trained)
        for name, rows in draws.items():
            write_examples(set_files[name], rows)
    eval_sets = {name: read_examples(path) for name, path in set_files.items()}
    return RunData(db_root, read_examples(files["sft"]), read_examples(files["rl"]), next(iter(eval_sets.values())),
                   prompt_format(cfg), d.compare, eval_sets)


def draw_held_out(held_out: dict[str, list[str]], validation: dict[str, list[str]], synth, trained: tuple[set, set]
                  ) -> dict[str, list[Example]]:
    """Each held-out set's questions, synthesized by `synth(db, seed, avoid_sql)` at its own seed, none with a
    trained query or question (`trained`: SQL, questions). A test set also avoids those of the `validation` sets:
    the seen-types sets share table types, and a test question must be one no design choice has seen."""
    from data_synthesis.demo_dbs import HELD_OUT_SETS

    def draw(name: str, dbs: list[str], sql: set[str], questions: set[str]) -> list[Example]:
        return [e for db in dbs for e in synth(db, HELD_OUT_SETS[name].question_seed, sql)
                if e.question not in questions]

    val = {name: draw(name, dbs, *trained) for name, dbs in validation.items()}
    seen = (trained[0] | {e.gold_sql for rows in val.values() for e in rows},
            trained[1] | {e.question for rows in val.values() for e in rows})
    return {name: val[name] if validation.get(name) == dbs else
            draw(name, dbs, *(seen if HELD_OUT_SETS[name].split == "test" else trained))
            for name, dbs in held_out.items()}


def evaluate_phase(backend: Backend, model: Path, data: RunData, phase: str) -> dict:
    """A phase's held-out figures: the first set's (`eval_exec_acc`, ...), and with several sets each one's EX
    (`eval_sets`; the others are logged as stage `<phase>@<set>`)."""
    figures = backend.evaluate(model, data, phase)
    if len(data.eval_sets) > 1:
        first, *others = data.eval_sets
        figures["eval_sets"] = {first: figures["eval_exec_acc"], **{
            name: backend.evaluate(model, replace(data, eval_set=data.eval_sets[name]), f"{phase}@{name}")[
                "eval_exec_acc"] for name in others}}
    return figures


def held_out_line(info: dict) -> str:
    """`after sft: held-out EX = 29.8%`, and with several held-out sets each one's EX, named."""
    sets = info.get("eval_sets")
    if not sets:
        return f"after {info['phase']}: held-out EX = {info['eval_exec_acc']:.1%}"
    return f"after {info['phase']}: held-out EX " + ", ".join(f"{name} {acc:.1%}" for name, acc in sets.items())


def check_pools(cfg: RunConfig, data: RunData, sft_only: bool) -> None:
    """Each phase that runs has examples: a ConfigError naming the keys to change, before any model is built."""
    d = cfg.data
    if cfg.sft.enabled and not data.sft_pool:
        raise ConfigError(f"no SFT examples: data.sft_share={d.sft_share} (split by {d.sft_split}) of the "
                          f"{len(data.rl_pool)}-example training pool leaves none for the warm start; raise "
                          "data.sft_share, or set sft.enabled=false")
    if not sft_only and not data.rl_pool:
        raise ConfigError(f"no RL examples: the training pool has {len(data.sft_pool)} examples and data.sft_share="
                          f"{d.sft_share} (data.rl_pool={d.rl_pool}) leaves none for the stages; lower data.sft_share "
                          "or set data.rl_pool=all")


def split_pool(pool: list[Example], share: float, by: str, seed: int) -> tuple[list[Example], list[Example]]:
    """(SFT part, rest) of a shuffled pool: `share` of its examples, or of its databases when `by="databases"`.

    Splitting by database leaves RL databases the warm start never saw, the same shift the held-out
    databases have, so what RL teaches there (copying literals, reading an unseen schema) is what transfers.
    """
    if by == "databases":
        dbs = sorted({e.db_id for e in pool})
        random.Random(seed).shuffle(dbs)
        sft_dbs = set(dbs[:round(len(dbs) * share)])
        return [e for e in pool if e.db_id in sft_dbs], [e for e in pool if e.db_id not in sft_dbs]
    n = int(len(pool) * share)
    return pool[:n], pool[n:]


def _done(phase_dir: Path) -> dict | None:
    marker = phase_dir / "DONE.json"
    return json.loads(marker.read_text()) if marker.is_file() else None


def _mark_done(phase_dir: Path, info: dict) -> None:
    phase_dir.mkdir(parents=True, exist_ok=True)
    tmp = phase_dir / "DONE.json.tmp"
    tmp.write_text(json.dumps(info, indent=2))
    os.replace(tmp, phase_dir / "DONE.json")


def run(cfg: RunConfig, backend: Backend, sft_only: bool = False) -> dict:
    """Run (or resume) the schedule -- or only its warm start -- and return the summary (`run_dir/summary.json`).

    SIGTERM / SIGUSR1 stop it at the next point where everything done is on disk, with `Preempted`: the end
    of a DAPO step or an SFT step (each checkpointed), a finished chunk of pass-rate estimates (cached), the
    end of a phase (DONE.json). Other work in progress (synthesis, evaluation, curriculum gap filling) runs to
    that point first. Under a launcher the signal ends the process as before: the other ranks cannot follow.
    """
    if launch_world_size() > 1:
        return _run(cfg, backend, sft_only)
    with preemption_signals():
        return _run(cfg, backend, sft_only)


def _run(cfg: RunConfig, backend: Backend, sft_only: bool) -> dict:
    from data_synthesis.curriculum import MutationFiller, build_curriculum, report_lines, uniform_curriculum
    from data_synthesis.export import write_stage

    run_dir = cfg.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(to_yaml(cfg))
    t_start = time.monotonic()
    data = prepare_data(cfg)
    check_pools(cfg, data, sft_only)
    held_out = cfg.data.held_out_sets()
    sets = "" if len(held_out) < 2 else " (" + ", ".join(f"{name} {len(data.eval_sets[name])} on {len(dbs)}"
                                                         for name, dbs in held_out.items()) + ")"
    sft = f"{len(data.sft_pool)} SFT" + ("" if cfg.sft.enabled else " (not trained here: kept out of RL)")
    stderr.print(f"[bold]run[/] {run_dir}: {sft} / {len(data.rl_pool)} RL examples on "
                 f"{len(cfg.data.all_train_dbs())} databases; {sum(map(len, data.eval_sets.values()))} held-out "
                 f"questions on {sum(map(len, held_out.values()))} other databases{sets}")
    summary = {"run": str(run_dir), "phases": []}

    base_dir = run_dir / "base"
    if (info := _done(base_dir)) is None:
        info = {"phase": "base", "model": str(backend.prepare_base(data, base_dir / "model"))}
        if cfg.eval.base:  # the zero-shot row of a pretrained model
            info.update(evaluate_phase(backend, Path(info["model"]), data, "base"))
        _mark_done(base_dir, info)
    write_phase_card(cfg, data, info)
    model = Path(info["model"])
    if "eval_exec_acc" in info:
        summary["phases"].append(info)
        stderr.print(held_out_line(info))
    stop_if_preempted(f"stopped after the base model ({base_dir / 'DONE.json'} written)")

    if cfg.sft.enabled:
        sft_dir = run_dir / "sft"
        if (info := _done(sft_dir)) is None:
            t0 = time.monotonic()
            init = model
            model, figures = backend.sft(data, model, sft_dir)
            figures.update(evaluate_phase(backend, model, data, "sft"))
            info = {"phase": "sft", "init": str(init), "model": str(model), "seconds": round(time.monotonic() - t0, 1), **figures}
            _mark_done(sft_dir, info)
        write_phase_card(cfg, data, info)
        stop_if_preempted(f"stopped after SFT and its evaluation ({sft_dir / 'DONE.json'} written)")
        model = Path(info["model"])
        summary["phases"].append(info)
        stderr.print(held_out_line(info))

    for index, stage in enumerate([] if sft_only else cfg.stages, start=1):
        stage_dir = run_dir / f"stage{index}"
        if (info := _done(stage_dir)) is None:
            t0 = time.monotonic()
            rates, sampler, options = backend.pass_rates(data.rl_pool, model, stage, data, stage_dir)
            smoothing = stage_smoothing(stage)
            if stage.curriculum == "uniform":  # ablation: no smoothing, no gap filling
                curriculum = uniform_curriculum(data.rl_pool, rates, stage.budget, seed=cfg.seed + index,
                                                drop_empty_gold=stage.drop_empty_gold)
            else:
                filler = MutationFiller(data.db_root, sampler, stage.estimate_k, seed=cfg.seed + index,
                                        cache_path=stage_dir / "fill.cache.jsonl", **options) if stage.fill_bins else None
                curriculum = build_curriculum(data.rl_pool, rates, stage.budget, config=smoothing,
                                              seed=cfg.seed + index, filler=filler,
                                              drop_empty_gold=stage.drop_empty_gold)
            paths = write_stage(curriculum, stage_dir, "curriculum", data.db_root, config=smoothing,
                                compare=data.compare, prompt_format=data.prompt_format)
            head, *notes = report_lines(stage.name, curriculum.report)
            stderr.print(escape(head), soft_wrap=True)
            for note in notes:
                stderr.print(f"[yellow]note:[/] {escape(note)}", soft_wrap=True)
            pool_rates = [rates[e.id] for e in data.rl_pool if e.id in rates]
            t_curriculum = time.monotonic() - t0
            stop_if_preempted(f"stopped before training {stage.name} (its curriculum {paths['parquet']} written)")
            skipped = None
            if curriculum.examples:
                model_out = backend.train_stage(index, stage, paths["parquet"], model, data, stage_dir)
            else:  # every example solved (p = 1) or never solved (p = 0): DAPO has no gradient to follow
                skipped = empty_curriculum_message(stage.name, len(pool_rates), curriculum.report["dropped"], model)
                stderr.print(f"[yellow]warning:[/] {skipped}")
                model_out = model
            figures = evaluate_phase(backend, model_out, data, stage.name)
            info = {"phase": stage.name, "init": str(model), "model": str(model_out), "seconds": round(time.monotonic() - t0, 1),
                    "curriculum_seconds": round(t_curriculum, 1), "curriculum": str(paths["parquet"]),
                    "pool_mean_pass_rate": sum(pool_rates) / max(len(pool_rates), 1),
                    "curriculum_report": curriculum.report, **({"skipped": skipped} if skipped else {}), **figures}
            _mark_done(stage_dir, info)
        write_phase_card(cfg, data, info)
        stop_if_preempted(f"stopped after {stage.name} and its evaluation ({stage_dir / 'DONE.json'} written)")
        model = Path(info["model"])
        summary["phases"].append(info)
        stderr.print(held_out_line(info))

    summary["final_model"] = str(model)
    summary["eval_exec_acc"] = {p["phase"]: p["eval_exec_acc"] for p in summary["phases"]}
    if len(data.eval_sets) > 1:
        summary["eval_sets"] = {p["phase"]: p["eval_sets"] for p in summary["phases"] if "eval_sets" in p}
    summary["wall_seconds_this_invocation"] = round(time.monotonic() - t_start, 1)
    summary["config"] = asdict(cfg)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    if cfg.logging.plots:
        from sirius_train.plots import plot_run

        plot_run(run_dir)
    return summary


def stage_smoothing(stage: StageConfig):
    """The stage's `SmoothingConfig`: its bins on the pass rates j/estimate_k (uniform stages ignore the bins)."""
    from data_synthesis.smoothing import SmoothingConfig, bins_for

    k = stage.estimate_k if stage.curriculum == "smoothed" else None
    return SmoothingConfig(n_bins=bins_for(k, stage.bins), max_repeats=stage.max_repeats,
                           keep_zero_share=stage.keep_zero_share, k=k)


def empty_curriculum_message(stage: str, rated: int, dropped: dict, model: Path) -> str:
    """Why a stage trains nothing, and what gives it something to train on.

    >>> empty_curriculum_message("stage1", 199, {"p = 0": 199}, Path("runs/x/sft/model"))[:97]
    'stage1: empty curriculum: none of the 199 rated pool questions has a pass rate strictly between 0'
    """
    return (f"{stage}: empty curriculum: none of the {rated} rated pool questions has a pass rate strictly between "
            f"0 and 1 under {model} ({dropped}), so DAPO has no gradient to follow; the stage is skipped (no training "
            "launched) and the model carried over. A longer warm start (sft.epochs) or an easier pool gives it one")
