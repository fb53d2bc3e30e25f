"""Where a sampled response ends: at EOS or the closed SQL block, never at a pad token the policy sampled."""

from __future__ import annotations

import pytest
import torch
from tokenizers import decoders
from test_samplers import _tiny_model

from data_synthesis.generation import SQLBlockClosed, generate, stop_lengths
from data_synthesis.prompts import FALLBACK_TEMPLATE, render_prompt

PAD, EOS = 0, 1


def _biased_model(bias: dict[str, float], default: float = -1e4):
    """The tiny char-level Llama with logits fixed by a bias: token probabilities we choose, whatever the prompt."""
    model, tokenizer = _tiny_model()
    vocab = tokenizer.get_vocab()
    head = torch.nn.Linear(model.config.hidden_size, model.config.vocab_size, bias=True)
    with torch.no_grad():
        head.weight.zero_()
        head.bias.fill_(default)
        for token, value in bias.items():
            head.bias[vocab[token]] = value
    model.lm_head = head
    assert tokenizer.pad_token_id == PAD != tokenizer.eos_token_id == EOS
    return model, tokenizer


PROMPTS = [render_prompt("q", "t(a)", system=""), render_prompt("a longer question", "t(a)", system="")]


def test_a_sampled_pad_token_does_not_end_the_response():
    model, tokenizer = _biased_model({"<pad>": 0.0, "a": 0.0})  # pad and 'a' equally likely, never EOS
    torch.manual_seed(0)
    roll = generate(model, tokenizer, PROMPTS, n=3, temperature=1.0, max_new_tokens=12, record_logprobs=True)
    assert (roll.response_ids == PAD).any(dim=1).all()  # every answer sampled pads ...
    assert roll.lengths.tolist() == [12] * 6  # ... and still runs to the length limit
    assert roll.response_mask.all() and roll.truncated.all()
    assert torch.allclose(roll.old_log_prob, torch.full_like(roll.old_log_prob, -torch.log(torch.tensor(2.0))))


def test_response_ends_at_its_first_eos_and_what_follows_is_masked():
    model, tokenizer = _biased_model({"<pad>": 0.0, "a": 0.0, "<eos>": -2.0})
    torch.manual_seed(1)
    roll = generate(model, tokenizer, PROMPTS, n=4, temperature=1.0, max_new_tokens=16)
    for ids, length, mask, cut in zip(roll.response_ids, roll.lengths, roll.response_mask, roll.truncated):
        eos = (ids == EOS).nonzero().flatten()
        if len(eos):
            assert int(length) == int(eos[0]) + 1 and not cut
        else:
            assert int(length) == 16 and cut
        assert mask.sum() == length and not mask[int(length):].any()
    assert (~roll.truncated).any() and roll.truncated.any()
    assert any((ids[:int(n)] == PAD).any() for ids, n in zip(roll.response_ids, roll.lengths))


@pytest.mark.parametrize("answer", ["```sql\nselect a\n```", "x ```SQL a``` a"])
def test_response_ends_where_the_sql_block_closes(answer):
    """The stop criterion records where each row's block closed; the filler after it is not the answer."""
    _, tokenizer = _tiny_model()
    tokenizer.backend_tokenizer.decoder = decoders.Fuse()  # characters back into text, as real tokenizers decode
    closed_at = answer.lower().index("```", answer.lower().index("```sql") + 6) + 3
    prompt = torch.tensor([[5, 6, 7]] * 2)
    rows = [tokenizer(answer, add_special_tokens=False)["input_ids"], [5] * (len(answer) + 4)]  # row 1 never closes
    stop = SQLBlockClosed(tokenizer, prompt.shape[1])
    for t in range(1, len(answer) + 1):
        done = stop(torch.cat([prompt, torch.tensor([r[:t] for r in rows])], dim=1), None)
        assert done.tolist() == [t >= closed_at, False] or t > closed_at
    resp = torch.tensor([rows[0][:closed_at] + [PAD] * 4, rows[1][:closed_at + 4]])
    length, ended_with_eos = stop_lengths(resp, stop.lengths(2), EOS)
    assert length.tolist() == [closed_at, closed_at + 4] and not ended_with_eos.any()


def test_stop_lengths_take_whichever_stop_came_first():
    resp = torch.tensor([[5, EOS, PAD, PAD], [5, 5, 5, EOS], [PAD, 5, PAD, 5], [5, EOS, PAD, PAD]])
    length, ended_with_eos = stop_lengths(resp, torch.tensor([-1, 2, -1, 3]), EOS)
    assert length.tolist() == [2, 2, 4, 2] and ended_with_eos.tolist() == [True, False, False, True]


def test_questions_on_one_schema_share_its_prefill_and_answer_as_if_asked_alone():
    """Prompts padded after their common prefix (the schema) prefill it once; greedy answers and the last
    prompt logits are those of each prompt on its own, for questions of different lengths."""
    from data_synthesis.generation import encode_prompts, prompt_cache, shared_prefix

    model, tokenizer = _tiny_model()
    with torch.no_grad():  # loud weights: answers that depend on the whole prompt, so a wrong position shows
        for w in model.parameters():
            w.add_(torch.randn_like(w) * 0.5)
    schema = "CREATE TABLE singer (id INT, name TEXT, age INT); CREATE TABLE concert (id INT, year TEXT);"
    prompts = [render_prompt(q, schema, system="") for q in ("How many?", "Name every singer older than 30.", "Ages")]
    ids, mask = encode_prompts(tokenizer, prompts, "cpu")
    own = [tokenizer(row[0]["content"], add_special_tokens=False)["input_ids"] for row in prompts]
    shared = shared_prefix(ids, mask)
    assert shared >= len(tokenizer("Database schema:\n" + schema, add_special_tokens=False)["input_ids"])
    assert [r[m.bool()].tolist() for r, m in zip(ids, mask)] == [
        tokenizer(tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True,
                                                chat_template=FALLBACK_TEMPLATE), add_special_tokens=False)["input_ids"]
        for p in prompts]  # every row holds its own prompt, only the pads moved
    assert len(set(map(len, own))) == 3
    rows = torch.arange(3)
    with torch.no_grad():
        _, once = prompt_cache(model, ids, mask, rows, shared=shared)
        _, full = prompt_cache(model, ids, mask, rows)
    assert torch.allclose(once, full, atol=1e-5)
    together = generate(model, tokenizer, prompts, n=1, temperature=0.0, max_new_tokens=12).texts
    alone = [generate(model, tokenizer, [p], n=1, temperature=0.0, max_new_tokens=12).texts[0] for p in prompts]
    assert together == alone and len(set(alone)) > 1


def test_no_answer_runs_past_the_models_positions():
    """A prompt longer than the model's context gets an empty answer (cut at the limit) instead of a generation over
    positions the model never had, and the others' answers stop at the context: the batch goes on."""
    from data_synthesis.prompts import chat_text

    model, tokenizer = _biased_model({"a": 0.0})  # never stops on its own
    short, long = PROMPTS[0], render_prompt("q " * 60, "t(a)", system="")
    width = len(tokenizer(chat_text(tokenizer, short), add_special_tokens=False)["input_ids"])
    assert len(tokenizer(chat_text(tokenizer, long), add_special_tokens=False)["input_ids"]) > width + 20
    model.config.max_position_embeddings = width + 5
    torch.manual_seed(0)
    roll = generate(model, tokenizer, [short, long, short], n=2, temperature=1.0, max_new_tokens=12,
                    record_logprobs=True)
    assert roll.lengths.tolist() == [5, 5, 0, 0, 5, 5]  # the context's room, none, and again its room
    assert roll.truncated.all() and roll.texts[2:4] == ["", ""]
    assert roll.old_log_prob.shape == roll.response_ids.shape and not roll.response_mask[2:4].any()
