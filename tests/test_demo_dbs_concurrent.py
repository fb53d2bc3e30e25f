"""Runs started together on one db_root build the same demo databases at once: none may fail or see a torn file."""

import multiprocessing as mp
import sqlite3

from data_synthesis.demo_dbs import build_demo_db

DB_IDS = ["retail", "university", "library", "generated_0", "generated_1"]


def _build_all(root: str, rounds: int) -> None:
    from pathlib import Path

    for _ in range(rounds):
        for db_id in DB_IDS:
            build_demo_db(db_id, Path(root) / db_id / f"{db_id}.sqlite", seed=0)


def test_processes_building_the_same_databases_at_once_all_succeed_with_whole_files(tmp_path):
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_build_all, args=(str(tmp_path), 3)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * len(procs)
    for db_id in DB_IDS:
        with sqlite3.connect(tmp_path / db_id / f"{db_id}.sqlite") as conn:
            assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
            assert conn.execute("SELECT count(*) FROM sqlite_master WHERE type = 'table'").fetchone()[0] > 0
    assert not list(tmp_path.rglob("*.tmp"))  # no temp file left behind
