"""Processes: run verl's `main_ppo` (through our entry point, main_ppo.py) for a stage, then merge its last checkpoint.

verl runs in a child process (it owns Ray and the GPUs); its whole output goes to a log file and the step
counter drives a progress bar. A failure raises with the log's tail, so the reason is on the screen, not only
in the file; a preemption signal is passed on to verl and ends in `Preempted`, a clean, resumable stop.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from collections import deque
from collections.abc import Callable
from pathlib import Path

from sirius_train.halts import Preempted, preemption_signals
from sirius_train.verl_backend.translate import VERL_ENTRY

STEP_LINE = re.compile(r"\bstep:(\d+)\s+-")  # verl's console logger: "step:3 - actor/entropy:0.71 - ..."


def verl_command(python: str | None, overrides: list[str]) -> list[str]:
    """argv of a verl training run.

    >>> verl_command("/opt/py/bin/python", ["trainer.nnodes=2"])
    ['/opt/py/bin/python', '-m', 'sirius_train.verl_backend.main_ppo', 'trainer.nnodes=2']
    """
    return [python or sys.executable, "-m", VERL_ENTRY, *overrides]


def merge_command(python: str | None, actor_dir: Path, target_dir: Path, lora=None) -> list[str]:
    """argv of verl's FSDP checkpoint -> Hugging Face folder conversion (`verl.model_merger`); a LoRA stage's
    (`lora`: its `LoraSpec` and starting model) folds its adapters into that model instead (`lora_merge`)."""
    if lora is not None:
        from sirius_train.verl_backend.lora_merge import merge_argv

        spec, init = lora
        return [python or sys.executable, *merge_argv(actor_dir, init, target_dir, spec)]
    return [python or sys.executable, "-m", "verl.model_merger", "merge", "--backend", "fsdp",
            "--local_dir", str(actor_dir), "--target_dir", str(target_dir)]


def verl_env(pythonpath: str, ray_address: str | None, device: str = "cuda") -> dict[str, str]:
    """This process's environment plus our code on PYTHONPATH and the cluster to join.

    A RAY_ADDRESS already in the environment wins over `verl.ray_address` (the sbatch script exports the
    head's address; the config's `auto` would only guess it). `device="cpu"`: the CPU platform's variables
    (`cpu_platform.cpu_env`), which the user's own settings of them override.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = prepend_path(pythonpath, env.get("PYTHONPATH"))
    if ray_address:
        env.setdefault("RAY_ADDRESS", ray_address)
    if device == "cpu":
        from sirius_train.verl_backend.cpu_platform import cpu_env

        env.update({key: value for key, value in cpu_env().items() if key not in os.environ})
    return env


def prepend_path(first: str, rest: str | None) -> str:
    """`first` ahead of an existing search path, never instead of it.

    >>> prepend_path("/code", "/site:/other"), prepend_path("/code", None), prepend_path("/code", "/code:/x")
    ('/code:/site:/other', '/code', '/code:/x')
    """
    parts = [first, *(p for p in (rest or "").split(os.pathsep) if p and p != first)]
    return os.pathsep.join(parts)


def run_logged(argv: list[str], env: dict[str, str], log_path: Path, on_step: Callable[[int], None] | None = None,
               checkpoints: Path | None = None) -> None:
    """Run `argv`, appending its output to `log_path`; `on_step(n)` on each verl step line; raise on failure.

    The child leads its own process group. A preemption signal to this process (SIGTERM, or SIGUSR1 from
    Slurm's `--signal`) is passed on to that whole group -- verl installs no handler, so it stops where it is
    and its newest complete checkpoint under `checkpoints` is what `resume_mode=auto` loads -- and once the
    child is gone `Preempted` is raised, naming that checkpoint.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    tail: deque[str] = deque(maxlen=40)
    child: list[subprocess.Popen] = []

    def forward(sig: signal.Signals) -> None:
        if child:
            _signal_group(child[0], sig)

    with log_path.open("a", encoding="utf-8") as log, preemption_signals(forward) as caught:
        log.write(f"$ {' '.join(argv)}\n")
        log.flush()
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, errors="replace", start_new_session=True)
        child.append(proc)
        if caught:  # it arrived while the child was starting
            forward(signal.Signals[caught[0]])
        try:
            for line in proc.stdout:
                log.write(line)
                tail.append(line)
                if on_step and (match := STEP_LINE.search(line)):
                    on_step(int(match.group(1)))
            code = proc.wait()
        except BaseException:  # Ctrl-C: stop verl too (it stops its Ray workers), then re-raise
            _signal_group(proc, signal.SIGTERM)
            proc.wait()
            raise
    what = argv[2] if argv[1:2] == ["-m"] else Path(argv[0]).name
    if caught:
        where = resume_point(checkpoints) if checkpoints is not None else "rerunning redoes it"
        raise Preempted(f"{caught[0]}: passed on to {what}, which stopped (exit code {code}); {where}")
    if code != 0:
        raise RuntimeError(f"{what} exited with code {code} (full log: {log_path}); last lines:\n{''.join(tail)}")


def _signal_group(proc: subprocess.Popen, sig: signal.Signals) -> None:
    """`sig` to the child's process group (its Ray and vLLM helpers included); nothing if it is already gone."""
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def resume_point(checkpoint_dir: Path) -> str:
    """Where verl's `resume_mode=auto` picks up: the step in `latest_checkpointed_iteration.txt`, which verl
    writes after a checkpoint is complete (so a save cut short is never the one loaded).

    >>> resume_point(Path("/nonexistent"))
    'verl has no checkpoint in /nonexistent yet: the stage restarts from its first step'
    """
    marker = checkpoint_dir / "latest_checkpointed_iteration.txt"
    step = marker.read_text().strip() if marker.is_file() else ""
    if not step.isdigit():
        return f"verl has no checkpoint in {checkpoint_dir} yet: the stage restarts from its first step"
    return f"verl resumes from {checkpoint_dir / f'global_step_{step}'} (the steps after {step} are redone)"


def prune_verl_checkpoints(checkpoint_dir: Path, keep: int) -> list[Path]:
    """Remove verl's checkpoints beyond the newest `keep` (0: keep all) of those it recorded; return what went.

    verl's checkpoint manager counts only the saves of its own launch, so every relaunch of a stage (a preemption,
    a requeue) would leave the previous launch's checkpoints forever. A save numbered past the recorded step
    (`latest_checkpointed_iteration.txt`) was cut short and goes too; with no record nothing is touched."""
    marker = checkpoint_dir / "latest_checkpointed_iteration.txt"
    recorded = marker.read_text().strip() if marker.is_file() else ""
    if keep <= 0 or not recorded.isdigit():
        return []
    saves = sorted((int(m.group(1)), path) for path in checkpoint_dir.iterdir()
                   if path.is_dir() and (m := re.fullmatch(r"global_step_(\d+)", path.name)))
    complete = [path for step, path in saves if step <= int(recorded)]
    gone = [path for step, path in saves if step > int(recorded)] + complete[:-keep]
    for path in gone:
        shutil.rmtree(path, ignore_errors=True)
    return gone


def latest_actor_checkpoint(checkpoint_dir: Path) -> Path:
    """The actor folder of the newest checkpoint verl recorded under `checkpoint_dir`."""
    from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path

    step_dir = find_latest_ckpt_path(str(checkpoint_dir))
    if step_dir is None or not (Path(step_dir) / "actor").is_dir():
        raise FileNotFoundError(f"no verl checkpoint under {checkpoint_dir} (latest_checkpointed_iteration.txt "
                                "missing): the stage ended before its first save")
    return Path(step_dir) / "actor"


def merge_to_hf(python: str | None, actor_dir: Path, target_dir: Path, env: dict[str, str], log_path: Path,
                lora=None) -> Path:
    """Merge FSDP shards into an HF folder (weights, config, tokenizer); skipped when already merged. `lora`:
    (spec, the stage's starting model) of a LoRA stage, whose checkpoint holds only adapters."""
    if (target_dir / "config.json").is_file():
        return target_dir
    partial = target_dir.with_name(target_dir.name + ".partial")
    run_logged(merge_command(python, actor_dir, partial, lora), env, log_path)
    if not (partial / "config.json").is_file():
        raise RuntimeError(f"verl.model_merger wrote no config.json into {partial} (see {log_path})")
    os.replace(partial, target_dir)
    return target_dir
