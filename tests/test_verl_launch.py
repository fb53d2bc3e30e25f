"""Processes around verl: the logged run with its step counter, and stage 1's checkpoint merged to HF weights.

The checkpoint is a real FSDP2 checkpoint: two CPU ranks on gloo shard the nano model with
`fully_shard` and save it with verl's own `FSDPCheckpointManager` (DTensor shards, fsdp_config.json,
huggingface/); `merge_to_hf` then runs the real `python -m verl.model_merger`.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import import_verl
import torch

from sirius_train.verl_backend.launch import (
    latest_actor_checkpoint,
    merge_to_hf,
    run_logged,
    verl_command,
    verl_env,
)

pytestmark = pytest.mark.timeout(300)
ROOT = Path(__file__).resolve().parents[1]

SAVE_SHARDED = textwrap.dedent("""
    import os, sys
    import torch.distributed as dist
    import torch.multiprocessing as mp

    def run(rank, model_dir, out, port):
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=str(rank), WORLD_SIZE="2")
        dist.init_process_group("gloo", rank=rank, world_size=2)
        from omegaconf import OmegaConf
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager

        model = AutoModelForCausalLM.from_pretrained(model_dir)
        mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("fsdp",))
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        contents = {"save_contents": ["model"], "load_contents": ["model"], "async_save": False}
        FSDPCheckpointManager(model, None, None, processing_class=AutoTokenizer.from_pretrained(model_dir),
                              checkpoint_config=OmegaConf.create(contents)).save_checkpoint(out, global_step=1)
        dist.barrier()
        dist.destroy_process_group()

    if __name__ == "__main__":
        mp.spawn(run, args=tuple(sys.argv[1:]), nprocs=2)
""")


def test_run_logged_counts_steps_and_keeps_the_log(tmp_path):
    code = "import sys\nfor i in (1, 2, 3):\n    print(f'(TaskRunner pid=1) step:{i} - actor/entropy:0.5 - x:1')\n"
    steps: list[int] = []
    run_logged([sys.executable, "-c", code], verl_env(str(ROOT), None), tmp_path / "verl.log", on_step=steps.append)
    assert steps == [1, 2, 3]
    log = (tmp_path / "verl.log").read_text()
    assert log.startswith(f"$ {sys.executable} -c") and "step:3 - actor/entropy" in log


def test_a_failed_run_raises_with_the_tail_and_the_log_path(tmp_path):
    code = "import sys\nprint('ValueError: Total available GPUs 0 is less than total desired GPUs 8')\nsys.exit(3)"
    expected = r"(?s)python\S* exited with code 3 \(full log: .*verl.log\).*Total available GPUs 0"
    with pytest.raises(RuntimeError, match=expected):
        run_logged([sys.executable, "-c", code], verl_env(str(ROOT), None), tmp_path / "verl.log")


def test_command_and_environment(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert verl_command(None, ["a=1"]) == [sys.executable, "-m", "sirius_train.verl_backend.main_ppo", "a=1"]
    env = verl_env("/code", "auto")
    assert env["PYTHONPATH"].split(":")[0] == "/code" and env["RAY_ADDRESS"] == "auto"


def test_the_environment_keeps_the_callers_ray_address_and_pythonpath(monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")  # what slurm_verl.sbatch exports
    monkeypatch.setenv("PYTHONPATH", "/site/extra")
    env = verl_env("/code", "auto")
    assert env["RAY_ADDRESS"] == "10.0.0.1:6379"
    assert env["PYTHONPATH"] == "/code:/site/extra"


def test_missing_checkpoint_says_why(tmp_path):
    import_verl("verl")
    with pytest.raises(FileNotFoundError, match="ended before its first save"):
        latest_actor_checkpoint(tmp_path)


@pytest.mark.verl
def test_fsdp_checkpoint_merges_to_the_same_weights(tmp_path):
    import_verl("verl")
    from transformers import AutoModelForCausalLM

    from sirius_train.local.model import NanoModelConfig, build_nano_model, train_tokenizer

    tokenizer = train_tokenizer(["SELECT name FROM singer WHERE age > 30", "how many singers"] * 20, 300)
    model = build_nano_model(NanoModelConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                             num_attention_heads=2, num_key_value_heads=2), tokenizer, seed=1)
    model.save_pretrained(tmp_path / "init")
    tokenizer.save_pretrained(tmp_path / "init")
    checkpoints = tmp_path / "verl_checkpoints"
    script = tmp_path / "save_sharded.py"
    script.write_text(SAVE_SHARDED)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    env = verl_env(str(ROOT), None)
    saved = subprocess.run([sys.executable, str(script), str(tmp_path / "init"),
                            str(checkpoints / "global_step_1" / "actor"), port],
                           env=env, capture_output=True, text=True, timeout=240)
    assert saved.returncode == 0, saved.stderr[-3000:]
    (checkpoints / "latest_checkpointed_iteration.txt").write_text("1")  # verl's trainer writes this tracker
    shards = sorted(p.name for p in (checkpoints / "global_step_1" / "actor").glob("model_world_size_*"))
    assert shards == ["model_world_size_2_rank_0.pt", "model_world_size_2_rank_1.pt"]

    actor = latest_actor_checkpoint(checkpoints)
    merged = merge_to_hf(None, actor, tmp_path / "stage1" / "model", env, tmp_path / "merge.log")
    original = model.state_dict()
    restored = AutoModelForCausalLM.from_pretrained(merged).state_dict()
    assert sorted(restored) == sorted(original)
    for key, value in original.items():  # verl's merger writes bf16 weights
        assert torch.equal(restored[key], value.to(torch.bfloat16)), key
    assert (merged / "tokenizer.json").is_file() and not (tmp_path / "stage1" / "model.partial").exists()
    assert merge_to_hf(None, actor, merged, env, tmp_path / "merge.log") == merged  # already merged: skipped
    assert (tmp_path / "merge.log").read_text().count("$ ") == 1


SAVE_LORA_SHARDED = textwrap.dedent("""
    import os, sys
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp

    def run(rank, model_dir, out, port, reference):
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=str(rank), WORLD_SIZE="2")
        dist.init_process_group("gloo", rank=rank, world_size=2)
        from omegaconf import OmegaConf
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager
        from sirius_train.lora import LoraSpec, attach

        model = attach(AutoModelForCausalLM.from_pretrained(model_dir), LoraSpec(4, 8.0))
        torch.manual_seed(3)  # the same "trained" adapters on both ranks (B != 0)
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.data = torch.randn(p.shape) * 0.2
        if rank == 0:
            model.save_pretrained(reference)
        mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("fsdp",))
        for layer in model.base_model.model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        contents = {"save_contents": ["model"], "load_contents": ["model"], "async_save": False,
                    "save_lora_only": True}
        FSDPCheckpointManager(model, None, None, processing_class=AutoTokenizer.from_pretrained(model_dir),
                              checkpoint_config=OmegaConf.create(contents)).save_checkpoint(out, global_step=1)
        dist.barrier()
        dist.destroy_process_group()

    if __name__ == "__main__":
        mp.spawn(run, args=tuple(sys.argv[1:]), nprocs=2)
""")


@pytest.mark.verl
def test_a_lora_only_fsdp_checkpoint_merges_into_the_stages_starting_model(tmp_path):
    """`checkpoint.save_lora_only` shards hold adapters alone (adapter-sized); `merge_to_hf` with the stage's
    LoRA spec folds them into the starting model: W + (alpha / r) B A on every projection, the rest unchanged."""
    import_verl("verl")
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from sirius_train.local.model import NanoModelConfig, build_nano_model, train_tokenizer
    from sirius_train.lora import LoraSpec

    tokenizer = train_tokenizer(["SELECT name FROM singer WHERE age > 30", "how many singers"] * 20, 300)
    model = build_nano_model(NanoModelConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                             num_attention_heads=2, num_key_value_heads=2), tokenizer, seed=1)
    model.save_pretrained(tmp_path / "init")
    tokenizer.save_pretrained(tmp_path / "init")
    checkpoints = tmp_path / "verl_checkpoints"
    script = tmp_path / "save_lora_sharded.py"
    script.write_text(SAVE_LORA_SHARDED)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    env = verl_env(str(ROOT), None)
    saved = subprocess.run([sys.executable, str(script), str(tmp_path / "init"),
                            str(checkpoints / "global_step_1" / "actor"), port, str(tmp_path / "reference")],
                           env=env, capture_output=True, text=True, timeout=240)
    assert saved.returncode == 0, saved.stderr[-3000:]
    (checkpoints / "latest_checkpointed_iteration.txt").write_text("1")
    actor = latest_actor_checkpoint(checkpoints)
    shard_bytes = sum(p.stat().st_size for p in actor.glob("model_world_size_*"))
    assert shard_bytes < 0.5 * (tmp_path / "init" / "model.safetensors").stat().st_size  # adapters only

    merged = merge_to_hf(None, actor, tmp_path / "stage1" / "model", env, tmp_path / "merge.log",
                         lora=(LoraSpec(4, 8.0), tmp_path / "init"))
    restored = AutoModelForCausalLM.from_pretrained(merged).state_dict()
    reference = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tmp_path / "init"),
                                          tmp_path / "reference")
    for name, module in reference.named_modules():  # the shards went through bf16 in verl's merger
        if hasattr(module, "lora_A") and "default" in module.lora_A:
            for adapter in (module.lora_A["default"], module.lora_B["default"]):
                adapter.weight.data = adapter.weight.data.to(torch.bfloat16).float()
    expected = reference.merge_and_unload().state_dict()
    assert sorted(restored) == sorted(expected)
    for key, value in expected.items():
        torch.testing.assert_close(restored[key], value, atol=1e-6, rtol=1e-5, msg=key)
    changed = [k for k in expected if not torch.equal(expected[k], model.state_dict()[k])]
    assert len(changed) == 2 * 7  # every projection of both blocks moved, nothing else
    assert (tmp_path / "stage1" / "adapter" / "adapter_model.safetensors").is_file()
    assert (merged / "tokenizer.json").is_file() and not (tmp_path / "stage1" / "model.partial").exists()
