"""`VerlBackend`: the schedule's DAPO stages run as verl jobs on a Ray cluster; the other phases run here.

Per stage: translate the run config (translate.py), check it against verl's own Hydra config
(compose.py), launch verl's `main_ppo` through our entry point (main_ppo.py, launch.py), merge the last
FSDP checkpoint to an HF folder, and hand that folder to the schedule, which re-estimates difficulty with
it for stage 2.
Building the base model, the SFT warm start, pass rates and evaluation reuse `LocalBackend` (HF on this
node's first GPU): they are inference or small jobs, and the schedule exchanges plain HF folders.
"""

from __future__ import annotations

import gc
import json
import os
import shlex
from dataclasses import dataclass
from pathlib import Path

from sirius_train.config import ConfigError, RunConfig, StageConfig
from sirius_train.progress import stderr
from sirius_train.verl_backend.launch import (
    latest_actor_checkpoint,
    merge_to_hf,
    prepend_path,
    run_logged,
    verl_command,
    verl_env,
)
from sirius_train.verl_backend.translate import StagePaths, stage_overrides

PROJECT_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class StagePlan:
    """Everything needed to launch one stage, and to show it in a dry run."""

    name: str
    paths: StagePaths
    overrides: list[str]
    argv: list[str]

    def shell(self) -> str:
        return shlex.join(self.argv)


def plan_stage(cfg: RunConfig, index: int, stage: StageConfig, curriculum: Path, init: Path, stage_dir: Path,
               eval_parquet: Path) -> StagePlan:
    """The verl command for stage `index` (1-based); every path absolute, since Ray workers run elsewhere."""
    checkpoints = (Path(cfg.verl.checkpoint_dir) / cfg.name / stage.name if cfg.verl.checkpoint_dir
                   else stage_dir / "verl_checkpoints")
    paths = StagePaths(
        train_files=str(curriculum.resolve()), val_files=str(eval_parquet.resolve()), model=str(init.resolve()),
        checkpoints=str(checkpoints.resolve()), reward_fn=str(PROJECT_ROOT / "rewards" / "verl_reward.py"),
        db_root=str(Path(cfg.data.db_root).resolve()),
        pythonpath=prepend_path(str(PROJECT_ROOT), os.environ.get("PYTHONPATH")),
        metrics=str((stage_dir / "verl_metrics.jsonl").resolve()))
    overrides = stage_overrides(cfg, index, stage, paths)
    return StagePlan(stage.name, paths, overrides, verl_command(cfg.verl.python, overrides))


def plan_run(cfg: RunConfig) -> list[StagePlan]:
    """Each stage's plan at the paths the schedule will use (for `--dry-run`: nothing needs to exist yet)."""
    run_dir = cfg.run_dir
    if cfg.model.path:
        init = Path(cfg.model.path)
    else:
        init = run_dir / ("sft" if cfg.sft.enabled else "base") / "model"
    plans = []
    for index, stage in enumerate(cfg.stages, start=1):
        stage_dir = run_dir / f"stage{index}"
        plans.append(plan_stage(cfg, index, stage, stage_dir / "curriculum.parquet", init, stage_dir,
                                eval_parquet_path(cfg)))
        init = stage_dir / "model"
    return plans


def eval_parquet_path(cfg: RunConfig) -> Path:
    return cfg.run_dir / "data" / "eval.parquet"


class VerlBackend:
    """The `Backend` of `sirius_train.schedule` on verl."""

    def __init__(self, cfg: RunConfig):
        try:
            import verl  # noqa: F401
        except ImportError:
            raise ConfigError("backend=verl needs verl installed: pip install -e '.[verl]' (verl 0.9.1, Ray, "
                              "TransferQueue; vLLM or SGLang for rollouts on the GPU nodes)") from None
        from sirius_train.local.backend import LocalBackend

        self.cfg = cfg
        self.local = LocalBackend(cfg)

    # Phases that are inference or small jobs run here, exactly as on the local backend.
    def prepare_base(self, data, out: Path) -> Path:
        return self.local.prepare_base(data, out)

    def sft(self, data, init: Path, out: Path):
        return self.local.sft(data, init, out)

    def pass_rates(self, examples, model: Path, stage: StageConfig, data, out: Path):
        return self.local.pass_rates(examples, model, stage, data, out)

    def evaluate(self, model: Path, data, stage: str) -> dict:
        return self.local.evaluate(model, data, stage)

    def train_stage(self, index: int, stage: StageConfig, curriculum: Path, init: Path, data, out: Path) -> Path:
        """Launch verl on the curriculum, wait, merge its last checkpoint; returns the HF folder `out/model`."""
        from omegaconf import OmegaConf

        from data_synthesis.export import write_verl_parquet
        from sirius_train.progress import progress_bar
        from sirius_train.verl_backend.compose import compose_verl_config

        model_dir = out / "model"
        if (model_dir / "config.json").is_file():  # merged before an interruption
            return model_dir
        _check_rows(curriculum, stage)
        eval_parquet = eval_parquet_path(self.cfg)
        if not eval_parquet.is_file():
            write_verl_parquet(data.eval_set, eval_parquet, data.db_root, compare=data.compare,
                               prompt_format=data.prompt_format)
        plan = plan_stage(self.cfg, index, stage, curriculum, init, out, eval_parquet)
        resolved = compose_verl_config(plan.overrides)  # a bad key fails here, not minutes into a cluster job
        out.mkdir(parents=True, exist_ok=True)
        (out / "verl_config.yaml").write_text(OmegaConf.to_yaml(resolved))
        (out / "verl_command.sh").write_text(plan.shell() + "\n")
        self._free_gpu()
        env = verl_env(plan.paths.pythonpath, self.cfg.verl.ray_address)
        _rotate(Path(plan.paths.metrics))
        stderr.print(f"[bold]verl[/] {stage.name}: {self.cfg.verl.nnodes}x{self.cfg.verl.n_gpus_per_node} GPUs, "
                     f"log {out / 'verl.log'}")
        with progress_bar(f"DAPO {stage.name} (verl)", stage.steps) as advance:
            done = [0]

            def on_step(step: int) -> None:
                if step > done[0]:
                    advance(step - done[0])
                    done[0] = step

            run_logged(plan.argv, env, out / "verl.log", on_step=on_step)
        actor = latest_actor_checkpoint(Path(plan.paths.checkpoints))
        merge_to_hf(self.cfg.verl.python, actor, model_dir, env, out / "merge.log")
        self._import_metrics(Path(plan.paths.metrics), stage.name)
        return model_dir

    def close(self) -> None:
        self.local.close()

    def _free_gpu(self) -> None:
        """verl needs every GPU of this node: move off the GPU the model LocalBackend keeps between phases.

        Moved, not only dropped: the schedule still holds the pass-rate sampler, which references it.
        """
        import torch

        if self.local._loaded is not None:  # LocalBackend has no public unload
            self.local._loaded[1].to("cpu")
            self.local._loaded = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def _import_metrics(self, path: Path, stage: str) -> None:
        """verl's per-step metrics into `runs/<name>/metrics.jsonl` (later launches of a step win)."""
        by_step: dict[int, dict] = {}
        for part in sorted(path.parent.glob(path.name + ".*")) + [path]:
            if part.is_file():
                for line in part.read_text().splitlines():
                    row = json.loads(line)
                    by_step[row["step"]] = row["data"]
        for step in sorted(by_step):
            self.local.metrics.log({"stage": stage, "step": step, "backend": "verl", **by_step[step]})


def _check_rows(curriculum: Path, stage: StageConfig) -> None:
    import pyarrow.parquet as pq

    rows = pq.read_metadata(curriculum).num_rows
    if rows < stage.prompts_per_step:
        raise ConfigError(f"{curriculum} has {rows} prompts but stage {stage.name!r} has prompts_per_step="
                          f"{stage.prompts_per_step}: verl drops incomplete batches, so nothing would train; "
                          "raise the stage budget or lower prompts_per_step")


def _rotate(metrics: Path) -> None:
    """verl's file logger truncates its file: keep an earlier launch's rows as `<name>.<n>`."""
    if metrics.is_file():
        n = len(list(metrics.parent.glob(metrics.name + ".*")))
        metrics.rename(metrics.with_name(f"{metrics.name}.{n:03d}"))
