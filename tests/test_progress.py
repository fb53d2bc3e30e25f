"""Progress where a user reads it: plain lines at a steady pace in a log file, a bar on a terminal; other
libraries' noise (GGUF de-quantization bar, DeepSpeed's CPU notice, BPE clean-up warning) kept out."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sirius_train import progress

ROOT = Path(__file__).resolve().parents[1]


def _python(code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)


def test_a_log_gets_a_line_at_a_steady_pace_even_while_a_step_is_slow(capsys, monkeypatch):
    monkeypatch.setattr(progress.stderr, "_force_terminal", False)
    with progress.progress_bar("SFT", 4, every_s=0.05) as advance:
        advance(1, earlier=True)  # a resumed run: one step done by an earlier process
        time.sleep(0.3)  # one slow step: lines keep coming while it runs
        advance(loss=1.25)
        time.sleep(0.2)
        advance(2, loss=0.5)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "SFT: 4 to do"
    while_slow = [line for line in lines if line.startswith("SFT: 1/4 (25%, 1 done earlier), ")]
    assert len(while_slow) >= 3, lines  # ~6 ticks of 0.05 s in 0.3 s, however loaded the machine
    assert any(", ETA " in line and "loss 1.250" in line for line in lines), lines
    assert lines[-1].startswith("SFT: 4/4 (100%, 1 done earlier), ") and lines[-1].endswith("loss 0.500")
    assert "ETA" not in lines[-1]


def test_a_terminal_gets_the_bar_and_no_lines(capsys, monkeypatch):
    monkeypatch.setattr(progress.stderr, "_force_terminal", True)
    with progress.progress_bar("DAPO stage1", 3, every_s=0.01) as advance:
        time.sleep(0.1)
        advance(3, reward=0.25)
    err = capsys.readouterr().err
    assert "to do" not in err and "elapsed" not in err
    assert "DAPO stage1" in err and "3/3" in err and "reward 0.250" in err


def test_the_sft_callback_reports_steps_done_earlier_and_the_loss(capsys, monkeypatch):
    from transformers import TrainerState

    from sirius_train.local.hf_progress import HFProgressCallback

    monkeypatch.setattr(progress.stderr, "_force_terminal", False)
    callback, state = HFProgressCallback("SFT"), TrainerState(max_steps=10, global_step=4)
    callback.on_train_begin(None, state, None)  # resumed at step 4
    for step in range(5, 11):
        state.global_step = step
        callback.on_step_end(None, state, None)
        if step == 8:
            callback.on_log(None, state, None, logs={"loss": 2.0})
    callback.on_train_end(None, state, None)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "SFT: 10 to do"
    assert lines[-1].startswith("SFT: 10/10 (100%, 4 done earlier), ") and lines[-1].endswith("loss 2.000")


def test_deepspeed_says_nothing_about_its_cpu_fallback_once_the_local_backend_runs(tmp_path):
    pytest.importorskip("deepspeed")
    code = (f"from sirius_train.config import load_config; from sirius_train.local.backend import LocalBackend; "
            f"LocalBackend(load_config({str(ROOT / 'configs' / 'nano.yaml')!r}, ['output_dir={tmp_path}'])); "
            "import deepspeed; print('imported')")
    quiet = _python(code)
    assert quiet.returncode == 0 and "imported" in quiet.stdout, quiet.stderr
    assert "Setting accelerator" not in quiet.stdout + quiet.stderr, quiet.stdout + quiet.stderr
    import torch

    if not torch.cuda.is_available():  # the notice is real here: without the filter it shows
        plain = _python("import deepspeed")  # DeepSpeed's logger writes to stdout
        assert "Setting accelerator to CPU" in plain.stdout + plain.stderr


def test_a_gguf_loads_without_bars_or_warnings(smollm2_gguf):
    result = _python(
        "from data_synthesis.checkpoints import load_model; "
        f"m, t = load_model({str(smollm2_gguf)!r}); "
        "print(t.decode(t('SELECT a , b FROM x ;')['input_ids']))")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "SELECT a , b FROM x ;"  # a byte-level BPE decodes the same without clean-up
    assert result.stderr == ""  # no de-quantization bar, no "Loading weights" bar, no clean-up warning
