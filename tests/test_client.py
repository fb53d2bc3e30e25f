"""RewardClient against real reward servers on 127.0.0.1: batching, balancing, failover, retries, timeouts."""

from __future__ import annotations

import socket
import threading
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from server_harness import running_server

from rewards.client import Endpoints, RewardClient, RewardServerError, RewardServerUnavailable, backoff_s, parse_urls
from rewards.executor import Executor
from rewards.scoring import ScoreItem
from rewards.service import ServerConfig

pytestmark = pytest.mark.timeout(120)

ENDLESS = "WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r) SELECT max(x) FROM r"


@pytest.fixture(scope="module")
def server(demo_db_root):
    with running_server(ServerConfig(demo_db_root, workers=2, timeout_s=1.0)) as running:
        yield running


def score_requests(url: str, code: str = "200") -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples
               if s.name == "sirius_reward_requests_total" and s.labels == {"endpoint": "/v1/score", "code": code})


def dead_url() -> str:
    """A loopback port nobody listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def items(n: int) -> list[ScoreItem]:
    return [ScoreItem("retail", f"SELECT {i}", f"SELECT {i + i % 3 // 2}", id=("key", i)) for i in range(n)]


# ------------------------------------------------------------------------------------ pure parts
def test_backoff_grows_exponentially_within_jitter_and_cap():
    assert [backoff_s(a, 0.5, 4.0, rand=lambda: 1.0) for a in range(5)] == [0.5, 1.0, 2.0, 4.0, 4.0]
    assert [backoff_s(a, 0.5, 4.0, rand=lambda: 0.0) for a in range(5)] == [0.25, 0.5, 1.0, 2.0, 2.0]


def test_endpoints_round_robin_skip_resting_and_wait_for_the_soonest():
    e = Endpoints(["a", "b", "c"])
    assert [e.pick(0.0)[0] for _ in range(6)] == ["a", "b", "c", "a", "b", "c"]
    e.rest("b", 10.0, now=0.0)
    assert [e.pick(1.0)[0] for _ in range(4)] == ["a", "c", "a", "c"]
    assert [e.pick(10.0)[0] for _ in range(3)] == ["a", "b", "c"]  # b's rest is over
    e.rest("a", 3.0, now=10.0), e.rest("b", 1.0, now=10.0), e.rest("c", 2.0, now=10.0)
    assert e.pick(10.5) == ("b", 0.5)


def test_urls_are_validated():
    assert parse_urls(["http://a:1/", "https://b"]) == ["http://a:1", "https://b"]
    with pytest.raises(ValueError, match="http://host:port"):
        parse_urls("a:8000")
    with pytest.raises(ValueError):
        RewardClient("http://a:1", batch_size=0)


# ------------------------------------------------------------------------------------ against real servers
def test_big_batches_are_split_sent_concurrently_and_reassembled_in_order(server, demo_db_root):
    before = score_requests(server.url)
    work = items(95)
    with RewardClient(server.url, batch_size=10, concurrency=3) as client, Executor(demo_db_root, workers=0) as local:
        got = client.score(work)
        assert got == local.score(work)
    assert [r.id for r in got] == [("key", i) for i in range(95)]  # any Python id survives the trip
    assert [r.match for r in got[:3]] == [True, True, False]
    assert score_requests(server.url) - before == 10
    with RewardClient(server.url) as client:
        assert client.score([]) == []


def test_requests_are_balanced_across_servers(demo_db_root):
    config = ServerConfig(demo_db_root, workers=1)
    with running_server(config) as a, running_server(config) as b:
        with RewardClient([a.url, b.url], batch_size=8, concurrency=2) as client:
            assert all(r.match == (i % 3 != 2) for i, r in enumerate(client.score(items(64))))
        assert score_requests(a.url) == score_requests(b.url) == 4


def test_failover_skips_a_dead_server(server):
    down = dead_url()
    with RewardClient([down, server.url], batch_size=5, concurrency=1, backoff_s=5.0) as client:
        t0 = time.monotonic()
        got = client.score(items(30))
        took = time.monotonic() - t0
        health = client.health()
    assert [r.id for r in got] == [("key", i) for i in range(30)]
    assert took < 3.0, "failover waited for the dead server's backoff instead of moving on"
    assert isinstance(health[down], str) and "ConnectError" in health[down]
    assert health[server.url].status == "ok"


def test_no_server_up_raises_after_bounded_tries():
    urls = [dead_url(), dead_url()]
    with RewardClient(urls, max_retries=3, backoff_s=0.05, max_backoff_s=0.2) as client:
        t0 = time.monotonic()
        with pytest.raises(RewardServerUnavailable, match="after 4 tries") as error:
            client.score(items(3))
        assert time.monotonic() - t0 < 5
    assert all(url in str(error.value) for url in urls)


def test_retry_after_of_a_full_server_is_honoured(demo_db_root):
    config = ServerConfig(demo_db_root, workers=1, timeout_s=1.0, max_queue_items=1, max_batch_items=1, chunk_size=1)
    with running_server(config) as running, RewardClient(running.url, max_retries=5, backoff_s=0.05) as client:
        blocker = threading.Thread(target=lambda: client.score([ScoreItem("retail", "SELECT 1", ENDLESS)]))
        blocker.start()
        deadline = time.monotonic() + 10
        while running.service.stats()["admitted_items"] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        t0 = time.monotonic()
        (result,) = client.score([ScoreItem("retail", "SELECT 7", "SELECT 7", id="late")])
        waited = time.monotonic() - t0
        blocker.join(timeout=30)
        assert result.match and result.id == "late"
        assert score_requests(running.url, "429") >= 1  # refused, then it waited out Retry-After (1 s) and got in
        assert waited >= 0.9


def test_refusals_a_retry_cannot_fix_raise_at_once(server, demo_db_root):
    with RewardClient(server.url, max_retries=5) as client:
        before = score_requests(server.url, "404")
        with pytest.raises(RewardServerError, match="unknown_db") as error:
            client.score([ScoreItem("atlantis", "SELECT 1", "SELECT 1")])
        assert error.value.status_code == 404 and score_requests(server.url, "404") - before == 1
    with running_server(ServerConfig(demo_db_root, workers=1, token="t0k")) as secured:
        with RewardClient(secured.url) as anonymous, pytest.raises(RewardServerError, match="401"):
            anonymous.score(items(1))
        with RewardClient(secured.url, token="t0k") as client:
            assert client.score(items(1))[0].match
            assert client.execute("retail", "SELECT 5").rows == [[5]]


def test_each_request_has_a_timeout(server):
    with RewardClient(server.url, timeout_s=0.3, max_retries=1, backoff_s=0.05) as client:
        t0 = time.monotonic()
        with pytest.raises(RewardServerUnavailable, match="ReadTimeout"):
            client.score([ScoreItem("retail", "SELECT 1", ENDLESS)])
        assert time.monotonic() - t0 < 3.0
