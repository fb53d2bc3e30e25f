"""One local DAPO stage in its own process, for the preemption test: `python preempt_worker.py RUN_DIR OUT_DIR`.

Starts from RUN_DIR's SFT model on its stage-1 curriculum (a tiny run), resumes from OUT_DIR's checkpoints
when there are any, prints `step N` after every step and, when preempted, the exception's line; exits 0.
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
from tiny_run import NANO, tiny_overrides

from sirius_train.config import load_config
from sirius_train.local.backend import LocalBackend, read_curriculum
from sirius_train.halts import Preempted
from sirius_train.local.trainer import DAPOTrainer
from sirius_train.metrics import MetricsLog

STEPS = 8


def main(run_dir: Path, out: Path) -> None:
    torch.set_num_threads(1)  # bit-exact runs to compare
    cfg = load_config(NANO, [*tiny_overrides(run_dir.parent.parent), f"output_dir={out / 'backend'}"])
    backend = LocalBackend(cfg)
    model, tokenizer = backend.load(run_dir / "sft" / "model")
    stage = replace(cfg.stages[0], steps=STEPS, checkpoint_every=100)  # only the preemption checkpoints mid-stage

    def show(step: int, row: dict) -> None:
        print(f"step {step}", flush=True)
        time.sleep(0.3)  # room for the test's signal to arrive mid-stage

    trainer = DAPOTrainer(model, tokenizer, read_curriculum(run_dir / "stage1" / "curriculum.parquet"), stage,
                          backend.executor, ckpt_dir=out / "checkpoints", metrics=MetricsLog(out / "metrics.jsonl"),
                          seed=7, progress=show)
    if trainer.resume():
        print(f"resumed from step {trainer.step}", flush=True)
    try:
        trainer.train()
    except Preempted as e:
        print(f"preempted: {e}", flush=True)
    finally:
        backend.close()


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
