"""A reward server in a child process: `spawn(config)` starts `sirius reward-server` on a free port.

For a single node, a trainer can start its own server and point its rollout workers at `.url`; the
tests and benchmarks use it to drive the real command line. The token, if any, travels through the
environment, never the command line (where `ps` would show it).
"""

from __future__ import annotations

import os
import queue
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from rewards.service import ServerConfig


class ServerProcess:
    """`sirius reward-server` in a child process on a free port: start it with `spawn`, stop it with `stop`."""

    def __init__(self, proc, url: str, log: list[str]):
        self.proc, self.url, self.log = proc, url, log

    def stop(self, timeout_s: float = 60.0) -> int:
        """SIGTERM (in-flight requests finish), then SIGKILL if it has not exited in time; the exit code."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                return self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def spawn(config: ServerConfig, host: str = "127.0.0.1", startup_timeout_s: float = 60.0) -> ServerProcess:
    """Start a reward server as a child process on a free port of `host`; returns once /health answers."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]),
                                                                      os.environ.get("PYTHONPATH")])))
    env.pop("SIRIUS_REWARD_TOKEN", None)
    if config.token:
        env["SIRIUS_REWARD_TOKEN"] = config.token
    args = [sys.executable, "-m", "sirius_train.cli", "reward-server", "--db-root", str(config.db_root),
            "--host", host, "--port", "0", "--workers", str(config.workers), "--timeout", str(config.timeout_s),
            "--max-queue", str(config.max_queue_items), "--max-batch", str(config.max_batch_items),
            "--max-body-mb", str(config.max_body_bytes / (1 << 20)), "--chunk-size", str(config.chunk_size)]
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, env=env)
    log: list[str] = []
    lines: queue.Queue = queue.Queue()

    def drain():  # keep reading, or a chatty server would block on a full pipe
        for line in proc.stderr:
            log.append(line)
            lines.put(line)

    threading.Thread(target=drain, daemon=True).start()
    deadline = time.monotonic() + startup_timeout_s
    url = None
    try:
        while url is None:
            try:
                line = lines.get(timeout=0.05)
            except queue.Empty:
                _check_alive(proc, log, deadline, startup_timeout_s)
                continue
            if match := re.search(r"listening on (http://\S+)", line):
                url = match.group(1)
        while True:
            _check_alive(proc, log, deadline, startup_timeout_s)
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    return ServerProcess(proc, url, log)
            except httpx.TransportError:
                pass
            time.sleep(0.05)
    except BaseException:
        proc.kill()
        proc.wait()
        raise


def _check_alive(proc, log: list[str], deadline: float, startup_timeout_s: float) -> None:
    if proc.poll() is not None:
        raise RuntimeError(f"reward server exited with code {proc.returncode}: {''.join(log)}")
    if time.monotonic() > deadline:
        raise RuntimeError(f"reward server not healthy within {startup_timeout_s:.0f}s: {''.join(log)}")
