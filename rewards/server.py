"""The reward server's HTTP edge (FastAPI): parse, call `RewardService`, map the answer -- nothing more.

    POST /v1/score     a batch of (answer, gold) pairs -> results in order: status, match, reward
    POST /v1/execute   one query -> typed outcome + a capped preview of its rows
    GET  /health       200 while serving (503 once shutting down)
    GET  /metrics      Prometheus text: requests, latency histogram, queue depth, outcomes, worker restarts
    GET  /openapi.json the schema (and /docs to browse it)

Every refusal has one shape, `{"error": {"type", "message", "details"?}}`, and one place where it is
mapped to a status (`_STATUS`): 400 malformed JSON, 401 missing/wrong bearer token, 404 unknown
db_id, 413 body or batch too large, 422 invalid fields, 429 queue full (+ Retry-After), 503 shutting
down. A client that disconnects cancels its work that has not started. The API speaks only JSON, so a
POST body is read as JSON whatever its Content-Type says (`curl -d` sends form-urlencoded): the
documented request works as pasted, and a body that is not JSON (or none) gets the 400 that says so.
"""

from __future__ import annotations

import asyncio
import hmac
import socket
import time
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel
from starlette.exceptions import HTTPException

from rewards.protocol import (ErrorBody, ErrorResponse, ExecuteRequest, ExecuteResponse, HealthResponse,
                              ScoreRequest, ScoreResponse, dumps, result_to_wire)
from rewards.service import (BatchTooLarge, DatabaseNotFound, Overloaded, RewardService, ServerConfig,
                             ServiceError, ShuttingDown)

_STATUS = {BatchTooLarge: 413, DatabaseNotFound: 404, Overloaded: 429, ShuttingDown: 503}
_HTTP_KIND = {401: "unauthorized", 404: "not_found", 405: "method_not_allowed", 413: "too_large"}
ENDPOINTS = frozenset({"/v1/score", "/v1/execute", "/health", "/metrics"})
CLIENT_CLOSED = 499  # nginx's code for "the client went away before the answer"
GRACEFUL_SHUTDOWN_S = 120.0
_ERRORS = {code: {"model": ErrorResponse} for code in (400, 401, 404, 413, 422, 429, 503)}


def build_app(config: ServerConfig) -> FastAPI:
    """The FastAPI app; its lifespan starts the worker processes and stops them after the last request."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.service = RewardService.start(config)
        try:
            yield
        finally:
            app.state.service.close()

    app = FastAPI(title="SIRIUS-SQL reward server", version="1", lifespan=lifespan,
                  description="Execution reward for rollout fleets: sandboxed SQLite scoring with backpressure.")
    app.add_middleware(_JsonBody)
    app.add_middleware(_BodyLimit, max_body_bytes=config.max_body_bytes)
    app.add_middleware(_Observe)  # added last = outermost: it also sees the 413s of the body limit
    router = APIRouter(prefix="/v1", dependencies=[Depends(_bearer_check(config.token))] if config.token else [])

    @router.post("/score", response_model=ScoreResponse, responses=_ERRORS)
    async def score(body: ScoreRequest, request: Request):
        """Score a batch of answers against gold SQL by execution; results come back in request order."""
        return await _answer(request, _service(request).score(body), _score_json)

    @router.post("/execute", response_model=ExecuteResponse, responses=_ERRORS)
    async def execute(body: ExecuteRequest, request: Request):
        """Run one read-only query in the sandbox: typed outcome and the first `max_rows` rows."""
        return await _answer(request, _service(request).execute(body), _json)

    app.include_router(router)

    @app.get("/health", response_model=HealthResponse, responses={503: {"model": HealthResponse}})
    def health(request: Request):
        state = _service(request).health()
        return _json(state, 200 if state.status == "ok" else 503)

    @app.get("/metrics", response_class=Response, responses={200: {"content": {"text/plain": {}}}})
    def metrics(request: Request):
        """Prometheus text exposition format."""
        m = _service(request).metrics
        return Response(m.render(), media_type=m.content_type)

    app.add_exception_handler(ServiceError, _service_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(HTTPException, _http_error)
    return app


def serve(config: ServerConfig, host: str = "127.0.0.1", port: int = 8000, log_level: str = "warning",
          announce=print) -> None:
    """Bind `host:port` (0 = any free port), then serve until SIGINT/SIGTERM; in-flight requests finish."""
    import uvicorn

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port}: {e.strerror}; choose another --port (0 = any free one)") \
            from None
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if family == socket.AF_INET6 else host
    announce(f"reward server listening on http://{shown}:{bound} (starting {config.workers} workers)")
    server = uvicorn.Server(uvicorn.Config(build_app(config), log_level=log_level, access_log=False,
                                           timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S))
    server.run(sockets=[sock])


# ---------------------------------------------------------------------- request plumbing
def _service(request: Request) -> RewardService:
    return request.app.state.service


def _json(model: BaseModel, status_code: int = 200, headers: dict | None = None) -> Response:
    # pydantic writes the JSON itself: no jsonable_encoder pass over every item
    return Response(model.model_dump_json(exclude_none=True), status_code, headers, media_type="application/json")


def _score_json(results) -> Response:
    return Response(dumps({"results": [result_to_wire(r) for r in results]}), media_type="application/json")


async def _answer(request: Request, work: Awaitable, encode: Callable[..., Response]) -> Response:
    """Await the service, unless the client disconnects first: then its pending work is cancelled."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(request))
    await asyncio.wait((task, gone), return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        gone.cancel()
        return encode(task.result())
    task.cancel()
    return Response(status_code=CLIENT_CLOSED)


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _bearer_check(token: str):
    expected = token.encode()
    scheme = HTTPBearer(auto_error=False, description="the server's --token")

    def check(credentials: HTTPAuthorizationCredentials | None = Depends(scheme)) -> None:
        if credentials is None or not hmac.compare_digest(credentials.credentials.encode(), expected):
            raise HTTPException(401, "missing or wrong bearer token: send 'Authorization: Bearer <token>' "
                                     "with the server's --token", headers={"WWW-Authenticate": "Bearer"})
    return check


# ---------------------------------------------------------------------- errors, mapped once
def _error(status_code: int, kind: str, message: str, details: list | None = None,
           headers: dict | None = None) -> Response:
    return _json(ErrorResponse(error=ErrorBody(type=kind, message=message, details=details)), status_code, headers)


async def _service_error(request: Request, exc: ServiceError) -> Response:
    headers = {"Retry-After": str(exc.retry_after_s)} if isinstance(exc, Overloaded) else None
    return _error(_STATUS[type(exc)], exc.kind, str(exc), headers=headers)


async def _validation_error(request: Request, exc: RequestValidationError) -> Response:
    errors = exc.errors()
    details = [{"loc": list(e.get("loc", ())), "msg": e.get("msg", "")} for e in errors[:20]]
    if any(e.get("type") == "json_invalid" for e in errors):
        reason = (errors[0].get("ctx") or {}).get("error", "not valid JSON")
        return _error(400, "invalid_json", f"the request body is not valid JSON ({reason})", details)
    if [tuple(e.get("loc", ())) for e in errors] == [("body",)] and errors[0].get("type") == "missing":
        return _error(400, "invalid_json", "the request body is empty: send a JSON object (see /openapi.json)",
                      details)
    first = errors[0]
    where = ".".join(str(part) for part in first.get("loc", ()))
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return _error(422, "invalid_request", f"{where}: {first.get('msg')}{more}; see /openapi.json for the schema",
                  details)


async def _http_error(request: Request, exc: HTTPException) -> Response:
    return _error(exc.status_code, _HTTP_KIND.get(exc.status_code, "http_error"), str(exc.detail),
                  headers=getattr(exc, "headers", None))


# ---------------------------------------------------------------------- ASGI middleware
class _BodyLimit:
    """Refuse bodies over `max_body_bytes` with 413 before parsing (by Content-Length, or while reading)."""

    def __init__(self, app, max_body_bytes: int):
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            return await self.app(scope, receive, send)
        limit = self.max_body_bytes
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            return await self._too_large(scope, receive, send, int(declared))
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > limit:
                return await self._too_large(scope, receive, send, size)
            if not message.get("more_body", False):
                break
        body, replayed = b"".join(chunks), False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    async def _too_large(self, scope, receive, send, size: int):
        response = _error(413, "too_large", f"request body is {size} bytes or more, over the limit of "
                                            f"{self.max_body_bytes}; send smaller batches or raise --max-body-mb",
                          headers={"Connection": "close"})
        await response(scope, receive, send)


class _JsonBody:
    """Read every POST body as JSON: its Content-Type is set to application/json before FastAPI parses it."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["method"] == "POST":
            headers = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
            scope = {**scope, "headers": [*headers, (b"content-type", b"application/json")]}
        await self.app(scope, receive, send)


class _Observe:
    """Count every request and time it, by endpoint and status code (unknown paths share one label)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0, status = time.perf_counter(), [500]

        async def send_observed(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_observed)
        finally:
            service = getattr(scope["app"].state, "service", None)
            if service is not None:
                path = scope["path"]
                service.metrics.observe(path if path in ENDPOINTS else "other", status[0], time.perf_counter() - t0)
