"""The reward server, started for real on 127.0.0.1 and driven over HTTP.

Every test has a timeout; every request loop is bounded; every accepted item must get exactly one answer.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from hostile_sql import HOSTILE
from prometheus_client.parser import text_string_to_metric_families
from server_harness import running_server
from worker_kill import running_worker_pid

from rewards.client import RewardClient
from rewards.executor import Executor
from rewards.outcome import Status
from rewards.scoring import ScoreItem
from rewards.service import ServerConfig

pytestmark = pytest.mark.timeout(120)

ENDLESS = "WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r) SELECT max(x) FROM r"
GOLD = "SELECT city, count(*) FROM customers GROUP BY city"
MAX_BODY = 12 << 20  # lets the hostile 10 MB SQL through, so the sandbox (not the edge) must refuse it


@pytest.fixture(scope="module")
def server(demo_db_root):
    config = ServerConfig(demo_db_root, workers=2, timeout_s=1.0, max_batch_items=512, max_body_bytes=MAX_BODY)
    with running_server(config) as running:
        yield running


def metrics(url: str) -> dict:
    """{(name, labels as a sorted tuple): value} of every sample the server exposes."""
    text = httpx.get(url + "/metrics", timeout=10).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def mixed_items(n: int) -> list[ScoreItem]:
    preds = [GOLD, "SELECT count(*), city FROM customers GROUP BY city", "SELECT city FROM customers",
             "SELECT nope FROM customers", None, "DELETE FROM customers", "SELECT title FROM courses"]
    dbs = ["retail"] * 6 + ["university"]
    golds = [GOLD] * 6 + ["SELECT title FROM courses"]
    return [ScoreItem(dbs[i % 7], golds[i % 7], preds[i % 7], ("bird", "spider")[i % 2], id=f"item-{i}")
            for i in range(n)]


def post(url: str, path: str, body, **kwargs) -> httpx.Response:
    content = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return httpx.post(url + path, content=content, headers={"content-type": "application/json"}, timeout=30,
                      **kwargs)


# ------------------------------------------------------------------------------------ the happy path
def test_score_over_http_equals_in_process_scoring(server, demo_db_root):
    items = mixed_items(70)
    with Executor(demo_db_root, workers=0) as local, RewardClient(server.url, batch_size=32) as client:
        expected = local.score(items)
        got = client.score(items)
    assert got == expected
    assert [r.id for r in got] == [f"item-{i}" for i in range(70)]
    assert [r.reward for r in got[:7]] == [1.0, 1.0, 0.0, 0.0, -1.0, 0.0, 1.0]  # item 1: spider mode, columns swapped


def test_score_wire_format_and_solution_str_extraction(server):
    items = [
        {"id": 7, "db_id": "retail", "gold_sql": GOLD, "solution_str": f"Let me think.\n```sql\n{GOLD}\n```"},
        {"id": "x", "db_id": "retail", "gold_sql": GOLD, "solution_str": "I cannot write SQL today."},
        {"id": None, "db_id": "retail", "gold_sql": GOLD, "pred_sql": None},
        {"db_id": "retail", "gold_sql": GOLD, "pred_sql": "SELECT nope FROM customers", "compare": "spider"},
    ]
    response = post(server.url, "/v1/score", {"items": items})
    assert response.status_code == 200
    results = response.json()["results"]
    assert [r.get("id") for r in results] == [7, "x", None, None]
    assert [(r["status"], r["match"], r["reward"], r["format_ok"]) for r in results] == [
        ("ok", True, 1.0, True), ("rejected", False, -1.0, False), ("rejected", False, -1.0, False),
        ("error", False, 0.0, True)]
    assert results[1]["error"] == "no SQL found in the answer"
    assert "no such column: nope" in results[3]["error"]
    assert {"status", "match", "reward", "gold_status", "elapsed_s"} <= results[0].keys()


def test_odd_text_comes_back_as_valid_json(server):
    items = [{"id": "\ud800-lone-surrogate", "db_id": "retail", "gold_sql": "SELECT 1", "pred_sql": "SELECT '\ud800'"},
             {"id": "ünï", "db_id": "retail", "gold_sql": "SELECT 'ünï'", "pred_sql": "SELECT 'ünï'"},
             {"id": 3, "db_id": "retail", "gold_sql": "SELECT 1", "pred_sql": "SELECT CAST(x'fffe41' AS TEXT)"}]
    response = post(server.url, "/v1/score", {"items": items})
    assert response.status_code == 200
    results = response.json()["results"]
    assert results[0]["id"] == "\ud800-lone-surrogate" and results[0]["status"] == "rejected"
    assert (results[1]["id"], results[1]["match"]) == ("ünï", True)
    assert results[2]["status"] == "ok"  # bad UTF-8 in the data decodes with replacement characters


def test_execute_gives_typed_outcome_and_capped_preview(server):
    ok = post(server.url, "/v1/execute", {"db_id": "retail", "sql": "SELECT id, name FROM customers ORDER BY id",
                                          "max_rows": 3}).json()
    assert ok["status"] == "ok" and ok["columns"] == ["id", "name"]
    assert len(ok["rows"]) == 3 and [r[0] for r in ok["rows"]] == [1, 2, 3]
    assert ok["row_count"] == 400 and ok["truncated"] is True
    empty = post(server.url, "/v1/execute", {"db_id": "retail", "sql": "SELECT * FROM customers WHERE 0"}).json()
    assert (empty["status"], empty["rows"], empty["truncated"]) == ("empty", [], False)
    error = post(server.url, "/v1/execute", {"db_id": "retail", "sql": "SELECT nope FROM customers"}).json()
    assert error["status"] == "error" and "no such column: nope" in error["error"]
    timeout = post(server.url, "/v1/execute", {"db_id": "retail", "sql": ENDLESS}).json()
    assert timeout["status"] == "timeout"
    too_many = post(server.url, "/v1/execute", {"db_id": "retail", "sql": "SELECT 1", "max_rows": 100_000})
    assert too_many.status_code == 422 and "max_rows" in too_many.json()["error"]["message"]
    with RewardClient(server.url) as client:
        assert client.execute("retail", "SELECT count(*) FROM orders").rows == [[1500]]


def test_health_metrics_and_openapi(server):
    health = httpx.get(server.url + "/health", timeout=10)
    assert health.status_code == 200
    assert health.json() == {"service": "sirius-reward-server", "db_root": str(server.service.config.db_root.resolve()),
                             "status": "ok", "workers": 2, "queue_depth": 0, "max_queue_items": 16_384,
                             "worker_restarts": server.service.executor.stats()["restarts"], "variants": 0}
    post(server.url, "/v1/score", {"items": [{"db_id": "retail", "gold_sql": "SELECT 1", "pred_sql": "SELECT 1"}]})
    m = metrics(server.url)
    assert m[("sirius_reward_requests_total", (("code", "200"), ("endpoint", "/v1/score")))] >= 1
    assert m[("sirius_reward_request_seconds_count", (("endpoint", "/v1/score"),))] >= 1
    assert ("sirius_reward_request_seconds_bucket", (("endpoint", "/v1/score"), ("le", "1.0"))) in m
    assert m[("sirius_reward_queue_depth", ())] == 0
    assert ("sirius_reward_worker_restarts_total", ()) in m
    assert m[("sirius_reward_outcomes_total", (("status", "ok"),))] >= 1
    assert m[("sirius_reward_items_total", (("endpoint", "score"),))] >= 1
    schema = httpx.get(server.url + "/openapi.json", timeout=10).json()
    assert {"/v1/score", "/v1/execute", "/health", "/metrics"} <= schema["paths"].keys()
    item = schema["components"]["schemas"]["ScoreRequestItem"]
    assert {"id", "db_id", "gold_sql", "pred_sql", "solution_str", "compare"} == item["properties"].keys()
    assert "429" in schema["paths"]["/v1/score"]["post"]["responses"]


# ------------------------------------------------------------------------------------ load and faults
def test_64_concurrent_clients_each_get_exactly_their_answers(server):
    before = metrics(server.url)[("sirius_reward_items_total", (("endpoint", "score"),))]
    n_clients, batches, per_batch = 64, 3, 40
    answers: dict[int, list] = {}

    def client_job(k: int):
        got = []
        with httpx.Client(base_url=server.url, timeout=60) as http:
            for b in range(batches):
                items = [{"id": f"{k}:{b}:{i}", "db_id": "retail", "pred_sql": f"SELECT {k * 10_000 + b * 100 + i}",
                          "gold_sql": f"SELECT {k * 10_000 + b * 100 + i + i % 2}"} for i in range(per_batch)]
                response = http.post("/v1/score", json={"items": items})
                assert response.status_code == 200, response.text
                got.extend(response.json()["results"])
            probe = http.post("/v1/execute", json={"db_id": "retail", "sql": f"SELECT {k}"}).json()
            got.append(probe["rows"])
        answers[k] = got

    with ThreadPoolExecutor(n_clients) as pool:
        list(pool.map(client_job, range(n_clients), timeout=90))
    assert sorted(answers) == list(range(n_clients))
    for k, got in answers.items():
        results, probe = got[:-1], got[-1]
        assert [r["id"] for r in results] == [f"{k}:{b}:{i}" for b in range(batches) for i in range(per_batch)]
        assert [r["match"] for r in results] == [i % 2 == 0 for _ in range(batches) for i in range(per_batch)]
        assert probe == [[k]]
    after = metrics(server.url)[("sirius_reward_items_total", (("endpoint", "score"),))]
    assert after - before == n_clients * batches * per_batch  # nothing lost, nothing answered twice
    assert server.service.stats()["admitted_items"] == 0 and server.service.executor.queue_depth() == 0


def test_worker_killed_with_sigkill_mid_query_every_item_answered_once(demo_db_root):
    config = ServerConfig(demo_db_root, workers=2, timeout_s=5.0, chunk_size=4)
    with running_server(config) as running:
        items = [{"id": 0, "db_id": "retail", "pred_sql": ENDLESS, "gold_sql": "SELECT 1"}]
        items += [{"id": i, "db_id": "retail", "pred_sql": f"SELECT {i}", "gold_sql": f"SELECT {i}"}
                  for i in range(1, 61)]
        box = {}
        thread = threading.Thread(target=lambda: box.update(r=post(running.url, "/v1/score", {"items": items})))
        thread.start()
        os.kill(running_worker_pid(running.service.executor, min_elapsed_s=0.3), signal.SIGKILL)
        thread.join(timeout=30)
        assert not thread.is_alive(), "the request hung after its worker was killed"
        results = box["r"].json()["results"]
        assert [r["id"] for r in results] == list(range(61))
        assert results[0]["status"] == "timeout", results[0]  # run again on a fresh worker: its own deadline
        assert all(r["status"] == "ok" and r["match"] for r in results[1:])
        assert metrics(running.url)[("sirius_reward_worker_restarts_total", ())] == 1
        again = post(running.url, "/v1/execute", {"db_id": "retail", "sql": "SELECT 41 + 1"}).json()
        assert again["rows"] == [[42]]  # the replacement worker serves


def test_hostile_sql_comes_back_typed_and_harms_nothing(server, demo_db_root):
    items = [{"id": name, "db_id": "retail", "pred_sql": sql, "gold_sql": "SELECT 1"} for name, sql, _ in HOSTILE]
    t0 = time.monotonic()
    with ThreadPoolExecutor(4) as pool:
        scoring = pool.submit(post, server.url, "/v1/score", {"items": items})
        executed = list(pool.map(lambda sql: post(server.url, "/v1/execute", {"db_id": "retail", "sql": sql}),
                                 [sql for _, sql, _ in HOSTILE]))
        scored = scoring.result()
    took = time.monotonic() - t0
    assert scored.status_code == 200
    for (name, _, allowed), result, response in zip(HOSTILE, scored.json()["results"], executed):
        assert result["id"] == name and Status(result["status"]) in allowed, (name, result)
        assert result["reward"] == 0.0
        assert response.status_code == 200 and Status(response.json()["status"]) in allowed, (name, response.text)
    n_slow = sum(Status.TIMEOUT in allowed for _, _, allowed in HOSTILE)
    assert took < 2 * n_slow * (1.0 + 0.5) + 10
    check = post(server.url, "/v1/execute", {"db_id": "retail", "sql": "SELECT count(*) FROM customers"}).json()
    assert check["rows"] == [[400]]
    assert not Path("/tmp/sirius_evil.db").exists() and not Path("/tmp/sirius_copy.db").exists()
    assert sorted(p.name for p in (demo_db_root / "retail").iterdir()) == ["retail.sqlite"]


# ------------------------------------------------------------------------------------ refusals
def test_oversize_requests_get_413_with_a_clear_message(server):
    big = {"items": [{"db_id": "retail", "gold_sql": "SELECT 1", "pred_sql": "SELECT 1" + " " * (MAX_BODY + 10)}]}
    declared = post(server.url, "/v1/score", big)
    assert declared.status_code == 413
    assert declared.json()["error"]["type"] == "too_large" and str(MAX_BODY) in declared.json()["error"]["message"]

    def chunks():  # no Content-Length: the limit is enforced while reading
        yield b'{"items": [{"db_id": "retail", "gold_sql": "SELECT 1", "pred_sql": "SELECT 1'
        for _ in range(MAX_BODY // (1 << 20) + 1):
            yield b" " * (1 << 20)
        yield b'"}]}'

    streamed = httpx.post(server.url + "/v1/score", content=chunks(), headers={"content-type": "application/json"},
                          timeout=30)
    assert streamed.status_code == 413 and streamed.json()["error"]["type"] == "too_large"
    many = post(server.url, "/v1/score", {"items": [{"db_id": "retail", "gold_sql": "SELECT 1",
                                                     "pred_sql": "SELECT 1"}] * 513})
    assert many.status_code == 413
    assert "513 items in one request, over the limit of 512" in many.json()["error"]["message"]
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200


@pytest.mark.parametrize("body, status, words", [
    ('{"items": [', 400, "not valid JSON"),
    (b"\xff\xfe garbage", 400, "not valid JSON"),
    ('["items"]', 422, "valid dictionary"),
    ('{"items": [{"db_id": "retail", "pred_sql": "SELECT 1"}]}', 422, "gold_sql"),
    ('{"items": [{"db_id": "retail", "gold_sql": "SELECT 1"}]}', 422, "exactly one of 'pred_sql'"),
    ('{"items": [{"db_id": "retail", "gold_sql": "S", "pred_sql": "S", "solution_str": "S"}]}', 422, "exactly one"),
    ('{"items": [{"db_id": "retail", "gold_sql": "S", "pred_sql": "S", "compare": "exact"}]}', 422, "compare"),
    ('{"items": [{"db_id": "retail", "gold_sql": "S", "pred_sql": "S", "gold": "S"}]}', 422, "gold"),
])
def test_malformed_requests_get_400_or_422_naming_the_problem(server, body, status, words):
    response = post(server.url, "/v1/score", body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["type"] == ("invalid_json" if status == 400 else "invalid_request")
    assert words in error["message"]


@pytest.mark.parametrize("db_id", ["no_such_db", "../../etc", "../retail", "/etc/passwd", "..", "retail/../retail",
                                   "retail\x00", ""])
def test_unknown_or_escaping_db_ids_are_refused_before_anything_runs(server, db_id):
    before = server.service.executor.stats()["outcomes"]
    items = [{"db_id": "retail", "gold_sql": "SELECT 1", "pred_sql": "SELECT 1"},
             {"db_id": db_id, "gold_sql": "SELECT 1", "pred_sql": "SELECT 1"}]
    scored = post(server.url, "/v1/score", {"items": items})
    executed = post(server.url, "/v1/execute", {"db_id": db_id, "sql": "SELECT 1"})
    for response in (scored, executed):
        assert response.status_code == 404, response.text
        error = response.json()["error"]
        assert error["type"] == "unknown_db" and repr(db_id) in error["message"]
    assert "(item 1)" in scored.json()["error"]["message"]
    assert server.service.executor.stats()["outcomes"] == before  # nothing was run


def test_full_queue_answers_429_with_retry_after_and_recovers(demo_db_root):
    config = ServerConfig(demo_db_root, workers=2, timeout_s=1.0, max_queue_items=2, max_batch_items=2, chunk_size=1)
    with running_server(config) as running:
        slow = {"items": [{"id": i, "db_id": "retail", "pred_sql": ENDLESS, "gold_sql": "SELECT 1"} for i in range(2)]}
        box = {}
        thread = threading.Thread(target=lambda: box.update(r=post(running.url, "/v1/score", slow)))
        thread.start()
        deadline = time.monotonic() + 10
        while running.service.stats()["admitted_items"] < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        refused = post(running.url, "/v1/score", {"items": [{"db_id": "retail", "gold_sql": "SELECT 1",
                                                             "pred_sql": "SELECT 1"}]})
        thread.join(timeout=30)
        assert refused.status_code == 429
        assert refused.json()["error"]["type"] == "overloaded" and "--max-queue 2" in refused.json()["error"]["message"]
        assert 1 <= int(refused.headers["retry-after"]) <= 30
        assert [r["status"] for r in box["r"].json()["results"]] == ["timeout", "timeout"]
        retried = post(running.url, "/v1/score", {"items": [{"db_id": "retail", "gold_sql": "SELECT 1",
                                                             "pred_sql": "SELECT 1"}]})
        assert retried.status_code == 200 and retried.json()["results"][0]["match"] is True
        assert metrics(running.url)[("sirius_reward_requests_total", (("code", "429"), ("endpoint", "/v1/score")))] == 1


def test_bearer_token_is_required_on_v1_only(demo_db_root):
    config = ServerConfig(demo_db_root, workers=1, token="s3cret")
    body = {"items": [{"db_id": "retail", "gold_sql": "SELECT 1", "pred_sql": "SELECT 1"}]}
    with running_server(config) as running:
        missing = post(running.url, "/v1/score", body)
        wrong = httpx.post(running.url + "/v1/score", json=body, headers={"authorization": "Bearer nope"}, timeout=10)
        right = httpx.post(running.url + "/v1/score", json=body, headers={"authorization": "Bearer s3cret"},
                           timeout=10)
        assert missing.status_code == wrong.status_code == 401
        assert missing.headers["www-authenticate"] == "Bearer"
        assert missing.json()["error"]["type"] == "unauthorized" and "--token" in missing.json()["error"]["message"]
        assert right.status_code == 200 and right.json()["results"][0]["match"] is True
        assert httpx.get(running.url + "/health", timeout=10).status_code == 200
        assert httpx.get(running.url + "/metrics", timeout=10).status_code == 200
        assert "HTTPBearer" in httpx.get(running.url + "/openapi.json", timeout=10).json()["components"][
            "securitySchemes"]


def test_a_client_that_disconnects_cancels_its_pending_work(demo_db_root):
    config = ServerConfig(demo_db_root, workers=1, timeout_s=1.0, chunk_size=1)
    with running_server(config) as running:
        items = [{"id": i, "db_id": "retail", "pred_sql": ENDLESS + f" -- {i}", "gold_sql": "SELECT 1"}
                 for i in range(8)]  # 8 s of work for the one worker if nobody cancelled it
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(running.url + "/v1/score", json={"items": items}, timeout=httpx.Timeout(10, read=0.5))
        deadline = time.monotonic() + 5
        while running.service.executor.queue_depth() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert running.service.executor.queue_depth() == 0, "the abandoned batch kept the worker busy"
        assert running.service.executor.stats()["outcomes"].get("timeout", 0) <= 3  # not the 8 it was sent
        m = metrics(running.url)
        assert m[("sirius_reward_requests_total", (("code", "499"), ("endpoint", "/v1/score")))] == 1


def test_once_shutting_down_new_work_gets_503_and_health_says_so(demo_db_root):
    with running_server(ServerConfig(demo_db_root, workers=1)) as running:
        running.service.close()
        refused = post(running.url, "/v1/score", {"items": [{"db_id": "retail", "gold_sql": "SELECT 1",
                                                             "pred_sql": "SELECT 1"}]})
        assert refused.status_code == 503 and refused.json()["error"]["type"] == "shutting_down"
        health = httpx.get(running.url + "/health", timeout=10)
        assert health.status_code == 503 and health.json()["status"] == "shutting_down"


def documented_score_request() -> str:
    """The request body docs/REWARD_SERVER.md shows for POST /v1/score, as written there."""
    doc = (Path(__file__).resolve().parents[1] / "docs" / "REWARD_SERVER.md").read_text()
    section = doc.split("### `POST /v1/score`", 1)[1]
    return section.split("```json\n", 1)[1].split("\n```", 1)[0]


def test_the_documented_request_works_whatever_its_content_type(demo_db_root):
    """`curl -d @request.json` sends form-urlencoded; a client may send none: the body is JSON regardless. The
    sample names a demo database, as a user has it after `make demo`."""
    with running_server(ServerConfig(demo_db_root, workers=1)) as running:
        for content_type in (None, "application/x-www-form-urlencoded", "text/plain", "application/json; charset=utf-8"):
            headers = {"content-type": content_type} if content_type else {}
            response = httpx.post(running.url + "/v1/score", content=documented_score_request().encode(),
                                  headers=headers, timeout=30)
            assert response.status_code == 200, (content_type, response.text)
            assert [(r["id"], r["status"], r["match"]) for r in response.json()["results"]] == [
                (17, "ok", True), ("b", "error", False)]


@pytest.mark.parametrize("content_type", [None, "application/x-www-form-urlencoded", "application/json"])
@pytest.mark.parametrize("body, words", [("items=1&db_id=retail", "not valid JSON"), ("", "the request body is empty")])
def test_a_body_that_is_not_json_is_400_whatever_its_content_type(server, content_type, body, words):
    headers = {"content-type": content_type} if content_type else {}
    response = httpx.post(server.url + "/v1/score", content=body.encode(), headers=headers, timeout=30)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["type"] == "invalid_json" and words in response.json()["error"]["message"]
