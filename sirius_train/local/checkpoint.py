"""Atomic checkpoints: a killed run resumes from the last complete one, never from half a write.

A checkpoint is a folder `step_NNNNNN/` holding an ordinary HF checkpoint (weights + tokenizer, so it
loads anywhere) plus `trainer_state.pt` (optimizer, scheduler, entropy gate, RNG streams, data
position, step). It is written under a hidden temporary name and renamed into place in one step.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch

STATE_FILE = "trainer_state.pt"


def save_checkpoint(ckpt_dir: Path, step: int, model, tokenizer, state: dict, keep_last: int = 2) -> Path:
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    final = ckpt_dir / f"step_{step:06d}"
    tmp = ckpt_dir / f".step_{step:06d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    torch.save(state, tmp / STATE_FILE)
    for f in tmp.iterdir():  # durable before it becomes visible
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    for old in list_checkpoints(ckpt_dir)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(ckpt_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first (temporary folders of an interrupted save are ignored)."""
    if not ckpt_dir.is_dir():
        return []
    done = [p for p in ckpt_dir.glob("step_*") if (p / STATE_FILE).is_file()]
    return sorted(done, key=lambda p: int(p.name.split("_")[1]))


def latest_checkpoint(ckpt_dir: Path) -> Path | None:
    found = list_checkpoints(ckpt_dir)
    return found[-1] if found else None


def load_state(path: Path) -> dict:
    return torch.load(path / STATE_FILE, map_location="cpu", weights_only=False)


def capture_rng() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
