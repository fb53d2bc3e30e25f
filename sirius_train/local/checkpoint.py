"""Atomic, verified checkpoints: a killed run resumes from the last complete one, never from half a write.

A checkpoint is a folder `step_NNNNNN/` holding an ordinary HF checkpoint (weights + tokenizer, so it
loads anywhere) plus `trainer_state.pt` (optimizer, scheduler, entropy gate, RNG streams, data
position, step). It is written under a hidden temporary name, every file fsynced, then `MANIFEST.json`
(each file's size and SHA-256) last, and renamed into place in one step. Resume takes the newest
checkpoint whose files match their manifest and says which damaged ones it passed over. A write that
fails (a full disk) removes its temporary folder and leaves the previous checkpoints as they were.
Retention (`keep_last`) counts complete checkpoints only: a damaged one never takes the place of a good one.

The SFT warm start's Hugging Face checkpoints (`checkpoint-N/`) get the same record, written last by
`sft_preemption.RecordCheckpoints` (sizes only: a 32B DeepSpeed checkpoint is too large to hash at every
save, and what a kill leaves behind -- a missing record, a short or missing file -- shows in the sizes).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

STATE_FILE = "trainer_state.pt"
MANIFEST = "MANIFEST.json"


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (disk full, quota, file size limit); older checkpoints are intact."""


def save_checkpoint(ckpt_dir: Path, step: int, model, tokenizer, state: dict, keep_last: int = 2) -> Path:
    """Write checkpoint `step`, then delete all but the newest `keep_last` (0 keeps every one)."""
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    final = ckpt_dir / f"step_{step:06d}"
    tmp = ckpt_dir / f".step_{step:06d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        torch.save(state, tmp / STATE_FILE)
        write_manifest(tmp, step)
    except Exception as e:  # noqa: BLE001 -- safetensors and torch wrap the OS error in their own types
        written = _folder_bytes(tmp)
        shutil.rmtree(tmp, ignore_errors=True)
        free = shutil.disk_usage(ckpt_dir).free
        raise CheckpointWriteError(
            f"could not write checkpoint {final}: {e}. It needs about {_gib(_expected_bytes(ckpt_dir, written))} "
            f"and {_gib(free)} is free on that disk; the previous checkpoints are intact (free space, or set "
            "keep_last lower, and rerun the same command to resume)") from e
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(ckpt_dir)
    prune_checkpoints(list_checkpoints(ckpt_dir), keep_last)
    return final


def write_manifest(folder: Path, step: int, hashes: bool = True) -> None:
    """`MANIFEST.json` in `folder`, last: each file's size (and SHA-256 with `hashes`), every file fsynced first so
    the record never vouches for data still in the page cache."""
    files = {}
    for f in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST):
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
        files[f.relative_to(folder).as_posix()] = {"size": f.stat().st_size, **({"sha256": _sha256(f)} if hashes
                                                                                 else {})}
    _write_durably(folder / MANIFEST, json.dumps({"step": step, "files": files}, indent=1))


def list_checkpoints(ckpt_dir: Path, pattern: str = "step_*") -> list[Path]:
    """Checkpoint folders named `pattern` ending in their step number, oldest first (temporary folders of an
    interrupted save are ignored)."""
    if not ckpt_dir.is_dir():
        return []
    done = [p for p in ckpt_dir.glob(pattern) if p.is_dir() and re.search(r"\d+$", p.name)]
    return sorted(done, key=lambda p: int(re.search(r"\d+$", p.name).group()))


def verify_checkpoint(path: Path, hashes: bool = True, writer_last: str | None = None) -> str | None:
    """None when every file of `path` matches its manifest, else what is wrong with it (`hashes=False`: the
    record and the sizes only -- is the save complete -- without reading the files).

    `writer_last`: the file the checkpoint's writer saves last (the Trainer's `trainer_state.json`). A checkpoint
    with it and no manifest was written before manifests were (an older version, a plain Trainer run): complete,
    not torn."""
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except FileNotFoundError:
        if writer_last is not None and (path / writer_last).is_file():
            return None
        return f"no {MANIFEST} (written last: the save never finished)"
    except (OSError, ValueError) as e:
        return f"unreadable {MANIFEST}: {e}"
    for name, expected in manifest["files"].items():
        f = path / name
        if not f.is_file():
            return f"{name} is missing"
        if f.stat().st_size != expected["size"]:
            return f"{name} has {f.stat().st_size} bytes, the manifest says {expected['size']}"
        if hashes and "sha256" in expected and _sha256(f) != expected["sha256"]:
            return f"{name} does not match its SHA-256"
    return None


def latest_checkpoint(ckpt_dir: Path, warn: Callable[[str], None] | None = None, pattern: str = "step_*",
                      hashes: bool = True, writer_last: str | None = None) -> Path | None:
    """The newest checkpoint that verifies; `warn(message)` hears of each newer one passed over."""
    for path in reversed(list_checkpoints(ckpt_dir, pattern)):
        problem = verify_checkpoint(path, hashes, writer_last)
        if problem is None:
            return path
        if warn is not None:
            warn(f"checkpoint {path} is damaged ({problem}); falling back to the previous one")
    return None


def prune_checkpoints(checkpoints: list[Path], keep_last: int, writer_last: str | None = None) -> None:
    """Keep the newest `keep_last` *complete* checkpoints of `checkpoints` (oldest first; 0 keeps all): delete the
    complete ones before them, and anything older than the oldest one kept. A damaged checkpoint newer than that
    stays (the run rewrites it when it gets there) and is never counted, so it never displaces a good one."""
    if keep_last <= 0:
        return
    complete = [p for p in checkpoints if verify_checkpoint(p, hashes=False, writer_last=writer_last) is None]
    if len(complete) <= keep_last:
        return
    oldest_kept = checkpoints.index(complete[-keep_last])
    for old in checkpoints[:oldest_kept]:
        shutil.rmtree(old, ignore_errors=True)


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


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _write_durably(path: Path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else 0


def _expected_bytes(ckpt_dir: Path, written: int) -> int:
    """The size of the newest existing checkpoint (the next one is as large), or at least what was written."""
    existing = list_checkpoints(ckpt_dir)
    return max(_folder_bytes(existing[-1]) if existing else 0, written)


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**26 else f"{n / 2**20:.1f} MiB"
