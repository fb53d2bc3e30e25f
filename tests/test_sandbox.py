"""Hostile SQL never harms anything: typed outcome within timeout + 0.5 s, files untouched, no temp files."""

from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
import tempfile
import time
from pathlib import Path

import pytest

from rewards.outcome import Status
from hostile_sql import HOSTILE
from rewards.sandbox import DatabaseNotFound, Limits, Sandbox

TIMEOUT = 1.0


def _digest(folder: Path) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


@pytest.fixture()
def retail(demo_db_root, tmp_path) -> Path:
    src = demo_db_root / "retail"
    dst = tmp_path / "retail"
    shutil.copytree(src, dst)
    return dst / "retail.sqlite"


@pytest.fixture()
def owned_temp_dir(tmp_path, monkeypatch) -> Path:
    """A temp folder only this test writes: SQLite's temp directory for this process (its `temp_store_directory`,
    process-wide, reset after), Python's `tempfile.tempdir`, and TMPDIR / SQLITE_TMPDIR for any child."""
    folder = tmp_path / "temp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    monkeypatch.setenv("TMPDIR", str(folder))
    monkeypatch.setenv("SQLITE_TMPDIR", str(folder))
    with sqlite3.connect(":memory:") as con:
        con.execute(f"PRAGMA temp_store_directory = '{folder}'")
    yield folder
    with sqlite3.connect(":memory:") as con:
        con.execute("PRAGMA temp_store_directory = ''")


def test_hostile_sql_is_contained(retail, owned_temp_dir):
    folder = retail.parent
    before = _digest(folder)
    temp_before = os.stat(owned_temp_dir).st_mtime_ns  # a temp file created and unlinked at once still changes it
    limits = Limits(timeout_s=TIMEOUT)
    with Sandbox(retail, limits) as sb:
        for name, sql, allowed in HOSTILE:
            t0 = time.monotonic()
            outcome = sb.run(sql)
            took = time.monotonic() - t0
            assert outcome.status in allowed, f"{name}: {outcome.status} {outcome.error}"
            assert took < TIMEOUT + 0.5, f"{name} took {took:.2f}s"
            if outcome.status is not Status.OK:
                assert outcome.error, name
        # still usable afterwards, data intact
        assert sb.run("SELECT count(*) FROM customers").rows == ((400,),)
    assert _digest(folder) == before, "database folder changed"
    assert not Path("/tmp/sirius_evil.db").exists() and not Path("/tmp/sirius_copy.db").exists()
    assert not list(owned_temp_dir.iterdir()) and os.stat(owned_temp_dir).st_mtime_ns == temp_before, \
        "a temp file was written"


def test_deep_nesting_reaches_sqlite_safely(retail):
    """With the size check lifted, SQLite's own parser limits still stop 100k-deep nesting."""
    with Sandbox(retail, Limits(timeout_s=TIMEOUT, max_sql_chars=30_000_000)) as sb:
        for sql in ["SELECT " + "(" * 100_000 + "1" + ")" * 100_000,
                    "SELECT 1 WHERE 1 IN " + "(SELECT 1 WHERE 1 IN " * 100_000 + "(1)" + ")" * 100_000,
                    "SELECT " + " + ".join(["1"] * 100_000)]:
            outcome = sb.run(sql)
            assert outcome.status is Status.ERROR and outcome.error


def test_invalid_utf8_in_data_is_decoded(tmp_path):
    path = tmp_path / "bad.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE t (s TEXT)")
    conn.execute("INSERT INTO t VALUES (CAST(x'41fffe42' AS TEXT)), ('ok')")
    conn.commit()
    conn.close()
    with Sandbox(path) as sb:
        outcome = sb.run("SELECT s FROM t ORDER BY s")
    assert outcome.status is Status.OK
    assert outcome.rows == (("A\ufffd\ufffdB",), ("ok",))


def test_typed_outcomes(retail):
    with Sandbox(retail) as sb:
        ok = sb.run("SELECT name, city FROM customers WHERE id = 1")
        assert ok.status is Status.OK and ok.columns == ("name", "city") and len(ok.rows) == 1
        empty = sb.run("SELECT name FROM customers WHERE id = -1")
        assert empty.status is Status.EMPTY and empty.rows == ()
        err = sb.run("SELECT * FROM nowhere")
        assert err.status is Status.ERROR and "no such table: nowhere" in err.error
        # reading the schema is allowed (the repair lifecycle needs it)
        assert sb.run("SELECT name FROM sqlite_master WHERE type = 'table'").status is Status.OK


def test_row_and_byte_caps(retail):
    with Sandbox(retail, Limits(max_rows=100)) as sb:
        out = sb.run("SELECT * FROM orders")
        assert out.status is Status.ERROR and "more than 100 rows" in out.error
        assert sb.run("SELECT * FROM orders LIMIT 100").status is Status.OK
    with Sandbox(retail, Limits(max_result_bytes=10_000)) as sb:
        out = sb.run("SELECT name, email, city FROM customers")
        assert out.status is Status.ERROR and "bytes" in out.error


def test_missing_database_is_a_clear_error(tmp_path):
    with pytest.raises(DatabaseNotFound, match="not found"):
        Sandbox(tmp_path / "nope.sqlite")


def test_limits_validate():
    with pytest.raises(ValueError, match="timeout_s"):
        Limits(timeout_s=0)


def test_an_open_sandbox_keeps_its_file_steady(retail):
    """The sandbox keeps its shared lock between queries: a writer cannot change the data under it, and can
    again once it is closed."""
    writer = sqlite3.connect(retail, timeout=0.1)
    with Sandbox(retail) as sb:
        assert sb.run("SELECT count(*) FROM customers").rows == ((400,),)
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            writer.execute("DELETE FROM customers")
            writer.commit()
        writer.rollback()
        assert sb.run("SELECT count(*) FROM customers").rows == ((400,),)
    writer.execute("DELETE FROM customers WHERE id = 1")
    writer.commit()
    writer.close()
    with Sandbox(retail) as sb:
        assert sb.run("SELECT count(*) FROM customers").rows == ((399,),)


def test_run_fields_is_run_as_a_tuple(retail):
    with Sandbox(retail, Limits(max_rows=10)) as sb:
        for sql in ["SELECT name, city FROM customers WHERE id < 3", "SELECT 1 WHERE 0", "SELECT * FROM nowhere",
                    "DELETE FROM customers", "", "SELECT * FROM orders"]:
            status, rows, columns, error, elapsed = sb.run_fields(sql)
            outcome = sb.run(sql)
            assert (status, rows, columns, error) == (outcome.status, outcome.rows, outcome.columns, outcome.error)
            assert type(rows) is tuple and elapsed >= 0
