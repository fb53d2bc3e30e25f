"""A reward server SIGKILLed mid-run: verl's reward function falls back to in-process scoring on the same
databases (or, with the fallback off, stops with a clear error instead of returning failures as rewards).
The local trainer's side: `test_local_backend.py::test_a_stage_survives_its_reward_server_being_killed`."""

from __future__ import annotations

import psutil
import pytest

from rewards.client import RewardServerUnavailable
from rewards.launch import spawn
from rewards.service import ServerConfig
from rewards.verl_reward import compute_score_batch

pytestmark = pytest.mark.timeout(180)

GOLD = ["SELECT COUNT(*) FROM customers", "SELECT COUNT(*) FROM customers"]
ANSWERS = ["```sql\nSELECT COUNT(*) FROM customers\n```", "```sql\nSELECT 1\n```"]
EXTRA = [{"db_id": "retail"}, {"db_id": "retail"}]


def kill_server(server) -> None:
    """SIGKILL the server and its worker processes, as a node failure would."""
    workers = psutil.Process(server.proc.pid).children(recursive=True)
    server.proc.kill()
    server.proc.wait(timeout=30)
    for w in workers:
        if w.is_running():
            w.kill()


def test_verl_reward_function_falls_back_when_its_server_is_killed(demo_db_root, capsys):
    server = spawn(ServerConfig(demo_db_root, workers=1, timeout_s=5.0))
    kwargs = {"reward_url": server.url, "reward_timeout_s": 5.0, "db_root": str(demo_db_root)}
    try:
        served = compute_score_batch(["d", "d"], ANSWERS, GOLD, EXTRA, **kwargs)
        assert served == [{"score": 1.0, "acc": 1.0}, {"score": 0.0, "acc": 0.0}]
        kill_server(server)
        assert compute_score_batch(["d", "d"], ANSWERS, GOLD, EXTRA, **kwargs) == served  # scored in-process
        assert "reward server unavailable" in capsys.readouterr().err
        with pytest.raises(RewardServerUnavailable, match="fallback is off"):
            compute_score_batch(["d", "d"], ANSWERS, GOLD, EXTRA, **kwargs, reward_fallback=False)
    finally:
        server.stop()


def test_fallback_finds_db_root_in_extra_info_as_verl_lays_it_out(demo_db_root, capsys):
    """verl's rows carry `db_root` in `extra_info` (data_synthesis.export), not in the reward kwargs: the
    in-process fallback must read it there as the serverless path does."""
    server = spawn(ServerConfig(demo_db_root, workers=1, timeout_s=5.0))
    extra = [{"db_id": "retail", "db_root": str(demo_db_root)}] * 2
    kwargs = {"reward_url": server.url, "reward_timeout_s": 5.0}
    try:
        served = compute_score_batch(["d", "d"], ANSWERS, GOLD, extra, **kwargs)
        kill_server(server)
        assert compute_score_batch(["d", "d"], ANSWERS, GOLD, extra, **kwargs) == served
        assert "reward server unavailable" in capsys.readouterr().err
    finally:
        server.stop()
