"""A tiny run laid out as a clone after `make demo`: `<root>/runs/demo/...` and `<root>/demo_data/dbs`.

Built once per test session and shared by every module that needs a finished run (the model-card checks,
the docs test that runs the documented commands from `<root>`, the benchmark tests).
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from functools import cache
from pathlib import Path

from tiny_run import NANO, tiny_overrides


@cache
def tiny_demo() -> tuple[object, dict, Path]:
    """(config, summary, root) of the shared tiny run named `demo`."""
    from sirius_train.commands.train import run_schedule
    from sirius_train.config import load_config

    root = Path(tempfile.mkdtemp(prefix="sirius-tiny-demo-"))
    atexit.register(shutil.rmtree, root, True)
    overrides = tiny_overrides(root, "demo") + [f"output_dir={root / 'runs'}", f"data.db_root={root / 'demo_data' / 'dbs'}"]
    cfg = load_config(NANO, overrides)
    return cfg, run_schedule(cfg), root
