"""`runs/<name>/metrics.jsonl`: one JSON row per training step (and per evaluation), plus optional wandb /
tensorboard mirrors. Rows are appended and flushed as they happen, so a crash loses at most the step
in flight; on resume, rows past the restored checkpoint are dropped so the log never double-counts.

The JSONL file is the record; the mirrors are for looking at it, and never required:
- wandb (`logging.backends: [wandb]`) writes under `run_dir/wandb`. With no API key (`WANDB_API_KEY` or
  `wandb login`) and no `WANDB_MODE`, it logs offline instead of stopping to ask (`wandb sync` uploads later);
  `WANDB_MODE=offline|disabled` is honoured. A resumed run continues the same wandb run (its id is kept in
  `run_dir/wandb_run_id`). Each stage's metrics are charted against that stage's own step (`<stage>/step`).
- tensorboard (`logging.backends: [tensorboard]`) writes event files under `run_dir/tensorboard`.
A backend that is asked for but not installed is a clear error naming the extra, before any training; a
wandb that cannot reach its server is a warning, and the run goes on without it.
"""

from __future__ import annotations

import json
import netrc
import os
import time
import uuid
from pathlib import Path
from urllib.parse import urlparse

from rich.markup import escape

from data_synthesis.extras import require
from data_synthesis.jsonl import iter_jsonl, write_jsonl
from sirius_train.progress import stderr

BACKENDS = ("wandb", "tensorboard")


class MetricsLog:
    def __init__(self, path: Path, backends: list[str] = (), project: str = "sirius-sql", run_name: str = "run",
                 config: dict | None = None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        unknown = [b for b in backends if b not in BACKENDS]
        if unknown:
            raise ValueError(f"unknown logging backend(s) {unknown}; use any of {list(BACKENDS)}")
        run_dir = self.path.parent
        self._sinks = []
        if "wandb" in backends:
            self._sinks.append(WandbSink(run_dir, project, run_name, config))
        if "tensorboard" in backends:
            self._sinks.append(TensorBoardSink(run_dir / "tensorboard"))

    def log(self, row: dict) -> None:
        row = {"time": round(time.time(), 3), **row}
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        if self._sinks:
            stage, step, scalars = scalar_view(row)
            for sink in self._sinks:
                sink.log(stage, step, scalars)

    def rows(self) -> list[dict]:
        return list(iter_jsonl(self.path))

    def truncate_after(self, stage: str, step: int) -> None:
        """Drop this stage's rows logged after `step` (they will be recomputed after a resume)."""
        kept = [r for r in self.rows() if not (r.get("stage") == stage and r.get("step", -1) > step)]
        write_jsonl(self.path, kept)

    def close(self) -> None:
        for sink in self._sinks:
            sink.close()
        self._sinks = []


def scalar_view(row: dict) -> tuple[str, int | None, dict[str, float]]:
    """(stage, step, numeric metrics) of a row; nested dicts of numbers become `key/subkey` metrics.

    Example:
        >>> scalar_view({"stage": "sft", "step": 3, "time": 1.0, "loss": 0.5, "ok": True, "note": "x",
        ...              "eval_per_db": {"clinic": 0.25}})
        ('sft', 3, {'loss': 0.5, 'ok': 1.0, 'eval_per_db/clinic': 0.25})
        >>> scalar_view({"stage": "stage1", "step": -1, "eval_exec_acc": 0.3})
        ('stage1', None, {'eval_exec_acc': 0.3})
    """
    stage = str(row.get("stage", "run"))
    step = row.get("step")
    step = step if isinstance(step, int) and step >= 0 else None
    scalars: dict[str, float] = {}
    for key, value in row.items():
        if key in ("stage", "step", "time"):
            continue
        if isinstance(value, dict):
            scalars.update({f"{key}/{k}": float(v) for k, v in value.items() if _is_number(v)})
        elif _is_number(value):
            scalars[key] = float(value)
    return stage, step, scalars


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and value == value  # NaN is not charted


class WandbSink:
    """Mirror rows into one wandb run; offline when there is no API key, resumed with the run."""

    def __init__(self, run_dir: Path, project: str, run_name: str, config: dict | None):
        wandb = require("wandb", "wandb", "logging.backends: wandb", "remove wandb from logging.backends")
        mode = wandb_mode()
        if mode == "offline" and not os.environ.get("WANDB_MODE"):
            stderr.print(f"wandb: no API key (WANDB_API_KEY or `wandb login`): logging offline under {run_dir}/wandb;"
                         " upload later with `wandb sync`")
        self._steps: dict[str, int] = {}
        try:
            self.run = wandb.init(project=project, name=run_name, dir=str(run_dir), config=config, mode=mode,
                                  id=_run_id(run_dir), resume="allow", reinit="finish_previous")
        except Exception as e:  # wandb.errors.CommError & co: a tracker outage must not stop a training run
            stderr.print(f"[yellow]wandb could not start, continuing without it[/] (metrics.jsonl has every row; "
                         f"WANDB_MODE=offline logs locally): {escape(' '.join(str(e).split()))}")
            self.run = None

    def log(self, stage: str, step: int | None, scalars: dict[str, float]) -> None:
        if self.run is None:
            return
        if stage not in self._steps:
            self.run.define_metric(f"{stage}/step")
            self.run.define_metric(f"{stage}/*", step_metric=f"{stage}/step")
        if step is not None:
            self._steps[stage] = step
        step = self._steps.setdefault(stage, 0)  # an evaluation row (no step) is charted at the stage's last step
        self.run.log({f"{stage}/step": step, **{f"{stage}/{k}": v for k, v in scalars.items()}})

    def close(self) -> None:
        if self.run is not None:
            self.run.finish()


def wandb_mode() -> str | None:
    """`WANDB_MODE` if set; else "offline" when no API key is found (instead of a login prompt); else None."""
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    if os.environ.get("WANDB_API_KEY"):
        return None
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    try:
        netrc_path = os.environ.get("NETRC") or None
        if netrc.netrc(netrc_path).authenticators(host):
            return None
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        pass
    return "offline"


def _run_id(run_dir: Path) -> str:
    """The wandb id of this run directory: made once, so a resumed run continues the same wandb run."""
    path = run_dir / "wandb_run_id"
    if not path.is_file():
        path.write_text(uuid.uuid4().hex[:12])
    return path.read_text().strip()


class TensorBoardSink:
    """Mirror rows into tensorboard event files, one tag per `<stage>/<metric>`, at the stage's step."""

    def __init__(self, log_dir: Path):
        require("tensorboard", "tensorboard", "logging.backends: tensorboard", "remove it from logging.backends")
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(log_dir))
        self._steps: dict[str, int] = {}

    def log(self, stage: str, step: int | None, scalars: dict[str, float]) -> None:
        if step is not None:
            self._steps[stage] = step
        step = self._steps.setdefault(stage, 0)
        for key, value in scalars.items():
            self.writer.add_scalar(f"{stage}/{key}", value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
