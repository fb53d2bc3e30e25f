"""Is the server at a URL a SIRIUS reward server, and for which databases? (`/health`'s `service` and `db_root`.)

A port can be held by anything: vLLM's OpenAI server also answers `GET /health` with a 200 on port 8000,
and every `/v1/score` would then be a 404 in the middle of training. So a 200 is not enough: the payload
must name our service and the `db_root` the caller means (compared as real paths).

    python -m rewards.identity http://127.0.0.1:8000 --db-root /shared/sirius/databases
    # exit 0: ours, serving that db_root; 1: nothing listening; 3: something else, or other databases
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass

from rewards.protocol import SERVICE_NAME

OURS, ABSENT, FOREIGN, OTHER_ROOT, UNHEALTHY = "ours", "absent", "foreign", "other_db_root", "unhealthy"
EXIT_CODES = {OURS: 0, ABSENT: 1, FOREIGN: 3, OTHER_ROOT: 3, UNHEALTHY: 3}


@dataclass(frozen=True)
class ServerCheck:
    kind: str  # one of OURS, ABSENT, FOREIGN, OTHER_ROOT, UNHEALTHY
    message: str

    @property
    def ok(self) -> bool:
        return self.kind == OURS


def classify_health(url: str, status: int, body: bytes, db_root: str | None) -> ServerCheck:
    """What an HTTP answer to `GET url/health` says about the server (pure).

    >>> classify_health("http://h:8000", 200, b"", "/d").kind  # vLLM: 200, empty body
    'foreign'
    >>> classify_health("http://h:8000", 200, b'{"service": "sirius-reward-server", "db_root": "/d", "status": "ok"}',
    ...                 "/d").ok
    True
    """
    try:
        payload = json.loads(body)
    except ValueError:
        payload = None
    if not isinstance(payload, dict) or payload.get("service") != SERVICE_NAME:
        return ServerCheck(FOREIGN, f"{url} answers /health (HTTP {status}) but is not a SIRIUS reward server "
                                    f"({_snippet(body)}): the port is held by another program; stop it or "
                                    "move the reward server and reward.url to a free port")
    served = payload.get("db_root", "")
    if db_root is not None and os.path.realpath(served) != os.path.realpath(db_root):
        return ServerCheck(OTHER_ROOT, f"{url} is a SIRIUS reward server for {served}, not {db_root}: restart it "
                                       f"with --db-root {db_root} (or point data.db_root at {served})")
    if status != 200 or payload.get("status") != "ok":
        return ServerCheck(UNHEALTHY, f"{url} is a SIRIUS reward server that is {payload.get('status')!r} "
                                      f"(HTTP {status}): wait for it to restart, or restart it")
    variants = f", {payload['variants']} variant databases" if payload.get("variants") else ""
    return ServerCheck(OURS, f"{url}: SIRIUS reward server for {served}, {payload.get('workers')} workers{variants}")


def check_reward_server(url: str, db_root: str | None, timeout_s: float = 5.0) -> ServerCheck:
    """GET `url`/health and classify the answer; nothing listening is ABSENT."""
    import httpx

    url = url.rstrip("/")
    try:
        response = httpx.get(url + "/health", timeout=timeout_s)
    except httpx.ConnectError:
        return ServerCheck(ABSENT, f"nothing listens at {url}: start the reward server there "
                                   "(scripts/reward_server_per_node.sh)")
    except httpx.HTTPError as e:  # a listener that does not speak HTTP, or never answers
        return ServerCheck(FOREIGN, f"{url} does not answer HTTP /health ({type(e).__name__}): the port is held by "
                                    "another program; stop it or move the reward server to a free port")
    return classify_health(url, response.status_code, response.content, db_root)


def _snippet(body: bytes) -> str:
    text = body[:80].decode("utf-8", "replace").strip()
    return f"body {text!r}" if text else "empty body"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rewards.identity", description=__doc__.split("\n")[0])
    parser.add_argument("url")
    parser.add_argument("--db-root", default=None, help="the databases the server must serve")
    parser.add_argument("--timeout", type=float, default=5.0)
    args = parser.parse_args(argv)
    check = check_reward_server(args.url, args.db_root, args.timeout)
    print(check.message, file=sys.stdout if check.ok else sys.stderr)
    return EXIT_CODES[check.kind]


if __name__ == "__main__":
    sys.exit(main())
