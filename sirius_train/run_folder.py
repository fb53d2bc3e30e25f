"""Who may write a run folder, and with which config: a lock and the record of the config its results came from.

Two `sirius train` on one run name would interleave their checkpoints and metrics, so a run holds an exclusive
`flock` on `RUN/.lock` (released by the kernel when the process ends, however it ends) with its PID and host in
it: a second run refuses at once and names them. A lock file left by a killed run is free again; the next run
takes it over and says whose it was.

`RUN/config.yaml` records the config the run's results were made with. A rerun whose config differs in anything
that changes results refuses and lists the keys, unless it asks to continue anyway (`--resume-anyway`: the
changes apply to the phases not yet done, and the old record is kept as `config.before-<time>.yaml`) or to start
over (`--fresh`: the old folder is moved aside to `RUN.replaced-<time>`, nothing is deleted). Keys that only say
where or how fast a run works (paths of the databases and servers, threads, checkpoint spacing, logging) may
change freely.

`RUN/run_id` names this run folder's life: a random id written when it is first claimed (and anew after
`--fresh`). What a run keeps outside its folder -- verl's checkpoints under `verl.checkpoint_dir` -- is keyed by
it, so a fresh start, or a run of the same name in another `output_dir`, never resumes another run's checkpoint.
"""

from __future__ import annotations

import fcntl
import fnmatch
import json
import os
import shutil
import secrets
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

from sirius_train.config import ConfigError, RunConfig

LOCK = ".lock"
RECORD = "config.yaml"
RUN_ID = "run_id"
REFUSE, RESUME_ANYWAY, FRESH = "refuse", "resume-anyway", "fresh"
# Keys that say where or how fast the run works, not what it computes.
NOT_RESULTS = ("name", "output_dir", "threads", "logging.*", "data.db_root", "data.build_demo_dbs", "reward.url",
               "reward.fallback", "reward.workers", "verl.python", "verl.ray_address", "verl.checkpoint_dir",
               "verl.keep_checkpoints", "stages.*.checkpoint_every", "stages.*.keep_last")


class RunFolderBusy(ConfigError):
    """Another live process holds the run folder's lock."""


def config_changes(recorded: RunConfig, current: RunConfig) -> list[str]:
    """`key: recorded -> current` for every result-changing key that differs (a stage added or removed too).

    >>> config_changes(RunConfig(seed=0, threads=1), RunConfig(seed=5, threads=2))
    ['seed: 0 -> 5']
    """
    old, new = _flat(asdict(recorded)), _flat(asdict(current))
    changed = []
    for key in sorted(old.keys() | new.keys(), key=lambda k: (k.count("."), k)):
        if any(fnmatch.fnmatchcase(key, pattern) for pattern in NOT_RESULTS):
            continue
        if old.get(key, "(absent)") != new.get(key, "(absent)"):
            changed.append(f"{key}: {old.get(key, '(absent)')} -> {new.get(key, '(absent)')}")
    return changed


def _flat(node, prefix: str = "") -> dict:
    items = node.items() if isinstance(node, dict) else enumerate(node) if _is_sections(node) else None
    if items is None:
        return {prefix: node}
    out = {}
    for key, child in items:
        out.update(_flat(child, f"{prefix}.{key}" if prefix else str(key)))
    return out


def _is_sections(node) -> bool:
    """A list of config sections (the stages), compared item by item; a list of values compares whole."""
    return isinstance(node, list) and bool(node) and all(isinstance(item, dict) for item in node)


def read_record(run_dir: Path) -> RunConfig | None:
    """The config recorded in `run_dir`, with today's defaults for keys it predates; None when there is none."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    path = run_dir / RECORD
    if not path.is_file():
        return None
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(RunConfig), OmegaConf.load(path)))
    except (OmegaConfBaseException, ValueError) as e:
        raise ConfigError(f"{path} (the config this run was made with) cannot be read: {' '.join(str(e).split())}; "
                          "rerun with --fresh to start this run over, or pick another name=") from None


def run_id(run_dir: Path) -> str | None:
    """The id of the run in `run_dir` (None before it was first claimed)."""
    try:
        return (run_dir / RUN_ID).read_text().strip() or None
    except FileNotFoundError:
        return None


def ensure_run_id(run_dir: Path) -> str:
    """The id of the run in `run_dir`, given one if it has none yet."""
    if (found := run_id(run_dir)) is not None:
        return found
    run_dir.mkdir(parents=True, exist_ok=True)
    new = secrets.token_hex(4)
    (run_dir / RUN_ID).write_text(new + "\n")
    return new


def phases(cfg: RunConfig) -> list[str]:
    """The phase folders a run of `cfg` finishes, in order (each gets a `DONE.json` when it does).

    >>> phases(RunConfig())
    ['base', 'sft', 'stage1', 'stage2']
    """
    return ["base", *(["sft"] if cfg.sft.enabled else []), *(f"stage{i}" for i in range(1, len(cfg.stages) + 1))]


@contextmanager
def claim(cfg: RunConfig, on_change: str = REFUSE, notice=print) -> Iterator[Path]:
    """Hold `cfg.run_dir` for this process: its lock, and a record that matches `cfg` (or `on_change` says what to
    do when it does not). `notice(text)` hears of a stale lock taken over, a record kept, a folder moved aside."""
    run_dir = cfg.run_dir
    with _locked(run_dir, notice) as held:
        recorded = read_record(run_dir)
        changes = config_changes(recorded, cfg) if recorded is not None else []
        if changes and on_change == REFUSE:
            raise ConfigError(
                f"{run_dir} was made with another config ({'; '.join(changes)}). To resume it, rerun with its "
                f"recorded config ({run_dir / RECORD}); --resume-anyway continues it with these changes (for the "
                "phases not yet done), --fresh moves it aside and starts over; or pick another name=")
        if changes and on_change == RESUME_ANYWAY:
            if all((run_dir / phase / "DONE.json").is_file() for phase in phases(cfg)):
                raise ConfigError(
                    f"every phase of {run_dir} is done ({', '.join(phases(cfg))}): --resume-anyway would apply these "
                    f"changes ({'; '.join(changes)}) to none of them, yet record them in its config.yaml and "
                    "summary.json as if they had been trained with. --fresh starts it over with them (the old "
                    "folder is moved aside), or pick another name=")
            kept = run_dir / f"config.before-{_stamp()}.yaml"
            shutil.copy2(run_dir / RECORD, kept)
            notice(f"continuing {run_dir} with a changed config ({'; '.join(changes)}); the previous one is kept "
                   f"as {kept}")
        if on_change == FRESH and any(p.name not in (LOCK, RUN_ID) for p in run_dir.iterdir()):
            aside = run_dir.with_name(f"{run_dir.name}.replaced-{_stamp()}")
            os.replace(run_dir, aside)  # the lock file moves too, still ours; the new folder gets a new one
            notice(f"moved the previous {run_dir} aside to {aside}; starting over"
                   + (f" (its verl checkpoints stay in {cfg.verl.checkpoint_dir}, keyed by its run id "
                      f"{run_id(aside)}; this run gets its own)" if cfg.verl.checkpoint_dir else ""))
            held.close()
            with _locked(run_dir, notice):
                ensure_run_id(run_dir)
                yield run_dir
            return
        ensure_run_id(run_dir)
        yield run_dir


@contextmanager
def _locked(run_dir: Path, notice) -> Iterator:
    handle = _lock_file(run_dir)
    try:
        if (previous := _holder(handle)) is not None:
            notice(f"taking over the lock of {run_dir} from {previous}, which no longer holds it (it was stopped "
                   "or killed)")
        handle.seek(0)
        handle.truncate()
        json.dump({"pid": os.getpid(), "host": socket.gethostname(), "since": _stamp()}, handle)
        handle.flush()
        try:
            yield handle
        finally:
            if not handle.closed:
                handle.seek(0)
                handle.truncate()  # a clean end leaves no holder to take over from
    finally:
        handle.close()


def _lock_file(run_dir: Path):
    """`RUN/.lock`, open and flocked. A lock won on a file that is no longer at that path -- opened just before a
    `--fresh` moved the folder aside, locked just after -- guards the old folder, not this run's: try again."""
    while True:
        run_dir.mkdir(parents=True, exist_ok=True)
        handle = open(run_dir / LOCK, "a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(handle)
            handle.close()
            raise RunFolderBusy(f"{run_dir} is in use by {holder or 'another process'}: two runs on one folder "
                                "would overwrite each other's checkpoints. Wait for it to finish (or stop it), or "
                                "pick another name=") from None
        try:
            if os.fstat(handle.fileno()).st_ino == os.stat(run_dir / LOCK).st_ino:
                return handle
        except FileNotFoundError:
            pass
        handle.close()


def _holder(handle) -> str | None:
    handle.seek(0)
    try:
        info = json.loads(handle.read() or "null")
    except ValueError:
        return None
    return f"PID {info['pid']} on {info['host']} (since {info['since']})" if isinstance(info, dict) else None


def _stamp() -> str:
    return time.strftime("%Y%m%d-%H%M%S")
