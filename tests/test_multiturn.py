"""Multi-turn rollouts on the local backend: episodes that probe a real SQLite database, observation tokens in the
context but out of the loss, the entropy and pi_old (checked exactly against a hand-masked reference on a real
tiny Llama), hostile probes typed while the episode goes on, and the ends of an episode (answer, format failure,
out of probes or tokens) scored as the issue says."""

from __future__ import annotations

import copy
import hashlib
import re
import shutil
from dataclasses import replace

import pytest
import torch
from hostile_sql import HOSTILE
from multiturn_policy import scripted_policy

from data_synthesis.interaction import ProbeLimits, SandboxProbes, observation_segment
from data_synthesis.multiturn import generate_episodes
from data_synthesis.prompts import render_prompt
from rewards.executor import Executor
from rewards.outcome import Status
from sirius_train.config import ConfigError, EntropyConfig, StageConfig, load_config
from sirius_train.local.trainer import DAPOTrainer, TrainItem
from sirius_train.metrics import MetricsLog

PROBE_A, PROBE_B = "SELECT count(*) FROM customers", "SELECT name FROM customers"
GOLD = "SELECT count(*) FROM customers"
ANSWER = f"```sql\n{GOLD}\n```"
WORDS = ["<sql>", "</sql>", PROBE_A, PROBE_B, ANSWER]
PROMPT = render_prompt("How many customers are there?", "customers(id, name)", system="")
# "=" ends every prompt (multiturn_policy.TEMPLATE) and "\n" every observation: the two places a turn starts
ONE_PROBE = {"=": "<sql>", "<sql>": PROBE_A, PROBE_A: "</sql>", "\n": ANSWER}
BRANCHING = {"=": ["<sql>", ANSWER], "<sql>": [PROBE_A, PROBE_B], PROBE_A: "</sql>", PROBE_B: "</sql>",
             "\n": ["<sql>", ANSWER]}
STAGE = StageConfig(name="mt", lr=1e-3, warmup_steps=0, mini_batches=1, micro_batch_size=3, grad_clip=1e9,
                    temperature=1.0, n_samples=4, prompts_per_step=2, max_new_tokens=16, overlong_cache=0,
                    old_logprobs="recompute", entropy=EntropyConfig(mode="fixed", coef=0.05))


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Decoding a tiny model is a few hundred small matmuls: on a shared 2-core machine a second intra-op thread
    only waits for the first (measured: 30x slower under load)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def db_root(demo_db_root, tmp_path):
    (tmp_path / "retail").mkdir()
    shutil.copy(demo_db_root / "retail" / "retail.sqlite", tmp_path / "retail" / "retail.sqlite")
    return tmp_path


def _digest(db_root) -> str:
    return hashlib.sha256((db_root / "retail" / "retail.sqlite").read_bytes()).hexdigest()


def _episodes(model, tokenizer, db_root, limits=ProbeLimits(), prompts=(PROMPT,), **sampling):
    with SandboxProbes(db_root, limits) as probes:
        return generate_episodes(model, tokenizer, list(prompts), lambda i, sql: probes("retail", sql), limits,
                                 **sampling)


def _observation_positions(tokenizer, ids: list[int]) -> set[int]:
    """Token positions inside an observation segment, found from the decoded text alone (not from any mask)."""
    pieces = [tokenizer.decode([t]) for t in ids]
    starts = [sum(map(len, pieces[:j])) for j in range(len(pieces))]
    spans = [m.span() for m in re.finditer(r"\n<observation>\n.*?\n</observation>\n", "".join(pieces), re.DOTALL)]
    return {j for j, s in enumerate(starts) if any(a <= s < b for a, b in spans)}


def _reference(model, tokenizer, roll, temperature: float = 1.0):
    """Per episode, with no padding, no cache and no mask: (log-probs, entropies) of every response token from one
    full forward, and the positions of the model's own tokens (all but the observations')."""
    out = []
    for i in range(len(roll.texts)):
        prompt = roll.prompt_ids[i][roll.prompt_mask[i].bool()]
        response = roll.response_ids[i][:int(roll.response_mask[i].sum())]
        ids = torch.cat([prompt, response])[None]
        log_p = torch.log_softmax(model(input_ids=ids).logits[0, len(prompt) - 1:-1].float() / temperature, dim=-1)
        lp = log_p.gather(1, response[:, None])[:, 0]
        entropy = -(log_p.exp() * log_p).sum(dim=-1)
        observed = _observation_positions(tokenizer, response.tolist())
        out.append((lp, entropy, [j for j in range(len(response)) if j not in observed]))
    return out


def test_an_episode_probes_reads_the_observation_and_answers_with_only_its_own_tokens_in_the_loss(db_root):
    model, tokenizer = scripted_policy(WORDS, ONE_PROBE)
    roll = _episodes(model, tokenizer, db_root, n=2, temperature=0.0)
    with SandboxProbes(db_root, ProbeLimits()) as probes:
        observation = probes("retail", PROBE_A)
    assert observation.splitlines()[1:3] == ["ok: 1 row", "count(*)"]
    assert roll.texts == [f"<sql>{PROBE_A}</sql>{observation_segment(observation)}{ANSWER}"] * 2
    assert roll.answers == [GOLD] * 2 and roll.probes.tolist() == [1, 1] and not roll.truncated.any()
    n_obs = len(tokenizer(observation_segment(observation), add_special_tokens=False)["input_ids"])
    assert roll.loss_mask[0].tolist() == [1, 1, 1] + [0] * n_obs + [1]  # <sql>, probe, </sql> | observation | answer
    assert roll.response_mask[0].tolist() == [1] * (4 + n_obs)  # ... all of it attended to
    assert roll.lengths.tolist() == [4, 4]  # model tokens only: what overlong shaping counts


def test_pi_old_is_kept_for_model_tokens_only_and_equals_a_full_forward_across_turns(db_root):
    """The recorded pi_old comes from the KV cache carried over the turns; a full forward over prompt, turns and
    observations gives the same log-probs and entropies on every model token, and pi_old is 0 on observations."""
    model, tokenizer = scripted_policy(WORDS, BRANCHING, margin=9.0, noise=0.05)
    torch.manual_seed(0)
    roll = _episodes(model, tokenizer, db_root, ProbeLimits(max_turns=2, max_rows=1, max_chars=60), prompts=[
        PROMPT, render_prompt("Name the customers.", "customers(id, name)", system="")], n=4, temperature=1.0,
        max_new_tokens=12, record_logprobs=True)
    assert {0, 1, 2} <= set(roll.probes.tolist())  # episodes that answered at once, after one probe, after two
    with torch.no_grad():
        reference = _reference(model, tokenizer, roll)
    for i, (lp, entropy, own) in enumerate(reference):
        mask = roll.loss_mask[i][:len(lp)].bool()
        assert mask.nonzero().flatten().tolist() == own  # the loss mask is exactly the model's own tokens
        assert torch.allclose(roll.old_log_prob[i][:len(lp)][mask], lp[mask], atol=1e-5)
        assert torch.allclose(roll.old_entropy[i][:len(lp)][mask], entropy[mask], atol=1e-5)
        assert not roll.old_log_prob[i][~roll.loss_mask[i].bool()].any()  # nothing recorded off the model's tokens
        assert not roll.old_entropy[i][~roll.loss_mask[i].bool()].any()


def _trainer(model, tokenizer, db_root, stage=STAGE, limits=ProbeLimits(max_turns=2, max_rows=1, max_chars=60),
             executor=None):
    probes = SandboxProbes(db_root, limits)
    items = [TrainItem(PROMPT, "retail", GOLD), TrainItem(render_prompt("Name them.", "customers(id, name)",
                                                                        system=""), "retail", PROBE_B)]
    return DAPOTrainer(model, tokenizer, items, stage, executor, ckpt_dir=db_root / "ck",
                       metrics=MetricsLog(db_root / "m.jsonl"), multi_turn=limits, probe=probes)


def test_observation_tokens_get_no_gradient_and_no_weight_in_the_token_mean(db_root):
    """The EXACT test: the trainer's update (micro-batched, prompt cache, padding) has the loss and the gradients
    of a reference that keeps, by hand, only the model's own tokens of each episode (found from the text)."""
    model, tokenizer = scripted_policy(WORDS, BRANCHING, margin=9.0, noise=0.05)
    trainer = _trainer(copy.deepcopy(model), tokenizer, db_root)
    torch.manual_seed(1)
    roll = trainer.rollout([0, 1])
    assert (roll.probes > 0).any() and (roll.loss_mask == 0).logical_and(roll.response_mask == 1).any()
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 1.0, 0.0]])
    groups = [(roll.select(range(g * 4, g * 4 + 4)), rewards[g]) for g in range(2)]

    # reference: plain autograd on per-episode full forwards, token-mean over the model's own tokens only
    advantages = ((rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-6)).flatten()
    reference = _reference(model, tokenizer, roll)
    count = sum(len(own) for _, _, own in reference)
    pg = sum((-advantages[i] * torch.exp(lp[own] - lp[own].detach())).sum() for i, (lp, _, own) in
             enumerate(reference)) / count
    entropy = sum(h[own].sum() for _, h, own in reference) / count
    model.zero_grad()
    (pg - STAGE.entropy.coef * entropy).backward()
    expected = {name: p.grad.clone() for name, p in model.named_parameters()}

    names = {id(p): name for name, p in trainer.model.named_parameters()}
    seen = {}
    trainer.optimizer.register_step_pre_hook(lambda opt, args, kwargs: seen.update(
        {names[id(p)]: p.grad.clone() for group in opt.param_groups for p in group["params"]}))
    row = trainer.update(groups)
    assert row["pg_loss"] == pytest.approx(float(pg.detach()), abs=1e-6)
    assert row["entropy"] == pytest.approx(float(entropy), rel=1e-5)  # H of pi_old over the model's tokens only
    assert set(seen) == set(expected)
    for name, grad in expected.items():
        assert torch.allclose(seen[name], grad, rtol=1e-4, atol=1e-7), name
    assert any(g.abs().sum() > 0 for g in expected.values())


HOSTILE_PROBES = {name: (sql, allowed) for name, sql, allowed in HOSTILE if len(sql) < 1000}


def test_hostile_probes_are_typed_the_episodes_go_on_and_the_database_is_unchanged(db_root):
    sqls = [sql for sql, _ in HOSTILE_PROBES.values()]
    script = {"=": "<sql>", "<sql>": sqls, "\n": ["<sql>", ANSWER], **{sql: "</sql>" for sql in sqls}}
    model, tokenizer = scripted_policy(WORDS + sqls, script, margin=16.0, noise=0.0)
    before = _digest(db_root)
    torch.manual_seed(0)
    limits = ProbeLimits(max_turns=3, turn_timeout_s=0.5)
    roll = _episodes(model, tokenizer, db_root, limits, n=24, temperature=1.0, max_new_tokens=16)
    assert _digest(db_root) == before
    allowed = {sql: ok for sql, ok in HOSTILE_PROBES.values()}
    ran = []
    for text, answer in zip(roll.texts, roll.answers):
        probes = re.findall(r"<sql>(.*?)</sql>\n<observation>\n(\w+):", text, re.DOTALL)
        for sql, status in probes:
            assert Status(status) in allowed[sql], (sql, status)
        ran += [sql for sql, _ in probes]
        if probes and answer is not None:
            assert answer == GOLD and text.endswith(ANSWER)  # the episode went on past its hostile probes
    assert len(set(ran)) >= len(sqls) // 2  # most of the hostile list was really run
    assert any(p > 0 and a == GOLD for p, a in zip(roll.probes.tolist(), roll.answers))


def test_no_final_answer_is_a_format_failure_and_running_out_of_probes_or_tokens_is_truncated(db_root):
    stop_at_once, _ = scripted_policy(WORDS, {"=": "<eos>"})
    always_probe, tokenizer = scripted_policy(WORDS, {**ONE_PROBE, "\n": "<sql>"})
    roll = _episodes(stop_at_once, tokenizer, db_root, n=1, temperature=0.0)
    assert roll.answers == [None] and not roll.truncated.any() and roll.lengths.tolist() == [1]  # the EOS
    roll = _episodes(always_probe, tokenizer, db_root, ProbeLimits(max_turns=2), n=1, temperature=0.0)
    assert roll.answers == [None] and roll.truncated.all() and roll.probes.tolist() == [2]
    assert roll.texts[0].count("<observation>") == 2 and roll.texts[0].endswith("</sql>")  # the third never ran
    roll = _episodes(always_probe, tokenizer, db_root, ProbeLimits(max_turns=5), n=1, temperature=0.0,
                     max_new_tokens=5)
    assert roll.answers == [None] and roll.truncated.all() and roll.lengths.tolist() == [5]
    assert roll.probes.tolist() == [1]  # <sql> probe </sql> | observation | <sql> probe: the budget ran out

    with Executor(db_root, workers=0) as executor:
        trainer = _trainer(stop_at_once, tokenizer, db_root, executor=executor)
        items = [trainer.items[0]]
        no_answer = _episodes(stop_at_once, tokenizer, db_root, n=1, temperature=0.0)
        assert trainer.score(no_answer, items)[1].tolist() == [-1.0]  # format failure


def test_an_episode_never_runs_past_the_models_positions(db_root):
    """After an observation one position was left for the answer, and nothing stopped the model's next tokens at the
    limit: an episode that rambled after its observation ran past max_position_embeddings."""
    model, tokenizer = scripted_policy(WORDS, {**ONE_PROBE, "\n": "a", "a": "a"})  # after the observation: a, a, ...
    roll = _episodes(model, tokenizer, db_root, n=1, temperature=0.0, max_new_tokens=200)
    whole = int(roll.attention_mask.sum())  # unbounded: the prompt, the probe, the observation, 197 a's
    model.config.max_position_embeddings = whole - 150
    roll = _episodes(model, tokenizer, db_root, n=1, temperature=0.0, max_new_tokens=200)
    assert int(roll.attention_mask.sum()) == model.config.max_position_embeddings  # to the last position, not past
    assert roll.truncated.all() and roll.probes.tolist() == [1] and roll.answers == [None]


def test_overlong_shaping_counts_model_tokens_only(db_root):
    model, tokenizer = scripted_policy(WORDS, ONE_PROBE)
    stage = replace(STAGE, max_new_tokens=8, overlong_cache=4)  # 4 model tokens: inside L_max - L_cache
    with Executor(db_root, workers=0) as executor:
        trainer = _trainer(model, tokenizer, db_root, stage=stage, executor=executor)
        roll = _episodes(model, tokenizer, db_root, n=2, temperature=0.0)
        assert int(roll.response_mask.sum(1).min()) > 8  # observations included, the episode is far past L_max
        correct, rewards = trainer.score(roll, [trainer.items[0]] * 2)
    assert correct.all() and rewards.tolist() == [1.0, 1.0]


def test_a_multi_turn_step_logs_probes_and_a_single_turn_step_does_not(db_root):
    model, tokenizer = scripted_policy(WORDS, BRANCHING, margin=9.0, noise=0.05)
    with Executor(db_root, workers=0) as executor:
        trainer = _trainer(model, tokenizer, db_root, stage=replace(STAGE, max_gen_rounds=2), executor=executor)
        torch.manual_seed(3)
        trainer.step = 1
        row = trainer.train_step()
        assert 0 < row["probe_share"] <= 1 and row["turns_mean"] >= row["probe_share"]
        single = DAPOTrainer(model, tokenizer, trainer.items, STAGE, executor, ckpt_dir=db_root / "ck1",
                             metrics=MetricsLog(db_root / "m1.jsonl"))
        single.step = 1
        assert "turns_mean" not in single.train_step()
    with pytest.raises(ValueError, match="need both"):
        DAPOTrainer(model, tokenizer, trainer.items, STAGE, None, ckpt_dir=db_root, metrics=trainer.metrics,
                    multi_turn=ProbeLimits())


@pytest.mark.parametrize("override, message", [
    ("rollout.multi_turn.max_turns=0", "probes allowed per episode"),
    ("rollout.multi_turn.max_rows=0", "result rows"),
    ("rollout.multi_turn.max_chars=10", ">= 40 characters"),
    ("rollout.multi_turn.turn_timeout_s=0", "deadline"),
    ("rollout.multi_turn.max_turn=2", "did you mean 'max_turns'"),
])
def test_multi_turn_config_is_validated(override, message):
    assert not load_config(None).rollout.multi_turn.enabled  # off by default
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])
