"""The cluster path run for real on this CPU: `sirius train --backend verl` drives verl 0.9.1's own trainer (FSDP2 on
gloo, rollouts on vLLM's CPU build, `verl.device: cpu`).

Two runs share the work of every check here (each verl launch costs a minute of start-up on 2 cores):
- `plain`: a real pretrained model, SmolLM2-135M-Instruct (`configs/smollm2_verl_cpu.yaml`: the GGUF de-quantized
  into base/model, an SFT warm start on the local backend, the prompt format and answer extraction of
  configs/smollm2.yaml), then one stage of 2 DAPO steps, reward in-process in verl's reward workers.
- `served`: the nano schedule (`configs/verl_cpu_smoke.yaml`: its own SFT, two stages: the hand-over from stage 1
  to stage 2) with LoRA stages (rank 8; the SFT full, nano's embeddings start random), reward through
  `sirius reward-server` on 127.0.0.1, stopped by SIGTERM after stage 1's first checkpoint and rerun with the same
  command (verl's resume_mode=auto).

Run in .venv-verl-cpu: `make test-verl-cpu`. A failed weight sync hangs rather than exits, so every launch has a
hard timeout, and each run has its own Ray temp folder (Ray's sockets) and its Ray stopped at the end.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import import_verl, import_vllm
from verl_cpu_runs import stop_ray, verl_metrics

import_verl("verl")
import_vllm()

from data_synthesis.demo_dbs import build_demo_dbs  # noqa: E402
from data_synthesis.difficulty import estimate  # noqa: E402
from sirius_train.config import load_config  # noqa: E402
from sirius_train.schedule import prepare_data  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.verl_cpu, pytest.mark.timeout(3600)]
ROOT = Path(__file__).resolve().parents[1]
SMOLLM2 = ROOT / "configs" / "smollm2_verl_cpu.yaml"
NANO = ROOT / "configs" / "verl_cpu_smoke.yaml"
RUN_LIMIT_S = 2400  # one `sirius train` takes ~6-11 minutes here (either run); a hung weight sync never ends


def _env(ray_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(PYTHONPATH=str(ROOT), RAY_TMPDIR=str(ray_dir), OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    return env


def _train(config: Path, args: list[str], env: dict[str, str], log: Path, stop_when=None) -> int:
    """`sirius train` as a user runs it, bounded by RUN_LIMIT_S; `stop_when()` true -> SIGTERM (a preemption)."""
    argv = [sys.executable, "-m", "sirius_train.cli", "train", str(config), *args]
    with log.open("a") as out:
        proc = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        deadline, stopped = time.monotonic() + RUN_LIMIT_S, False
        try:
            while proc.poll() is None:
                if time.monotonic() > deadline:
                    raise AssertionError(f"sirius train still running after {RUN_LIMIT_S} s (a hung weight sync?); "
                                         f"log {log}")
                if stop_when is not None and not stopped and stop_when():
                    proc.send_signal(signal.SIGTERM)  # as Slurm does: to sirius, which passes it on to verl
                    stopped = True
                time.sleep(0.2 if stop_when is not None else 2)  # a CPU step takes ~3 s: stop inside the next one
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return proc.returncode


@pytest.fixture(scope="module")
def work():
    """A short folder (Ray's socket paths live under it), removed afterwards; SIRIUS_VERL_CPU_KEEP=DIR keeps the
    runs there instead and reuses finished ones (to look into a failure without rerunning verl)."""
    keep = os.environ.get("SIRIUS_VERL_CPU_KEEP")
    path = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="vcpu"))
    path.mkdir(parents=True, exist_ok=True)
    yield path
    if not keep:
        shutil.rmtree(path, ignore_errors=True)


def _plain_args(work: Path) -> list[str]:
    # lr x 10: one update then moves log-probs far beyond vLLM's numeric distance from the actor
    return [f"output_dir={work}", "name=plain", f"data.db_root={work / 'dbs'}", "verl.keep_checkpoints=0",
            "stages.0.lr=1e-4",
            f"verl.overrides=[trainer.rollout_data_dir={work / 'rollouts'},"
            "actor_rollout_ref.rollout.calculate_log_probs=true]"]


@pytest.fixture(scope="module")
def plain(work, smollm2_gguf):
    """SmolLM2: two stages on verl from the SFT warm start, reward in-process; every checkpoint kept, rollouts
    dumped."""
    if (work / "plain" / "summary.json").is_file():
        return work / "plain"
    ray_dir = work / "r1"
    try:
        code = _train(SMOLLM2, _plain_args(work), _env(ray_dir), work / "plain.log")
    finally:
        stop_ray(ray_dir)
    assert code == 0, (work / "plain.log").read_text()[-6000:]
    return work / "plain"


def test_smollm2_trains_a_dapo_stage_on_verls_trainer_with_the_local_backends_prompts(plain):
    summary = json.loads((plain / "summary.json").read_text())
    assert [p["phase"] for p in summary["phases"]] == ["sft", "stage1"]
    stage_dir = plain / "stage1"
    steps = verl_metrics(stage_dir)
    assert sorted(steps) == [1, 2], steps.keys()  # two DAPO steps, each logged by verl itself
    for row in steps.values():
        assert "actor/pg_loss" in row and "critic/score/mean" in row
        # the entropy gate's coefficient, computed by our trainer inside verl, in verl's own metrics
        assert {"actor/entropy_coef", "actor/entropy_gate_open", "actor/entropy_coef_next"} <= row.keys()
    # ... and its state beside every verl checkpoint, the coefficient the next step starts from
    for step in (1, 2):
        gate = json.loads((stage_dir / "verl_checkpoints" / f"global_step_{step}" /
                           "sirius_entropy_gate.json").read_text())
        assert gate["mode"] == "adaptive" and gate["step"] == step
        assert gate["coef"] == pytest.approx(steps[step]["actor/entropy_coef_next"])
    assert (stage_dir / "model" / "config.json").is_file()  # the merged Hugging Face model
    assert f"path: {plain / 'sft' / 'model'}\n" in (stage_dir / "verl_config.yaml").read_text()
    assert "pass rates (stage1, k=4, vLLM)" in (plain.parent / "plain.log").read_text()
    # verl's rollouts were asked exactly what the local backend asks: SmolLM2's chat template over our messages
    from transformers import AutoTokenizer

    from data_synthesis.difficulty import prompt_for
    from data_synthesis.prompts import chat_text

    data = prepare_data(load_config(SMOLLM2, _plain_args(plain.parent)))
    tokenizer = AutoTokenizer.from_pretrained(plain / "sft" / "model")
    local = {tokenizer.decode(tokenizer(chat_text(tokenizer, prompt_for(example, data.db_root, data.prompt_format)),
                                        add_special_tokens=False)["input_ids"], skip_special_tokens=True)
             for example in data.rl_pool}
    rows = [json.loads(line) for step in (1, 2)
            for line in (plain.parent / "rollouts" / f"{step}.jsonl").read_text().splitlines()]
    assert rows and all(row["input"] in local for row in rows), rows[0]["input"][:500]


def test_the_update_is_real_and_vllm_samples_from_the_new_weights(plain):
    """Weights change; after verl's weight sync the vLLM rollout samples from the updated actor, not the old one.

    At step 2 verl compares the log-probs vLLM sampled with (after syncing the step-1 weights) with the actor's own
    on the same tokens (`training/rollout_probs_diff_mean`). Those rollouts are dumped, so their log-probs under
    the weights before (the SFT warm start) and after the step-1 update (the global_step_1 checkpoint)
    are computed here with transformers: the update moved them by far more than vLLM differs from the actor --
    had the sync failed, vLLM would still serve the old weights and differ from the actor by that whole move."""
    import torch
    from safetensors.torch import load_file

    from sirius_train.verl_backend.launch import latest_actor_checkpoint, merge_to_hf, verl_env

    before_dir, stage_dir = plain / "sft" / "model", plain / "stage1"
    before, after = load_file(before_dir / "model.safetensors"), load_file(stage_dir / "model" / "model.safetensors")
    changed = [name for name in before if not torch.equal(before[name], after[name])]
    assert len(changed) >= len(before) // 2, changed  # the stage's two updates moved the weights

    step1 = stage_dir / "verl_checkpoints" / "global_step_1"
    merged = merge_to_hf(None, step1 / "actor", plain.parent / "step1_hf", verl_env(str(ROOT), None),
                         plain.parent / "merge_step1.log")
    assert latest_actor_checkpoint(stage_dir / "verl_checkpoints").parent.name == "global_step_2"
    rows = [json.loads(line) for line in (plain.parent / "rollouts" / "2.jsonl").read_text().splitlines()]
    update_moved = _mean_log_prob_move(rows, stage_dir / "curriculum.parquet", before_dir, merged)
    vllm_vs_actor = verl_metrics(stage_dir)[2]["training/rollout_probs_diff_mean"]
    assert update_moved > 0.01, update_moved
    assert vllm_vs_actor < update_moved / 5, (vllm_vs_actor, update_moved)
    assert verl_metrics(stage_dir)[2]["training/rollout_actor_probs_pearson_corr"] > 0.99


def _mean_log_prob_move(rows: list[dict], curriculum: Path, before: Path, after: Path) -> float:
    """How far the weights in `after` moved the log-probs of the dumped rollouts' answers from those in `before`
    (mean absolute per token, computed with transformers)."""
    import pyarrow.parquet as pq
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(before)
    models = {name: AutoModelForCausalLM.from_pretrained(path).eval() for name, path in
              (("before", before), ("after", after))}
    # verl dumps prompts decoded without special tokens: find each one's token ids among the curriculum's prompts
    prompt_ids = {}
    for messages in pq.read_table(curriculum).column("prompt").to_pylist():
        text = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]  # as verl's dataset tokenizes it
        prompt_ids[tokenizer.decode(ids, skip_special_tokens=True)] = ids
    moved = []
    for row in rows:
        prompt = prompt_ids[row["input"]]
        answer = tokenizer(row["output"], add_special_tokens=False)["input_ids"]
        if not answer:
            continue
        ids = torch.tensor([prompt + answer])
        with torch.no_grad():
            logps = {name: torch.log_softmax(m(ids).logits[0, len(prompt) - 1:-1].float(), -1)
                     .gather(-1, ids[0, len(prompt):, None])[:, 0] for name, m in models.items()}
        moved.append((logps["after"] - logps["before"]).abs().mean().item())
    return sum(moved) / len(moved)


def _served_args(work: Path) -> list[str]:
    # LoRA stages; stage 1 at 50x the full fine-tune's lr, so that one update moves log-probs far beyond vLLM's
    # numeric distance from the actor (at 10x: 0.0067 against 0.0018); each stage dumps its own rollouts
    return [f"output_dir={work}", "name=served", f"data.db_root={work / 'dbs'}", "model.lora_rank=8",
            "model.lora_alpha=16", "sft.lora=false", "stages.0.lr=1e-2", "stages.1.lr=1e-3",
            "verl.overrides=['trainer.rollout_data_dir=\\${trainer.default_local_dir}/../rollouts',"
            "actor_rollout_ref.rollout.calculate_log_probs=true]"]


@pytest.fixture(scope="module")
def served(work):
    """nano's two stages through the reward server, SIGTERMed once in stage 1 and rerun."""
    if (work / "served.json").is_file():
        return {**json.loads((work / "served.json").read_text()), "run": work / "served"}
    ray_dir = work / "r2"
    data = load_config(NANO, _served_args(work)).data  # the server needs its databases before the run builds them
    build_demo_dbs(work / "dbs", db_ids=[*data.all_train_dbs(), *data.all_eval_dbs()], seed=0)
    server_log = work / "reward_server.log"
    server = subprocess.Popen([sys.executable, "-m", "sirius_train.cli", "reward-server", "--db-root",
                               str(work / "dbs"), "--port", "0", "--workers", "1"], env=_env(ray_dir), cwd=ROOT,
                              stdout=server_log.open("w"), stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while not (match := re.search(r"http://127\.0\.0\.1:\d+", server_log.read_text())):
            assert server.poll() is None and time.monotonic() < deadline, server_log.read_text()
            time.sleep(1)
        url = match.group(0)
        args = [*_served_args(work), f"reward.url={url}", "reward.fallback=false"]
        marker = work / "served" / "stage1" / "verl_checkpoints" / "latest_checkpointed_iteration.txt"
        first = _train(NANO, args, _env(ray_dir), work / "served.log", stop_when=marker.is_file)
        stop_ray(ray_dir)
        stopped_at = marker.read_text().strip() if marker.is_file() else None
        if (step1 := marker.parent / "global_step_1").is_dir():  # retention removes it once step 2 is saved
            shutil.copytree(step1, work / "served_step1", dirs_exist_ok=True)
        second = _train(NANO, args, _env(ray_dir), work / "served.log")
        import httpx

        served_items = httpx.get(url + "/metrics", timeout=10).text
    finally:
        stop_ray(ray_dir)
        server.terminate()
        server.wait(timeout=60)
    found = {"first": first, "second": second, "stopped_at": stopped_at, "log": (work / "served.log").read_text(),
             "metrics": served_items}
    (work / "served.json").write_text(json.dumps(found))
    return {**found, "run": work / "served"}


def test_sigterm_mid_stage_resumes_from_verls_checkpoint_to_the_same_step_count(served):
    log = " ".join(served["log"].split())
    # a preemption is a clean stop (exit code 0) that names the checkpoint verl resumes from
    assert served["first"] == 0 and served["stopped_at"] == "1", served["log"][-4000:]
    assert "preempted -- SIGTERM: passed on to sirius_train.verl_backend.main_ppo" in log
    assert "verl resumes from " + str(served["run"] / "stage1" / "verl_checkpoints" / "global_step_1") in log
    assert served["second"] == 0, served["log"][-6000:]
    # stage 1's verl log: the first launch (stopped after step 1's checkpoint), then the rerun's, which found that
    # checkpoint and trained step 2 only
    launches = re.split(r"^\$ .*sirius_train\.verl_backend\.main_ppo .*$", (served["run"] / "stage1" / "verl.log")
                        .read_text(), flags=re.M)[1:]
    assert len(launches) == 2
    assert "global_step_1" in launches[1] and "step:2 -" in launches[1] and "step:1 -" not in launches[1]
    # retention spans both launches (verl's manager counts only its own saves): keep_checkpoints=1 leaves step 2
    assert [p.name for p in (served["run"] / "stage1" / "verl_checkpoints").glob("global_step_*")] == ["global_step_2"]
    steps = {index: load_config(NANO).stages[index - 1].steps for index in (1, 2)}
    for index in (1, 2):  # and every stage ends with the step count of an uninterrupted run
        assert sorted(verl_metrics(served["run"] / f"stage{index}")) == list(range(1, steps[index] + 1))
    summary = json.loads((served["run"] / "summary.json").read_text())
    assert [p["phase"] for p in summary["phases"]] == ["sft", "stage1", "stage2"]


def test_stage_two_starts_from_stage_ones_model_on_a_curriculum_estimated_with_it(served):
    run = served["run"]
    assert f"path: {run / 'stage1' / 'model'}\n" in (run / "stage2" / "verl_config.yaml").read_text()
    assert "pass rates (stage2, k=4, vLLM)" in served["log"]
    # every stage-2 rate in the cache is keyed by stage 1's model: read back with that policy, nothing is sampled
    cfg = load_config(NANO, _served_args(run.parent))
    data, stage = prepare_data(cfg), cfg.stages[1]

    def cached_rates(policy: Path):
        class NothingSampled:
            prompt_format = data.prompt_format

            def sample(self, *args, **kwargs):
                raise LookupError(f"a stage-2 rate was not estimated with {policy}")

        return estimate(data.rl_pool, NothingSampled(), data.db_root, stage.estimate_k, seed=cfg.seed,
                        cache_path=run / "stage2" / "passrates.cache.jsonl", temperature=stage.temperature,
                        top_p=stage.top_p, max_new_tokens=stage.max_new_tokens, compare=data.compare,
                        policy=str(policy), prompt_format=data.prompt_format, batch_size=len(data.rl_pool))

    assert len(cached_rates(run / "stage1" / "model")) == len(data.rl_pool)
    with pytest.raises(LookupError):  # ... and not by the warm start's
        cached_rates(run / "sft" / "model")


def test_verls_reward_workers_score_through_the_reward_server(served):
    """reward.url set and the in-process fallback off: verl's reward workers had no other way to score than the
    server, and the run finished; the server counted one /v1/score request per verl rollout (verl's DAPO reward
    manager scores answer by answer), far more than the few batched calls of pass rates and evaluation."""
    for index in (1, 2):
        config = (served["run"] / f"stage{index}" / "verl_config.yaml").read_text()
        assert re.search(r"reward_url: http://127\.0\.0\.1:\d+", config) and "reward_fallback: false" in config
    requests = sum(float(line.rsplit(" ", 1)[1]) for line in served["metrics"].splitlines()
                   if line.startswith("sirius_reward_requests_total{") and 'endpoint="/v1/score"' in line
                   and 'code="200"' in line)
    rollouts = 2 * 2 * 4 * 4  # two stages x two steps x 4 prompts x 4 answers, at least (dynamic sampling adds)
    assert requests >= rollouts, served["metrics"][:3000]


def test_lora_stages_train_adapters_only_and_vllm_samples_from_the_synced_adapters(served):
    """A LoRA stage on verl: its checkpoints hold the adapters alone, its model is the stage's start plus a rank-8
    update on the block projections (nothing else moves), its adapter folder is peft's, and after the step-1 weight
    sync vLLM samples from the adapted actor (as for a full fine-tune above: verl's vLLM-vs-actor distance on the
    step-2 rollouts is far below what the step-1 update moved them)."""
    import torch
    from safetensors.torch import load_file

    from sirius_train.lora import LoraSpec
    from sirius_train.verl_backend.launch import merge_to_hf, verl_env

    run = served["run"]
    stage, start = run / "stage1", run / "sft" / "model"
    shards = torch.load(stage / "verl_checkpoints" / "global_step_2" / "actor" / "model_world_size_1_rank_0.pt",
                        weights_only=False)
    assert shards and all("lora_" in name for name in shards), sorted(shards)[:5]
    adapter = json.loads((stage / "adapter" / "adapter_config.json").read_text())
    assert (adapter["r"], adapter["lora_alpha"]) == (8, 16)
    before, after = load_file(start / "model.safetensors"), load_file(stage / "model" / "model.safetensors")
    projections = [name for name in before if name.endswith("proj.weight")]
    assert projections and set(projections) <= set(after)
    for name in before:
        delta = after[name].float() - before[name].float()
        if name in projections:
            assert 0 < torch.linalg.matrix_rank(delta).item() <= 8, name
        else:  # embeddings, norms, head: frozen
            assert torch.equal(after[name], before[name]), name

    spec = LoraSpec(8, 16.0)
    step1 = merge_to_hf(None, run.parent / "served_step1" / "actor", run.parent / "served_step1_hf",
                        verl_env(str(ROOT), None), run.parent / "merge_served_step1.log", lora=(spec, start))
    rows = [json.loads(line) for line in (stage / "rollouts" / "2.jsonl").read_text().splitlines()]
    update_moved = _mean_log_prob_move(rows, stage / "curriculum.parquet", start, step1)
    vllm_vs_actor = verl_metrics(stage)[2]["training/rollout_probs_diff_mean"]
    assert update_moved > 0.01, update_moved
    assert vllm_vs_actor < update_moved / 5, (vllm_vs_actor, update_moved)
