"""Pass rates fanned out over a real local Ray cluster (2 CPU actors, the HF sampler standing in for vLLM) are
exactly those of one process, and land in the same on-disk cache."""

from functools import partial

import pytest
from conftest import import_verl

from data_synthesis.difficulty import estimate
from data_synthesis.extras import MissingExtra
from data_synthesis.prompts import PromptFormat
from data_synthesis.samplers import HFSampler
from data_synthesis.sqlgen.rules import RULES
from data_synthesis.sqlgen.synthesize import synthesize

ray = import_verl("ray")

K = 4
FORMAT = PromptFormat(schema_style="compact", schema_samples=0, system="")
SAMPLING = {"temperature": 1.0, "max_new_tokens": 32, "seed": 7, "batch_size": 3, "prompt_format": FORMAT}


@pytest.fixture(scope="module")
def policy(demo_db_root, tmp_path_factory):
    """A small model fine-tuned on a dozen retail questions: pass rates spread over [0, 1], so equal rates mean
    equal answers, not two runs that both fail everything."""
    import torch

    from data_synthesis.difficulty import prompt_for
    from sirius_train.local.model import NanoModelConfig, build_nano_model, train_tokenizer
    from sirius_train.local.sft import answer_text, train_sft

    torch.set_num_threads(1)  # what each single-CPU actor uses; on a busy 2-core machine also much faster
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
    return out / "model", pool


@pytest.fixture(scope="module")
def cluster():
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_fanout_gives_the_one_process_estimates_and_cache(policy, cluster, demo_db_root, tmp_path):
    from data_synthesis.ray_sampler import distributed_estimate

    path, pool = policy
    one = estimate(pool, HFSampler(path, batch_size=16, device="cpu"), demo_db_root, K,
                   cache_path=tmp_path / "one.jsonl", **SAMPLING)
    fanned = distributed_estimate(pool, partial(HFSampler, str(path), batch_size=16, device="cpu"), demo_db_root, K,
                                  actors=2, num_cpus=1, cache_path=tmp_path / "ray.jsonl", **SAMPLING)
    rates = [e.pass_rate for e in one]
    assert any(0 < r < 1 for r in rates) and len(set(rates)) >= 3, rates  # a spread, not all-or-nothing
    assert [e.to_json() for e in fanned] == [e.to_json() for e in one]
    assert (tmp_path / "ray.jsonl").read_text() == (tmp_path / "one.jsonl").read_text()  # same lines, same order

    class Refuse:
        def sample(self, *a, **k):
            raise AssertionError("everything is in the cache")

    resumed = estimate(pool, Refuse(), demo_db_root, K, cache_path=tmp_path / "ray.jsonl", **SAMPLING)
    assert resumed == fanned  # a one-process run resumes from the fanned-out cache


def test_planned_calls_are_generated_ahead_and_errors_come_through(policy, cluster, demo_db_root):
    from data_synthesis.ray_sampler import RaySampler, estimate_calls
    from data_synthesis.vllm_sampler import VLLMSampler

    path, pool = policy
    prompts = [[{"role": "user", "content": f"question {i}"}] for i in range(6)]
    calls = estimate_calls(prompts, 2, batch_size=2, seed=1, temperature=1.0, top_p=1.0, max_new_tokens=6)
    reference = HFSampler(path, batch_size=16, device="cpu")
    with RaySampler(partial(HFSampler, str(path), batch_size=16, device="cpu"), 2, num_cpus=1) as sampler:
        sampler.expect(calls)
        for chunk, n, options in calls:
            assert sampler.sample(chunk, n, **options) == reference.sample(chunk, n, **options)
        assert sampler.stats == {"prefetched": 3, "on_demand": 0}
        assert sampler.sample(prompts[:1], 1, temperature=0.0, max_new_tokens=4) == \
            reference.sample(prompts[:1], 1, temperature=0.0, max_new_tokens=4)
        assert sampler.stats["on_demand"] == 1

    with pytest.raises(ValueError, match=r"3 actors x 1 CPU = 3 CPUs, but the Ray cluster has 2"):
        RaySampler(partial(HFSampler, str(path)), 3, num_cpus=1)
    try:
        import vllm  # noqa: F401
    except ImportError:  # the usual CPU machine: the actor's own error, naming the extra, not Ray's wrapper
        with pytest.raises(MissingExtra, match=r"pip install 'sirius-sql\[vllm\]'"):
            RaySampler(partial(VLLMSampler, str(path)), 1, num_cpus=1)
