"""REWARD_SERVER.md's sample requests, sent as written to a real server on the demo databases, get the documented
answers (everything but the timings): a user who pastes them after `make demo` sees what the page shows."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest
from server_harness import running_server

from rewards.service import ServerConfig

DOC = (Path(__file__).resolve().parents[1] / "docs" / "REWARD_SERVER.md").read_text()


def section(title: str) -> str:
    return DOC.split(f"### `{title}`", 1)[1].split("\n### ", 1)[0]


def timeless(result: dict) -> dict:
    return {k: v for k, v in result.items() if k != "elapsed_s"}


@pytest.fixture(scope="module")
def server(demo_db_root):
    with running_server(ServerConfig(demo_db_root, workers=1, timeout_s=2.0)) as running:
        yield running


def test_the_score_sample_gets_the_documented_results(server):
    blocks = re.findall(r"^```json\n(.*?)^```", section("POST /v1/score"), re.S | re.M)
    request, response = json.loads(blocks[0]), json.loads(blocks[1])
    got = httpx.post(server.url + "/v1/score", json=request, timeout=30)
    assert got.status_code == 200, got.text
    assert [timeless(r) for r in got.json()["results"]] == [timeless(r) for r in response["results"]]


def test_the_execute_sample_gets_the_documented_preview(server):
    text = section("POST /v1/execute")
    request = json.loads(re.search(r"`(\{\"db_id\".*?\})` →", text)[1])
    shown = re.search(r"`\{\"status\": \"ok\", \"columns\": (\[.*?\]), \"rows\": (\[.*?\]), …\], \"row_count\": (\d+), "
                      r"\"truncated\": (\w+)", text)
    got = httpx.post(server.url + "/v1/execute", json=request, timeout=30).json()
    first_rows = json.loads(shown[2] + "]")
    assert got["status"] == "ok" and got["columns"] == json.loads(shown[1])
    assert got["rows"][:len(first_rows)] == first_rows and len(got["rows"]) == request["max_rows"]
    assert got["row_count"] == int(shown[3]) and got["truncated"] == (shown[4] == "true")
