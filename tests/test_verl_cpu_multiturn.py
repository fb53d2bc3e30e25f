"""Multi-turn on the cluster path, run for real on this CPU: verl's `sirius_sql` agent loop with vLLM's CPU build
generating, on a nano model taught to probe (SFT on a dozen retail questions, each demo probing its own query
once and reading the real observation before it answers: `interaction.demo_episode`).

- `</sql>` as vLLM returns it: the agent loop stops each turn at the end of a probe and its parser reads the probe
  from the turn's token ids; if vLLM dropped the stop string's tokens, no probe would parse and multi-turn would
  silently be single-turn.
- One DAPO stage on verl's trainer (`VerlBackend.train_stage`, the call `sirius train` makes for a stage) with
  `rollout.multi_turn` on: the probes verl's loop parsed ran through our tool (each observation in verl's rollout
  dump is what the sandbox returns for that probe), and the observation tokens carry response-mask 0 in verl's
  batch (verl's rollout-vs-actor log-prob check, which reads only mask-1 tokens, sees none of them).

Run in .venv-verl-cpu: `make test-verl-cpu`. A failed weight sync hangs rather than exits: hard timeouts.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from conftest import import_verl, import_vllm
from verl_cpu_runs import stop_ray, verl_metrics

import_verl("verl")
import_vllm()

from data_synthesis.difficulty import prompt_for  # noqa: E402
from data_synthesis.interaction import (  # noqa: E402
    OBSERVATION_OPEN,
    PROBE_CLOSE,
    ProbeLimits,
    SandboxProbes,
    TurnKind,
    demo_episode,
    parse_turn,
    with_probe_instructions,
)
from data_synthesis.prompts import PromptFormat, chat_text  # noqa: E402
from data_synthesis.sqlgen.rules import RULES  # noqa: E402
from data_synthesis.sqlgen.synthesize import synthesize  # noqa: E402

pytestmark = [pytest.mark.verl_cpu]
ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "verl_cpu_smoke.yaml"
FORMAT = PromptFormat(schema_style="compact", schema_samples=0, system="")  # the smoke config's
LIMITS = ProbeLimits(max_turns=2, max_rows=3, max_chars=160, turn_timeout_s=1.0)  # nano_multiturn's
TAUGHT = 12


@pytest.fixture(scope="module")
def prober(demo_db_root, tmp_path_factory):
    """(model folder, taught questions, unseen questions): the nano model after SFT on TAUGHT one-probe episodes."""
    import torch

    from sirius_train.local.model import NanoModelConfig, build_nano_model, train_tokenizer
    from sirius_train.local.sft import answer_text, train_sft

    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("prober")
    pool = synthesize(demo_db_root / "retail" / "retail.sqlite", 2 * TAUGHT, seed=3, db_id="retail",
                      rules=tuple(r for r in RULES if r.name in ("count", "rows")), joins=False)
    taught, unseen = pool[:TAUGHT], pool[TAUGHT:]
    with SandboxProbes(demo_db_root, LIMITS) as probe:
        pairs = [(with_probe_instructions(prompt_for(e, demo_db_root, FORMAT), LIMITS),
                  demo_episode(e.gold_sql, probe(e.db_id, e.gold_sql), answer_text(e.gold_sql))) for e in taught]
    tokenizer = train_tokenizer([p[-1]["content"] + a for p, a in pairs] * 4, 512)
    model = build_nano_model(NanoModelConfig(vocab_size=512, hidden_size=64, intermediate_size=128,
                                             num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2),
                             tokenizer)  # head_dim 32: the least vLLM's CPU attention takes
    train_sft(model, tokenizer, pairs, out / "trainer", epochs=60, lr=5e-3, batch_size=4)
    model.save_pretrained(out / "model")
    tokenizer.save_pretrained(out / "model")
    return out / "model", taught, unseen


@pytest.mark.timeout(900)
def test_vllm_keeps_the_probe_stop_string_in_the_token_ids(prober, demo_db_root, monkeypatch):
    """Greedy first turns of the taught questions, stopped at `</sql>` as the agent loop asks, with vLLM's
    `include_stop_str_in_output` off (its default) and on: both stop on the string and return the same token ids,
    which hold the whole probe with its `</sql>`; the option changes the text only."""
    from vllm import SamplingParams

    from data_synthesis.vllm_sampler import VLLMSampler

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB (else gpu_memory_utilization x the machine's RAM)
    path, taught, _ = prober
    sampler = VLLMSampler(path, max_model_len=512, enforce_eager=True)
    try:
        tokenizer = sampler.tokenizer
        prompts = [{"prompt_token_ids": tokenizer(chat_text(tokenizer, with_probe_instructions(
            prompt_for(e, demo_db_root, FORMAT), LIMITS)), add_special_tokens=False)["input_ids"]} for e in taught]
        outs = {keep: [o.outputs[0] for o in sampler.llm.generate(prompts, SamplingParams(
            temperature=0.0, max_tokens=96, stop=[PROBE_CLOSE], include_stop_str_in_output=keep))]
            for keep in (False, True)}
    finally:
        del sampler.llm
    probed = 0
    for example, dropped, kept in zip(taught, outs[False], outs[True]):
        assert list(dropped.token_ids) == list(kept.token_ids)
        assert (dropped.finish_reason, dropped.stop_reason) == (kept.finish_reason, kept.stop_reason)
        if dropped.stop_reason != PROBE_CLOSE:  # no probe in this answer: nothing to settle
            continue
        probed += 1
        decoded = tokenizer.decode(dropped.token_ids, skip_special_tokens=True)  # what the loop's parser reads
        turn = parse_turn(decoded)
        assert turn.kind is TurnKind.PROBE and turn.sql.strip() == example.gold_sql, decoded
        assert PROBE_CLOSE not in dropped.text and kept.text == dropped.text + PROBE_CLOSE
        assert decoded.startswith(kept.text), (decoded, kept.text)
    assert probed >= TAUGHT // 2, [o.text for o in outs[True]]  # the model was taught to probe, and does


# ---------------------------------------------------------------------------------------------------------------
# one multi-turn DAPO stage on verl's trainer
# ---------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def stage(prober, demo_db_root, tmp_path_factory):
    """Stage 1 of the smoke config, multi-turn, from the prober on retail questions (taught and unseen, so that
    groups differ and DAPO's dynamic sampling keeps some); verl dumps its rollouts, with vLLM's log-probs."""
    from data_synthesis.export import write_verl_parquet
    from sirius_train.config import load_config
    from sirius_train.schedule import RunData
    from sirius_train.verl_backend import VerlBackend

    path, taught, unseen = prober
    work = tmp_path_factory.mktemp("vmt")
    ray_dir = Path(f"/tmp/vmt{os.getpid()}")  # Ray's socket paths must stay short
    cfg = load_config(CONFIG, [
        f"output_dir={work}", "name=mt", f"data.db_root={demo_db_root}", "data.build_demo_dbs=false",
        f"model.path={path}", "sft.enabled=false", "verl.keep_checkpoints=0", "stages.0.max_new_tokens=96",
        "rollout.multi_turn.enabled=true",
        *(f"rollout.multi_turn.{k}={getattr(LIMITS, k)}" for k in ("max_turns", "max_rows", "max_chars",
                                                                    "turn_timeout_s")),
        f"verl.overrides=[trainer.rollout_data_dir={work / 'rollouts'},"
        "actor_rollout_ref.rollout.calculate_log_probs=true]"])
    data = RunData(db_root=demo_db_root, sft_pool=[], rl_pool=[*taught, *unseen], eval_set=unseen[:4],
                   prompt_format=FORMAT, compare=cfg.data.compare)
    curriculum = write_verl_parquet(data.rl_pool * 2, work / "curriculum.parquet", demo_db_root,
                                    compare=data.compare, prompt_format=FORMAT)
    out = cfg.run_dir / "stage1"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_TMPDIR", str(ray_dir))
        mp.setenv("OMP_NUM_THREADS", "1")
        backend = VerlBackend(cfg)
        try:
            backend.train_stage(1, cfg.stages[0], curriculum, path, data, out)
        finally:
            backend.close()
            stop_ray(ray_dir)
    return out, work / "rollouts"


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_verls_agent_loop_runs_our_probes_on_vllm_and_masks_their_observations(stage, prober, demo_db_root):
    out, rollouts = stage
    steps = verl_metrics(out)
    assert sorted(steps) == [1, 2], steps.keys()
    rows = [json.loads(line) for f in sorted(rollouts.glob("*.jsonl")) for line in f.read_text().splitlines()]
    episodes = [row["output"] for row in rows]
    assert len(episodes) >= 2 * 4 * 4
    # verl's loop parsed the probes vLLM generated and our tool ran them: each observation is the sandbox's answer
    # to the probe before it (the last probe of an episode may be unanswered: past max_turns or out of tokens)
    probe_then_observation = re.compile(r"<sql>(.*?)</sql>\n(<observation>\n.*?\n</observation>)", re.DOTALL)
    ran = 0
    with SandboxProbes(demo_db_root, LIMITS) as probe:
        for text in episodes:
            for query, observation in probe_then_observation.findall(text):
                assert observation == probe("retail", query), text
                ran += 1
    probing = sum(OBSERVATION_OPEN in text for text in episodes)
    assert probing >= len(episodes) // 2, episodes[:4]
    assert ran >= probing
    # verl counts 2 x probes run + 2 turns in our loop (docs/MULTITURN.md)
    assert all(row["num_turns/mean"] > 2 for row in steps.values()), steps
    # Observation tokens are context: our loop gives them log-prob 0 (probability 1) in the rollout. verl compares
    # vLLM's log-probs with the actor's own on the tokens its batch's response_mask selects; had the observation
    # tokens mask 1 there, that comparison would take in the actor's probabilities of the observation text, far
    # from 1 (the SFT loss never saw them). It saw vLLM's numeric distance from the actor only.
    gap = observation_gap(prober[0], rows, [*prober[1], *prober[2]], demo_db_root)
    for row in steps.values():
        assert row["training/rollout_probs_diff_max"] < gap / 4, (row["training/rollout_probs_diff_max"], gap)
        assert row["training/rollout_actor_probs_pearson_corr"] > 0.99


def observation_gap(model_dir: Path, rows: list[dict], questions, db_root: Path) -> float:
    """The largest 1 - p(token) over the observation tokens of the dumped episodes, under the starting model:
    what verl's rollout-vs-actor check would have seen at step 1 had those tokens been in its mask."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    prompt_ids = {}  # verl dumps prompts decoded without special tokens: each one's ids, as the loop built them
    for e in questions:
        messages = with_probe_instructions(prompt_for(e, db_root, FORMAT), LIMITS)
        ids = tokenizer(chat_text(tokenizer, messages), add_special_tokens=False)["input_ids"]
        prompt_ids[tokenizer.decode(ids, skip_special_tokens=True)] = ids
    gap = 0.0
    for row in rows:
        text = row["output"]
        if OBSERVATION_OPEN not in text:
            continue
        start = text.index("\n" + OBSERVATION_OPEN)
        end = text.index("</observation>", start) + len("</observation>\n")
        head, observation = (tokenizer(t, add_special_tokens=False)["input_ids"] for t in (text[:start],
                                                                                          text[start:end]))
        ids = torch.tensor([prompt_ids[row["input"]] + head + observation])
        with torch.no_grad():
            probs = torch.softmax(model(ids).logits[0, -len(observation) - 1:-1].float(), -1)
        gap = max(gap, float((1 - probs.gather(-1, ids[0, -len(observation):, None])).max()))
    return gap
