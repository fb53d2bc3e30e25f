import pytest
from fake_openai import FakeOpenAIServer

from data_synthesis.chat_client import ChatClient, EndpointError


def test_chat_client_speaks_the_protocol():
    with FakeOpenAIServer(lambda msgs, i: f"answer {i} to {msgs[-1]['content']}") as server:
        client = ChatClient(server.url, "m", max_retries=0)
        out = client.complete([{"role": "user", "content": "hi"}], n=3, temperature=0.7, seed=1)
    assert out == ["answer 0 to hi", "answer 1 to hi", "answer 2 to hi"]
    assert server.requests[0]["n"] == 3 and server.requests[0]["temperature"] == 0.7


def test_chat_client_retries_server_errors():
    with FakeOpenAIServer(lambda msgs, i: "ok", fail_first=2) as server:
        client = ChatClient(server.url, "m", max_retries=3, backoff_s=0.01)
        assert client.complete([{"role": "user", "content": "x"}]) == ["ok"]
    assert len(server.requests) == 3


def test_unreachable_endpoint_is_a_clear_error():
    client = ChatClient("http://127.0.0.1:9/v1", "m", max_retries=1, backoff_s=0.01, timeout_s=2)
    with pytest.raises(EndpointError, match="127.0.0.1:9/v1/chat/completions failed after 2 attempt"):
        client.complete([{"role": "user", "content": "x"}])
