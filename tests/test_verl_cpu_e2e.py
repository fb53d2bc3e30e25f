"""Can verl 0.9.1 run a real DAPO step on CPU? No -- this reproduces exactly where it stops (docs/CLUSTER.md).

The nano model, a curriculum parquet and the overrides `sirius train --backend verl` would launch, on a
one-"GPU" CPU shape (trainer.device=cpu, a local Ray). verl stops before the first rollout:
1. as configured: `ResourcePoolManager.create_resource_pool` builds every pool with use_gpu=True and
   `_check_resource_available` counts only GPU/NPU resources;
2. with a logical GPU declared to Ray: the actor worker's `init_process_group("cpu:gloo,cuda:nccl")`,
   because verl's platform manager knows nvidia/huawei/amd only and falls back to nvidia.
Past both, the V1 trainer builds rollout *servers* (vLLM, SGLang, TRT-LLM replicas) and has no HF rollout.
If verl changes any of this, this test fails and the note must be updated (and a real CPU step tried).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import import_verl

import_verl("verl")
import_verl("transfer_queue")

from data_synthesis.export import write_verl_parquet  # noqa: E402
from data_synthesis.prompts import PromptFormat  # noqa: E402
from data_synthesis.sqlgen.synthesize import synthesize  # noqa: E402
from sirius_train.config import load_config  # noqa: E402
from sirius_train.local.model import NanoModelConfig, build_nano_model, train_tokenizer  # noqa: E402
from sirius_train.schedule import RunData  # noqa: E402
from sirius_train.verl_backend import VerlBackend  # noqa: E402
from sirius_train.verl_backend.backend import plan_stage  # noqa: E402
from sirius_train.verl_backend.launch import verl_env  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.verl, pytest.mark.timeout(900),
              pytest.mark.skipif(torch.cuda.is_available(), reason="documents the CPU-only stop")]
ROOT = Path(__file__).resolve().parents[1]
CPU_SHAPE = ["trainer.device=cpu", "ray_kwargs.ray_init.num_cpus=8", "data.dataloader_num_workers=0",
             "actor_rollout_ref.rollout.agent.num_workers=1",
             "transfer_queue.backend.SimpleStorage.num_data_storage_units=1"]


@pytest.fixture(scope="module")
def stage_inputs(tmp_path_factory, demo_db_root):
    """A run config on a one-"GPU" CPU shape, the nano model, a curriculum parquet and the held-out set."""
    work = tmp_path_factory.mktemp("verl_cpu")
    examples = synthesize(demo_db_root / "retail" / "retail.sqlite", 32, seed=0, db_id="retail")
    fmt = PromptFormat(schema_style="compact", schema_samples=0, system="")
    write_verl_parquet(examples[:24], work / "curriculum.parquet", demo_db_root, prompt_format=fmt)
    tokenizer = train_tokenizer([e.question + " " + e.gold_sql for e in examples] * 4, 512)
    model = build_nano_model(NanoModelConfig(vocab_size=512, hidden_size=64, intermediate_size=128,
                                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4),
                             tokenizer)
    model.save_pretrained(work / "model")
    tokenizer.save_pretrained(work / "model")
    cfg = load_config(None, ["backend=verl", f"data.db_root={demo_db_root}", f"output_dir={work}",
                             "verl.n_gpus_per_node=1", "verl.reward_workers=1", "verl.max_prompt_length=512",
                             "verl.strategy=fsdp", "verl.use_remove_padding=false", "stages.0.prompts_per_step=4",
                             "stages.0.n_samples=2", "stages.0.mini_batches=1", "stages.0.steps=1",
                             "stages.0.max_new_tokens=16", "stages.0.overlong_cache=4",
                             f"verl.overrides=[{','.join(CPU_SHAPE)}]"])
    data = RunData(demo_db_root, [], examples[:24], examples[24:], fmt, "bird")
    return cfg, data, work


def test_backend_launches_verl_which_stops_at_its_gpu_check(stage_inputs):
    cfg, data, work = stage_inputs
    backend = VerlBackend(cfg)
    stage_dir = cfg.run_dir / "stage1"
    try:
        with pytest.raises(RuntimeError) as failure:
            backend.train_stage(1, cfg.stages[0], work / "curriculum.parquet", work / "model", data, stage_dir)
    finally:
        backend.close()
    assert "sirius_train.verl_backend.main_ppo exited with code" in str(failure.value)
    assert "Total available GPUs 0 is less than total desired GPUs 1" in str(failure.value)
    # everything before the launch happened: the held-out parquet, the resolved config, the command, the log
    assert (cfg.run_dir / "data" / "eval.parquet").is_file()
    assert "clip_ratio_c: 10.0" in (stage_dir / "verl_config.yaml").read_text()
    command = (stage_dir / "verl_command.sh").read_text()
    assert command.startswith(f"{sys.executable} -m sirius_train.verl_backend.main_ppo ")
    log = (stage_dir / "verl.log").read_text()
    assert "ray init kwargs" in log  # verl itself ran, and its TaskRunner (a Ray worker) built our gated trainer:
    assert "sirius_train/verl_backend/entropy.py" in log and "in _setup" in log
    assert not (stage_dir / "model").exists()


def test_with_a_logical_gpu_it_stops_at_nccl(stage_inputs):
    cfg, _, work = stage_inputs
    curriculum = work / "curriculum.parquet"  # the same command, plus a GPU resource declared to Ray (none exists)
    plan = plan_stage(cfg, 1, cfg.stages[0], curriculum, work / "model", work / "probe", curriculum)
    out = subprocess.run([*plan.argv, "+ray_kwargs.ray_init.num_gpus=1"], env=verl_env(str(ROOT), None), cwd=work,
                         capture_output=True, text=True, timeout=800)
    log = out.stdout + out.stderr
    assert out.returncode != 0
    assert "RuntimeError: Distributed package doesn't have NCCL built in" in log, log[-4000:]
