"""A run with several held-out sets evaluates each phase on every one, each on its own databases."""

from __future__ import annotations

import json

from tiny_run import NANO, tiny_overrides

from sirius_train.config import load_config
from sirius_train.schedule import evaluate_phase, held_out_line, prepare_data

SETS = ["test-seen-types", "val-unseen-names"]


def test_each_held_out_set_is_evaluated_on_its_own_databases(tmp_path):
    from sirius_train.local.backend import LocalBackend

    cfg = load_config(NANO, [*tiny_overrides(tmp_path), f"data.eval_sets=[{','.join(SETS)}]", "data.eval_per_db=3",
                             "threads=1"])
    data = prepare_data(cfg)
    assert list(data.eval_sets) == SETS and data.eval_set == data.eval_sets[SETS[0]]
    assert (cfg.run_dir / "data" / "eval-val-unseen-names.jsonl").is_file()  # eval.jsonl holds the first set
    backend = LocalBackend(cfg)
    try:
        model = backend.prepare_base(data, tmp_path / "base")
        figures = evaluate_phase(backend, model, data, "base")
    finally:
        backend.close()

    assert list(figures["eval_sets"]) == SETS and figures["eval_sets"][SETS[0]] == figures["eval_exec_acc"]
    assert set(figures["eval_per_db"]) == {"gen_test_00"}  # the run's own figures: the first set's
    rows = [json.loads(line) for line in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]
    other = [r for r in rows if r["stage"] == f"base@{SETS[1]}"]
    assert len(other) == 1 and set(other[0]["eval_per_db"]) == {"unseen_val_00"}
    assert other[0]["eval_exec_acc"] == figures["eval_sets"][SETS[1]]
    assert held_out_line({"phase": "base", **figures}).startswith(f"after base: held-out EX {SETS[0]} ")
