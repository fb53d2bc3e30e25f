"""Preemption outside the local trainer: the light halts module, signals forwarded to the verl child and by
the Slurm script, and signals during SFT / pass-rate estimation."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sirius_train.halts import Preempted
from sirius_train.verl_backend.launch import resume_point, run_logged, verl_env

ROOT = Path(__file__).resolve().parents[1]


def test_the_halts_module_imports_without_torch():
    """The verl launcher and the commands raise and catch `Preempted` without the local trainer's torch."""
    code = ("import sys, sirius_train.halts as h; "
            "print(issubclass(h.Preempted, h.TrainingHalted), issubclass(h.NonFiniteGradients, h.TrainingHalted), "
            "[m for m in ('torch', 'transformers') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}).stdout
    assert out.split("\n")[0] == "True True []"


def test_a_signal_caught_outside_is_pending_inside_and_handlers_come_back():
    """The schedule's context catches a signal between phases; a phase's own context opened later starts with
    it (so the DAPO loop stops after one step, the verl launcher stops verl at once); both restore handlers."""
    from sirius_train.halts import pending, preemption_signals, stop_if_preempted

    before = signal.getsignal(signal.SIGUSR1)
    with preemption_signals() as outer:
        assert pending() is None
        stop_if_preempted("nothing pending: no stop")
        os.kill(os.getpid(), signal.SIGUSR1)
        assert outer == ["SIGUSR1"]
        with preemption_signals() as inner:
            assert inner == ["SIGUSR1"] and pending() == "SIGUSR1"
        with pytest.raises(Preempted, match="^SIGUSR1: stopped after base$"):
            stop_if_preempted("stopped after base")
    assert pending() is None and signal.getsignal(signal.SIGUSR1) is before


def test_a_signal_after_an_inner_context_closed_is_pending_in_the_outer_one():
    """The schedule's context and a phase's (the DAPO trainer's, verl's launcher's) both start empty, so they are
    *equal* lists: closing the inner one must leave the outer one open, and a signal sent afterwards -- during
    stage-1 evaluation, stage-2 pass rates -- must reach `pending()`; the outer one then closes cleanly."""
    from sirius_train.halts import pending, preemption_signals

    before = signal.getsignal(signal.SIGTERM)
    with preemption_signals() as outer:
        with preemption_signals() as inner:
            assert inner == outer == [] and pending() is None
        os.kill(os.getpid(), signal.SIGTERM)
        assert outer == ["SIGTERM"] and pending() == "SIGTERM"
        with preemption_signals() as later:  # stage 2's trainer: starts with it and stops after one step
            assert later == ["SIGTERM"]
    assert pending() is None and signal.getsignal(signal.SIGTERM) is before


@pytest.fixture
def uncaught_ctrl_c():
    """Outside the contexts, Ctrl-C fails the test (instead of ending the whole pytest session)."""
    def uncaught(signum, frame):
        pytest.fail("Ctrl-C reached the handler outside the preemption_signals contexts")

    previous = signal.signal(signal.SIGINT, uncaught)
    yield uncaught
    signal.signal(signal.SIGINT, previous)


def test_a_sigterm_while_ray_is_up_in_the_driver_is_a_preemption_not_an_exit():
    """Ray 2.60's `ray.init` makes SIGTERM `sys.exit(15)`. Under `--backend verl` the driver starts Ray for its vLLM
    engines (pass rates, every held-out evaluation) inside the schedule's signal context: through `init_ray` a
    preemption there is still noted for the run to stop at a checkpoint, not an exit Slurm does not requeue."""
    import ray

    from data_synthesis.ray_sampler import init_ray
    from sirius_train.halts import preemption_signals

    with preemption_signals() as caught:
        init_ray(ray, address="local", num_cpus=1, include_dashboard=False, log_to_driver=False,
                 logging_level="ERROR")
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)  # Python runs the handler in the main thread, between bytecodes
        finally:
            ray.shutdown()
    assert caught == ["SIGTERM"]


def test_a_first_ctrl_c_is_a_preemption_and_a_second_one_stops_at_once(capfd, uncaught_ctrl_c):
    """Ctrl-C inside the schedule: the first is noted like SIGTERM (and passed on to a child as SIGTERM) with a line
    saying what happens; the second raises KeyboardInterrupt where the process is; Ctrl-C is plain again after."""
    from sirius_train.halts import pending, preemption_signals

    forwarded = []
    with preemption_signals() as outer, preemption_signals(forwarded.append) as inner:
        os.kill(os.getpid(), signal.SIGINT)
        assert inner == ["SIGINT"] and outer == [] and pending() == "SIGINT" and forwarded == [signal.SIGTERM]
        assert "Ctrl-C: stopping at the next checkpoint" in capfd.readouterr().err
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert Preempted("SIGINT: SFT stopped").interrupted and not Preempted("SIGTERM: SFT stopped").interrupted
    assert signal.getsignal(signal.SIGINT) is uncaught_ctrl_c


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1], ids=["SIGTERM", "SIGUSR1"])
def test_a_signal_to_the_launcher_reaches_verls_process_group_and_ends_in_preempted(tmp_path, sig):
    """verl's launcher forwards the signal to verl's whole process group, waits for it, raises `Preempted`
    naming the checkpoint `resume_mode=auto` resumes from; its own handlers are back afterwards."""
    before = signal.getsignal(sig)

    def on_step(step: int) -> None:  # the cluster's signal, once verl has saved step 2 and is on step 3
        if step == 3:
            os.kill(os.getpid(), sig)

    argv = [sys.executable, "-m", "preempt_verl_standin", str(tmp_path)]  # as verl_command runs verl's entry
    expected = (rf"{sig.name}: passed on to preempt_verl_standin, which stopped \(exit code {-sig}\); "
                rf"verl resumes from {tmp_path}/checkpoints/global_step_2 \(the steps after 2 are redone\)")
    with pytest.raises(Preempted, match=expected):
        run_logged(argv, verl_env(str(ROOT / "tests"), None), tmp_path / "verl.log", on_step=on_step,
                   checkpoints=tmp_path / "checkpoints")
    assert (tmp_path / "main.sig").read_text() == (tmp_path / "helper.sig").read_text() == sig.name
    assert (tmp_path / "main.exited").exists()  # run_logged returned only after verl was gone
    assert signal.getsignal(sig) is before


def test_without_a_checkpoint_the_message_says_the_stage_restarts(tmp_path):
    assert resume_point(tmp_path) == f"verl has no checkpoint in {tmp_path} yet: the stage restarts from its first step"
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("12\n")
    assert resume_point(tmp_path) == f"verl resumes from {tmp_path}/global_step_12 (the steps after 12 are redone)"


def test_the_verl_stage_saves_every_checkpoint_every_steps_keeps_n_and_resumes_automatically(tmp_path):
    """What a preempted verl stage resumes from, in verl's own resolved config: saves every
    `checkpoint_every` steps into the stage's folder, `keep_checkpoints` kept, `resume_mode=auto`."""
    from sirius_train.config import load_config
    from sirius_train.verl_backend.compose import compose_verl_config
    from sirius_train.verl_backend.translate import StagePaths, stage_overrides

    cfg = load_config(ROOT / "configs" / "nano.yaml", ["backend=verl", "stages.0.checkpoint_every=3",
                                                        "verl.keep_checkpoints=4"])
    paths = StagePaths(train_files="/r/c.parquet", val_files="/r/e.parquet", model="/r/sft/model",
                       checkpoints=str(tmp_path / "verl_checkpoints"), reward_fn="/code/rewards/verl_reward.py",
                       db_root="/data/dbs", pythonpath=str(ROOT), metrics="/r/stage1/verl_metrics.jsonl")
    trainer = compose_verl_config(stage_overrides(cfg, 1, cfg.stages[0], paths)).trainer
    assert (trainer.save_freq, trainer.max_actor_ckpt_to_keep, trainer.resume_mode, trainer.default_local_dir) == (
        3, 4, "auto", str(tmp_path / "verl_checkpoints"))


def test_a_relaunched_stage_keeps_only_the_checkpoints_retention_allows(tmp_path):
    """keep=2, preempted after step 30 and relaunched: verl's manager counts only the new launch's saves (50, 60), so
    without pruning 20 and 30 stay forever (366 GiB each on the 32B recipe). Before the relaunch only the resume
    point stays, after it the newest two; a save past the recorded step (cut short) goes; no record, nothing goes."""
    from sirius_train.verl_backend.launch import prune_verl_checkpoints

    ckpts = tmp_path / "verl_checkpoints"

    def save(*steps: int, recorded: int) -> None:
        for step in steps:
            (ckpts / f"global_step_{step}" / "actor").mkdir(parents=True, exist_ok=True)
        (ckpts / "latest_checkpointed_iteration.txt").write_text(str(recorded))

    def on_disk() -> list[str]:
        return sorted((p.name for p in ckpts.glob("global_step_*")), key=lambda n: int(n.rsplit("_", 1)[1]))

    save(10, 20, 30, 40, recorded=30)  # 40: the save the preemption cut short
    assert [p.name for p in prune_verl_checkpoints(ckpts, 1)] == ["global_step_40", "global_step_10",
                                                                   "global_step_20"]
    assert on_disk() == ["global_step_30"]  # the relaunch resumes from it
    save(50, 60, recorded=60)
    prune_verl_checkpoints(ckpts, 2)
    assert on_disk() == ["global_step_50", "global_step_60"]
    assert prune_verl_checkpoints(ckpts, 0) == [] and on_disk() == ["global_step_50", "global_step_60"]  # 0: all
    (ckpts / "latest_checkpointed_iteration.txt").unlink()
    assert prune_verl_checkpoints(ckpts, 1) == [] and len(on_disk()) == 2


SRUN = """#!/usr/bin/env bash
# srun: runs its command on this machine; exec makes this pid the task, as srun forwards USR1/TERM to its task
while [[ $# -gt 0 ]]; do
    case "$1" in -w) shift 2 ;; -*) shift ;; *) break ;; esac
done
exec "$@"
"""
SCONTROL = """#!/usr/bin/env bash
case "$1" in
    show) printf 'n1\\nn2\\n' ;;
    requeue) echo "requeue $2" >> "$OUT/scontrol.log" ;;
esac
"""
RAY = "#!/usr/bin/env bash\nexec sleep 60  # `ray start --block`\n"
PYTHON = "#!/usr/bin/env bash\necho 2  # the alive check: both nodes joined\n"
SIRIUS = """#!/usr/bin/env bash
# sirius train: notes the signal it gets, then takes half a second to checkpoint and exits 0, as it does preempted
echo "$*" > "$OUT/sirius.argv"
got=""
trap 'got=USR1' USR1
trap 'got=TERM' TERM
touch "$OUT/sirius.started"
for _ in $(seq 100); do [[ -n "$got" ]] && break; sleep 0.1; done
echo "$got" > "$OUT/sirius.sig"
sleep 0.5
touch "$OUT/sirius.exited"
"""


@pytest.mark.parametrize("sig,requeued", [("USR1", ["requeue 42"]), ("TERM", [])], ids=["USR1", "TERM"])
def test_the_slurm_script_passes_the_signal_to_sirius_train_and_waits_for_it(tmp_path, sig, requeued):
    """scripts/slurm_verl.sbatch run by bash with stand-ins for srun, scontrol, ray and `sirius`: the signal the
    batch shell gets (`--signal=B:USR1`, or a preemption's TERM) reaches `sirius train`, the script exits with
    its status only after it finished, and with SIRIUS_REQUEUE=1 requeues itself after the time-limit signal."""
    import time

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in {"srun": SRUN, "scontrol": SCONTROL, "ray": RAY, "python": PYTHON, "sirius": SIRIUS}.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "OUT": str(tmp_path), "CONFIG": "configs/sirius32b.yaml",
           "SIRIUS_DB_ROOT": "/dbs", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_JOB_ID": "42",
           "SLURM_SUBMIT_DIR": str(ROOT), "SIRIUS_NO_REWARD_SERVER": "1", "RAY_HEAD_WAIT": "0", "SIRIUS_REQUEUE": "1",
           "RAY_NUM_GPUS": "8"}
    log_path = tmp_path / "job.log"  # a file, not a pipe: the Ray stand-ins hold their copy of it open
    with log_path.open("w") as job_log:
        script = subprocess.Popen(["bash", str(ROOT / "scripts" / "slurm_verl.sbatch"), "stages.0.steps=3"],
                                  env=env, stdout=job_log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "sirius.started").exists():
            assert script.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.05)
        os.kill(script.pid, getattr(signal, f"SIG{sig}"))  # B: the batch shell only
        assert script.wait(timeout=30) == 0, log_path.read_text()
        out = log_path.read_text()
        assert (tmp_path / "sirius.exited").exists(), out  # it waited for the checkpointed stop
        assert (tmp_path / "sirius.sig").read_text().strip() == sig
        argv = (tmp_path / "sirius.argv").read_text().strip()
        assert argv == "train configs/sirius32b.yaml verl.nnodes=2 stages.0.steps=3"
        assert f"{sig} received: passing it on to sirius train" in out
        log = tmp_path / "scontrol.log"
        assert (log.read_text().split("\n")[:-1] if log.exists() else []) == requeued
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(script.pid, signal.SIGKILL)  # the Ray stand-ins, as the end of a Slurm job would


def _killed_mid_save(sft_dir: Path) -> Path:
    """What a SIGKILL during the Trainer's save of a later checkpoint leaves: weights written, the optimizer state
    cut short, no trainer state, no record."""
    import shutil

    partial = sft_dir / "checkpoint-6"
    shutil.copytree(sft_dir / "checkpoint-3", partial)
    (partial / "optimizer.pt").write_bytes((partial / "optimizer.pt").read_bytes()[:100])
    for name in ("trainer_state.json", "MANIFEST.json"):
        (partial / name).unlink(missing_ok=True)
    return partial


def _written_before_records(sft_dir: Path) -> None:
    """The checkpoint as an older version (or a plain Trainer run) wrote it: complete, with no MANIFEST.json."""
    (sft_dir / "checkpoint-3" / "MANIFEST.json").unlink()


@pytest.mark.parametrize("sig,then", [(signal.SIGTERM, None), (signal.SIGINT, None), (signal.SIGTERM, _killed_mid_save),
                                      (signal.SIGTERM, _written_before_records)],
                         ids=["SIGTERM", "Ctrl-C", "SIGTERM, then killed mid-save", "SIGTERM, written before records"])
def test_a_signal_during_sft_checkpoints_the_step_and_the_rerun_ends_with_the_same_weights(tmp_path, sig, then,
                                                                                         uncaught_ctrl_c, capfd):
    """SIGTERM or a first Ctrl-C mid-SFT (a real signal to this process, inside the schedule's
    `preemption_signals`): the step in progress ends, the Trainer's checkpoint is written, `Preempted` says so;
    rerunning resumes from that step and ends with the weights of an uninterrupted SFT, exactly, on CPU. A later
    checkpoint that a kill left incomplete is passed over (and removed before training starts) with a warning; one
    written before checkpoints had records (the Trainer's last file there) is resumed from, not removed."""
    import copy

    import torch
    from transformers import TrainerCallback

    from sirius_train.halts import preemption_signals
    from sirius_train.local.model import NanoModelConfig, build_nano_model, train_tokenizer
    from sirius_train.local.sft import train_sft

    torch.set_num_threads(1)
    pairs = [([{"role": "user", "content": f"count rows of t{i}"}], f"SELECT COUNT(*) FROM t{i}") for i in range(12)]
    tokenizer = train_tokenizer([p[-1]["content"] + a for p, a in pairs] * 4, 256)
    model = build_nano_model(NanoModelConfig(vocab_size=256, hidden_size=32, intermediate_size=64,
                                             num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2),
                             tokenizer)
    options = {"epochs": 4, "lr": 5e-3, "batch_size": 4, "seed": 3}  # 3 steps an epoch, 12 in all

    class SignalAtStep3(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 3:
                os.kill(os.getpid(), sig)

    reference = copy.deepcopy(model)
    train_sft(reference, tokenizer, pairs, tmp_path / "reference", **options)
    interrupted = copy.deepcopy(model)
    with preemption_signals(), pytest.raises(Preempted, match=rf"^{sig.name}: SFT stopped after step 3 of 12, "
                                                               rf"checkpoint {tmp_path}/sft/checkpoint-3 written$"):
        train_sft(interrupted, tokenizer, pairs, tmp_path / "sft", callbacks=[SignalAtStep3()], **options)
    partial = then(tmp_path / "sft") if then else None
    seen_at_start = []

    class SeeTheFolder(TrainerCallback):  # the torn save must be gone before the Trainer writes anything
        def on_train_begin(self, args, state, control, **kwargs):
            seen_at_start.extend(sorted(p.name for p in (tmp_path / "sft").glob("checkpoint-*")))

    capfd.readouterr()
    resumed = copy.deepcopy(model)
    figures = train_sft(resumed, tokenizer, pairs, tmp_path / "sft", callbacks=[SeeTheFolder()], **options)
    err = " ".join(capfd.readouterr().err.split())
    assert figures["sft_steps"] == 12 and f"resuming SFT from {tmp_path}/sft/checkpoint-3" in err, err
    assert seen_at_start == ["checkpoint-3"]
    if partial is not None:
        assert f"warning: SFT checkpoint {partial} is damaged (no MANIFEST.json" in err and not partial.exists(), err
    else:
        assert "damaged" not in err, err
    for (name, a), b in zip(reference.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name


def test_a_signal_during_pass_rate_estimation_stops_after_a_cached_chunk_and_the_rerun_finishes_it(demo_db_root,
                                                                                                    tmp_path):
    """SIGUSR1 while pass rates are estimated (real HTTP sampler, real sandboxed scoring): the estimate stops
    at the end of the chunk in progress, which is in the cache; the rerun samples only the rest and gets the
    rates of an uninterrupted estimate."""
    from fake_openai import FakeOpenAIServer
    from test_synth_difficulty import K, _answerer, _expected, _pool

    from data_synthesis.difficulty import estimate_pass_rates
    from data_synthesis.samplers import OpenAISampler
    from sirius_train.halts import preemptible, preemption_signals

    pool = _pool(demo_db_root)
    cache = tmp_path / "passrates.cache.jsonl"

    def signal_after_the_first_chunk(n: int) -> None:
        os.kill(os.getpid(), signal.SIGUSR1)

    with FakeOpenAIServer(_answerer(pool)) as server:
        sampler = OpenAISampler(server.url, "policy", concurrency=4)
        with preemption_signals(), pytest.raises(Preempted, match="^SIGUSR1: stage1: pass rates stopped"):
            estimate_pass_rates(pool, sampler, demo_db_root, K, cache_path=cache, batch_size=5, seed=3,
                                progress=preemptible(signal_after_the_first_chunk, "stage1: pass rates stopped"))
        assert len(server.requests) == 5 and len(cache.read_text().splitlines()) == 5
        rates = estimate_pass_rates(pool, sampler, demo_db_root, K, cache_path=cache, batch_size=5, seed=3)
        assert len(server.requests) == len(pool)  # the first chunk came from the cache
    assert rates == {e.id: _expected(i) for i, e in enumerate(pool)}
