"""Experiment tracking: metrics.jsonl rows mirrored to a real wandb offline run and real tensorboard event files."""

import json
import struct
import sys
import time

import pytest

from data_synthesis.extras import MissingExtra
from sirius_train.metrics import MetricsLog, wandb_mode

ROWS = [{"stage": "sft", "step": 10, "sft_loss": 2.5},
        {"stage": "sft", "step": 20, "sft_loss": 1.25, "eval_per_db": {"clinic": 0.5}},
        {"stage": "stage1", "step": 1, "pg_loss": -0.1, "entropy": 0.9, "note": "not a number"},
        {"stage": "stage1", "step": -1, "eval": "final", "eval_exec_acc": 0.375}]


def wandb_history(run_file, timeout_s: float = 60.0) -> list[dict]:
    """History rows of a `.wandb` file, once wandb has written its exit record (its core process writes the file
    on its own schedule: `finish()` can return before the records are on disk)."""
    deadline = time.monotonic() + timeout_s
    while True:
        records = _wandb_records(run_file)
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    return [{(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in r.history.item}
            for r in records if r.WhichOneof("record_type") == "history"]


def _wandb_records(run_file) -> list:
    """The `Record` protobufs of wandb's record log: a 7-byte header, then 32 KiB blocks of
    checksum/length/type-framed chunks."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = run_file.read_bytes()
    assert data[:4] == b":W&B", "not a wandb run file"
    records, pos, pending = [], 7, b""
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # block trailer too short for a header: padding
            pos += 32768 - pos % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST chunk: a whole record
            record = pb.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def test_wandb_offline_run_directory_holds_the_metrics(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    log = MetricsLog(tmp_path / "run" / "metrics.jsonl", ["wandb"], project="sirius-test", run_name="t")
    for row in ROWS:
        log.log(row)
    log.close()
    assert [r["stage"] for r in log.rows()] == ["sft", "sft", "stage1", "stage1"]  # the JSONL record is intact
    run_dirs = list((tmp_path / "run" / "wandb").glob("offline-run-*"))
    assert len(run_dirs) == 1
    history = wandb_history(next(run_dirs[0].glob("run-*.wandb")))
    logged = [{k: v for k, v in h.items() if not k.startswith("_")} for h in history]
    assert logged == [
        {"sft/step": 10, "sft/sft_loss": 2.5},
        {"sft/step": 20, "sft/sft_loss": 1.25, "sft/eval_per_db/clinic": 0.5},
        {"stage1/step": 1, "stage1/pg_loss": -0.1, "stage1/entropy": 0.9},
        {"stage1/step": 1, "stage1/eval_exec_acc": 0.375},  # the final evaluation, at the stage's last step
    ]
    run_id = (tmp_path / "run" / "wandb_run_id").read_text()
    assert f"-{run_id}" in run_dirs[0].name

    # a resumed run continues the same wandb run id
    log = MetricsLog(tmp_path / "run" / "metrics.jsonl", ["wandb"], project="sirius-test", run_name="t")
    log.log({"stage": "stage1", "step": 2, "pg_loss": 0.0})
    log.close()
    resumed = list((tmp_path / "run" / "wandb").glob("offline-run-*"))  # "-1" is added within the same second
    assert len(resumed) == 2 and all(f"-{run_id}" in d.name for d in resumed)


def test_wandb_without_api_key_goes_offline_instead_of_prompting(tmp_path, monkeypatch):
    for var in ("WANDB_MODE", "WANDB_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    assert wandb_mode() == "offline"
    (tmp_path / "netrc").write_text("machine api.wandb.ai login user password " + "k" * 40 + "\n")
    (tmp_path / "netrc").chmod(0o600)
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    assert wandb_mode() is None  # credentials found: wandb's own default (online)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert wandb_mode() == "disabled"


def test_tensorboard_event_files_hold_the_metrics(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log = MetricsLog(tmp_path / "metrics.jsonl", ["tensorboard"])
    for row in ROWS:
        log.log(row)
    log.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    scalars = {tag: [(e.step, round(e.value, 6)) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    assert scalars == {"sft/sft_loss": [(10, 2.5), (20, 1.25)], "sft/eval_per_db/clinic": [(20, 0.5)],
                       "stage1/pg_loss": [(1, -0.1)], "stage1/entropy": [(1, 0.9)], "stage1/eval_exec_acc": [(1, 0.375)]}


def test_backend_asked_for_but_not_installed_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # what `import wandb` meets on a machine without it
    with pytest.raises(MissingExtra, match=r"logging.backends: wandb needs wandb.*pip install 'sirius-sql\[wandb\]'"):
        MetricsLog(tmp_path / "metrics.jsonl", ["wandb"])
    with pytest.raises(ValueError, match=r"unknown logging backend\(s\) \['mlflow'\]"):
        MetricsLog(tmp_path / "metrics.jsonl", ["mlflow"])


@pytest.mark.slow
def test_unreachable_wandb_server_is_a_warning_not_a_crash(tmp_path, monkeypatch, capsys):
    """An API key, online mode and a server that refuses connections: wandb gives up after its init timeout."""
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # the discard port: nothing listens
    monkeypatch.setenv("WANDB_INIT_TIMEOUT", "5")
    log = MetricsLog(tmp_path / "metrics.jsonl", ["wandb", "tensorboard"])
    log.log({"stage": "sft", "step": 1, "loss": 1.0})
    log.close()
    assert log.rows()[0]["loss"] == 1.0 and any((tmp_path / "tensorboard").iterdir())
    assert "wandb could not start, continuing without it" in " ".join(capsys.readouterr().err.split())
