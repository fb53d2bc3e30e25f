"""How the train pool is cut between the SFT warm start and RL: by examples or by databases."""

from __future__ import annotations

import pytest
from tiny_run import NANO

from data_synthesis.records import Example
from sirius_train.config import ConfigError, load_config
from sirius_train.schedule import split_pool

POOL = [Example(f"{db}-{i}", db, f"q{i}", "SELECT 1") for db in ("a", "b", "c", "d", "e") for i in range(4)]


def test_example_split_cuts_the_shuffled_pool_at_the_share():
    sft, rest = split_pool(POOL, 0.5, "examples", seed=0)
    assert sft == POOL[:10] and rest == POOL[10:]


def test_database_split_leaves_rl_databases_the_warm_start_never_saw():
    sft, rest = split_pool(POOL, 0.6, "databases", seed=0)
    sft_dbs, rest_dbs = {e.db_id for e in sft}, {e.db_id for e in rest}
    assert len(sft_dbs) == 3 and len(rest_dbs) == 2 and not sft_dbs & rest_dbs
    assert sorted(sft + rest, key=POOL.index) == POOL  # nothing lost, nothing twice
    assert split_pool(POOL, 0.6, "databases", seed=0) == (sft, rest)  # seeded


def test_no_warm_start_leaves_the_whole_pool_to_rl():
    for by in ("examples", "databases"):
        assert split_pool(POOL, 0.0, by, seed=0) == ([], POOL)


@pytest.mark.parametrize("override", ["data.sft_split=rows", "data.rl_pool=some"])
def test_unknown_split_choices_are_config_errors(override):
    with pytest.raises(ConfigError, match=override.split("=")[0]):
        load_config(NANO, [override])


def test_rl_from_a_warm_start_made_elsewhere_keeps_its_split_and_held_out_set(tmp_path):
    """docs/SFT.md's `sirius train ... model.path=runs/demo/sft/model sft.enabled=false`: with SFT skipped the RL
    pool must still leave out the demos that model was trained on, and the held-out questions stay the same ones
    (they were 0 SFT / 2,300 RL and 385 held-out instead of the demo's 1,610 / 690 and 377)."""
    from sirius_train.schedule import prepare_data

    small = [f"data.db_root={tmp_path / 'dbs'}", "data.generated_train_dbs=2", "data.synth_per_db=30",
             "data.generated_eval_dbs=1", "data.eval_sets=[val-seen-types]", "data.eval_per_db=20"]
    warm = prepare_data(load_config(NANO, [*small, f"output_dir={tmp_path / 'a'}"]))
    rl = prepare_data(load_config(NANO, [*small, f"output_dir={tmp_path / 'b'}", "sft.enabled=false"]))
    assert len(warm.sft_pool) > 0 and len(warm.rl_pool) > 0
    assert [e.id for e in rl.rl_pool] == [e.id for e in warm.rl_pool]
    assert [(e.question, e.gold_sql) for e in rl.eval_set] == [(e.question, e.gold_sql) for e in warm.eval_set]
