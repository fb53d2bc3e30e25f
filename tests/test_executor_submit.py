"""Executor submission: futures, cancellation, in-batch dedup, and chunks too big to wait in a worker's pipe."""

from __future__ import annotations

import time

import pytest

from rewards.executor import PIPELINE_MAX_BYTES, Executor
from rewards.outcome import Status
from rewards.sandbox import Limits
from rewards.scoring import ScoreItem

pytestmark = pytest.mark.timeout(120)

ENDLESS = "WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r) SELECT max(x) FROM r"


def test_identical_pairs_run_once_and_each_keeps_its_own_id(demo_db_root):
    # random() tells a copied answer from a re-run one: two runs would (almost surely) differ
    items = [ScoreItem("retail", "SELECT 1", "SELECT random()", id=("copy", i)) for i in range(40)]
    items += [ScoreItem("retail", "SELECT 1", "SELECT random() ", id=("other", 0))]
    with Executor(demo_db_root, workers=2, chunk_size=4) as ex:
        results = ex.score(items)
        outs = ex.execute_many([("retail", "SELECT random()")] * 10)
        assert ex.stats()["outcomes"]["ok"] == 41 + 10  # every item is counted as answered
    assert [r.id for r in results] == [("copy", i) for i in range(40)] + [("other", 0)]
    assert len({r.pred_elapsed_s for r in results[:40]}) == 1  # one run, copied to 40 items
    assert len({o.rows for o in outs}) == 1


def test_submit_returns_a_future_and_cancelling_drops_chunks_not_started(demo_db_root):
    with Executor(demo_db_root, workers=1, chunk_size=1, limits=Limits(timeout_s=0.5)) as ex:
        future = ex.submit_execute_many([("retail", f"{ENDLESS} -- {i}") for i in range(8)])  # 4 s of work
        assert not future.done()
        time.sleep(0.2)
        assert future.cancel()
        deadline = time.monotonic() + 5
        while ex.queue_depth() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert ex.queue_depth() == 0
        assert ex.stats()["outcomes"].get("timeout", 0) <= 2  # the running one and the one in the pipe
        done = ex.submit_score([ScoreItem("retail", "SELECT 2", "SELECT 2", id="after")]).result(timeout=10)
        assert done[0].match and done[0].id == "after"


def test_chunks_too_big_for_the_pipe_wait_for_an_idle_worker(demo_db_root):
    padding = " " * (PIPELINE_MAX_BYTES * 4)
    queries = [("retail", f"SELECT {i}" + (padding if i % 3 == 0 else "")) for i in range(30)]
    with Executor(demo_db_root, workers=1, chunk_size=2) as ex:
        outs = ex.execute_many(queries)
    assert [o.status for o in outs] == [Status.OK] * 30
    assert [o.rows for o in outs] == [((i,),) for i in range(30)]
