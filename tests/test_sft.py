"""`sirius sft` end to end: the real command on overrides of configs/nano.yaml, compared with the untrained model
on the held-out databases; experiment tracking through the same run; DeepSpeed ZeRO-3 in one process and
under `torchrun` with two ranks (the launcher path of a cluster, on CPUs)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_tracking import wandb_history
from typer.testing import CliRunner

from sirius_train.cli import app
from sirius_train.config import load_config

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")  # DeepSpeed calls deprecated torch.distributed ops
ROOT = Path(__file__).resolve().parents[1]
NANO = ROOT / "configs" / "nano.yaml"
# A small slice of the nano config: fewer databases, examples and epochs; one thread (fast on a busy machine).
SMALL = ["threads=1", "logging.plots=false", "data.generated_train_dbs=4", "data.synth_per_db=30",
         "data.generated_eval_dbs=1", "data.eval_sets=[val-seen-types]", "data.eval_per_db=20", "sft.epochs=10",
         "sft.batch_size=16",
         "data.synth_where=1.0", "data.sft_flaws=[]"]  # plain data: the demo's filter-free space is tiny at 30 per db


def _sft(tmp_path, *overrides) -> dict:
    args = ["sft", str(NANO), f"output_dir={tmp_path / 'runs'}", f"data.db_root={tmp_path / 'dbs'}", *overrides]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return json.loads((tmp_path / "runs" / "nano" / "summary.json").read_text())


def _untrained(tmp_path, *overrides) -> dict:
    """Held-out figures of the run's base model (before SFT), by the same evaluation the SFT phase ran."""
    from sirius_train.local.backend import LocalBackend
    from sirius_train.schedule import prepare_data

    cfg = load_config(tmp_path / "runs" / "nano" / "config.yaml", list(overrides))
    backend = LocalBackend(cfg)
    try:
        return backend.evaluate(cfg.run_dir / "base" / "model", prepare_data(cfg), "base")
    finally:
        backend.close()


def _sft_row(run_dir: Path) -> dict:
    return next(r for r in map(json.loads, (run_dir / "metrics.jsonl").open()) if r.get("stage") == "sft"
                and "sft_steps" in r)


def test_sft_teaches_the_answer_format_and_tracks_the_run(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    summary = _sft(tmp_path, *SMALL, "logging.backends=[wandb,tensorboard]")
    after = summary["phases"][0]
    before = _untrained(tmp_path, "logging.backends=[]")
    # the answer contract is learned, on a held-out schema whose names the tokenizer never saw (split into pieces)
    assert before["eval_format_ok"] < 0.1 <= 0.5 < after["eval_format_ok"]
    assert after["eval_exec_acc"] >= before["eval_exec_acc"]
    assert after["sft_steps"] == 10 * -(-after["sft_examples"] // 16)
    model_dir = Path(summary["final_model"])
    assert (model_dir / "model.safetensors").is_file()  # an HF checkpoint `sirius train model.path=` starts from

    run_dir = tmp_path / "runs" / "nano"
    [wandb_run] = (run_dir / "wandb").glob("offline-run-*")
    history = wandb_history(next(wandb_run.glob("run-*.wandb")))
    ours = [h for h in history if "sft/eval_exec_acc" in h]
    assert ours and ours[-1]["sft/eval_exec_acc"] == pytest.approx(after["eval_exec_acc"])
    losses = [h["train/loss"] for h in history if "train/loss" in h]  # the HF Trainer's curve, in the same run
    assert len(losses) == after["sft_steps"] // 10 and losses[-1] < losses[0] / 2
    assert any(run_dir.glob("tensorboard/events.out.tfevents.*"))
    assert _sft_row(run_dir)["sft_steps"] == after["sft_steps"]


def test_sft_under_deepspeed_zero3_in_one_process(tmp_path):
    pytest.importorskip("deepspeed")
    summary = _sft(tmp_path, *SMALL, "sft.epochs=1", "data.eval_per_db=5",
                   f"sft.deepspeed={ROOT / 'configs' / 'deepspeed' / 'zero3.json'}")
    after = summary["phases"][0]
    assert after["sft_steps"] == -(-after["sft_examples"] // 16)
    _assert_whole_trained_checkpoint(tmp_path / "runs" / "nano", after["sft_steps"])
    # and the process is a plain one again: a later training here does not inherit DeepSpeed
    import torch.distributed as dist
    from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled

    assert not dist.is_initialized() and not is_deepspeed_zero3_enabled()
    assert not {"RANK", "WORLD_SIZE", "ACCELERATE_USE_DEEPSPEED"} & set(os.environ)


def _assert_whole_trained_checkpoint(run_dir: Path, steps: int) -> None:
    """The saved SFT model is whole (ZeRO-3 shards gathered), trained, and equal to DeepSpeed's own gathered copy."""
    from safetensors.torch import load_file

    base = load_file(run_dir / "base" / "model" / "model.safetensors")
    ours = load_file(run_dir / "sft" / "model" / "model.safetensors")
    deepspeed_own = load_file(run_dir / "sft" / "trainer" / f"checkpoint-{steps}" / "model.safetensors")
    assert {k: v.shape for k, v in ours.items()} == {k: v.shape for k, v in base.items()}
    assert all(not ours[k].equal(base[k]) for k in base)
    assert all(ours[k].equal(deepspeed_own[k]) for k in ours)


@pytest.mark.slow
def test_sft_under_torchrun_two_ranks_zero3(tmp_path):
    """Two CPU processes launched like a cluster job: rank 0 runs the schedule, rank 1 joins its SFT; each step
    takes one batch per rank, so the epoch has half the steps of one process."""
    pytest.importorskip("deepspeed")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "0",
           "-m", "sirius_train.cli", "sft", str(NANO), f"output_dir={tmp_path / 'runs'}",
           f"data.db_root={tmp_path / 'dbs'}", *SMALL, "sft.epochs=1", "data.eval_per_db=5", "sft.batch_size=8",
           f"sft.deepspeed={ROOT / 'configs' / 'deepspeed' / 'zero3.json'}"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = tmp_path / "runs" / "nano"
    done = json.loads((run_dir / "sft" / "DONE.json").read_text())
    assert done["sft_steps"] == -(-done["sft_examples"] // (8 * 2))
    assert sorted(p.name for p in (run_dir / "sft" / "trainer").glob("checkpoint-*/rng_state_*.pth")) == \
        ["rng_state_0.pth", "rng_state_1.pth"]  # both ranks trained
    assert not (run_dir / "sft" / "trainer" / "handoff").exists()
    _assert_whole_trained_checkpoint(run_dir, done["sft_steps"])


@pytest.mark.slow
def test_sft_on_the_nano_config_raises_held_out_execution_accuracy(tmp_path):
    """The nano warm start of `make demo` (all its training data and epochs), evaluated on one held-out database."""
    overrides = ["threads=1", "logging.plots=false", "data.generated_eval_dbs=1", "data.eval_per_db=40"]
    after = _sft(tmp_path, *overrides)["phases"][0]
    before = _untrained(tmp_path)
    assert before["eval_exec_acc"] <= 0.05
    assert after["eval_exec_acc"] >= before["eval_exec_acc"] + 0.15, (before, after)


def test_local_backend_forwards_gradient_accumulation(tmp_path):
    from sirius_train.local.backend import LocalBackend
    from sirius_train.schedule import prepare_data

    cfg = load_config(NANO, [f"output_dir={tmp_path / 'runs'}", f"data.db_root={tmp_path / 'dbs'}", "threads=1",
                             "data.generated_train_dbs=0", "data.synth_per_db=10", "data.generated_eval_dbs=1",
                             "data.eval_per_db=2", "sft.epochs=1", "sft.batch_size=4",
                             "sft.gradient_accumulation_steps=2"])
    data = prepare_data(cfg)
    backend = LocalBackend(cfg)
    try:
        base = backend.prepare_base(data, tmp_path / "base")
        _, figures = backend.sft(data, base, tmp_path / "sft")
    finally:
        backend.close()
    micro_batches = -(-figures["sft_examples"] // 4)
    assert figures["sft_steps"] == -(-micro_batches // 2)


def test_a_multi_turn_demo_learns_its_probe_and_answer_but_not_the_observation():
    """The observation is the environment's text: RL masks it (tests/test_multiturn.py), so SFT must too."""
    from data_synthesis.interaction import demo_episode
    from sirius_train.local.model import train_tokenizer
    from sirius_train.local.sft import IGNORE, answer_text, encode_example

    observation = "<observation>\nok: 2 rows\nname\nAda\nBo\n</observation>"
    answer = demo_episode("SELECT name FROM t", observation, answer_text("SELECT name FROM t WHERE id = 1"))
    prompt = [{"role": "user", "content": "Question: who is first?"}]
    tokenizer = train_tokenizer([answer, "Question: who is first?"] * 20, vocab_size=400)
    ex = encode_example(tokenizer, prompt, answer, max_len=512)
    learned = tokenizer.decode([t for t, label in zip(ex["input_ids"], ex["labels"]) if label != IGNORE])
    assert learned.startswith("<sql>SELECT name FROM t</sql>")
    assert "```sql\nSELECT name FROM t WHERE id = 1\n```" in learned
    assert "observation" not in learned and "Ada" not in learned and "rows" not in learned
    # and a single-turn answer keeps every one of its tokens
    plain = encode_example(tokenizer, prompt, answer_text("SELECT 1"), max_len=512)
    plain_learned = tokenizer.decode([t for t, label in zip(plain["input_ids"], plain["labels"]) if label != IGNORE])
    assert plain_learned.startswith("```sql\nSELECT 1\n```")
