"""`VerlBackend` bookkeeping around a stage: metrics across relaunches, guards before launching, resumption."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import import_verl

from sirius_train.config import ConfigError, load_config
from sirius_train.verl_backend import VerlBackend
from sirius_train.verl_backend.backend import _check_rows, _rotate

import_verl("verl")
NANO = Path(__file__).resolve().parents[1] / "configs" / "nano.yaml"


@pytest.fixture
def backend(tmp_path):
    backend = VerlBackend(load_config(NANO, ["backend=verl", f"output_dir={tmp_path}", "logging.plots=false"]))
    yield backend
    backend.close()


def _verl_rows(path: Path, steps: dict[int, float]) -> None:
    """What verl's file logger writes: {"step": n, "data": {...}} per line."""
    path.write_text("".join(json.dumps({"step": s, "data": {"actor/entropy": h}}) + "\n" for s, h in steps.items()))


def test_metrics_of_every_launch_reach_the_run_log_later_launch_wins(backend, tmp_path):
    metrics = tmp_path / "stage1" / "verl_metrics.jsonl"
    metrics.parent.mkdir()
    _verl_rows(metrics, {1: 0.9, 2: 0.8})  # first launch, interrupted after step 2
    _rotate(metrics)  # the relaunch: verl's logger would truncate the file
    assert not metrics.exists() and (metrics.parent / "verl_metrics.jsonl.000").is_file()
    _verl_rows(metrics, {2: 0.7, 3: 0.6})  # resumed from the step-1 checkpoint
    backend._import_metrics(metrics, "stage1")
    rows = [json.loads(line) for line in (backend.cfg.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [(r["stage"], r["step"], r["backend"], r["actor/entropy"]) for r in rows] == [
        ("stage1", 1, "verl", 0.9), ("stage1", 2, "verl", 0.7), ("stage1", 3, "verl", 0.6)]


def test_a_curriculum_smaller_than_one_batch_is_refused(tmp_path):
    cfg = load_config(NANO, ["backend=verl"])
    parquet = tmp_path / "curriculum.parquet"
    pq.write_table(pa.table({"x": list(range(5))}), parquet)
    with pytest.raises(ConfigError, match=r"has 5 prompts but stage 'stage1' has prompts_per_step=8"):
        _check_rows(parquet, cfg.stages[0])


def test_a_merged_stage_is_not_trained_again(backend, tmp_path):
    model = tmp_path / "stage1" / "model"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    stage = backend.cfg.stages[0]
    assert backend.train_stage(1, stage, tmp_path / "missing.parquet", tmp_path / "init", None, model.parent) == model


def test_a_stage_merged_before_the_run_died_still_brings_its_step_metrics_in_once(backend, tmp_path):
    """Merged, then killed before its done marker: the rerun takes the merged model and imports verl's step metrics
    that the dead run never did (the plot would lack the stage); a second rerun imports nothing twice."""
    stage_dir = tmp_path / "stage1"
    (stage_dir / "model").mkdir(parents=True)
    (stage_dir / "model" / "config.json").write_text("{}")
    _verl_rows(stage_dir / "verl_metrics.jsonl", {1: 0.9, 2: 0.8})
    for _ in range(2):
        backend.train_stage(1, backend.cfg.stages[0], tmp_path / "missing.parquet", tmp_path / "init", None, stage_dir)
    rows = [json.loads(line) for line in (backend.cfg.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [(r["stage"], r["step"], r["actor/entropy"]) for r in rows] == [("stage1", 1, 0.9), ("stage1", 2, 0.8)]


def test_the_models_kept_between_phases_leave_the_gpu_before_verl_starts(backend, tmp_path):
    from sirius_train.local.model import NanoModelConfig, build_nano_model, train_tokenizer

    tokenizer = train_tokenizer(["SELECT name FROM singer"] * 20, 300)
    model = build_nano_model(NanoModelConfig(vocab_size=300, hidden_size=32, intermediate_size=64,
                                             num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2),
                             tokenizer)
    model.save_pretrained(tmp_path / "m")
    tokenizer.save_pretrained(tmp_path / "m")
    kept, _ = backend.local.load(tmp_path / "m")
    backend._free_gpu()
    assert backend.local._loaded is None and next(kept.parameters()).device.type == "cpu"


def test_verl_is_not_launched_beside_a_server_that_is_not_ours(tmp_path, demo_db_root):
    from server_harness import running_server, vllm_like_server

    from rewards.service import ServerConfig
    from sirius_train.verl_backend.reward_check import reward_server_problems

    with vllm_like_server() as port:
        cfg = load_config(NANO, ["backend=verl", f"output_dir={tmp_path}", f"data.db_root={demo_db_root}",
                                 f"reward.url=http://127.0.0.1:{port}"])
        backend = VerlBackend(cfg)
        try:
            with pytest.raises(ConfigError, match=r"before launching verl: .*not a SIRIUS reward server"):
                backend._check_reward_servers(None, str(Path.cwd()))
        finally:
            backend.close()
    with running_server(ServerConfig(demo_db_root, workers=1)) as ours:
        assert reward_server_problems([ours.url], str(demo_db_root), None, "") == []
        assert "not " + str(tmp_path) in reward_server_problems([ours.url], str(tmp_path), None, "")[0]


def test_every_ray_node_checks_its_own_reward_server(demo_db_root):
    import ray
    from server_harness import vllm_like_server

    from sirius_train.verl_backend.reward_check import reward_server_problems

    ray.init(num_cpus=1, include_dashboard=False, logging_level="ERROR",
             runtime_env={"env_vars": {"PYTHONPATH": str(Path(__file__).resolve().parents[1])}})
    try:
        with vllm_like_server() as port:
            (problem,) = reward_server_problems([f"http://127.0.0.1:{port}"], str(demo_db_root), "auto", "")
    finally:
        ray.shutdown()
    assert problem.startswith("node ") and "not a SIRIUS reward server" in problem  # found by a task on that node


def test_pass_rates_and_evaluation_run_on_vllm_across_the_jobs_gpus():
    from data_synthesis.vllm_sampler import VLLMSampler
    from sirius_train.verl_backend.backend import engine_factory
    from sirius_train.verl_backend.plans import estimation_engine

    big = estimation_engine(load_config(NANO.parent / "sirius32b.yaml"))
    assert (big.engine, big.tensor_parallel, big.actors) == ("vLLM", 4, 8)  # 4 nodes x 8 GPUs / TP 4
    make, actors, gpus = engine_factory(load_config(NANO.parent / "sirius32b.yaml"), Path("/m/32b"), 8192)
    assert make.func is VLLMSampler and (actors, gpus) == (8, 4)  # each Ray actor reserves its 4 GPUs
    assert {k: make.keywords[k] for k in ("tensor_parallel_size", "gpu_memory_utilization", "max_model_len",
                                          "distributed_executor_backend")} == {
        "tensor_parallel_size": 4, "gpu_memory_utilization": 0.85, "max_model_len": 8192,
        "distributed_executor_backend": "mp"}
    seven = estimation_engine(load_config(NANO.parent / "qwen7b_8gpu.yaml"))
    assert (seven.tensor_parallel, seven.actors) == (1, 8)
    make, _, _ = engine_factory(load_config(NANO.parent / "qwen7b_8gpu.yaml"), Path("/m/7b"), 6144)
    assert "distributed_executor_backend" not in make.keywords  # one GPU per engine


def test_a_resumed_stage_whose_pass_rates_are_all_cached_starts_no_engine(backend, demo_db_root, tmp_path):
    """A requeued verl stage re-reads its pool's rates from the cache: starting vLLM engines for that (minutes of
    the whole allocation, every requeue) is skipped. This environment has no vLLM, so an engine start would fail;
    the rates equal the cached ones, and gap filling's sampler would start the engines on its first request."""
    from data_synthesis.difficulty import estimate_pass_rates
    from data_synthesis.prompts import PromptFormat
    from data_synthesis.records import Example
    from data_synthesis.samplers import HFSampler
    from sirius_train.local.model import NanoModelConfig, build_nano_model, train_tokenizer
    from sirius_train.schedule import RunData

    tokenizer = train_tokenizer(["SELECT count(*) FROM customers", "How many customers are there?"] * 8, 300)
    model = build_nano_model(NanoModelConfig(vocab_size=300, hidden_size=32, intermediate_size=64,
                                             num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2),
                             tokenizer)
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    examples = [Example(f"q{i}", "retail", f"How many customers are there? ({i})", "SELECT count(*) FROM customers")
                for i in range(3)]
    data = RunData(demo_db_root, [], examples, [], PromptFormat(schema_style="compact", schema_samples=0), "bird")
    stage, cfg = backend.cfg.stages[0], backend.cfg
    cache = tmp_path / "stage1" / "passrates.cache.jsonl"
    cache.parent.mkdir()
    cached = estimate_pass_rates(  # the first launch's estimate, with this stage's options
        examples, HFSampler(str(folder), device="cpu"), demo_db_root, k=stage.estimate_k, cache_path=cache,
        seed=cfg.seed, temperature=stage.temperature, top_p=stage.top_p, max_new_tokens=8, compare="bird",
        policy=str(folder), variants=cfg.reward.variants, prompt_format=data.prompt_format)
    stage = replace(stage, max_new_tokens=8)
    rates, sampler, options = backend.pass_rates(examples, folder, stage, data, cache.parent)
    assert rates == cached and backend._engines is None and sampler.multi_turn is False
    assert options["policy"] == str(folder)
