"""Reward server identity: /health says who answers and for which db_root; a port held by anything else is refused.

The "anything else" is a real second HTTP server on 127.0.0.1 that answers `/health` the way vLLM's OpenAI
server does (200, empty body) and 404s `/v1/score`. `scripts/reward_server_per_node.sh` runs for real: it
refuses that port, starts our server (supervised) on a free one, and the supervisor brings it back after
the server is killed.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest
from server_harness import running_server, vllm_like_server

from rewards.identity import ABSENT, FOREIGN, OTHER_ROOT, OURS, check_reward_server
from rewards.service import ServerConfig

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "reward_server_per_node.sh"


@pytest.fixture()
def vllm_like():
    with vllm_like_server() as port:
        yield port


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_our_server_says_who_it_is_and_for_which_databases(demo_db_root, tmp_path):
    with running_server(ServerConfig(demo_db_root, workers=1)) as server:
        assert check_reward_server(server.url, str(demo_db_root)).kind == OURS
        assert check_reward_server(server.url, str(demo_db_root / "." / "retail" / "..")).kind == OURS  # real paths
        other = check_reward_server(server.url, str(tmp_path))
        assert other.kind == OTHER_ROOT and f"--db-root {tmp_path}" in other.message


def test_another_server_answering_health_is_not_ours(vllm_like, demo_db_root):
    url = f"http://127.0.0.1:{vllm_like}"
    assert httpx.get(url + "/health").status_code == 200  # a bare 200 check would take it for ours
    check = check_reward_server(url, str(demo_db_root))
    assert check.kind == FOREIGN and "not a SIRIUS reward server" in check.message and "empty body" in check.message
    assert check_reward_server(f"http://127.0.0.1:{_free_port()}", None).kind == ABSENT


def _script(port: int, db_root: Path, log_dir: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, SIRIUS_DB_ROOT=str(db_root), SIRIUS_REWARD_PORT=str(port), SIRIUS_REWARD_WORKERS="1",
               SIRIUS_LOG_DIR=str(log_dir), SIRIUS=f"{sys.executable} -m sirius_train.cli", PYTHON=sys.executable,
               PYTHONPATH=str(ROOT))
    return subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=timeout)


def test_per_node_script_refuses_a_port_held_by_another_server(vllm_like, demo_db_root, tmp_path):
    out = _script(vllm_like, demo_db_root, tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "not a SIRIUS reward server" in out.stderr
    assert not (tmp_path / f"reward_server_{vllm_like}.pid").exists()  # nothing was started


def _wait(predicate, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def test_per_node_script_starts_a_supervised_server_that_comes_back(demo_db_root, tmp_path):
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    out = _script(port, demo_db_root, tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    supervisor = psutil.Process(int((tmp_path / f"reward_server_{port}.pid").read_text()))
    try:
        assert check_reward_server(url, str(demo_db_root)).ok
        again = _script(port, demo_db_root, tmp_path)  # a second call finds it and starts nothing
        assert again.returncode == 0 and "already serving" in again.stdout
        (server,) = supervisor.children()
        server.kill()  # the server dies; its supervisor starts another
        server.wait(30)
        _wait(lambda: check_reward_server(url, str(demo_db_root)).ok)
        assert [c.pid for c in supervisor.children()] != [server.pid]
        assert "restarting in 2 s" in (tmp_path / f"reward_server_{port}.log").read_text()
    finally:
        children = supervisor.children(recursive=True)
        supervisor.send_signal(signal.SIGTERM)  # stops the supervisor and its server
        supervisor.wait(60)
        psutil.wait_procs(children, timeout=60)
    assert check_reward_server(url, None).kind == ABSENT
