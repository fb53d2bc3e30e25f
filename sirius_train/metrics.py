"""`runs/<name>/metrics.jsonl`: one JSON row per training step (and per evaluation), plus optional wandb /
tensorboard mirrors. Rows are appended and flushed as they happen, so a crash loses at most the step
in flight; on resume, rows past the restored checkpoint are dropped so the log never double-counts.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from sirius_train.jsonl import iter_jsonl, write_jsonl


class MetricsLog:
    def __init__(self, path: Path, backends: list[str] = (), project: str = "sirius-sql", run_name: str = "run",
                 config: dict | None = None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._sinks = [_make_sink(b, self.path.parent, project, run_name, config) for b in backends]

    def log(self, row: dict) -> None:
        row = {"time": round(time.time(), 3), **row}
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        for sink in self._sinks:
            sink(row)

    def rows(self) -> list[dict]:
        return list(iter_jsonl(self.path))

    def truncate_after(self, stage: str, step: int) -> None:
        """Drop this stage's rows logged after `step` (they will be recomputed after a resume)."""
        kept = [r for r in self.rows() if not (r.get("stage") == stage and r.get("step", -1) > step)]
        write_jsonl(self.path, kept)

    def close(self) -> None:
        for sink in self._sinks:
            getattr(sink, "close", lambda: None)()


def _make_sink(backend: str, run_dir: Path, project: str, run_name: str, config: dict | None):
    if backend == "wandb":
        try:
            import wandb
        except ImportError:
            raise RuntimeError("logging.backends has 'wandb' but wandb is not installed: pip install "
                               "'sirius-sql[wandb]' (or remove it from logging.backends)") from None
        run = wandb.init(project=project, name=run_name, dir=str(run_dir), config=config, reinit=True)

        def sink(row: dict) -> None:
            run.log({f"{row.get('stage', 'run')}/{k}": v for k, v in row.items() if isinstance(v, (int, float))})
        sink.close = run.finish
        return sink
    if backend == "tensorboard":
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"))
        counter = {"n": 0}

        def sink(row: dict) -> None:
            counter["n"] += 1
            for k, v in row.items():
                if isinstance(v, (int, float)) and k not in ("time", "step"):
                    writer.add_scalar(f"{row.get('stage', 'run')}/{k}", v, counter["n"])
        sink.close = writer.close
        return sink
    raise ValueError(f"unknown logging backend {backend!r}; use wandb or tensorboard")
