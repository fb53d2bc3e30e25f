"""The local backend end to end at tiny scale: schedule, metrics contract, warm-up, and the faults a run survives
(SIGKILL, preemption signals, a reward server killed mid-stage)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from tiny_run import NANO, tiny_overrides

from sirius_train.algorithms import logprobs_and_entropy
from sirius_train.config import load_config

STEP_FIELDS = {"step", "stage", "reward_mean", "acc_mean", "entropy", "entropy_coef", "kept_groups", "gen_rounds",
               "tokens_per_s", "lr", "skipped_steps", "reward_fallback"}


def _sirius(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "sirius_train.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def _rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """The tiny schedule, its stderr written to `<tmp>/stderr.log` as a log file on a cluster would get it."""
    from sirius_train.commands.train import run_schedule

    tmp = tmp_path_factory.mktemp("tiny")
    cfg = load_config(NANO, tiny_overrides(tmp))
    pace = os.environ.get("SIRIUS_PROGRESS_EVERY_S")
    os.environ["SIRIUS_PROGRESS_EVERY_S"] = "0.2"
    try:
        with (tmp / "stderr.log").open("w") as log, contextlib.redirect_stderr(log):
            summary = run_schedule(cfg)
    finally:
        os.environ.pop("SIRIUS_PROGRESS_EVERY_S") if pace is None else os.environ.update(SIRIUS_PROGRESS_EVERY_S=pace)
    return cfg, summary, tmp / "runs" / "tiny"


def test_schedule_runs_and_logs_the_contract(tiny_run):
    cfg, summary, run_dir = tiny_run
    assert [p["phase"] for p in summary["phases"]] == ["sft", "stage1", "stage2"]
    rows = _rows(run_dir)
    steps = [r for r in rows if "reward_mean" in r]
    assert [(r["stage"], r["step"]) for r in steps] == [("stage1", i) for i in range(1, 7)] + [("stage2", 1),
                                                                                             ("stage2", 2)]
    for r in steps:
        assert STEP_FIELDS <= set(r), STEP_FIELDS - set(r)
        if "entropy_gate_open" in r:  # a step that trained: the loss used c_k only while the gate was open
            assert r["entropy_coef_applied"] == r["entropy_coef"] * r["entropy_gate_open"]
    evals = [r for r in rows if "eval_exec_acc" in r]
    assert {r["stage"] for r in evals} == {"sft", "stage1", "stage2"}
    # stage 2 starts from stage 1's weights and re-estimates difficulty with them
    assert (run_dir / "stage2" / "curriculum.parquet").is_file()
    assert (run_dir / "stage1" / "curriculum.report.json").is_file()
    assert (run_dir / "training.png").stat().st_size > 10_000
    assert json.loads((run_dir / "summary.json").read_text())["final_model"].endswith("stage2/model")
    # stage 1's curriculum has questions the warm-started policy sometimes solves
    report = json.loads((run_dir / "stage1" / "curriculum.report.json").read_text())
    assert report["selected"] > 0, report


def test_every_long_phase_prints_plain_lines_in_a_log(tiny_run):
    """stderr a file, not a terminal: no bars (they would print once, when finished), a line per phase at a steady
    pace with done/total, elapsed, rate, ETA and the phase's own figure, and the curriculum's bins."""
    log = (tiny_run[2].parents[1] / "stderr.log").read_text()
    assert "\r" not in log and "━" not in log  # no bar redraws
    lines = log.splitlines()
    for phase, figure in (("SFT", "loss "), ("pass rates (stage1, k=4)", None), ("DAPO stage1", "reward "),
                          ("pass rates (stage2, k=4)", None), ("DAPO stage2", "reward "), ("evaluation (sft)", None),
                          ("evaluation (stage2)", None)):
        mine = [line for line in lines if line.startswith(f"{phase}: ")]
        total = re.fullmatch(rf"{re.escape(phase)}: (\d+) to do", mine[0]).group(1)
        assert re.fullmatch(rf"{re.escape(phase)}: {total}/{total} \(100%\), \w+ elapsed, .*", mine[-1]), mine[-1]
        if figure:
            assert figure in mine[-1], mine[-1]
    sft = [line for line in lines if line.startswith("SFT: ") and " elapsed" in line]
    started = [line for line in sft if not line.startswith("SFT: 0/")]  # a rate once a step is done (a slow first
    assert len(sft) >= 3 and all("/s" in line or "s each" in line for line in started), sft  # step ticks without one)
    assert any(", ETA " in line for line in sft)
    assert re.search(r"^stage1 curriculum: 8 of budget 8 \(\d+ distinct\) in 3 bins over k=4 pass rates: 1/4 ", log,
                     re.M), log


def test_the_warm_start_learned_its_data(tiny_run):
    """Train-set execution accuracy (greedy, the reward's scorer) rises by a margin from the base model to SFT's."""
    from data_synthesis.difficulty import prompt_for
    from data_synthesis.records import read_examples
    from sirius_train.local.backend import LocalBackend
    from sirius_train.local.evaluate import evaluate_policy
    from sirius_train.local.trainer import TrainItem
    from sirius_train.schedule import prompt_format

    cfg, _, run_dir = tiny_run
    backend = LocalBackend(cfg)
    examples = read_examples(run_dir / "data" / "sft.jsonl")
    items = [TrainItem(prompt_for(e, cfg.data.db_root, prompt_format(cfg)), e.db_id, e.gold_sql) for e in examples]
    accuracy = {}
    for phase in ("base", "sft"):
        model, tokenizer = backend.load(run_dir / phase / "model")
        accuracy[phase] = evaluate_policy(model, tokenizer, items, backend.executor, compare=cfg.data.compare,
                                          max_new_tokens=cfg.stages[0].max_new_tokens)["eval_exec_acc"]
    backend.close()
    assert len(items) >= 20 and accuracy["base"] <= 0.05, accuracy
    assert accuracy["sft"] >= accuracy["base"] + 0.5, accuracy  # measured: 0.0 -> 0.93 on 30 examples


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


def test_warmup_counts_training_steps(tiny_run, tmp_path):
    """Step t trains at lr * min(1, t / warmup_steps) in every one of its optimizer steps (verl's side of the same
    schedule: `test_lr_schedule.py`), and its metrics row says so."""
    from dataclasses import replace

    from sirius_train.local.backend import LocalBackend, read_curriculum
    from sirius_train.local.trainer import DAPOTrainer
    from sirius_train.metrics import MetricsLog

    cfg, _, run_dir = tiny_run
    backend = LocalBackend(cfg)
    model, tokenizer = backend.load(run_dir / "sft" / "model")
    stage = replace(cfg.stages[0], warmup_steps=3, mini_batches=2)
    trainer = DAPOTrainer(model, tokenizer, read_curriculum(run_dir / "stage1" / "curriculum.parquet"), stage,
                          backend.executor, ckpt_dir=tmp_path / "ck", metrics=MetricsLog(tmp_path / "m.jsonl"), seed=3)
    stepped_at = []  # the learning rate of every optimizer step, as AdamW sees it
    trainer.optimizer.register_step_pre_hook(lambda opt, args, kwargs: stepped_at.append(opt.param_groups[0]["lr"]))
    trained = 0
    for t in range(1, 5):
        trainer.step = t
        stepped_at.clear()
        row = trainer.train_step()
        expected = stage.lr * min(1.0, t / 3)
        assert row["lr"] == pytest.approx(expected, rel=1e-12), (t, row["lr"])
        assert stepped_at == pytest.approx([expected] * len(stepped_at), rel=1e-12), (t, stepped_at)
        assert len(stepped_at) == (stage.mini_batches if row["train_groups"] else 0)
        trained += bool(stepped_at)
    backend.close()
    assert trained >= 2, "too few steps trained to see the schedule"


def test_shared_prefill_generates_what_a_prefill_per_copy_does(tiny_run):
    """n answers sharing one prompt prefill are the tokens HF `generate` gives on n copies of the prompt."""
    from transformers import StoppingCriteriaList

    from sirius_train.local.backend import LocalBackend, read_curriculum
    from data_synthesis.generation import SQLBlockClosed, encode_prompts, generate

    cfg, _, run_dir = tiny_run
    backend = LocalBackend(cfg)
    model, tokenizer = backend.load(run_dir / "sft" / "model")
    backend.close()
    torch.manual_seed(0)
    with torch.no_grad():  # noisy weights: answers that depend on every prompt, so a row mix-up shows
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    distinct = {json.dumps(it.prompt): it.prompt for it in read_curriculum(run_dir / "stage1" / "curriculum.parquet")}
    prompts = list(distinct.values())[:3]  # the curriculum repeats examples
    roll = generate(model, tokenizer, prompts, n=3, temperature=0, max_new_tokens=24, batch_size=7)  # 2 + 1 prompts
    expected = []
    for chunk in (prompts[:2], prompts[2:]):
        ids, mask = encode_prompts(tokenizer, [p for p in chunk for _ in range(3)], "cpu")
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=24,
                                 pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                                 stopping_criteria=StoppingCriteriaList([SQLBlockClosed(tokenizer, ids.shape[1])]))
        expected += tokenizer.batch_decode(out[:, ids.shape[1]:], skip_special_tokens=True)
    assert roll.texts == expected
    assert len({roll.texts[0], roll.texts[3], roll.texts[6]}) == 3, roll.texts  # the prompts' answers differ


def test_shared_prompt_forward_equals_the_full_forward(tiny_run):
    """Answers that share a prompt share its forward: same log-probs, entropies and gradients as one forward
    over every (prompt + answer) row, for a shuffled mix of groups with different prompt and answer lengths."""
    from sirius_train.local.backend import LocalBackend, read_curriculum
    from data_synthesis.generation import generate, left_pad_positions
    from sirius_train.local.trainer import response_logits, trim

    cfg, _, run_dir = tiny_run
    backend = LocalBackend(cfg)
    model, tokenizer = backend.load(run_dir / "sft" / "model")
    backend.close()
    distinct = {json.dumps(it.prompt): it.prompt for it in read_curriculum(run_dir / "stage1" / "curriculum.parquet")}
    torch.manual_seed(0)
    roll = generate(model, tokenizer, list(distinct.values())[:3], n=4, temperature=1.0, max_new_tokens=24,
                    batch_size=4)  # one generate call per prompt: the prompts are padded together afterwards
    batch = trim(roll.select(torch.randperm(12)[:9]))  # a mini-batch: some answers of each prompt, shuffled
    mask = batch.response_mask.bool()
    assert len(set(batch.lengths.tolist())) > 1 and len(set(batch.prompt_mask.sum(1).tolist())) > 1

    def one_forward_per_row(model, roll):
        logits = model(input_ids=roll.input_ids, attention_mask=roll.attention_mask,
                       position_ids=left_pad_positions(roll.attention_mask), use_cache=False).logits
        return logits[:, roll.prompt_ids.shape[1] - 1:-1]

    results = []
    for logits_of in (one_forward_per_row, response_logits):
        model.zero_grad()
        log_prob, entropy = logprobs_and_entropy(logits_of(model, batch), batch.response_ids)
        (log_prob[mask].sum() + entropy[mask].sum()).backward()
        results.append((log_prob.detach(), entropy.detach(),
                        {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (lp_a, h_a, g_a), (lp_b, h_b, g_b) = results
    assert torch.allclose(lp_a[mask], lp_b[mask], atol=1e-5) and torch.allclose(h_a[mask], h_b[mask], atol=1e-5)
    assert g_a.keys() == g_b.keys() and g_a
    for n in g_a:
        assert torch.allclose(g_a[n], g_b[n], atol=1e-5, rtol=1e-4), (n, (g_a[n] - g_b[n]).abs().max())


def test_sampler_logprobs_are_pi_old(tiny_run, tmp_path):
    """The log-probs and entropies kept while sampling (top-p on) are those a full forward gives at the
    sampling temperature, and the update that uses them equals the one with a recomputed pi_old."""
    import copy
    from dataclasses import replace

    from sirius_train.local.backend import LocalBackend, read_curriculum
    from data_synthesis.generation import generate
    from sirius_train.local.trainer import DAPOTrainer, response_logprobs
    from sirius_train.metrics import MetricsLog

    cfg, _, run_dir = tiny_run
    backend = LocalBackend(cfg)
    model, tokenizer = backend.load(run_dir / "sft" / "model")
    items = read_curriculum(run_dir / "stage1" / "curriculum.parquet")[:2]
    model.generation_config.repetition_penalty = 1.5  # as checkpoints ship (Qwen2.5-Instruct: 1.05): not pi
    model.generation_config.top_k = 3
    torch.manual_seed(0)
    roll = generate(model, tokenizer, [it.prompt for it in items], n=4, temperature=0.7, top_p=0.9,
                    max_new_tokens=24, batch_size=5, record_logprobs=True)  # two generate calls, padded together
    with torch.no_grad():
        log_prob, entropy = response_logprobs(model, roll, temperature=0.7)
    mask = roll.response_mask.bool()
    assert mask.sum() > 8 and roll.old_log_prob.shape == mask.shape
    assert torch.allclose(roll.old_log_prob[mask], log_prob[mask], atol=1e-4)
    assert torch.allclose(roll.old_entropy[mask], entropy[mask], atol=1e-4)
    assert not roll.old_log_prob[~mask].any() and not roll.old_entropy[~mask].any()
    assert not torch.allclose(roll.old_log_prob[mask], response_logprobs(model, roll, 1.0)[0][mask].detach(),
                              atol=1e-2)  # the temperature matters: the check above can tell

    groups = [(roll.select(list(range(g * 4, g * 4 + 4))), torch.tensor([1.0, 0.0, 1.0, 0.0])) for g in (0, 1)]
    plain = [(r.select(list(range(4))), rw) for r, rw in groups]
    for r, _ in plain:
        r.old_log_prob = r.old_entropy = None  # no recorded pi_old: the update recomputes it
    results = {}
    for name, batch in (("sampler", groups), ("recompute", plain)):
        policy = copy.deepcopy(model)
        stage = replace(cfg.stages[0], temperature=0.7, micro_batch_size=3, mini_batches=2,
                        entropy=replace(cfg.stages[0].entropy, mode="fixed", coef=0.01))
        trainer = DAPOTrainer(policy, tokenizer, items, stage, backend.executor, ckpt_dir=tmp_path / name,
                              metrics=MetricsLog(tmp_path / f"{name}.jsonl"), seed=1)
        torch.manual_seed(1)
        row = trainer.update(batch)
        results[name] = (row, {n: p.detach().clone() for n, p in policy.named_parameters()})
    backend.close()
    (row_a, params_a), (row_b, params_b) = results["sampler"], results["recompute"]
    assert row_a["entropy"] == pytest.approx(row_b["entropy"], rel=1e-4)
    for n in params_a:
        assert torch.allclose(params_a[n], params_b[n], atol=1e-5, rtol=1e-4), n


@pytest.mark.parametrize("fallback", [True, False])
def test_a_stage_survives_its_reward_server_being_killed(tiny_run, tmp_path, capsys, fallback):
    """A real `sirius reward-server` SIGKILLed after step 1 of a local stage: with the fallback the stage goes on,
    scored in-process on the same databases and counted in `reward_fallback`; without it the run stops with a
    clear error before step 2 makes any update."""
    from dataclasses import replace

    from rewards.client import RewardServerUnavailable
    from rewards.launch import spawn
    from rewards.service import ServerConfig
    from sirius_train.local.backend import LocalBackend, read_curriculum
    from sirius_train.local.trainer import DAPOTrainer
    from sirius_train.metrics import MetricsLog
    from test_reward_fallback import kill_server

    cfg, _, run_dir = tiny_run
    server = spawn(ServerConfig(cfg.data.db_root, workers=1, timeout_s=5.0))
    try:
        backend = LocalBackend(replace(cfg, reward=replace(cfg.reward, url=server.url, fallback=fallback)))
        model, tokenizer = backend.load(run_dir / "sft" / "model")
        optimizer_steps = []

        def after_step(step, row):
            optimizer_steps.append(sum(int(s["step"]) for s in trainer.optimizer.state.values()))
            if step == 1:
                kill_server(server)

        stage = replace(cfg.stages[0], steps=3, checkpoint_every=100)
        trainer = DAPOTrainer(model, tokenizer, read_curriculum(run_dir / "stage1" / "curriculum.parquet"), stage,
                              backend.executor, ckpt_dir=tmp_path / "ck",
                              metrics=MetricsLog(tmp_path / "metrics.jsonl"), seed=5, progress=after_step)
        if fallback:
            trainer.train()
        else:
            with pytest.raises(RewardServerUnavailable, match="fallback is off"):
                trainer.train()
            assert len(optimizer_steps) == 1  # step 2 never finished ...
            updates = sum(int(s["step"]) for s in trainer.optimizer.state.values())
            assert updates == optimizer_steps[0]  # ... nor made an update
        backend.close()
    finally:
        server.stop()
    rows = _rows(tmp_path)
    assert rows[0]["reward_fallback"] == 0
    if fallback:
        assert [r["step"] for r in rows] == [1, 2, 3] and rows[1]["reward_fallback"] >= 1
        assert rows[2]["reward_fallback"] > rows[1]["reward_fallback"]
        assert "reward server unavailable" in capsys.readouterr().err
    else:
        assert [r["step"] for r in rows] == [1]


TIMINGS = {"time", "gen_time_s", "step_time_s", "tokens_per_s"}  # wall-clock fields differ run to run


def _worker(run_dir, out):
    return subprocess.Popen([sys.executable, str(Path(__file__).parent / "preempt_worker.py"), str(run_dir), str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]),
                                                                              str(Path(__file__).parent)])})


def _rows_without_timings(where) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMINGS} for r in _rows(where)]


@pytest.fixture(scope="module")
def uninterrupted_stage(tiny_run, tmp_path_factory) -> list[dict]:
    """The worker's stage run start to end: the metrics rows an interrupted run must end with."""
    _, _, run_dir = tiny_run
    out_dir = tmp_path_factory.mktemp("uninterrupted")
    reference = _worker(run_dir, out_dir)
    out, err = reference.communicate(timeout=600)
    assert reference.returncode == 0 and "preempted" not in out, err[-3000:]
    return _rows_without_timings(out_dir)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1], ids=["SIGTERM", "SIGUSR1"])
def test_preemption_checkpoints_the_step_and_the_rerun_ends_with_the_same_rows(tiny_run, uninterrupted_stage,
                                                                              tmp_path, signum):
    """A real signal mid-stage: the step in progress finishes, is checkpointed, the process exits 0 saying so; the
    rerun resumes there and its metrics rows equal an uninterrupted run's (timings aside), exactly, on CPU."""
    _, _, run_dir = tiny_run

    interrupted = _worker(run_dir, tmp_path / "run")
    for line in interrupted.stdout:
        if line.startswith("step 2"):
            os.kill(interrupted.pid, signum)
            break
    out, err = interrupted.communicate(timeout=600)
    assert interrupted.returncode == 0, err[-3000:]
    stopped = re.search(rf"preempted: {signum.name}: stage 'stage1' stopped after step (\d) of 8, checkpoint (\S+) "
                        "written", out)
    assert stopped, out + err[-3000:]
    step = int(stopped.group(1))
    assert 2 <= step < 8 and Path(stopped.group(2)).name == f"step_{step:06d}"

    resumed = _worker(run_dir, tmp_path / "run")
    out, err = resumed.communicate(timeout=600)
    assert resumed.returncode == 0 and f"resumed from step {step}" in out, err[-3000:]

    rows = _rows_without_timings(tmp_path / "run")
    assert [r["step"] for r in rows] == list(range(1, 9))
    assert rows == uninterrupted_stage


def _start_train(tmp_path, name):
    """`sirius train` on the tiny config in its own session: (its arguments, its run folder, the process)."""
    args = ["train", str(NANO), *tiny_overrides(tmp_path, name)]
    proc = subprocess.Popen([sys.executable, "-m", "sirius_train.cli", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    return args, tmp_path / "runs" / name, proc


def _stage1_steps(run_dir) -> list[int]:
    rows = _rows(run_dir) if (run_dir / "metrics.jsonl").exists() else []
    return [r["step"] for r in rows if r.get("stage") == "stage1" and "reward_mean" in r]


@pytest.mark.timeout(900)
def test_sigkill_mid_stage_resumes_from_last_checkpoint(tmp_path):
    args, run_dir, proc = _start_train(tmp_path, "killed")
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        done = (run_dir / "stage1" / "checkpoints").glob("step_*")
        if any(p.name >= "step_000004" for p in done):  # killed between checkpoint 4 and the end of the stage
            break
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert _stage1_steps(run_dir) and not (run_dir / "stage1" / "DONE.json").exists()

    second = _sirius(*args)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resumed stage1 from step" in second.stderr
    stage1 = _stage1_steps(run_dir)
    assert stage1 == list(range(1, 7)), stage1  # every step exactly once: nothing lost, nothing counted twice
    assert (run_dir / "summary.json").is_file()
    assert not list(run_dir.rglob(".step_*.tmp"))
    table = [line.split("│")[1].strip() for line in second.stderr.splitlines() if line.startswith("│")]
    assert table == ["sft", "stage1", "stage2"], second.stderr[-2000:]  # the final table: each phase once


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_sirius_train_exits_0_on_sigterm_and_the_same_command_resumes(tiny_run, tmp_path):
    """The CLI's side of preemption: exit 0, the resume line, and the same command finishing the run with the
    metrics rows of the uninterrupted schedule (`tiny_run`: same config and seed), timings aside."""
    args, run_dir, proc = _start_train(tmp_path, "preempted")
    deadline = time.monotonic() + 1200
    while not _stage1_steps(run_dir):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    assert "preempted -- SIGTERM: stage 'stage1' stopped after step" in err and "resume with: sirius train" in err
    second = _sirius(*args, timeout=1200)
    assert second.returncode == 0, second.stderr[-3000:]
    assert _stage1_steps(run_dir) == list(range(1, 7))
    assert _rows_without_timings(run_dir) == _rows_without_timings(tiny_run[2])


def test_a_signal_after_the_trainers_context_closed_stops_the_schedule_after_stage1(tiny_run, tmp_path):
    """SIGTERM during stage-1 evaluation, after the DAPO trainer's own signal context has closed: the schedule's
    context still hears it, so the run stops at the next durable point (stage 1's DONE.json) before stage 2 starts.
    Resumed, the run goes on with stage 2 without redoing stage 1, and a signal during stage 2's pass rates stops
    it after their first cached chunk."""
    import shutil

    from sirius_train.halts import Preempted
    from sirius_train.local.backend import LocalBackend
    from sirius_train.schedule import run

    _, _, finished = tiny_run
    run_dir = tmp_path / "runs" / "tiny"
    shutil.copytree(finished, run_dir, ignore=shutil.ignore_patterns("stage2", "DONE.json", "summary.json"))
    for phase in ("base", "sft"):  # stage 1 resumes from its last checkpoint (its step 6 of 6): train, evaluate
        shutil.copy(finished / phase / "DONE.json", run_dir / phase / "DONE.json")
    cfg = load_config(NANO, tiny_overrides(tmp_path))  # the fixture's config, in tmp_path
    logged = len(_rows(run_dir))

    class Signalling(LocalBackend):
        def evaluate(self, model_path, data, stage):
            if stage == "stage1":
                os.kill(os.getpid(), signal.SIGTERM)
            return super().evaluate(model_path, data, stage)

        def pass_rates(self, examples, model_path, stage, data, out):
            if stage.name == "stage2":
                os.kill(os.getpid(), signal.SIGTERM)
            return super().pass_rates(examples, model_path, stage, data, out)

    for stops in (r"^SIGTERM: stopped after stage1 and its evaluation", r"^SIGTERM: stage2: pass rates stopped"):
        backend = Signalling(cfg)
        try:
            with pytest.raises(Preempted, match=stops):
                run(cfg, backend)
        finally:
            backend.close()
        if "stage1" in stops:
            assert (run_dir / "stage1" / "DONE.json").is_file() and not (run_dir / "stage2").exists()
    assert [r["stage"] for r in _rows(run_dir)[logged:] if r.get("eval") == "final"] == ["stage1"]  # evaluated once
    cached = (run_dir / "stage2" / "passrates.cache.jsonl").read_text().splitlines()
    assert 0 < len(cached) < len(cfg.data.train_dbs) * cfg.data.synth_per_db  # one chunk, not the pool


def test_a_warm_start_too_weak_for_any_gradient_says_so_and_records_the_skip(tmp_path, capsys):
    """No SFT: an untrained model solves nothing, every pass rate is 0 and both curricula are empty. The run says
    why nothing trained and what fixes it (scripts/gpu_smoke.sh once ran 4 SFT epochs and never launched verl)."""
    from sirius_train.commands.train import run_schedule

    cfg = load_config(NANO, [*tiny_overrides(tmp_path, "cold"), "sft.enabled=false", "data.synth_per_db=16",
                             "data.eval_per_db=4", "stages.0.estimate_k=2", "stages.1.estimate_k=2",
                             "stages.0.max_new_tokens=8", "stages.1.max_new_tokens=8", "logging.plots=false"])
    summary = run_schedule(cfg)
    err = " ".join(capsys.readouterr().err.split())
    for phase in summary["phases"]:
        assert phase["skipped"].startswith(f"{phase['phase']}: empty curriculum: none of the ")
        assert phase["model"] == summary["phases"][0]["model"] == str(tmp_path / "runs" / "cold" / "base" / "model")
    assert "so DAPO has no gradient to follow; the stage is skipped (no training launched)" in err
    assert "A longer warm start (sft.epochs)" in err


def test_gap_filling_rates_new_examples_with_the_reward_and_settings_that_rated_the_pool(tiny_run, tmp_path):
    """The curriculum's filled bins must be rated as the pool was: the same variants, deadline, batch size and
    sampling (the schedule hands the filler exactly the options `pass_rates` used). The filler, asked about the
    pool's own examples, finds every rate in the pool's cache: nothing is sampled again."""
    from data_synthesis.curriculum import MutationFiller
    from data_synthesis.difficulty import estimate_pass_rates
    from sirius_train.local.backend import LocalBackend
    from sirius_train.schedule import prepare_data

    _, _, finished = tiny_run
    cfg = load_config(NANO, [*tiny_overrides(finished.parent.parent), "reward.variants=1", "reward.timeout_s=1.5"])
    data, stage = prepare_data(cfg), cfg.stages[0]
    examples = data.rl_pool[:4]
    backend = LocalBackend(cfg)
    try:
        rates, sampler, options = backend.pass_rates(examples, finished / "sft" / "model", stage, data, tmp_path)
    finally:
        backend.close()
    assert options["variants"] == 1 and options["timeout_s"] == 1.5
    assert options["batch_size"] == max(1, stage.gen_batch_size // stage.estimate_k)
    filler = MutationFiller(data.db_root, sampler, stage.estimate_k, seed=cfg.seed + 1, **options)

    class NothingSampled:
        prompt_format, multi_turn = data.prompt_format, False

        def sample(self, *args, **kwargs):
            raise AssertionError("the filler's rates are keyed apart from the pool's")

    again = estimate_pass_rates(examples, NothingSampled(), data.db_root, filler.k, seed=cfg.seed,
                                cache_path=tmp_path / "passrates.cache.jsonl", **filler.estimate_options)
    assert again == rates
