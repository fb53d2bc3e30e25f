"""Warm-up means one thing on both backends: training step t trains at lr * min(1, t / warmup_steps).

The local trainer's side runs real training steps (`test_local_backend.py::test_warmup_counts_training_steps`);
here verl's side: the optimizer config our overrides compose to, given to verl's own FSDP scheduler builder,
advanced once per training step as verl's actor worker does (after the step's last mini-batch).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from conftest import import_verl
from tiny_run import NANO

from sirius_train.config import load_config
from sirius_train.local.trainer import warmup_factor
from sirius_train.verl_backend.translate import StagePaths, stage_overrides

PATHS = StagePaths(train_files="/r/stage1/curriculum.parquet", val_files="/r/data/eval.parquet", model="/r/sft/model",
                   checkpoints="/r/stage1/verl_checkpoints", reward_fn="/code/rewards/verl_reward.py",
                   db_root="/data/dbs", pythonpath="/code", metrics="/r/stage1/verl_metrics.jsonl")


def test_warmup_factor_is_linear_from_the_first_step():
    assert [warmup_factor(t, 4) for t in range(1, 7)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert [warmup_factor(t, 0) for t in (1, 2)] == [1.0, 1.0]
    assert warmup_factor(1, 1) == 1.0


def _verl_lrs(warmup: int, steps: int) -> tuple[float, list[float]]:
    import_verl("hydra")
    engine = import_verl("verl.workers.engine.fsdp.transformer_impl")
    from verl.utils.config import omega_conf_to_dataclass

    from sirius_train.verl_backend.compose import compose_verl_config

    cfg = load_config(NANO, ["backend=verl", f"stages.0.warmup_steps={warmup}", f"stages.0.steps={steps}"])
    resolved = compose_verl_config(stage_overrides(cfg, 1, cfg.stages[0], PATHS))
    optim = omega_conf_to_dataclass(resolved.actor_rollout_ref.actor.optim)
    optim.total_training_steps = steps  # verl injects the run's length at start-up
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=optim.lr)
    scheduler = engine.FSDPEngine._build_lr_scheduler(SimpleNamespace(optimizer_config=optim, rank=1), optimizer)
    lrs = []
    for _ in range(steps):  # every mini-batch of training step t trains at this rate
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return cfg.stages[0].lr, lrs


@pytest.mark.parametrize("warmup", [0, 1, 3])
def test_verl_warms_up_as_the_local_trainer_does(warmup):
    lr, lrs = _verl_lrs(warmup, steps=6)
    assert lrs == pytest.approx([lr * warmup_factor(t, warmup) for t in range(1, 7)], rel=1e-12)
    assert lrs[0] > 0  # verl's plain "constant" schedule would train step 1 at lr 0
