"""The wire format: the fast result encoder/decoder agree with the documented pydantic schema."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from rewards.protocol import (ExecuteResponse, ScoreRequest, ScoreResponse, ScoreResultItem, result_from_wire,
                              result_to_wire)
from rewards.outcome import Outcome, Status
from rewards.scoring import ScoreItem, ScoreResult

RESULTS = [
    ScoreResult(0, True, 1.0, "ok", "ok", pred_elapsed_s=0.000125),
    ScoreResult("b", False, -1.0, "rejected", "ok", pred_error="no SQL found in the answer", format_ok=False),
    ScoreResult(None, False, 0.0, "timeout", "error", pred_error="timed out after 5.00s", gold_error="no such table"),
]


@pytest.mark.parametrize("result", RESULTS)
def test_fast_encoder_matches_the_schema_and_round_trips(result):
    wire = json.loads(json.dumps(result_to_wire(result)))
    model = ScoreResultItem.model_validate(wire)  # what the OpenAPI schema promises
    assert set(wire) <= set(ScoreResultItem.model_fields)
    assert model.model_dump() == {**dict.fromkeys(ScoreResultItem.model_fields), **wire,
                                  "status": Status(wire["status"]), "gold_status": Status(wire["gold_status"])}
    assert result_from_wire(wire, result.id) == result
    assert ScoreResponse.model_validate({"results": [wire]}).results[0] == model


def test_every_schema_field_is_written_when_present():
    full = ScoreResult(1, False, 0.0, "error", "error", pred_error="x", gold_error="y", pred_elapsed_s=0.5)
    assert set(result_to_wire(full)) == set(ScoreResultItem.model_fields)


def test_request_item_needs_exactly_one_answer_and_extracts_sql():
    def items(*wire):
        return ScoreRequest.model_validate({"items": list(wire)}).score_items()

    with pytest.raises(ValidationError, match="items.0: give exactly one of"):
        items({"db_id": "a", "gold_sql": "SELECT 1"})
    with pytest.raises(ValidationError, match="items.1: give exactly one of"):
        items({"db_id": "a", "gold_sql": "g", "pred_sql": "x"},
              {"db_id": "a", "gold_sql": "SELECT 1", "pred_sql": "SELECT 1", "solution_str": "x"})
    with pytest.raises(ValidationError, match="extra"):
        items({"db_id": "a", "gold_sql": "g", "pred_sql": "x", "gold": "g"})
    assert items({"db_id": "a", "gold_sql": "g", "pred_sql": None, "id": 3}) == [ScoreItem("a", "g", None, "bird", 3)]
    assert items({"db_id": "a", "gold_sql": "g", "solution_str": "no sql", "compare": "spider"}) == \
        [ScoreItem("a", "g", None, "spider", None)]
    assert items({"db_id": "a", "gold_sql": "g", "solution_str": None}) == [ScoreItem("a", "g", None, "bird", None)]
    assert items({"db_id": "a", "gold_sql": "g", "solution_str": "```sql\nSELECT 2\n```"})[0].pred_sql == "SELECT 2"


def test_execute_preview_is_capped_and_says_so():
    outcome = Outcome(Status.OK, rows=tuple((i, b"\x00\xff", None) for i in range(50)), columns=("i", "b", "n"))
    preview = ExecuteResponse.from_outcome(outcome, max_rows=3)
    assert preview.rows == [[0, "00ff", None], [1, "00ff", None], [2, "00ff", None]]
    assert (preview.row_count, preview.truncated) == (50, True)
    assert ExecuteResponse.from_outcome(outcome, max_rows=50).truncated is False
