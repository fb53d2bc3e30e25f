"""A run folder as a user meets it through `sirius train` / `sirius sft`: Ctrl-C stops cleanly and resumes."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tiny_run import NANO, tiny_overrides

ROOT = Path(__file__).resolve().parents[1]


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), COLUMNS="200")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_ctrl_c_during_sft_checkpoints_the_step_exits_130_and_the_same_command_resumes(tmp_path):
    """A terminal's Ctrl-C (SIGINT to the whole process group) during `sirius sft`: the step in progress ends, the
    checkpoint is written, the resume line printed, exit code 130; the same command resumes SFT from there."""
    args = [sys.executable, "-m", "sirius_train.cli", "sft", str(NANO), *tiny_overrides(tmp_path, "ctrlc")]
    run_dir = tmp_path / "runs" / "ctrlc"
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_env(),
                            start_new_session=True)
    deadline = time.monotonic() + 600
    while not (run_dir / "base" / "DONE.json").exists():  # SFT comes next: a signal from now on stops it
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=600)
    err = " ".join(err.split())
    assert proc.returncode == 130, err[-3000:]
    assert "Ctrl-C: stopping at the next checkpoint" in err
    stopped = re.search(r"interrupted -- SIGINT: SFT stopped after step (\d+) of (\d+), checkpoint (\S+) written; "
                        r"resume with: sirius sft", err)
    assert stopped and Path(stopped.group(3)).is_dir(), err[-3000:]
    assert not (run_dir / "sft" / "DONE.json").exists()

    resumed = subprocess.run(args, capture_output=True, text=True, env=_env(), timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming SFT from {stopped.group(3)}" in " ".join(resumed.stderr.split())
    assert (run_dir / "sft" / "DONE.json").exists()


# ------------------------------------------------------------------------------------------- the run record
def _record(tmp_path, *overrides):
    """A run folder as the schedule leaves it: the config it was made with in config.yaml."""
    from sirius_train.config import load_config, to_yaml

    cfg = load_config(NANO, [*tiny_overrides(tmp_path, "rec"), *overrides])
    cfg.run_dir.mkdir(parents=True)
    (cfg.run_dir / "config.yaml").write_text(to_yaml(cfg))
    return cfg


def test_a_rerun_with_a_changed_config_refuses_and_names_the_keys(tmp_path):
    """`sirius train` on a run folder made with seed 0 and stage-1 lr 1e-4, now asked with seed 5 and lr 1e-3: one
    line naming both keys and both ways on, exit 2, the record untouched and nothing started."""
    from typer.testing import CliRunner

    from sirius_train.cli import app

    cfg = _record(tmp_path)
    recorded = (cfg.run_dir / "config.yaml").read_bytes()
    result = CliRunner().invoke(app, ["train", str(NANO), *tiny_overrides(tmp_path, "rec"), "seed=5",
                                      "stages.0.lr=1e-3"], env={"COLUMNS": "400"})
    assert result.exit_code == 2, result.output
    line = " ".join(result.output.split())
    assert line.startswith(f"error: {cfg.run_dir} was made with another config (seed: 0 -> 5; stages.0.lr: "
                           f"{cfg.stages[0].lr} -> 0.001)"), line
    assert "--resume-anyway" in line and "--fresh" in line and "Traceback" not in result.output
    assert (cfg.run_dir / "config.yaml").read_bytes() == recorded
    assert sorted(p.name for p in cfg.run_dir.iterdir()) == [".lock", "config.yaml"]
    both = CliRunner().invoke(app, ["train", str(NANO), "--resume-anyway", "--fresh"])
    assert both.exit_code == 2 and "exclude each other" in both.output


def test_where_and_how_fast_may_change_what_is_computed_may_not(tmp_path):
    from sirius_train.config import load_config
    from sirius_train.run_folder import config_changes

    cfg = _record(tmp_path)
    same = load_config(NANO, [*tiny_overrides(tmp_path, "rec"), "threads=1", "logging.plots=false",
                              "stages.0.checkpoint_every=7", "reward.workers=2", f"data.db_root={tmp_path}/moved",
                              "verl.keep_checkpoints=5", f"verl.checkpoint_dir={tmp_path}/ckpts"])
    assert config_changes(cfg, same) == []
    other = load_config(NANO, [*tiny_overrides(tmp_path, "rec"), "stages.1.temperature=0.5", "data.train_dbs=[library]",
                               "rollout.multi_turn.enabled=true", "verl.gradient_checkpointing=false",
                               "verl.overrides=[actor_rollout_ref.actor.optim.weight_decay=0.1]"])
    assert sorted(config_changes(cfg, other)) == ["data.train_dbs: ['retail'] -> ['library']",
                                          "rollout.multi_turn.enabled: False -> True",
                                          "stages.1.temperature: 1.0 -> 0.5",
                                          "verl.gradient_checkpointing: True -> False",
                                          "verl.overrides: [] -> ['actor_rollout_ref.actor.optim.weight_decay=0.1']"]


def test_resume_anyway_keeps_the_old_record_and_fresh_moves_the_folder_aside(tmp_path):
    from sirius_train.config import load_config
    from sirius_train.run_folder import claim

    cfg = _record(tmp_path)
    (cfg.run_dir / "summary.json").write_text("{}")
    changed = load_config(NANO, [*tiny_overrides(tmp_path, "rec"), "seed=5"])
    notices = []
    with claim(changed, "resume-anyway", notices.append):
        pass
    kept = list(cfg.run_dir.glob("config.before-*.yaml"))
    assert len(kept) == 1 and "seed: 0" in kept[0].read_text() and "seed: 0 -> 5" in notices[0]
    with claim(changed, "fresh", notices.append) as run_dir:
        assert run_dir == cfg.run_dir and sorted(p.name for p in run_dir.iterdir()) == [".lock", "run_id"]
    aside = list(tmp_path.glob("runs/rec.replaced-*"))
    assert len(aside) == 1 and (aside[0] / "summary.json").is_file() and f"aside to {aside[0]}" in notices[1]


# ------------------------------------------------------------------------------------------- the lock
HOLD = """
import sys, time
from sirius_train.config import load_config
from sirius_train.run_folder import claim
cfg = load_config(sys.argv[1], sys.argv[2:])
with claim(cfg):
    print("holding", flush=True)
    time.sleep(120)
"""


def test_a_second_run_on_a_busy_folder_refuses_and_a_dead_holders_lock_is_taken_over(tmp_path):
    """A real second process holds the run folder: `sirius train` there refuses at once naming its PID and host;
    once that process is SIGKILLed (its lock file left behind), the next claim takes the lock over and says so."""
    import socket

    from typer.testing import CliRunner

    from sirius_train.cli import app
    from sirius_train.config import load_config
    from sirius_train.run_folder import RunFolderBusy, claim

    overrides = tiny_overrides(tmp_path, "busy")
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(NANO), *overrides], stdout=subprocess.PIPE, text=True,
                              env=_env())
    try:
        assert holder.stdout.readline() == "holding\n"
        cfg = load_config(NANO, overrides)
        with pytest.raises(RunFolderBusy, match=rf"is in use by PID {holder.pid} on {socket.gethostname()} "):
            with claim(cfg):
                pass
        result = CliRunner().invoke(app, ["train", str(NANO), *overrides], env={"COLUMNS": "400"})
        assert result.exit_code == 2 and f"in use by PID {holder.pid}" in result.output, result.output
    finally:
        holder.kill()
        holder.wait()
    notices = []
    with claim(cfg, notice=notices.append):
        assert (cfg.run_dir / ".lock").read_text().startswith(f'{{"pid": {os.getpid()}')
    assert notices == [f"taking over the lock of {cfg.run_dir} from PID {holder.pid} on {socket.gethostname()} "
                       f"(since {notices[0].split('(since ')[1].split(')')[0]}), which no longer holds it (it was "
                       "stopped or killed)"]
    with claim(cfg, notice=notices.append):  # a clean end left no holder behind: no notice
        pass
    assert len(notices) == 1


def test_a_lock_won_on_a_folder_moved_aside_meanwhile_is_not_taken_as_the_runs(tmp_path, monkeypatch):
    """A second run opens RUN/.lock; before it flocks, a `--fresh` run moves the folder aside (the opened file with
    it), releases that file and locks the new RUN/.lock. The second run's flock then succeeds on the moved file: it
    must see that file is no longer RUN/.lock, try the new one, and find it busy -- not write beside the first."""
    import fcntl

    from sirius_train import run_folder

    cfg = _record(tmp_path)
    real_flock, fresh_run = fcntl.flock, []

    def flock_after_a_fresh_start_moved_the_folder(fd, operation):
        if not fresh_run:  # the fresh run's steps, between the second run's open and its flock
            os.replace(cfg.run_dir, cfg.run_dir.with_name("rec.replaced-1"))
            cfg.run_dir.mkdir()
            fresh_run.append(open(cfg.run_dir / ".lock", "a+"))
            real_flock(fresh_run[0], fcntl.LOCK_EX | fcntl.LOCK_NB)
        return real_flock(fd, operation)

    monkeypatch.setattr(fcntl, "flock", flock_after_a_fresh_start_moved_the_folder)
    try:
        with pytest.raises(run_folder.RunFolderBusy, match="is in use by"):
            with run_folder.claim(cfg):
                pass
    finally:
        fresh_run[0].close()


# ------------------------------------------------------------------------------------------- the picture
def test_an_sft_only_run_plots_its_held_out_panel_alone_without_warnings(tmp_path):
    """`sirius sft` leaves no DAPO step: training.png is the held-out panel only (no four empty panels) and
    matplotlib warns of nothing (an empty legend used to leak a warning into the command's output)."""
    import json
    import warnings

    from matplotlib.image import imread

    from sirius_train.plots import plot_run

    rows = [{"stage": "sft", "step": 160, "sft_loss": 0.4, "sft_steps": 160},
            {"stage": "sft", "step": -1, "eval": "final", "eval_exec_acc": 0.25}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = plot_run(tmp_path)
    height, width, _ = imread(out).shape
    assert width < 1.5 * height  # one panel (4 x 3.4 in); five would be 20 in wide


def test_the_resume_line_of_a_run_started_with_fresh_does_not_start_it_over(capsys, monkeypatch):
    """Pasting the printed line must resume: `--fresh` would move the run aside again (and `--resume-anyway` is
    no longer needed once the record holds the config)."""
    from sirius_train.commands.train import preempted_exit
    from sirius_train.halts import Preempted

    monkeypatch.setattr(sys, "argv", ["sirius", "train", "configs/nano.yaml", "--fresh", "seed=3"])
    code = preempted_exit(Preempted("SIGINT: stage 'stage1' stopped after step 2 of 40")).exit_code
    err = " ".join(capsys.readouterr().err.split())
    assert code == 130 and err.endswith("resume with: sirius train configs/nano.yaml seed=3"), err
    monkeypatch.setattr(sys, "argv", ["sirius", "sft", "run.yaml", "--resume-anyway", "name=a b"])
    preempted_exit(Preempted("SIGTERM: SFT stopped after step 3 of 9"))
    assert " ".join(capsys.readouterr().err.split()).endswith("resume with: sirius sft run.yaml 'name=a b'")


def test_resume_anyway_on_a_finished_run_refuses_instead_of_recording_changes_no_phase_trained_with(tmp_path):
    from typer.testing import CliRunner

    from sirius_train.cli import app
    from sirius_train.run_folder import phases

    cfg = _record(tmp_path)
    for phase in phases(cfg):
        (cfg.run_dir / phase).mkdir()
        (cfg.run_dir / phase / "DONE.json").write_text('{"phase": "%s"}' % phase)
    (cfg.run_dir / "summary.json").write_text('{"seed": 0}')
    before = {p: p.read_bytes() for p in cfg.run_dir.rglob("*") if p.is_file() and p.name != ".lock"}
    result = CliRunner().invoke(app, ["train", str(NANO), *tiny_overrides(tmp_path, "rec"), "seed=5",
                                      "--resume-anyway"], env={"COLUMNS": "400"})
    line = " ".join(result.output.split())
    assert result.exit_code == 2, result.output
    assert line.startswith(f"error: every phase of {cfg.run_dir} is done (base, sft, stage1, stage2): "
                           "--resume-anyway would apply these changes (seed: 0 -> 5) to none of them"), line
    assert "--fresh starts it over" in line
    assert {p: p.read_bytes() for p in cfg.run_dir.rglob("*") if p.is_file() and p.name != ".lock"} == before


def test_the_recorded_config_reads_back_with_a_verl_interpolation_in_it(tmp_path):
    """`verl.overrides` may hold `${...}` for verl to resolve (e.g. a per-stage rollout folder): the run folder's
    config.yaml must read back to the same config, or every resume of that run fails."""
    from sirius_train.config import load_config, to_yaml
    from sirius_train.run_folder import read_record

    cfg = load_config(NANO, ["verl.overrides=['trainer.rollout_data_dir=\\${trainer.default_local_dir}/../r']"])
    assert cfg.verl.overrides == ["trainer.rollout_data_dir=${trainer.default_local_dir}/../r"]
    (tmp_path / "config.yaml").write_text(to_yaml(cfg))
    assert read_record(tmp_path) == cfg
