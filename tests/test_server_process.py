"""`sirius reward-server` as a real subprocess: start-up, bad settings, and graceful shutdown on SIGTERM."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from rewards.launch import spawn
from rewards.service import ServerConfig

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[1]
SLOW = "WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r WHERE x < 3000000) SELECT count(*) FROM r"


def _cli(db_root, *args) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen([sys.executable, "-m", "sirius_train.cli", "reward-server", "--db-root", str(db_root),
                             *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)


def test_sigterm_finishes_in_flight_work_then_exits_cleanly(demo_db_root):
    server = spawn(ServerConfig(demo_db_root, workers=2, timeout_s=30.0, token="tok-123"))
    try:
        log = "".join(server.log)
        assert "bearer token" in log and "tok-123" not in log  # the token travels in the environment only
        assert "tok-123" not in " ".join(psutil.Process(server.proc.pid).cmdline())
        workers = [p.pid for p in psutil.Process(server.proc.pid).children(recursive=True)]
        assert len(workers) == 2
        items = [{"id": 0, "db_id": "retail", "pred_sql": SLOW, "gold_sql": "SELECT 3000000"},
                 {"id": 1, "db_id": "retail", "pred_sql": "SELECT 1", "gold_sql": "SELECT 1"}]
        box = {}
        thread = threading.Thread(target=lambda: box.update(r=httpx.post(
            server.url + "/v1/score", json={"items": items}, headers={"authorization": "Bearer tok-123"}, timeout=60)))
        thread.start()
        deadline = time.monotonic() + 10
        while httpx.get(server.url + "/health", timeout=5).json()["queue_depth"] == 0:
            assert time.monotonic() < deadline, "the request was never admitted"
            time.sleep(0.01)
        server.proc.send_signal(signal.SIGTERM)
        thread.join(timeout=60)
        # uvicorn re-raises the signal once the graceful shutdown is done, so a supervisor sees "terminated"
        assert server.proc.wait(timeout=60) in (0, -signal.SIGTERM)
        response = box["r"]
        assert response.status_code == 200
        assert [(r["id"], r["status"], r["match"]) for r in response.json()["results"]] == [(0, "ok", True),
                                                                                              (1, "ok", True)]
        assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
                       for pid in workers), "worker processes outlived the server"
        with pytest.raises(httpx.ConnectError):
            httpx.get(server.url + "/health", timeout=2)
        assert "Traceback" not in "".join(server.log)
    finally:
        server.stop()


def test_spawn_reports_a_server_that_cannot_start(tmp_path):
    (tmp_path / "gone").mkdir()
    config = ServerConfig(tmp_path / "gone", workers=1)
    (tmp_path / "gone").rmdir()  # valid when checked here, missing when the child checks it
    with pytest.raises(RuntimeError, match="exited with code 2"):
        spawn(config, startup_timeout_s=30)


@pytest.mark.parametrize("args, words", [
    (["--workers", "0"], "workers must be >= 1"),
    (["--max-batch", "100", "--max-queue", "10"], "max_batch_items <= max_queue_items"),
])
def test_bad_settings_exit_2_with_the_rule(demo_db_root, args, words):
    proc = _cli(demo_db_root, "--port", "0", *args)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and words in err


def test_a_busy_port_is_a_clear_error(demo_db_root):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        proc = _cli(demo_db_root, "--port", str(busy.getsockname()[1]))
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "cannot listen on 127.0.0.1" in err and "--port" in err
