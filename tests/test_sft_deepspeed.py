"""DeepSpeed configs for the SFT: the shipped ZeRO-2/3 configs pass transformers' DeepSpeed integration and
DeepSpeed's own parser; a wrong stage, broken batch arithmetic or an unknown key is a clear error when
`sirius sft` / `sirius train` load the run (not at step 1 of a cluster job)."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sirius_train.cli import app
from sirius_train.config import ConfigError, load_config

pytest.importorskip("deepspeed")

from sirius_train.local.deepspeed_config import DeepSpeedConfigError  # noqa: E402
from sirius_train.local.sft import check_run_config, check_sft_deepspeed  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NANO = ROOT / "configs" / "nano.yaml"
SHIPPED = sorted((ROOT / "configs" / "deepspeed").glob("*.json"))


def _load_checked(path, overrides):
    """What `sirius sft` does before it starts: the run config, then the SFT engine's DeepSpeed rules."""
    cfg = load_config(path, overrides)
    check_run_config(cfg)
    return cfg


def _variant(tmp_path, base: str, **changes) -> str:
    """A copy of a shipped config with `changes` (dotted keys) applied."""
    config = json.loads((ROOT / "configs" / "deepspeed" / base).read_text())
    for key, value in changes.items():
        node = config
        *parents, leaf = key.split("__")
        for p in parents:
            node = node[p]
        node[leaf] = value
    path = tmp_path / f"{base}-{len(list(tmp_path.iterdir()))}.json"
    path.write_text(json.dumps(config))
    return str(path)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
@pytest.mark.parametrize("world_size", [1, 8])
def test_shipped_configs_fill_from_the_run_config(path, world_size):
    cfg = load_config(NANO, [f"sft.deepspeed={path}", "sft.batch_size=4", "sft.gradient_accumulation_steps=2",
                             "sft.lr=1e-5", "device=cpu"])
    filled = check_sft_deepspeed(cfg.sft, device="cpu", world_size=world_size)
    assert filled["train_micro_batch_size_per_gpu"] == 4
    assert filled["gradient_accumulation_steps"] == 2
    assert filled["train_batch_size"] == 4 * 2 * world_size
    assert filled["gradient_clipping"] == 1.0 and filled["bf16"]["enabled"] is False  # CPU: no bf16
    assert filled["zero_optimization"]["stage"] in (2, 3)
    if "optimizer" in filled:
        assert filled["optimizer"]["params"]["lr"] == 1e-5


def test_wrong_stage_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"zero_optimization.stage=4: DeepSpeed ZeRO has stages 0, 1, 2, 3; use 2"):
        _load_checked(NANO, [f"sft.deepspeed={_variant(tmp_path, 'zero3.json', zero_optimization__stage=4)}"])
    offload = _variant(tmp_path, "zero3_offload.json", zero_optimization__stage=2)
    with pytest.raises(ConfigError, match=r"offload_param with stage=2: parameter offload needs ZeRO-3"):
        _load_checked(NANO, [f"sft.deepspeed={offload}"])


def test_batch_arithmetic_is_checked_at_the_launch_world_size(tmp_path):
    explicit = _variant(tmp_path, "zero2.json", train_batch_size=32, train_micro_batch_size_per_gpu=4,
                        gradient_accumulation_steps=2)
    cfg = load_config(NANO, [f"sft.deepspeed={explicit}", "sft.batch_size=4", "sft.gradient_accumulation_steps=2",
                             "device=cpu", "sft.enabled=false"])  # sft off: nothing checked at load
    assert check_sft_deepspeed(cfg.sft, device="cpu", world_size=4)["train_batch_size"] == 32  # 4 x 2 x 4
    with pytest.raises(DeepSpeedConfigError, match=r"sft.batch_size=4 per GPU x sft.gradient_accumulation_steps=2 "
                                                   r"x 2 processes = 16, but the DeepSpeed config says "
                                                   r"\{'train_batch_size': 32"):
        check_sft_deepspeed(cfg.sft, device="cpu", world_size=2)
    with pytest.raises(ConfigError, match=r"sft.batch_size=8 per GPU .* = 8, .*set these keys to \"auto\""):
        _load_checked(NANO, [f"sft.deepspeed={explicit}", "sft.batch_size=8"])  # this process alone: world size 1
    clipping = _variant(tmp_path, "zero2.json", gradient_clipping=0.5)
    with pytest.raises(ConfigError, match=r"ds gradient_clipping=0.5 vs hf max_grad_norm=1.0"):
        _load_checked(NANO, [f"sft.deepspeed={clipping}"])


def test_deepspeed_parser_rejects_unknown_keys_and_files_are_checked(tmp_path):
    typo = _variant(tmp_path, "zero3.json", zero_optimization__stage3_max_live_params=10)
    with pytest.raises(ConfigError, match=r"DeepSpeed rejects the config: .*stage3_max_live_params .*Extra inputs"):
        _load_checked(NANO, [f"sft.deepspeed={typo}"])
    with pytest.raises(ConfigError, match=r"sft.deepspeed='nope.json': no such file"):
        _load_checked(NANO, ["sft.deepspeed=nope.json"])
    broken = tmp_path / "broken.json"
    broken.write_text('{"zero_optimization": {"stage": 3,}}')
    with pytest.raises(ConfigError, match=r"not valid JSON \(.*line 1"):
        _load_checked(NANO, [f"sft.deepspeed={broken}"])


def test_sirius_sft_reports_a_bad_config_in_one_line(tmp_path):
    result = CliRunner().invoke(app, ["sft", str(NANO), f"output_dir={tmp_path}",
                                      f"sft.deepspeed={_variant(tmp_path, 'zero2.json', zero_optimization__stage=7)}"])
    assert result.exit_code == 2
    output = " ".join(result.output.split())
    assert "error: sft.deepspeed=" in output and "zero_optimization.stage=7" in output
    assert "Traceback" not in output and not any(tmp_path.glob("*/config.yaml"))  # nothing started


def test_the_32b_recipe_loads_and_its_deepspeed_config_fits_a_32_gpu_launch():
    cfg = load_config(ROOT / "configs" / "sft_32b.yaml", ["model.path=/models/coder-32b", "device=cuda"])
    assert cfg.sft.deepspeed == "configs/deepspeed/zero3.json" and cfg.sft.gradient_checkpointing
    filled = check_sft_deepspeed(cfg.sft, device="cuda", world_size=32)
    assert filled["train_batch_size"] == 1 * 4 * 32 and filled["zero_optimization"]["stage"] == 3
