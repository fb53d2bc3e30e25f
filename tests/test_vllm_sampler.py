"""The vLLM sampler: without vLLM (every CPU machine) a clear error naming the extra, from the library and from
`sirius synth estimate`; with vLLM and a GPU, answers that depend only on the prompt and its seed."""

import importlib.util

import pytest
from typer.testing import CliRunner

from data_synthesis.extras import MissingExtra
from data_synthesis.records import Example, write_examples
from sirius_train.cli import app

HAS_VLLM = importlib.util.find_spec("vllm") is not None


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    from test_samplers import _tiny_model

    model, tokenizer = _tiny_model()
    tokenizer.chat_template = ("{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
                               "{% if add_generation_prompt %}>{% endif %}")
    path = tmp_path_factory.mktemp("tiny") / "model"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed here")
def test_without_vllm_the_error_names_the_extra(tiny_checkpoint):
    from data_synthesis.vllm_sampler import VLLMSampler

    with pytest.raises(MissingExtra, match=r"the vLLM sampler needs vllm, which is not installed: "
                                           r"pip install 'sirius-sql\[vllm\]' \(or sample with the HF sampler"):
        VLLMSampler(tiny_checkpoint)


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed here")
def test_sirius_synth_estimate_engine_vllm_fails_in_one_line(tiny_checkpoint, demo_db_root, tmp_path):
    pool = tmp_path / "pool.jsonl"
    write_examples(pool, [Example("e1", "retail", "How many orders?", "SELECT COUNT(*) FROM orders")])
    result = CliRunner().invoke(app, ["synth", "estimate", "--pool", str(pool), "--db-root", str(demo_db_root),
                                      "--model", str(tiny_checkpoint), "--engine", "vllm", "--out",
                                      str(tmp_path / "rates.jsonl"), "--quiet"])
    output = " ".join(result.output.split())
    assert result.exit_code == 2, output
    assert "error: the vLLM sampler needs vllm" in output and "pip install 'sirius-sql[vllm]'" in output
    assert "Traceback" not in output and not (tmp_path / "rates.jsonl").exists()
    result = CliRunner().invoke(app, ["synth", "estimate", "--pool", str(pool), "--db-root", str(demo_db_root),
                                      "--model", str(tiny_checkpoint), "--engine", "jax", "--out",
                                      str(tmp_path / "rates.jsonl")])
    assert result.exit_code == 2 and "'jax' is not one of 'hf', 'vllm'" in " ".join(result.output.split())


@pytest.mark.skipif(not HAS_VLLM, reason="needs vLLM (pip install 'sirius-sql[vllm]') and a CUDA GPU")
def test_vllm_answers_depend_only_on_prompt_and_seed(tiny_checkpoint):
    from data_synthesis.vllm_sampler import VLLMSampler

    sampler = VLLMSampler(tiny_checkpoint, gpu_memory_utilization=0.3, max_model_len=256, enforce_eager=True)
    prompts = [[{"role": "user", "content": f"question {i}"}] for i in range(4)]
    together = sampler.sample(prompts, 3, temperature=1.0, max_new_tokens=8, seed=5)
    assert [len(a) for a in together] == [3, 3, 3, 3]
    # prompt i carries seed 5 + i, so a chunk sampled alone (as a Ray actor would) gets the same answers
    assert sampler.sample(prompts[2:], 3, temperature=1.0, max_new_tokens=8, seed=7) == together[2:]
