"""The reward server's wire format: pydantic models of `/v1/score`, `/v1/execute`, `/health` and errors.

These field names are a public contract (rollout workers in other languages speak them); the server
and `rewards.client.RewardClient` both import them from here, so the two cannot drift apart.

Score results are the hot path (thousands per second): they are written and read with two plain
functions, `result_to_wire` / `result_from_wire`, instead of a pydantic object per item. The
`ScoreResultItem` model documents the same JSON in the OpenAPI schema; tests check the two agree.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, Union

import orjson
from pydantic import BaseModel, ConfigDict, Field, model_validator, with_config
from typing_extensions import NotRequired, TypedDict

from rewards.compare import CompareMode
from rewards.extract import extract_sql
from rewards.outcome import Outcome, Status
from rewards.scoring import ScoreItem, ScoreResult

ItemId = Union[int, str, None]
CompareName = Literal[tuple(mode.value for mode in CompareMode)]  # plain strings: no enum lookup per item
PREVIEW_ROWS_MAX = 1000  # the most rows /v1/execute will ever return


@with_config(ConfigDict(extra="forbid"))
class ScoreRequestItem(TypedDict):
    """One (answer, gold) pair. Give exactly one of `pred_sql` (the SQL; null = no SQL found, a format
    failure) or `solution_str` (the model's whole answer; the SQL is extracted as in training).

    A TypedDict, not a model: items are validated in pydantic's core without a Python object (or call)
    per item -- on the reward server's hot path that halves the cost of reading a batch.
    """

    id: NotRequired[Annotated[ItemId, Field(description="echoed back; any JSON string or integer")]]
    db_id: Annotated[str, Field(description="database folder under the server's --db-root")]
    gold_sql: str
    pred_sql: NotRequired[str | None]
    solution_str: NotRequired[str | None]
    compare: NotRequired[Annotated[CompareName, Field(description="result equivalence rule (rewards.compare); "
                                                                  "default 'bird'")]]


class ScoreRequest(BaseModel):
    items: list[ScoreRequestItem]

    @model_validator(mode="after")
    def _exactly_one_answer(self):
        for i, item in enumerate(self.items):
            if ("pred_sql" in item) == ("solution_str" in item):
                raise ValueError(f"items.{i}: give exactly one of 'pred_sql' (the SQL, null when none was found) "
                                 "or 'solution_str' (the model's answer; the SQL is extracted from it)")
        return self

    def score_items(self) -> list[ScoreItem]:
        """The domain records: `solution_str` goes through `extract_sql` (None = format failure).

        Example:
            >>> ScoreRequest(items=[{"db_id": "a", "gold_sql": "SELECT 1", "solution_str": "<answer>SELECT 2</answer>"}]
            ...              ).score_items()
            [ScoreItem(db_id='a', gold_sql='SELECT 1', pred_sql='SELECT 2', compare='bird', id=None)]
        """
        return [ScoreItem(item["db_id"], item["gold_sql"], _answer_sql(item), item.get("compare", "bird"),
                          item.get("id")) for item in self.items]


def _answer_sql(item: ScoreRequestItem) -> str | None:
    if "pred_sql" in item:
        return item["pred_sql"]
    return None if item["solution_str"] is None else extract_sql(item["solution_str"])


class ScoreResultItem(BaseModel):
    """The answer for one item, in request order."""

    id: ItemId
    status: Status = Field(..., description="how the prediction ran: ok, empty, error, timeout, rejected")
    match: bool
    reward: float
    gold_status: Status
    format_ok: bool = Field(..., description="false when no SQL was found in the answer")
    error: str | None = Field(None, description="the prediction's error message, verbatim from the engine")
    gold_error: str | None = None
    elapsed_s: float = Field(0.0, description="seconds the prediction ran")


class ScoreResponse(BaseModel):
    results: list[ScoreResultItem]


def dumps(obj) -> bytes:
    """JSON bytes by orjson (3-4x faster than `json` on score batches); strings with lone surrogates,
    which orjson refuses, go through `json` as ASCII escapes instead, so nothing a client sends is unanswerable.

    Example:
        >>> dumps({"sql": "SELECT 1"}), dumps({"sql": "\\ud800"})
        (b'{"sql":"SELECT 1"}', b'{"sql": "\\\\ud800"}')
    """
    try:
        return orjson.dumps(obj)
    except orjson.JSONEncodeError:
        return json.dumps(obj).encode()


def loads(data: bytes | str):
    """Parse JSON (orjson; `json` for escaped lone surrogates, which orjson refuses). Raises ValueError."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)


def result_to_wire(r: ScoreResult) -> dict:
    """One `/v1/score` result as JSON-ready data (the `ScoreResultItem` schema); errors only when present.

    Example:
        >>> wire = result_to_wire(ScoreResult(7, True, 1.0, "ok", "ok", pred_elapsed_s=0.002))
        >>> wire["id"], wire["status"], wire["match"], wire["reward"], "error" in wire
        (7, 'ok', True, 1.0, False)
    """
    wire = {"id": r.id, "status": r.pred_status, "match": r.match, "reward": r.reward, "gold_status": r.gold_status,
            "format_ok": r.format_ok, "elapsed_s": r.pred_elapsed_s}
    if r.pred_error is not None:
        wire["error"] = r.pred_error
    if r.gold_error is not None:
        wire["gold_error"] = r.gold_error
    return wire


def result_from_wire(wire: dict, id: Any = None) -> ScoreResult:
    """Back to the domain record, with the caller's own `id`: a remote score reads exactly like a local one.

    Example:
        >>> result_from_wire({"id": 0, "status": "error", "match": False, "reward": 0.0, "gold_status": "ok",
        ...                   "format_ok": True, "error": "no such column: x"}, id="a").pred_error
        'no such column: x'
    """
    get = wire.get
    return ScoreResult(id, wire["match"], wire["reward"], wire["status"], wire["gold_status"], get("error"),
                       get("gold_error"), wire["format_ok"], get("elapsed_s", 0.0))  # positional: the hot path


class ExecuteRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    db_id: str
    sql: str
    max_rows: int = Field(20, ge=0, le=PREVIEW_ROWS_MAX, description="rows of the result to send back")


class ExecuteResponse(BaseModel):
    """A typed outcome and a capped preview of its rows (for the repair lifecycle)."""

    status: Status
    columns: list[str]
    rows: list[list[Any]] = Field(..., description="the first max_rows rows; bytes as hex")
    row_count: int = Field(..., description="rows the query returned in all")
    truncated: bool
    elapsed_s: float
    error: str | None = None

    @classmethod
    def from_outcome(cls, outcome: Outcome, max_rows: int) -> "ExecuteResponse":
        """Example:
            >>> ExecuteResponse.from_outcome(Outcome(Status.OK, rows=((1,), (2,)), columns=("x",)), 1).rows
            [[1]]
        """
        view = outcome.to_json(max_rows=max_rows)
        return cls(**view, truncated=view["row_count"] > len(view["rows"]))


SERVICE_NAME = "sirius-reward-server"


class HealthResponse(BaseModel):
    service: Literal["sirius-reward-server"] = Field(
        SERVICE_NAME, description="who answers: a SIRIUS reward server (another server's /health says nothing like it)")
    db_root: str = Field(..., description="absolute path of the databases this server scores against")
    status: str = Field(..., description="'ok', or 'shutting_down' once the server stops admitting work")
    workers: int
    queue_depth: int = Field(..., description="items admitted and not yet answered")
    max_queue_items: int
    worker_restarts: int
    variants: int = Field(0, description="variant databases a prediction must also match on (--variants)")


class ErrorBody(BaseModel):
    type: str = Field(..., description="machine-readable kind: invalid_request, too_large, unknown_db, ...")
    message: str
    details: list[Any] | None = None


class ErrorResponse(BaseModel):
    """Every non-2xx answer has this shape."""

    error: ErrorBody
