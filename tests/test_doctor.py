"""`sirius doctor CONFIG`: light, all green for the demo, and each failure with its fix; `sirius train` stops on them.

Real parts throughout: package metadata, SQLite files opened read-only, our reward server and a vLLM-like
HTTP server on 127.0.0.1, the memory planner on the shipped configs. No GPU here, so the GPU rows are the
"none visible" ones.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from server_harness import running_server, vllm_like_server
from typer.testing import CliRunner

from rewards.service import ServerConfig
from sirius_train.cli import app
from sirius_train.commands.doctor import doctor_report
from sirius_train.config import load_config

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"


def _statuses(cfg) -> dict[str, str]:
    return {c.name: c.status for c in doctor_report(cfg).checks}


def test_doctor_on_the_demo_is_all_green_and_imports_no_model_library():
    code = ("import sys\nfrom sirius_train.cli import app\nfrom typer.testing import CliRunner\n"
            "r = CliRunner().invoke(app, ['doctor', 'configs/nano.yaml'])\n"
            "print(r.exit_code, [m for m in ('torch', 'transformers', 'vllm', 'verl', 'ray') if m in sys.modules])\n"
            "print(r.output)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "COLUMNS": "200"})
    first, *table = out.stdout.splitlines()
    assert first == "0 []", out.stdout + out.stderr
    # the demo's stages read each curriculum question 2-3 times on purpose (measured: docs/benchmarks/nano.md), so
    # the budget check's warning is the one non-green line it may show
    assert not [line for line in table if " FAIL " in line or (" warn " in line and "│ budget " not in line)]
    statuses = {name: status for name, status in _statuses(load_config(CONFIGS / "nano.yaml")).items()
                if not name.startswith("budget ")}
    assert set(statuses.values()) <= {"ok", "-"}


def test_cluster_configs_here_say_what_is_missing_and_the_fix():
    result = CliRunner().invoke(app, ["doctor", str(CONFIGS / "sirius32b.yaml")], env={"COLUMNS": "250"})
    assert result.exit_code == 1
    report = doctor_report(load_config(CONFIGS / "sirius32b.yaml"))
    failed = {c.name: c for c in report.checks if c.status == "FAIL"}
    assert {"GPUs", "model.path", "databases", "reward server", "vllm", "flash-attn"} <= failed.keys()
    assert all(c.fix for c in failed.values())
    assert "scripts/reward_server_per_node.sh" in failed["reward server"].fix
    assert "verl.attn_implementation=sdpa" in failed["flash-attn"].fix
    phases = [(stage, p.phase, p.fits) for stage, plans in report.plans for p in plans]
    assert [(s, f) for s, _, f in phases] == [("stage1", True)] * 3 + [("stage2", True)] * 3
    assert "published config of qwen2.5-coder-32b" in report.shape_source
    assert "memory plan per GPU" in result.output and "tensor parallel 4, 8 Ray actor(s)" in result.output


def test_a_phase_that_does_not_fit_fails_the_doctor_and_the_dry_run():
    cfg = load_config(CONFIGS / "sirius32b.yaml", ["verl.rollout_tp=1"])  # 61 GiB of weights per GPU
    report = doctor_report(cfg)
    assert report.failed
    assert {p.phase for _, plans in report.plans for p in plans if not p.fits} == {"rollout (vLLM in verl)"}
    dry = CliRunner().invoke(app, ["train", str(CONFIGS / "sirius32b.yaml"), "verl.rollout_tp=1", "--dry-run"])
    assert dry.exit_code == 2 and "DOES NOT FIT" in dry.output


def test_databases_are_opened_read_only_and_missing_ones_named(demo_db_root, tmp_path):
    root = tmp_path / "dbs"
    (root / "retail").mkdir(parents=True)
    (root / "retail" / "retail.sqlite").write_bytes((demo_db_root / "retail" / "retail.sqlite").read_bytes())
    (root / "clinic").mkdir()
    (root / "clinic" / "clinic.sqlite").write_bytes(b"not a database" * 100)
    cfg = load_config(CONFIGS / "nano.yaml", [f"data.db_root={root}", "data.build_demo_dbs=false",
                                              "data.generated_train_dbs=0", "data.generated_eval_dbs=0",
                                              "data.train_dbs=[retail,library]", "data.eval_dbs=[clinic]"])
    (check,) = [c for c in doctor_report(cfg).checks if c.name == "databases"]
    assert check.status == "FAIL" and "missing: library" in check.detail and "clinic (file is not a database)" in \
        check.detail and "<db_root>/<db_id>/<db_id>.sqlite" in check.fix


def test_the_reward_server_must_be_ours_for_the_configs_databases(demo_db_root, tmp_path):
    with running_server(ServerConfig(demo_db_root, workers=1)) as ours:
        ok = load_config(CONFIGS / "nano.yaml", [f"data.db_root={demo_db_root}", f"reward.url={ours.url}"])
        assert _statuses(ok)["reward server"] == "ok"
        other = load_config(CONFIGS / "nano.yaml", [f"data.db_root={tmp_path}", f"reward.url={ours.url}"])
        assert _statuses(other)["reward server"] == "FAIL"
    with vllm_like_server() as port:
        cfg = load_config(CONFIGS / "nano.yaml", [f"reward.url=http://127.0.0.1:{port}"])
        (check,) = [c for c in doctor_report(cfg).checks if c.name == "reward server"]
        assert check.status == "FAIL" and "not a SIRIUS reward server" in check.detail


def test_budget_without_slack_is_flagged_with_the_size_to_use():
    cfg = load_config(CONFIGS / "nano.yaml", ["stages.0.steps=12", "stages.0.budget=96"])  # 12 x 8 prompts exactly
    (check,) = [c for c in doctor_report(cfg).checks if c.name == "budget stage1"]
    assert check.status == "warn" and "stages.0.budget=192" in check.fix
    roomy = load_config(CONFIGS / "nano.yaml", ["stages.0.steps=12", "stages.0.budget=192"])
    assert [c.status for c in doctor_report(roomy).checks if c.name == "budget stage1"] == ["ok"]


def test_train_runs_the_cheap_checks_first_and_starts_nothing(tmp_path):
    result = CliRunner().invoke(app, ["train", str(CONFIGS / "nano.yaml"), f"output_dir={tmp_path}",
                                      f"data.db_root={tmp_path / 'none'}", "data.build_demo_dbs=false"])
    assert result.exit_code == 2
    assert "error: databases:" in result.output and "nothing was started" in result.output
    assert not (tmp_path / "nano").exists()


def test_the_32b_sft_config_names_its_missing_pool_in_doctor_and_in_sirius_sft(tmp_path):
    """configs/sft_32b.yaml as shipped: doctor and `sirius sft` both name the placeholder pool and model (no nano
    model is built); with no pool file at all the config itself says there is no training example."""
    doctor = CliRunner().invoke(app, ["doctor", str(CONFIGS / "sft_32b.yaml")], env={"COLUMNS": "250"})
    assert doctor.exit_code == 1
    rows = {line.split("│")[1].strip(): line for line in doctor.output.splitlines() if line.count("│") > 3}
    assert " FAIL " in rows["data.pool_files"] and "train_pool.jsonl not found" in rows["data.pool_files"]
    assert " FAIL " in rows["model.path"]
    sft = CliRunner().invoke(app, ["sft", str(CONFIGS / "sft_32b.yaml"), f"output_dir={tmp_path}"],
                             env={"COLUMNS": "250"})
    assert sft.exit_code == 2 and "error: data.pool_files: /shared/sirius/pools/train_pool.jsonl not found" in \
        sft.output and "nothing was started" in sft.output, sft.output
    assert not any(tmp_path.iterdir())
    for command in ("doctor", "sft"):
        empty = CliRunner().invoke(app, [command, str(CONFIGS / "sft_32b.yaml"), "data.pool_files=[]"],
                                   env={"COLUMNS": "400"})
        assert empty.exit_code == 2 and empty.output.startswith("error: data.pool_files=[]: no training examples at "
                                                                "all"), empty.output


@pytest.mark.parametrize("name", ["qwen7b_8gpu.yaml", "sirius32b.yaml", "smoke_1gpu.yaml"])
def test_shipped_verl_configs_plan_within_80_gib(name):
    report = doctor_report(load_config(CONFIGS / name), gpu_gib=80)
    assert report.plans and all(p.fits for _, plans in report.plans for p in plans)


def test_without_a_config_the_doctor_checks_this_machine_for_what_it_can_run():
    """A GPU node: against verl's tested set. A CPU-only machine (this one): the local backend, which runs here, so a
    new user's first `sirius doctor` does not fail on GPUs, vLLM and flash-attn it has no use for."""
    from sirius_train import preflight

    result = CliRunner().invoke(app, ["doctor"], env={"COLUMNS": "300"})
    output = " ".join(result.output.split())
    if preflight.query_gpus().names:
        assert "this machine against the verl tested set" in output and "tested set: ==0.9.1" in output
        return
    assert result.exit_code == 0 and " FAIL " not in result.output, result.output
    assert "this machine: no GPU visible, so the local backend on the CPU" in output
    assert "none visible: this run uses the CPU" in output and "not needed (backend: local)" in output



def test_ports_the_run_still_has_to_bind_must_be_free():
    import socket

    with socket.socket() as held:  # bound, not listening: nothing answers, yet nothing else can start there
        held.bind(("0.0.0.0", 0))
        port = held.getsockname()[1]
        cfg = load_config(CONFIGS / "nano.yaml", [f"reward.url=http://127.0.0.1:{port}"])
        (check,) = [c for c in doctor_report(cfg).checks if c.name == "ports"]
        assert check.status == "FAIL" and f"{port} (reward server)" in check.detail
    (check,) = [c for c in doctor_report(cfg).checks if c.name == "ports"]
    assert check.status == "ok" and f"free: {port}" in check.detail


def test_the_cpu_platform_is_reported_with_where_to_get_vllms_cpu_build():
    """`verl.device: cpu`: the doctor names the platform module and vLLM's CPU build, or how to build that
    environment; versions are held against constraints/verl-cpu.txt (here: the project's venv, no vLLM)."""
    from sirius_train.verl_backend.cpu_platform import vllm_cpu_build

    report = doctor_report(load_config(CONFIGS / "verl_cpu_smoke.yaml"))
    checks = {c.name: c for c in report.checks}
    platform = checks["verl CPU platform"]
    assert "GPUs" not in checks and "flash-attn" in checks and checks["flash-attn"].status == "-"
    if vllm_cpu_build() is None:
        assert platform.status == "FAIL" and "scripts/verl_cpu_venv.sh" in platform.fix
        assert checks["vllm"].status == "FAIL" and "scripts/verl_cpu_venv.sh" in checks["vllm"].fix
    else:  # the verl-on-CPU environment (make test-verl-cpu)
        assert platform.status == "ok" and "sirius_train.verl_backend.cpu_platform" in platform.detail
        assert checks["vllm"].status == "ok" and "==0.27.0" in checks["vllm"].detail


@pytest.mark.verl_cpu
def test_doctor_in_the_verl_cpu_environment_is_green():
    from conftest import import_vllm

    import_vllm()
    result = CliRunner().invoke(app, ["doctor", str(CONFIGS / "verl_cpu_smoke.yaml")], env={"COLUMNS": "250"})
    assert "verl CPU platform" in result.output and "vLLM's CPU build (0.27.0+cpu)" in " ".join(result.output.split())
    assert result.exit_code == 0, result.output


def test_doctor_and_the_dry_run_state_what_estimation_generates_beside_dapo(tmp_path):
    """Per stage: pool x k for the pass rates (again for stage 2) beside DAPO's steps x prompts x samples."""
    from tiny_run import tiny_overrides

    from sirius_train.cost import sizes
    from sirius_train.schedule import prepare_data

    nano = load_config(CONFIGS / "nano.yaml", [f"output_dir={tmp_path / 'none'}"])
    checks = {c.name: c.detail for c in doctor_report(nano).checks}
    # 23 training databases x 100 examples, 30% of them RL; stage 1: 40 steps x 8 prompts x 8 answers
    assert checks["generations stage1"] == ("pass rates 690 x k=4 = 2,760; DAPO 40 steps x 8 prompts x 8 = 2,560 "
                                            "(<= 7,680 with 3 dynamic-sampling rounds)")
    assert checks["generations stage2"].startswith("pass rates 690 x k=4 = 2,760; DAPO 30 steps x 8 prompts x 8 = ")
    assert checks["generations"].startswith("answers sampled over an RL pool of 690 and 800 held-out questions "
                                            "(planned from the config")
    dry = CliRunner().invoke(app, ["train", str(CONFIGS / "nano.yaml"), f"output_dir={tmp_path / 'none'}",
                                   "stages.1.estimate_k=8", "--dry-run"], env={"COLUMNS": "300"})
    assert dry.exit_code == 0, dry.output
    assert "stage2: pass rates 690 x k=8 = 5,520; DAPO 30 steps" in dry.output
    assert not (tmp_path / "none").exists()  # a dry run starts nothing

    tiny = load_config(CONFIGS / "nano.yaml", tiny_overrides(tmp_path))  # one database x 60, RL on all of them
    planned = sizes(tiny)
    data = prepare_data(tiny)
    written = sizes(tiny)  # a rerun counts the run folder's own data
    assert (planned.rl_pool, written.rl_pool) == (60, len(data.rl_pool))
    assert written.held_out == sum(map(len, data.eval_sets.values())) <= planned.held_out == 12
    assert written.source == f"from {tiny.run_dir / 'data'}"
    cluster = {c.name: c.detail for c in doctor_report(load_config(CONFIGS / "qwen7b_8gpu.yaml")).checks}
    assert "the pool's size is unknown here: no /shared/sirius/pools/train_pool.jsonl" in cluster["generations"]
    assert cluster["generations stage1"].startswith("pass rates pool x k=8 (8 per pool example)")
