"""Preemption outside the local trainer: the light halts module, signals forwarded to the verl child and by
the Slurm script, and signals during SFT / pass-rate estimation."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from sirius_train.halts import Preempted
from sirius_train.verl_backend.launch import resume_point, run_logged, verl_env

ROOT = Path(__file__).resolve().parents[1]


def test_the_halts_module_imports_without_torch():
    """The verl launcher and the commands raise and catch `Preempted` without the local trainer's torch."""
    code = ("import sys, sirius_train.halts as h; "
            "print(issubclass(h.Preempted, h.TrainingHalted), issubclass(h.NonFiniteGradients, h.TrainingHalted), "
            "[m for m in ('torch', 'transformers') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}).stdout
    assert out.split("\n")[0] == "True True []"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1], ids=["SIGTERM", "SIGUSR1"])
def test_a_signal_to_the_launcher_reaches_verls_process_group_and_ends_in_preempted(tmp_path, sig):
    """verl's launcher forwards the signal to verl's whole process group, waits for it, raises `Preempted`
    naming the checkpoint `resume_mode=auto` resumes from; its own handlers are back afterwards."""
    before = signal.getsignal(sig)

    def on_step(step: int) -> None:  # the cluster's signal, once verl has saved step 2 and is on step 3
        if step == 3:
            os.kill(os.getpid(), sig)

    argv = [sys.executable, "-m", "preempt_verl_standin", str(tmp_path)]  # as verl_command runs verl's entry
    expected = (rf"{sig.name}: passed on to preempt_verl_standin, which stopped \(exit code {-sig}\); "
                rf"verl resumes from {tmp_path}/checkpoints/global_step_2 \(the steps after 2 are redone\)")
    with pytest.raises(Preempted, match=expected):
        run_logged(argv, verl_env(str(ROOT / "tests"), None), tmp_path / "verl.log", on_step=on_step,
                   checkpoints=tmp_path / "checkpoints")
    assert (tmp_path / "main.sig").read_text() == (tmp_path / "helper.sig").read_text() == sig.name
    assert (tmp_path / "main.exited").exists()  # run_logged returned only after verl was gone
    assert signal.getsignal(sig) is before


def test_without_a_checkpoint_the_message_says_the_stage_restarts(tmp_path):
    assert resume_point(tmp_path) == f"verl has no checkpoint in {tmp_path} yet: the stage restarts from its first step"
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("12\n")
    assert resume_point(tmp_path) == f"verl resumes from {tmp_path}/global_step_12 (the steps after 12 are redone)"


def test_the_verl_stage_saves_every_checkpoint_every_steps_keeps_n_and_resumes_automatically(tmp_path):
    """What a preempted verl stage resumes from, in verl's own resolved config: saves every
    `checkpoint_every` steps into the stage's folder, `keep_checkpoints` kept, `resume_mode=auto`."""
    from sirius_train.config import load_config
    from sirius_train.verl_backend.compose import compose_verl_config
    from sirius_train.verl_backend.translate import StagePaths, stage_overrides

    cfg = load_config(ROOT / "configs" / "nano.yaml", ["backend=verl", "stages.0.checkpoint_every=3",
                                                        "verl.keep_checkpoints=4"])
    paths = StagePaths(train_files="/r/c.parquet", val_files="/r/e.parquet", model="/r/sft/model",
                       checkpoints=str(tmp_path / "verl_checkpoints"), reward_fn="/code/rewards/verl_reward.py",
                       db_root="/data/dbs", pythonpath=str(ROOT), metrics="/r/stage1/verl_metrics.jsonl")
    trainer = compose_verl_config(stage_overrides(cfg, 1, cfg.stages[0], paths)).trainer
    assert (trainer.save_freq, trainer.max_actor_ckpt_to_keep, trainer.resume_mode, trainer.default_local_dir) == (
        3, 4, "auto", str(tmp_path / "verl_checkpoints"))
