"""A small client for any OpenAI-compatible chat endpoint (vLLM, SGLang, TGI, hosted APIs).

Used wherever a model behind HTTP answers: the sampler for pass-rate estimation, the LLM question
writer, and on the inference side the generalist, the corrector and the pairwise judge. One
connection pool, bounded retries with backoff on 429/5xx/network errors, and errors that say which
endpoint failed and how.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import httpx


class EndpointError(RuntimeError):
    """The endpoint could not be reached or answered with an error after retries."""


@dataclass
class ChatClient:
    """`ChatClient("http://127.0.0.1:8000/v1", "Qwen2.5-Coder-7B-Instruct").complete(messages, n=4)`.

    `api_key` defaults to $OPENAI_API_KEY (many local servers need none).
    """

    base_url: str
    model: str
    api_key: str | None = None
    timeout_s: float = 120.0
    max_retries: int = 3
    backoff_s: float = 0.5

    def __post_init__(self):
        self.base_url = self.base_url.rstrip("/")
        key = self.api_key if self.api_key is not None else os.environ.get("OPENAI_API_KEY")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._http = httpx.Client(timeout=self.timeout_s, headers=headers)

    def complete(self, messages: list[dict], n: int = 1, temperature: float = 0.0, top_p: float = 1.0,
                 max_tokens: int = 512, seed: int | None = None, stop: list[str] | None = None) -> list[str]:
        """`n` completions of one chat; returns their texts in order."""
        return self.complete_with_usage(messages, n, temperature, top_p, max_tokens, seed, stop)[0]

    def complete_with_usage(self, messages: list[dict], n: int = 1, temperature: float = 0.0, top_p: float = 1.0,
                            max_tokens: int = 512, seed: int | None = None, stop: list[str] | None = None
                            ) -> tuple[list[str], dict]:
        """`complete`'s texts, and the tokens the server reports: `prompt`, `answer` (its usage's prompt and
        completion tokens) and `at_limit` (choices that stopped for length)."""
        body = {"model": self.model, "messages": messages, "n": n, "temperature": temperature, "top_p": top_p,
                "max_tokens": max_tokens}
        if seed is not None:
            body["seed"] = seed
        if stop:
            body["stop"] = stop
        data = self._post("/chat/completions", body)
        try:
            choices = sorted(data["choices"], key=lambda c: c.get("index", 0))
            texts = [c["message"]["content"] or "" for c in choices]
            usage = data.get("usage") or {}
            tokens = {"prompt": int(usage.get("prompt_tokens") or 0), "answer": int(usage.get("completion_tokens") or 0),
                      "at_limit": sum(c.get("finish_reason") == "length" for c in choices)}
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise EndpointError(f"{self.base_url}: malformed chat completion response ({e!r})") from None
        if len(texts) < n:  # some servers ignore `n`; ask again for the rest
            more, extra = self.complete_with_usage(messages, n - len(texts), temperature, top_p, max_tokens,
                                                   None if seed is None else seed + len(texts), stop)
            texts += more
            tokens = {key: tokens[key] + extra[key] for key in tokens}
        return texts, tokens

    def _post(self, path: str, body: dict) -> dict:
        url = self.base_url + path
        last = None
        for attempt in range(self.max_retries + 1):
            try:
                response = self._http.post(url, json=body)
            except httpx.HTTPError as e:
                last = f"{type(e).__name__}: {e}"
            else:
                if response.status_code == 200:
                    return response.json()
                last = f"HTTP {response.status_code}: {response.text[:300]}"
                if response.status_code not in (408, 429) and response.status_code < 500:
                    break  # a client error will not fix itself
            if attempt < self.max_retries:
                time.sleep(self.backoff_s * 2 ** attempt)
        raise EndpointError(f"{url} failed after {self.max_retries + 1} attempt(s): {last}")

    def close(self) -> None:
        self._http.close()
