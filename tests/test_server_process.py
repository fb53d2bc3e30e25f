"""`sirius reward-server` as a real subprocess: start-up, bad settings, and graceful shutdown on SIGTERM."""

from __future__ import annotations

import os
import queue
import re
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

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[1]
SLOW = "WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r WHERE x < 3000000) SELECT count(*) FROM r"


def _env(**extra) -> dict:
    env = dict(os.environ, **extra)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _cli(db_root, *args, env=None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "sirius_train.cli", "reward-server", "--db-root", str(db_root),
                             *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env or _env())


def _lines(proc: subprocess.Popen) -> queue.Queue:
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stderr], daemon=True).start()
    return lines


def _wait_ready(proc: subprocess.Popen, lines: queue.Queue, timeout_s: float = 30.0) -> tuple[str, list[str]]:
    """The server's URL, once /health answers; and the stderr lines seen so far."""
    deadline, seen, url = time.monotonic() + timeout_s, [], None
    while url is None:
        try:
            seen.append(lines.get(timeout=max(0.01, deadline - time.monotonic())))
        except queue.Empty:
            raise AssertionError(f"no 'listening' line; stderr so far: {''.join(seen)}") from None
        if match := re.search(r"listening on (http://127\.0\.0\.1:\d+)", seen[-1]):
            url = match.group(1)
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return url, seen
        except httpx.TransportError:
            pass
        assert proc.poll() is None, f"server exited: {''.join(seen)}"
        time.sleep(0.05)
    raise AssertionError("server never became healthy")


def test_sigterm_finishes_in_flight_work_then_exits_cleanly(demo_db_root):
    proc = _cli(demo_db_root, "--port", "0", "--workers", "2", "--timeout", "30",
                env=_env(SIRIUS_REWARD_TOKEN="tok-123"))
    try:
        lines = _lines(proc)
        url, seen = _wait_ready(proc, lines)
        assert "bearer token" in "".join(seen) and "tok-123" not in "".join(seen)
        workers = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
        assert len(workers) == 2
        auth = {"authorization": "Bearer tok-123"}
        items = [{"id": 0, "db_id": "retail", "pred_sql": SLOW, "gold_sql": "SELECT 3000000"},
                 {"id": 1, "db_id": "retail", "pred_sql": "SELECT 1", "gold_sql": "SELECT 1"}]
        box = {}
        thread = threading.Thread(target=lambda: box.update(r=httpx.post(url + "/v1/score", json={"items": items},
                                                                         headers=auth, timeout=60)))
        thread.start()
        deadline = time.monotonic() + 10
        while httpx.get(url + "/health", timeout=5).json()["queue_depth"] == 0:
            assert time.monotonic() < deadline, "the request was never admitted"
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        thread.join(timeout=60)
        # uvicorn re-raises the signal once the graceful shutdown is done, so a supervisor sees "terminated"
        assert proc.wait(timeout=60) in (0, -signal.SIGTERM)
        response = box["r"]
        assert response.status_code == 200
        assert [(r["id"], r["status"], r["match"]) for r in response.json()["results"]] == [(0, "ok", True),
                                                                                              (1, "ok", True)]
        assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
                       for pid in workers), "worker processes outlived the server"
        with pytest.raises(httpx.ConnectError):
            httpx.get(url + "/health", timeout=2)
        rest = "".join(seen) + "".join(lines.get_nowait() for _ in range(lines.qsize()))
        assert "Traceback" not in rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


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
