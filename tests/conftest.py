"""Shared fixtures: the project's generated demo databases and (when present) the real Spider data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

SPIDER = Path(__file__).resolve().parents[2] / "shared" / "data" / "spider"


@pytest.fixture(scope="session")
def demo_db_root(tmp_path_factory) -> Path:
    from data_synthesis.demo_dbs import build_demo_dbs

    root = tmp_path_factory.mktemp("demo_dbs")
    build_demo_dbs(root)
    return root


@pytest.fixture(scope="session")
def spider_root() -> Path:
    if not (SPIDER / "databases").is_dir():
        pytest.skip("Spider data not found at ../shared/data/spider")
    return SPIDER


@pytest.fixture(scope="session")
def spider_pools(spider_root) -> list[dict]:
    with (spider_root / "dev_candidate_pools.jsonl").open() as f:
        return [json.loads(line) for line in f]
