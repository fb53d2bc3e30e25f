"""Checkpoints on real files: retention, a damaged newest checkpoint passed over for the previous one, and a
disk that fills while checkpointing (a real file-size limit on the writing process)."""

from __future__ import annotations

import re
import resource
import signal

import pytest
from safetensors.torch import load_file
from test_samplers import _tiny_model

from sirius_train.local.checkpoint import (
    MANIFEST,
    STATE_FILE,
    CheckpointWriteError,
    latest_checkpoint,
    list_checkpoints,
    load_state,
    save_checkpoint,
    verify_checkpoint,
)

@pytest.fixture(scope="module")
def tiny():
    return _tiny_model()


def _save(ckpt_dir, step, tiny, keep_last=2):
    model, tokenizer = tiny
    return save_checkpoint(ckpt_dir, step, model, tokenizer, {"step": step}, keep_last=keep_last)


def test_keep_last_retains_the_newest_checkpoints(tiny, tmp_path):
    for step in range(1, 6):
        _save(tmp_path / "two", step, tiny)
        _save(tmp_path / "all", step, tiny, keep_last=0)
    assert [p.name for p in list_checkpoints(tmp_path / "two")] == ["step_000004", "step_000005"]
    assert len(list_checkpoints(tmp_path / "all")) == 5
    assert all(verify_checkpoint(p) is None for p in list_checkpoints(tmp_path / "two"))


def test_retention_counts_complete_checkpoints_only(tiny, tmp_path):
    """keep_last=1 after a resume past a damaged newest checkpoint (step 6): the fresh save (step 5) is kept and the
    one resumed from (step 4) goes; counting the damaged one would delete each fresh save until step 6."""
    for step in (2, 4, 6):
        _save(tmp_path, step, tiny, keep_last=0)
    _damage_truncate(tmp_path / "step_000006")
    assert latest_checkpoint(tmp_path) == tmp_path / "step_000004"  # where the rerun resumes
    _save(tmp_path, 5, tiny, keep_last=1)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_000005", "step_000006"]
    assert latest_checkpoint(tmp_path) == tmp_path / "step_000005"
    _save(tmp_path, 6, tiny, keep_last=1)  # the run reaches the damaged step: rewritten, the older one goes
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_000006"]
    assert verify_checkpoint(tmp_path / "step_000006") is None


def _damage_truncate(path):
    f = path / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


def _damage_flip_a_byte(path):
    f = path / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[-1] ^= 0xFF
    f.write_bytes(bytes(data))


@pytest.mark.parametrize("damage, reason", [
    (_damage_truncate, "model.safetensors has .* bytes, the manifest says"),
    (_damage_flip_a_byte, "model.safetensors does not match its SHA-256"),
    (lambda p: (p / STATE_FILE).unlink(), f"{STATE_FILE} is missing"),
    (lambda p: (p / MANIFEST).unlink(), "no MANIFEST.json"),
    (lambda p: (p / MANIFEST).write_text("{trunc"), "unreadable MANIFEST.json"),
])
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_one(tiny, tmp_path, damage, reason):
    _save(tmp_path, 1, tiny)
    newest = _save(tmp_path, 2, tiny)
    damage(newest)
    warnings = []
    assert latest_checkpoint(tmp_path, warn=warnings.append) == tmp_path / "step_000001"
    assert len(warnings) == 1 and "step_000002 is damaged" in warnings[0]
    assert re.search(reason, warnings[0]), warnings[0]
    assert load_state(tmp_path / "step_000001") == {"step": 1}


def test_no_valid_checkpoint_means_a_fresh_start(tiny, tmp_path):
    _damage_truncate(_save(tmp_path, 1, tiny))
    assert latest_checkpoint(tmp_path) is None


def test_the_trainer_resumes_from_the_previous_checkpoint_and_says_why(tiny, tmp_path, capsys):
    from sirius_train.config import StageConfig
    from sirius_train.local.trainer import DAPOTrainer, TrainItem
    from sirius_train.metrics import MetricsLog

    model, tokenizer = tiny
    stage = StageConfig(name="s", steps=4)
    items = [TrainItem([{"role": "user", "content": "q"}], "db", "SELECT 1")]
    trainer = DAPOTrainer(model, tokenizer, items, stage, None, ckpt_dir=tmp_path, metrics=MetricsLog(tmp_path / "m"))
    for trainer.step in (1, 2):
        trainer.save()
    (tmp_path / "step_000002" / "model.safetensors").unlink()
    resumed = DAPOTrainer(model, tokenizer, items, stage, None, ckpt_dir=tmp_path, metrics=MetricsLog(tmp_path / "m"))
    assert resumed.resume() and resumed.step == 1
    assert "step_000002 is damaged (model.safetensors is missing); falling back" in capsys.readouterr().err


@pytest.fixture
def file_size_limit():
    """Limit the size of any file this process writes (RLIMIT_FSIZE, soft limit only, restored after): a write
    past it fails with EFBIG, as a write to a full disk fails with ENOSPC."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the error, not the signal that kills by default

    def limit(n: int):
        resource.setrlimit(resource.RLIMIT_FSIZE, (n, hard))

    yield limit
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    signal.signal(signal.SIGXFSZ, previous)


def test_a_disk_that_fills_while_checkpointing_keeps_the_previous_checkpoint(tiny, tmp_path, file_size_limit):
    _save(tmp_path, 1, tiny)
    file_size_limit(16_000)  # the tokenizer files fit, the weights do not
    with pytest.raises(CheckpointWriteError) as failed:
        _save(tmp_path, 2, tiny)
    file_size_limit(resource.RLIM_INFINITY)
    message = str(failed.value)
    assert f"could not write checkpoint {tmp_path / 'step_000002'}" in message, message
    assert re.search(r"It needs about [\d.]+ MiB and [\d.]+ (GiB|MiB) is free on that disk", message), message
    assert "previous checkpoints are intact" in message
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_000001"]
    assert not list(tmp_path.glob(".step_*"))  # the half-written folder is gone
    assert verify_checkpoint(tmp_path / "step_000001") is None
    assert load_file(str(tmp_path / "step_000001" / "model.safetensors"))
    assert load_state(tmp_path / "step_000001") == {"step": 1}
