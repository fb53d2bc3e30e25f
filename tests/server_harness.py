"""The real reward server in a background thread on 127.0.0.1 (a free port), for tests and nothing else."""

from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import uvicorn

from rewards.server import build_app
from rewards.service import RewardService, ServerConfig


@dataclass
class RunningServer:
    url: str
    service: RewardService


@contextmanager
def running_server(config: ServerConfig, start_timeout_s: float = 30.0):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    app = build_app(config)
    server = uvicorn.Server(uvicorn.Config(app, log_level="error", access_log=False, timeout_graceful_shutdown=30))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout_s
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("reward server did not start")
        time.sleep(0.01)
    try:
        yield RunningServer(f"http://127.0.0.1:{sock.getsockname()[1]}", app.state.service)
    finally:
        server.should_exit = True
        thread.join(timeout=60)
        sock.close()
        assert not thread.is_alive(), "reward server thread did not stop"


class _VLLMLikeHandler(BaseHTTPRequestHandler):
    """What vLLM's OpenAI server answers: /health 200 with an empty body, /v1/score 404."""

    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_POST = do_GET

    def log_message(self, *args):
        pass


@contextmanager
def vllm_like_server():
    """A second, real HTTP server on 127.0.0.1 that answers /health like vLLM does; yields its port."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _VLLMLikeHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
