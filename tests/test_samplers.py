import pytest
from fake_openai import FakeOpenAIServer

from data_synthesis.prompts import render_prompt
from data_synthesis.samplers import HFSampler, OpenAISampler, Sampler


def _tiny_model():
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(["<pad>", "<eos>"] + [chr(i) for i in range(32, 127)] + ["\n"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(vocab), hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                                         max_position_embeddings=8192, pad_token_id=0, eos_token_id=1,
                                         bos_token_id=1))
    return model, tokenizer


def test_hf_sampler_shapes_and_seed():
    model, tokenizer = _tiny_model()
    sampler = HFSampler(model, tokenizer, batch_size=3)
    assert isinstance(sampler, Sampler)
    prompts = [render_prompt("q1", "t(a)", system=""), render_prompt("a longer question", "t(a)", system="")]
    a = sampler.sample(prompts, 2, temperature=1.0, max_new_tokens=5, seed=3)
    b = sampler.sample(prompts, 2, temperature=1.0, max_new_tokens=5, seed=3)
    assert len(a) == 2 and all(len(x) == 2 for x in a)
    assert a == b  # seeded
    greedy = sampler.sample(prompts, 1, temperature=0.0, max_new_tokens=4)
    assert all(isinstance(t, str) for x in greedy for t in x)


def test_hf_sampler_missing_path_is_clear(tmp_path):
    with pytest.raises(FileNotFoundError, match="never downloaded"):
        HFSampler(tmp_path / "nope")


def test_openai_sampler_against_real_http():
    with FakeOpenAIServer(lambda msgs, i: f"```sql\nSELECT {i}\n```") as server:
        sampler = OpenAISampler(server.url, "m", concurrency=2)
        out = sampler.sample([render_prompt("q", "t")] * 3, 2, temperature=0.8, seed=10)
    assert out == [["```sql\nSELECT 0\n```", "```sql\nSELECT 1\n```"]] * 3
    # n=2 per request: a vLLM server seeds answer j with request + j, so prompt i's request is (10 + i) * 2
    assert sorted(r["seed"] for r in server.requests) == [20, 22, 24]


def test_hf_sampler_counts_the_tokens_it_generated():
    import torch
    from multiturn_policy import scripted_policy

    from data_synthesis.generation import generate
    from data_synthesis.prompts import chat_text
    from data_synthesis.samplers import TokenUsage

    def prompt_tokens(tokenizer, p):
        return len(tokenizer(chat_text(tokenizer, p), add_special_tokens=False)["input_ids"])

    prompts = [render_prompt("q1", "t(a)", system=""), render_prompt("a longer question", "t(a)", system="")]
    model, tokenizer = _tiny_model()  # random characters: most answers run to max_new_tokens, some sample EOS
    sampler = HFSampler(model, tokenizer, batch_size=4)
    sampler.sample(prompts, 3, temperature=1.0, max_new_tokens=6, seed=3)
    torch.manual_seed(3)  # the same rollout, read directly: 3 rows per prompt
    rollout = generate(model, tokenizer, prompts, n=3, temperature=1.0, max_new_tokens=6, batch_size=4)
    assert sampler.last_usage == [TokenUsage(prompt_tokens(tokenizer, p), int(rollout.lengths[3 * i:3 * i + 3].sum()),
                                             3, int(rollout.truncated[3 * i:3 * i + 3].sum()))
                                  for i, p in enumerate(prompts)]
    assert 0 < int(rollout.truncated.sum()) < 6 and set(rollout.lengths[rollout.truncated].tolist()) == {6}
    model, tokenizer = scripted_policy([], {"=": "<eos>"})  # answers EOS at once: one token, not at the limit
    sampler = HFSampler(model, tokenizer, batch_size=4)
    assert sampler.sample(prompts, 2, temperature=0.0, max_new_tokens=6) == [["", ""]] * 2
    assert sampler.last_usage == [TokenUsage(prompt_tokens(tokenizer, p), 2, 2, 0) for p in prompts]


def test_openai_sampler_reports_the_servers_usage():
    from data_synthesis.samplers import TokenUsage

    with FakeOpenAIServer(lambda msgs, i: "SELECT a FROM t" if i == 0 else "SELECT a , b , c FROM t") as server:
        sampler = OpenAISampler(server.url, "m")
        prompt = [{"role": "user", "content": "three words here"}]
        sampler.sample([prompt], 2, max_new_tokens=5)
    assert sampler.last_usage == [TokenUsage(3, 4 + 5, 2, 1)]
