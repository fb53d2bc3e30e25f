"""`RewardClient`: score on one or more reward servers over HTTP -- in bounded time, or with a clear error.

    with RewardClient("http://node1:8000,http://node2:8000") as client:
        results = client.score(items)          # list[ScoreResult], in order, as Executor.score returns

- Batching: a big list is split into requests of `batch_size` items, sent `concurrency` at a time.
- Connection reuse: one `httpx.Client` (thread-safe, keep-alive) for every request.
- Several servers: requests go round-robin; a server that fails or answers 429/503 rests (for its
  Retry-After, or an exponential backoff) and the request moves on to the next one (failover).
- Bounded retries: each request gets `max_retries` more tries after the first; every try has the
  `timeout_s` read timeout. Refusals that a retry cannot fix (401, 404, 413, 422, ...) raise
  `RewardServerError` at once; running out of tries raises `RewardServerUnavailable`.

Scoring is read-only, so a retried request never does harm. Items travel with their position as `id`
and come back mapped to the caller's own ids, so any Python id works and every item is checked to get
exactly one answer.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import httpx

from rewards.protocol import ExecuteResponse, HealthResponse, dumps, loads, result_from_wire
from rewards.scoring import ScoreItem, ScoreResult

RETRYABLE_STATUS = frozenset({429, 502, 503, 504})
_JSON = {"content-type": "application/json"}


class RewardServerError(RuntimeError):
    """The server refused the request for a reason retrying cannot fix: the message says what to change."""

    def __init__(self, url: str, status_code: int, kind: str, message: str):
        super().__init__(f"{url} answered {status_code} ({kind}): {message}")
        self.url, self.status_code, self.kind = url, status_code, kind


class RewardServerUnavailable(RuntimeError):
    """No server gave an answer within the retry budget."""


def backoff_s(attempt: int, base_s: float, cap_s: float, rand=random.random) -> float:
    """Exponential backoff with jitter: between half and all of min(cap, base * 2**attempt).

    Example:
        >>> backoff_s(0, 0.25, 10.0, rand=lambda: 1.0), backoff_s(2, 0.25, 10.0, rand=lambda: 0.0)
        (0.25, 0.5)
        >>> backoff_s(10, 0.25, 10.0, rand=lambda: 1.0)
        10.0
    """
    delay = min(cap_s, base_s * 2 ** attempt)
    return delay / 2 + rand() * delay / 2


class Endpoints:
    """Round-robin over server URLs, skipping those resting after a failure; time is passed in.

    Example:
        >>> e = Endpoints(["http://a", "http://b"])
        >>> e.pick(now=0.0), e.pick(now=0.0)
        (('http://a', 0.0), ('http://b', 0.0))
        >>> e.rest("http://a", 5.0, now=0.0); e.pick(now=1.0), e.pick(now=1.0)
        (('http://b', 0.0), ('http://b', 0.0))
        >>> e.rest("http://b", 2.0, now=1.0); e.pick(now=1.0)
        ('http://b', 2.0)
    """

    def __init__(self, urls: Sequence[str]):
        self.urls = list(urls)
        self._resting_until = dict.fromkeys(self.urls, 0.0)
        self._turn = 0
        self._lock = threading.Lock()

    def pick(self, now: float) -> tuple[str, float]:
        """The next URL in turn that is not resting, with 0 s to wait; if all rest, the one free soonest."""
        with self._lock:
            n = len(self.urls)
            for k in range(n):
                url = self.urls[(self._turn + k) % n]
                if self._resting_until[url] <= now:
                    self._turn = (self._turn + k + 1) % n
                    return url, 0.0
            url = min(self.urls, key=self._resting_until.__getitem__)
            return url, self._resting_until[url] - now

    def rest(self, url: str, seconds: float, now: float) -> None:
        with self._lock:
            self._resting_until[url] = max(self._resting_until[url], now + seconds)


class RewardClient:
    """Client of `sirius reward-server`. Thread-safe; use one per process and close it (or use `with`).

    Args:
        urls: a server URL, several as a list, or a comma-separated string (`http://host:port`).
        token: bearer token, when the servers were started with `--token`.
        timeout_s: read timeout of one HTTP request (a batch's whole scoring must fit in it).
        batch_size: items per request.
        concurrency: requests in flight at once (default: 2 per server).
        max_retries: further tries of one request after its first failure (on any server).
        backoff_s / max_backoff_s: first and largest rest of a failing server (Retry-After, when the
            server sends one, counts instead, up to `max_backoff_s`).
    """

    def __init__(self, urls: str | Sequence[str], *, token: str | None = None, timeout_s: float = 120.0,
                 batch_size: int = 256, concurrency: int | None = None, max_retries: int = 4,
                 backoff_s: float = 0.25, max_backoff_s: float = 30.0):
        self.urls = parse_urls(urls)
        if batch_size < 1 or max_retries < 0 or timeout_s <= 0:
            raise ValueError(f"need batch_size >= 1, max_retries >= 0, timeout_s > 0; got {batch_size}, "
                             f"{max_retries}, {timeout_s}")
        self.batch_size, self.max_retries = batch_size, max_retries
        self.backoff_s, self.max_backoff_s = backoff_s, max_backoff_s
        self.concurrency = concurrency or 2 * len(self.urls)
        self._endpoints = Endpoints(self.urls)
        headers = {"authorization": f"Bearer {token}"} if token else {}
        # Many threads may call score() at once (verl scores answer by answer from a thread pool): room for them.
        connections = max(64, self.concurrency + len(self.urls))
        self._http = httpx.Client(headers=headers, timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 5.0)),
                                  limits=httpx.Limits(max_connections=connections,
                                                      max_keepalive_connections=connections))
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    def score(self, items: Sequence[ScoreItem | Mapping]) -> list[ScoreResult]:
        """Score `items` (ScoreItem, or /v1/score item dicts, e.g. with `solution_str`); results in order."""
        items = list(items)
        chunks = [items[i:i + self.batch_size] for i in range(0, len(items), self.batch_size)]
        if len(chunks) <= 1:
            return self._score_chunk(items) if items else []
        results: list[ScoreResult] = []
        for part in self._threads().map(self._score_chunk, chunks):
            results.extend(part)
        return results

    def execute(self, db_id: str, sql: str, max_rows: int = 20) -> ExecuteResponse:
        """Run one query on a server: typed outcome and the first `max_rows` rows."""
        body = dumps({"db_id": db_id, "sql": sql, "max_rows": max_rows})
        return ExecuteResponse.model_validate_json(self._post("/v1/execute", body).content)

    def health(self) -> dict[str, HealthResponse | str]:
        """Each server's /health, or why it could not be read."""
        out: dict[str, HealthResponse | str] = {}
        for url in self.urls:
            try:
                out[url] = HealthResponse.model_validate_json(self._http.get(url + "/health").content)
            except (httpx.HTTPError, ValueError) as e:
                out[url] = f"{type(e).__name__}: {e}"
        return out

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        self._http.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ------------------------------------------------------------------ internals
    def _threads(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="sirius-reward-client")
            return self._pool

    def _score_chunk(self, chunk: list) -> list[ScoreResult]:
        wire = [_wire_item(item, position) for position, item in enumerate(chunk)]
        response = self._post("/v1/score", dumps({"items": wire}))
        try:
            results = loads(response.content)["results"]
            if [r["id"] for r in results] != list(range(len(chunk))):
                raise ValueError(f"expected {len(chunk)} results in order, got {len(results)}")
            return [result_from_wire(r, _item_id(item)) for r, item in zip(results, chunk)]
        except (ValueError, KeyError, TypeError) as e:
            raise RewardServerError(str(response.url), 200, "bad_response",
                                    f"{type(e).__name__}: {e}; is this a SIRIUS reward server?") from None

    def _post(self, path: str, body: bytes) -> httpx.Response:
        """POST with failover and bounded retries: the first 200 response, or an exception."""
        failures: list[str] = []
        for attempt in range(self.max_retries + 1):
            url, wait = self._endpoints.pick(time.monotonic())
            if wait > 0:
                time.sleep(wait)
            try:
                response = self._http.post(url + path, content=body, headers=_JSON)
            except httpx.TransportError as e:  # refused, reset, timed out: rest this server, try the next
                failures.append(f"{url}: {type(e).__name__} {e}".rstrip())
                self._endpoints.rest(url, backoff_s(attempt, self.backoff_s, self.max_backoff_s), time.monotonic())
                continue
            if response.status_code == 200:
                return response
            kind, message = _error_of(response)
            if response.status_code not in RETRYABLE_STATUS:
                raise RewardServerError(url, response.status_code, kind, message)
            failures.append(f"{url}: {response.status_code} {message}")
            rest = _retry_after(response) or backoff_s(attempt, self.backoff_s, self.max_backoff_s)
            self._endpoints.rest(url, min(rest, self.max_backoff_s), time.monotonic())
        raise RewardServerUnavailable(f"no reward server answered {path} after {self.max_retries + 1} tries; last "
                                      f"failures: {'; '.join(failures[-len(self.urls):])}")


def parse_urls(urls: str | Sequence[str]) -> list[str]:
    """Server URLs from a list or a comma-separated string, without trailing slashes.

    Example:
        >>> parse_urls("http://a:8000/, http://b:8000")
        ['http://a:8000', 'http://b:8000']
    """
    parts = urls.split(",") if isinstance(urls, str) else list(urls)
    cleaned = [u.strip().rstrip("/") for u in parts if u and u.strip()]
    bad = [u for u in cleaned if not u.startswith(("http://", "https://"))]
    if not cleaned or bad:
        raise ValueError(f"reward server URLs must look like http://host:port, got {urls!r}")
    return cleaned


def _wire_item(item: ScoreItem | Mapping, position: int) -> dict:
    if isinstance(item, ScoreItem):
        return {"id": position, "db_id": item.db_id, "gold_sql": item.gold_sql, "pred_sql": item.pred_sql,
                "compare": item.compare}
    return {**item, "id": position}


def _item_id(item: ScoreItem | Mapping):
    return item.id if isinstance(item, ScoreItem) else item.get("id")


def _error_of(response: httpx.Response) -> tuple[str, str]:
    try:
        error = response.json()["error"]
        return str(error["type"]), str(error["message"])
    except (ValueError, KeyError, TypeError):
        return "http_error", response.text[:500] or response.reason_phrase


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after", "")
    return float(value) if value.replace(".", "", 1).isdigit() else None


class FallbackScorer:
    """Scores on reward servers while they answer; once they stay unavailable past the client's retries and
    backoff, scores in-process (sandboxed, the same databases) from then on, saying so once.

    With `fallback=False` the outage is an error instead, raised from `score` -- so before the caller has any
    reward to train on: a batch is never scored with failures standing in for rewards.

    Args:
        client: a `RewardClient` (or anything with `score` raising `RewardServerUnavailable`).
        make_local: builds the in-process scorer (`Executor` or `Scorer`-like `score`) on first need.
        warn: called with the one-line notice of the switch.
    """

    def __init__(self, client, make_local, *, fallback: bool = True, warn=None):
        self.client, self._make_local, self.fallback, self._warn = client, make_local, fallback, warn
        self._local = None
        self._lock = threading.Lock()
        self.fallbacks = 0  # score calls answered in-process

    def score(self, items: Sequence[ScoreItem]) -> list[ScoreResult]:
        if self._local is None:
            try:
                return self.client.score(items)
            except RewardServerUnavailable as e:
                if not self.fallback:
                    raise RewardServerUnavailable(f"{e}; in-process fallback is off (reward.fallback=false): "
                                                  "stopping before any update from rewards never computed") from e
                self._switch(e)
        with self._lock:
            self.fallbacks += 1
        return self._local.score(items)

    def _switch(self, error: Exception) -> None:
        with self._lock:
            if self._local is None:
                self._local = self._make_local()
                if self._warn is not None:
                    self._warn(f"reward server unavailable ({error}); scoring in-process from now on")

    def close(self) -> None:
        self.client.close()
        if self._local is not None and hasattr(self._local, "close"):
            self._local.close()
