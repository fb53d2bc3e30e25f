"""The demo's held-out set is held out: no database, table-name set, question or query of it is trained on."""

from __future__ import annotations

import sqlite3

import pytest
from tiny_run import NANO

from sirius_train.config import load_config
from sirius_train.schedule import prepare_data


def table_names(db_root, db_id: str) -> frozenset[str]:
    with sqlite3.connect(db_root / db_id / f"{db_id}.sqlite") as conn:
        return frozenset(r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'"))


# the shipped data, and the taught-mistake design without WHERE literals (docs/benchmarks/nano.md), whose small
# query space makes a held-out gold equal a flawed demo's SQL ("minimum" asked, MIN taught for "maximum")
@pytest.mark.parametrize("design", [[], ["data.synth_where=0", "data.sft_flaws=[order,aggregate]",
                                         "data.sft_flaw_share=0.8"]], ids=["shipped", "taught-mistakes"])
def test_shipped_demo_never_trains_on_its_held_out_databases_or_questions(tmp_path, design):
    cfg = load_config(NANO, [f"output_dir={tmp_path}", f"data.db_root={tmp_path / 'dbs'}", *design])
    data = prepare_data(cfg)
    training = data.sft_pool + data.rl_pool
    held_out = data.eval_set
    assert len(held_out) >= 0.95 * cfg.data.eval_per_db * len(cfg.data.all_eval_dbs())

    train_dbs = {e.db_id for e in training}
    eval_dbs = {e.db_id for e in held_out}
    assert eval_dbs == set(cfg.data.all_eval_dbs()) and not eval_dbs & train_dbs
    train_tables = {table_names(data.db_root, db) for db in train_dbs}
    assert not {table_names(data.db_root, db) for db in eval_dbs} & train_tables

    questions = {e.question for e in training}
    queries = {e.gold_sql for e in training} | {e.meta.get("clean_sql", e.gold_sql) for e in data.sft_pool}
    assert not {e.question for e in held_out} & questions
    assert not {e.gold_sql for e in held_out} & queries

    # the flawed demonstrations are SFT's only: RL's reward and the evaluation use the correct gold
    assert any(e.meta.get("flaw") for e in data.sft_pool) == bool(cfg.data.sft_flaws)
    assert not any(e.meta.get("flaw") for e in data.rl_pool + held_out)


def test_the_nano_tokenizer_is_fitted_on_training_schemas_only(tmp_path, monkeypatch):
    """The tokenizer is a trained part too: a held-out schema's names must not shape its vocabulary."""
    from data_synthesis.schema import read_schema
    from sirius_train.local import model as nano
    from sirius_train.local.backend import LocalBackend

    cfg = load_config(NANO, [f"output_dir={tmp_path}", f"data.db_root={tmp_path / 'dbs'}"])
    data = prepare_data(cfg)
    fitted = []
    real = nano.train_tokenizer
    monkeypatch.setattr(nano, "train_tokenizer", lambda texts, *a, **k: real(fitted.extend(texts) or fitted, *a, **k))
    LocalBackend(cfg).prepare_base(data, tmp_path / "base")

    def schema(db):
        fmt = data.prompt_format
        return read_schema(data.db_root / db / f"{db}.sqlite", n_samples=0).to_text(samples=False,
                                                                                  style=fmt.schema_style)

    assert all(schema(db) in fitted for db in cfg.data.all_train_dbs())
    assert not any(schema(db) in fitted for db in cfg.data.all_eval_dbs())
