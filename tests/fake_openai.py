"""A real OpenAI-compatible HTTP server on 127.0.0.1 with scripted answers, for tests.

Only the model is fake (nothing commercial can run here); the protocol is the real one:
`POST /v1/chat/completions` with `messages`, `n`, `temperature`..., answering `choices[].message.content`.
`answer(messages, i)` decides the i-th completion's text. Requests are recorded for assertions. Tokens are
words split at spaces: `usage` counts them, and an answer longer than `max_tokens` is cut with reason "length".
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse


class FakeOpenAIServer:
    def __init__(self, answer: Callable[[list[dict], int], str], fail_first: int = 0, fail_after: int | None = None):
        """`fail_first`: the first requests get HTTP 503; `fail_after`: every request after that many gets HTTP 400
        (an endpoint that goes bad midway: a quota spent, a model unloaded)."""
        self.answer = answer
        self.requests: list[dict] = []
        self._fail_first, self._fail_after = fail_first, fail_after
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def chat(request: Request):
            body = await request.json()
            self.requests.append(body)
            if self._fail_first > 0:
                self._fail_first -= 1
                return JSONResponse({"error": {"message": "overloaded"}}, status_code=503)
            if self._fail_after is not None and len(self.requests) > self._fail_after:
                return JSONResponse({"error": {"message": "quota exceeded"}}, status_code=400)
            n, limit = int(body.get("n", 1)), int(body.get("max_tokens", 1 << 30))
            # tokens are words here: an answer of more than max_tokens words is cut there ("length")
            words = [self.answer(body["messages"], i).split(" ") for i in range(n)]
            choices = [{"index": i, "finish_reason": "length" if len(w) > limit else "stop",
                        "message": {"role": "assistant", "content": " ".join(w[:limit])}} for i, w in enumerate(words)]
            prompt = sum(len(m["content"].split(" ")) for m in body["messages"])
            completion = sum(min(len(w), limit) for w in words)
            return {"id": "chatcmpl-test", "object": "chat.completion", "created": int(time.time()),
                    "model": body.get("model", "fake"), "choices": choices,
                    "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                              "total_tokens": prompt + completion}}

        @app.get("/v1/models")
        async def models():
            return {"object": "list", "data": [{"id": "fake", "object": "model"}]}

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self._server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self):
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("fake OpenAI server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc):
        self._server.should_exit = True
        self._thread.join(timeout=10)
