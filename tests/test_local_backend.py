"""The local backend end to end at tiny scale: schedule, metrics contract, and resume after SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from tiny_run import NANO, tiny_overrides

from sirius_train.config import load_config

STEP_FIELDS = {"step", "stage", "reward_mean", "acc_mean", "entropy", "entropy_coef", "kept_groups", "gen_rounds",
               "tokens_per_s"}


def _sirius(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "sirius_train.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def _rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    from sirius_train.commands.train import run_schedule

    tmp = tmp_path_factory.mktemp("tiny")
    cfg = load_config(NANO, tiny_overrides(tmp))
    return cfg, run_schedule(cfg), tmp / "runs" / "tiny"


def test_schedule_runs_and_logs_the_contract(tiny_run):
    cfg, summary, run_dir = tiny_run
    assert [p["phase"] for p in summary["phases"]] == ["sft", "stage1", "stage2"]
    rows = _rows(run_dir)
    steps = [r for r in rows if "reward_mean" in r]
    assert [(r["stage"], r["step"]) for r in steps] == [("stage1", i) for i in range(1, 7)] + [("stage2", 1),
                                                                                             ("stage2", 2)]
    for r in steps:
        assert STEP_FIELDS <= set(r), STEP_FIELDS - set(r)
    evals = [r for r in rows if "eval_exec_acc" in r]
    assert {r["stage"] for r in evals} == {"sft", "stage1", "stage2"}
    # stage 2 starts from stage 1's weights and re-estimates difficulty with them
    assert (run_dir / "stage2" / "curriculum.parquet").is_file()
    assert (run_dir / "stage1" / "curriculum.report.json").is_file()
    assert (run_dir / "training.png").stat().st_size > 10_000
    assert json.loads((run_dir / "summary.json").read_text())["final_model"].endswith("stage2/model")
    # the SFT warm start learned its data: stage 1's curriculum has questions the policy sometimes solves
    assert 0 <= summary["phases"][0]["eval_exec_acc"] <= 1
    report = json.loads((run_dir / "stage1" / "curriculum.report.json").read_text())
    assert report["selected"] > 0, report


def test_dapo_updates_every_trainable_parameter(tiny_run, tmp_path):
    """A DAPO step on mixed groups changes every trainable weight."""
    from sirius_train.local.backend import LocalBackend, read_curriculum
    from sirius_train.local.trainer import DAPOTrainer
    from sirius_train.metrics import MetricsLog

    cfg, _, run_dir = tiny_run
    backend = LocalBackend(cfg)
    model, tokenizer = backend.load(run_dir / "sft" / "model")
    items = read_curriculum(run_dir / "stage1" / "curriculum.parquet")
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    stage = cfg.stages[0]
    trainer = DAPOTrainer(model, tokenizer, items, stage, backend.executor, ckpt_dir=tmp_path / "ck",
                          metrics=MetricsLog(tmp_path / "m.jsonl"), seed=1)
    row = {}
    for _ in range(5):  # until a batch has a mixed group
        trainer.step += 1
        row = trainer.train_step()
        if row["train_groups"]:
            break
    assert row["train_groups"] > 0
    changed = [n for n, p in model.named_parameters() if not torch.equal(p, before[n])]
    assert len(changed) == len(before)
    backend.close()


def test_first_mini_batch_reuses_its_forward_as_pi_old(tiny_run, tmp_path):
    """The update that reuses the first mini-batch's forward as pi_old equals the one with a separate pass."""
    import copy
    from dataclasses import replace

    from sirius_train.local.backend import LocalBackend, read_curriculum
    from sirius_train.local.rollout import generate
    from sirius_train.local.trainer import DAPOTrainer
    from sirius_train.metrics import MetricsLog

    cfg, _, run_dir = tiny_run
    backend = LocalBackend(cfg)
    model, tokenizer = backend.load(run_dir / "sft" / "model")
    items = read_curriculum(run_dir / "stage1" / "curriculum.parquet")[:2]
    torch.manual_seed(0)
    roll = generate(model, tokenizer, [it.prompt for it in items], n=4, temperature=1.0, max_new_tokens=24)
    rows = torch.arange(8).view(2, 4)
    groups = [(roll.select(r.tolist()), torch.tensor([1.0, 0.0, 1.0, 0.0])) for r in rows]
    results = {}
    for name, micro in (("reused", 64), ("separate", 2)):  # 2-answer micro-batches: no reuse
        policy = copy.deepcopy(model)
        stage = replace(cfg.stages[0], micro_batch_size=micro, mini_batches=2, entropy=replace(
            cfg.stages[0].entropy, mode="fixed", coef=0.01))
        trainer = DAPOTrainer(policy, tokenizer, items, stage, backend.executor, ckpt_dir=tmp_path / name,
                              metrics=MetricsLog(tmp_path / f"{name}.jsonl"), seed=1)
        torch.manual_seed(1)
        row = trainer.update(groups)
        results[name] = (row, {n: p.detach().clone() for n, p in policy.named_parameters()})
    backend.close()
    (row_a, params_a), (row_b, params_b) = results["reused"], results["separate"]
    assert row_a["entropy"] == pytest.approx(row_b["entropy"], rel=1e-5)
    for n in params_a:
        assert torch.allclose(params_a[n], params_b[n], atol=1e-6, rtol=1e-5), n


@pytest.mark.timeout(900)
def test_sigkill_mid_stage_resumes_from_last_checkpoint(tmp_path):
    args = ["train", str(NANO), *tiny_overrides(tmp_path, "killed")]
    run_dir = tmp_path / "runs" / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "sirius_train.cli", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        done = (run_dir / "stage1" / "checkpoints").glob("step_*")
        if any(p.name >= "step_000004" for p in done):  # killed between checkpoint 4 and the end of the stage
            break
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = [r for r in _rows(run_dir) if r.get("stage") == "stage1" and "reward_mean" in r]
    assert before and not (run_dir / "stage1" / "DONE.json").exists()

    second = _sirius(*args)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resumed stage1 from step" in second.stderr
    rows = _rows(run_dir)
    stage1 = [r["step"] for r in rows if r.get("stage") == "stage1" and "reward_mean" in r]
    assert stage1 == list(range(1, 7)), stage1  # every step exactly once: nothing lost, nothing counted twice
    assert (run_dir / "summary.json").is_file()
    assert not list(run_dir.rglob(".step_*.tmp"))
