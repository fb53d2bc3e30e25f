"""What a run will generate, before it pays for it: per stage, the pass-rate estimation (RL pool x k, the
largest cost of a stage on a real model) beside what DAPO samples, and the held-out evaluations.

`sirius train --dry-run` and `sirius doctor` print it, so a user sizes `estimate_k` and the pool knowingly.
The pool sizes come from the run folder's data when it exists (a rerun), else from the config (at most: synthesis
may make fewer examples than `data.synth_per_db` on a small database). Light: no model, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from data_synthesis.smoothing import bins_for
from sirius_train.config import RunConfig

FILL_OVERGENERATE = 2  # data_synthesis.curriculum.build_curriculum's default: parents per missing example
FILL_ROUNDS = 2  # and its max_fill_rounds


@dataclass(frozen=True)
class Sizes:
    rl_pool: int | None  # None: not known here (a pool file this machine cannot read)
    held_out: int  # questions over every held-out set
    source: str  # where the figures come from


@dataclass(frozen=True)
class StageCost:
    name: str
    estimation: int  # rl_pool x estimate_k
    fill_max: int  # gap filling's estimation at most (0: off)
    dapo: int  # steps x prompts_per_step x n_samples (one generation round per step)
    dapo_max: int  # ... with every dynamic-sampling round run


def _lines(path: str | Path) -> int:
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip())


def sizes(cfg: RunConfig) -> Sizes:
    """The RL pool and held-out question counts: the run folder's own when its data is written, else planned."""
    data = cfg.run_dir / "data"
    sets = cfg.data.held_out_sets()
    files = [data / ("eval.jsonl" if i == 0 else f"eval-{name}.jsonl") for i, name in enumerate(sets)]
    if (data / "rl.jsonl").is_file() and all(f.is_file() for f in files):
        return Sizes(_lines(data / "rl.jsonl"), sum(map(_lines, files)), f"from {data}")
    d = cfg.data
    held_out = sum(len(dbs) for dbs in sets.values()) * d.eval_per_db
    absent = [str(p) for p in d.pool_files if not Path(p).is_file()]
    if absent:
        return Sizes(None, held_out, f"planned from the config; the pool's size is unknown here: no {absent[0]}")
    pool = len(d.all_train_dbs()) * d.synth_per_db + sum(map(_lines, d.pool_files))
    rl = pool if d.rl_pool == "all" else round(pool * (1 - d.sft_share))
    return Sizes(rl, held_out, "planned from the config, at most: synthesis may make fewer")


def stage_costs(cfg: RunConfig, rl_pool: int) -> list[StageCost]:
    """Each stage's generations (pure; `rl_pool=1` gives the estimation per pool example).

    >>> from sirius_train.config import StageConfig
    >>> cfg = RunConfig(stages=[StageConfig(name="s1", steps=40, prompts_per_step=8, n_samples=8, estimate_k=4,
    ...                                     max_gen_rounds=3, fill_bins=False)])
    >>> stage_costs(cfg, 690)
    [StageCost(name='s1', estimation=2760, fill_max=0, dapo=2560, dapo_max=7680)]
    """
    out = []
    for s in cfg.stages:
        dapo = s.steps * s.prompts_per_step * s.n_samples
        fill = 0
        if s.fill_bins and s.curriculum == "smoothed":  # each round: 2 parents per missing example, each estimated
            bins = bins_for(s.estimate_k, s.bins)
            fill = FILL_ROUNDS * FILL_OVERGENERATE * (-(-s.budget // s.max_repeats) + bins) * s.estimate_k
        out.append(StageCost(s.name, rl_pool * s.estimate_k, fill, dapo, dapo * s.max_gen_rounds))
    return out


def eval_generations(cfg: RunConfig, held_out: int) -> tuple[int, int]:
    """(generations per evaluation of every held-out set, evaluations): of the base model (`eval.base`), after SFT
    and after each stage."""
    return held_out * (1 + cfg.eval.k), int(cfg.eval.base) + int(cfg.sft.enabled) + len(cfg.stages)


def cost_rows(cfg: RunConfig, found: Sizes | None = None) -> list[tuple[str, str]]:
    """The preview as (what, figures) rows: the sizes, one row per stage, one for evaluation."""
    found = found or sizes(cfg)
    what = "episodes" if cfg.rollout.multi_turn.enabled else "answers"
    pool = "an RL pool of unknown size" if found.rl_pool is None else f"an RL pool of {found.rl_pool:,}"
    rows = [("generations", f"{what} sampled over {pool} and {found.held_out:,} held-out questions ({found.source})")]
    for s, c in zip(cfg.stages, stage_costs(cfg, found.rl_pool or 1)):
        fill = f" (+ gap filling <= {c.fill_max:,})" if c.fill_max else ""
        estimation = (f"pool x k={s.estimate_k} ({s.estimate_k} per pool example)" if found.rl_pool is None else
                      f"{found.rl_pool:,} x k={s.estimate_k} = {c.estimation:,}")
        rows.append((s.name, f"pass rates {estimation}{fill}; DAPO "
                             f"{s.steps} steps x {s.prompts_per_step} prompts x {s.n_samples} = {c.dapo:,} (<= "
                             f"{c.dapo_max:,} with {s.max_gen_rounds} dynamic-sampling rounds)"))
    each, times = eval_generations(cfg, found.held_out)
    k = f" x (1 greedy + eval.k={cfg.eval.k})" if cfg.eval.k else " (greedy)"
    rows.append(("evaluation", f"{found.held_out:,}{k} = {each:,} per phase, {times} phases = {each * times:,}"))
    return rows
