"""A tiny run laid out as a clone after `make demo`: `<root>/runs/demo/...` and `<root>/demo_data/dbs`.

Built once per test session and shared by every module that needs a finished run (the model-card checks,
the docs test that runs the documented commands from `<root>`, the benchmark tests).

Its held-out EX is 0 in every phase (a 0.12M-parameter model trained on one database for seconds does not
read an unseen schema), so an equality on held-out figures compares 0 with 0 and would hold with a wrong prompt
format or scorer. `trained_questions` gives the questions where a figure means something: some of the run's
training questions, which its models answer partly right, with the trainer's own evaluation of each phase.
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


TRAINED_N = 24  # questions of the run's RL pool: each phase answers roughly 85-95% of them right


@cache
def trained_questions() -> tuple[Path, dict[str, dict]]:
    """(a JSONL of TRAINED_N of the tiny run's training questions, {phase: the trainer's held-out figures of that
    phase's model on them}): `LocalBackend.evaluate`, the function behind every phase's `eval_exec_acc`."""
    from dataclasses import replace

    from data_synthesis.records import write_examples
    from sirius_train.local.backend import LocalBackend
    from sirius_train.schedule import prepare_data

    cfg, summary, root = tiny_demo()
    data = prepare_data(cfg)
    questions = data.rl_pool[:TRAINED_N]
    path = root / "trained-questions.jsonl"
    write_examples(path, questions)
    backend = LocalBackend(cfg)
    try:
        figures = {p["phase"]: backend.evaluate(Path(p["model"]), replace(data, eval_set=questions),
                                                f"{p['phase']}@trained") for p in summary["phases"]}
    finally:
        backend.close()
    return path, figures
