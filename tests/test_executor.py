"""The worker pool: same answers as in-process, survives SIGKILL and hangs, leaks nothing, bounded memory."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import psutil
import pytest
from hostile_sql import HOSTILE
from worker_kill import running_worker_pid

from rewards.executor import Executor
from rewards.outcome import Status
from rewards.sandbox import Limits
from rewards.scoring import ScoreItem

ENDLESS = "WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r) SELECT max(x) FROM r"
GOLD = "SELECT city, count(*) FROM customers GROUP BY city"


def _items(n: int) -> list[ScoreItem]:
    preds = [GOLD, "SELECT count(*), city FROM customers GROUP BY city", "SELECT city FROM customers",
             "SELECT nope FROM customers", None, "DELETE FROM customers"]
    return [ScoreItem("retail", GOLD, preds[i % len(preds)], "spider", id=i) for i in range(n)]


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def test_workers_agree_with_in_process(demo_db_root):
    items = _items(120)
    with Executor(demo_db_root, workers=0) as local, Executor(demo_db_root, workers=2, chunk_size=7) as pool:
        expected = local.score(items)
        got = pool.score(items)
    assert got == expected
    assert [r.id for r in got] == list(range(120))
    assert [r.match for r in got[:6]] == [True, True, False, False, False, False]
    assert [r.pred_status for r in got[:6]] == ["ok", "ok", "ok", "error", "rejected", "rejected"]
    assert [r.reward for r in got[:6]] == [1.0, 1.0, 0.0, 0.0, -1.0, 0.0]


def test_unknown_database_is_a_typed_error(demo_db_root):
    with Executor(demo_db_root, workers=1) as ex:
        out = ex.execute("no_such_db", "SELECT 1")
        traversal = ex.execute("../../etc", "SELECT 1")
    assert out.status is Status.ERROR and "unknown db_id 'no_such_db'" in out.error
    assert traversal.status is Status.ERROR and "invalid db_id" in traversal.error


def test_unknown_database_scores_as_typed_errors(demo_db_root):
    with Executor(demo_db_root, workers=0) as ex:
        (result,) = ex.score([ScoreItem("atlantis", "SELECT 1", "SELECT 1", id=7)])
    assert (result.id, result.match, result.reward, result.pred_status, result.gold_status) == (7, False, 0.0,
                                                                                                 "error", "error")
    assert "unknown db_id 'atlantis'" in result.pred_error and result.pred_error == result.gold_error


@pytest.mark.parametrize("kills", [1, 2])
def test_worker_killed_mid_query_is_replaced_and_nothing_is_lost(demo_db_root, kills):
    """A worker SIGKILLed under an item (the OOM killer, say) is replaced and the rest of its work re-queued. The item
    itself runs once more, alone, on a fresh worker -- the kill need not be its doing, and a right answer typed as an
    error would score 0 in its rollout group; here the endless query then meets its own deadline. An item under
    which a worker dies twice is typed as the death."""
    before = _children()
    with Executor(demo_db_root, workers=2, limits=Limits(timeout_s=4.0), chunk_size=4) as ex:
        queries = [("retail", ENDLESS)] + [("retail", "SELECT count(*) FROM orders")] * 40
        results: list = []
        thread = threading.Thread(target=lambda: results.extend(ex.execute_many(queries)))
        thread.start()
        killed: list[int] = []
        for _ in range(kills):  # each time the endless query has run 1 s in some worker
            killed.append(running_worker_pid(ex, min_elapsed_s=1.0, exclude=killed))
            os.kill(killed[-1], signal.SIGKILL)
        thread.join(timeout=30)
        assert not thread.is_alive(), "a caller hung after a worker was killed"
        assert len(results) == len(queries)
        if kills == 1:
            assert results[0].status is Status.TIMEOUT, results[0]
        else:
            assert results[0].status is Status.ERROR and "worker process died" in results[0].error
        assert all(r.status is Status.OK and r.rows == ((1500,),) for r in results[1:])
        assert ex.stats()["restarts"] == kills
        assert ex.execute("retail", "SELECT 1").rows == ((1,),)  # the replacement works
    assert _children() == before, "worker processes leaked"


def test_backstop_kills_a_hung_worker(demo_db_root):
    """A worker frozen mid-query (SIGSTOP: it will never check its deadline) is killed at the budget."""
    limits = Limits(timeout_s=1.0)
    with Executor(demo_db_root, workers=1, limits=limits, grace_s=0.5) as ex:
        worker = ex._workers[0]
        threading.Timer(0.3, lambda: worker.proc.send_signal(signal.SIGSTOP)).start()
        t0 = time.monotonic()
        out = ex.execute("retail", ENDLESS)
        took = time.monotonic() - t0
        assert out.status is Status.TIMEOUT and "backstop" in out.error
        assert took < limits.timeout_s + 0.5 + 0.5  # budget + polling slack
        assert ex.execute("retail", "SELECT 2").rows == ((2,),)
        assert ex.stats()["restarts"] == 1


def test_worker_stalled_before_starting_is_replaced(demo_db_root):
    with Executor(demo_db_root, workers=1, limits=Limits(timeout_s=0.5), grace_s=0.2) as ex:
        ex._workers[0].proc.send_signal(signal.SIGSTOP)  # frozen while idle
        out = ex.execute("retail", "SELECT 1")
        assert out.status is Status.OK and out.rows == ((1,),)  # re-sent to the replacement, not blamed
        assert ex.stats()["restarts"] == 1


def test_concurrent_callers_each_get_their_own_answers(demo_db_root):
    with Executor(demo_db_root, workers=2, chunk_size=5) as ex:
        outputs: dict[int, list] = {}

        def caller(k: int):
            outputs[k] = ex.execute_many([("retail", f"SELECT {k} * 1000 + {i}") for i in range(50)])

        threads = [threading.Thread(target=caller, args=(k,)) for k in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
    for k in range(16):
        assert [o.rows[0][0] for o in outputs[k]] == [k * 1000 + i for i in range(50)]


def test_hostile_sql_through_the_pool(demo_db_root):
    limits = Limits(timeout_s=1.0)
    with Executor(demo_db_root, workers=2, limits=limits, chunk_size=1) as ex:
        t0 = time.monotonic()
        outs = ex.execute_many([("retail", sql) for _, sql, _ in HOSTILE])
        took = time.monotonic() - t0
        for (name, _, allowed), out in zip(HOSTILE, outs):
            assert out.status in allowed, (name, out)
        assert ex.stats()["restarts"] == 0
    n_slow = sum(Status.TIMEOUT in allowed for _, _, allowed in HOSTILE)
    assert took < (n_slow / 2 + 1) * (limits.timeout_s + 0.5) + 2


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
def test_memory_stays_bounded(demo_db_root):
    """A query that would need gigabytes (DISTINCT over a cartesian product) is stopped by the heap cap."""
    limits = Limits(timeout_s=20.0, heap_limit_bytes=256 << 20)
    hungry = ("SELECT count(DISTINCT a.name || b.name || c.name || random()) "
              "FROM customers a, customers b, customers c")
    with Executor(demo_db_root, workers=1, limits=limits) as ex:
        out = ex.execute("retail", hungry)
        peak = _peak_rss_mb(ex._workers[0].proc.pid)
    assert out.status in (Status.ERROR, Status.TIMEOUT), out
    assert peak < 256 + 150, f"worker peak RSS {peak:.0f} MB"
