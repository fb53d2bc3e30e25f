"""A multi-turn run on verl estimates pass rates and evaluates in episodes (issue 27), through the backend's own path:
`VerlBackend.pass_rates` / `evaluate` -> Ray actors -> `turns.TurnEpisodeSampler` -> probes in the sandbox. The one
part swapped is the engine inside each actor: vLLM does not run here, so a real HF model on the same `continue_ids`
interface (`HFSampler`) stands in (`test_vllm_cpu.py` runs `VLLMSampler.continue_ids` where vLLM does).

The policy is a real tiny Llama that follows a script (tests/multiturn_policy.py): it probes only right after the
probe instructions' last words, so it probes only when the prompt carries them, and answers only after an
observation."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import pytest
from conftest import import_verl
from multiturn_policy import scripted_policy

from data_synthesis.records import Example
from data_synthesis.samplers import HFSampler
from sirius_train.config import load_config
from sirius_train.schedule import RunData, prompt_format

import_verl("verl")
CONFIG = Path(__file__).resolve().parents[1] / "configs" / "nano_multiturn.yaml"
PROBE = "SELECT count(*) FROM customers"
GOLD = "SELECT count(*) FROM customers WHERE city = 'Paris'"
ANSWER = f"```sql\n{GOLD}\n```"
LAST_WORDS = "code block."  # how the probe instructions end; the prompt ends with them (no system message)
# a question ends in "?" or ".": asked without the instructions the model stops at once
SCRIPT = {"?": "<eos>", ".": "<eos>", LAST_WORDS: "<sql>", "<sql>": PROBE, PROBE: "</sql>", "</sql>": "<eos>", "\n": ANSWER, ANSWER: "<eos>"}


@pytest.fixture
def backend(tmp_path, demo_db_root, monkeypatch):
    import sirius_train.verl_backend.backend as verl_backend

    model, tokenizer = scripted_policy(["<sql>", "</sql>", PROBE, ANSWER, LAST_WORDS], SCRIPT)
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"  # ends as the prompt ends
    model.save_pretrained(tmp_path / "policy")
    tokenizer.save_pretrained(tmp_path / "policy")
    # the engine of each Ray actor: a real HF model where the backend starts vLLM
    monkeypatch.setattr(verl_backend, "engine_factory",
                        lambda cfg, path, max_model_len: (partial(HFSampler, str(path), batch_size=8), 1, 0))
    cfg = load_config(CONFIG, ["backend=verl", f"output_dir={tmp_path}", f"data.db_root={demo_db_root}",
                               f"model.path={tmp_path / 'policy'}", "logging.plots=false", "verl.max_prompt_length=1024"])
    backend = verl_backend.VerlBackend(cfg)
    yield backend
    backend.close()


def test_a_verl_multi_turn_run_estimates_and_evaluates_in_episodes(backend, demo_db_root, tmp_path):
    cfg = backend.cfg
    examples = [Example(f"q{i}", "retail", question, GOLD)
                for i, question in enumerate(["How many customers live in Paris?", "Count the Parisians."])]
    data = RunData(demo_db_root, [], examples, examples, prompt_format(cfg), "bird")
    model = Path(cfg.model.path)
    rates, sampler, _ = backend.pass_rates(examples, model, cfg.stages[0], data, tmp_path / "stage1")
    assert rates == {"q0": 1.0, "q1": 1.0}  # probe, observation, right answer: every one of k episodes
    assert sampler.multi_turn and sampler.stats["on_demand"] == 0  # the announced calls carried the db_ids
    keys = [json.loads(line)["key"] for line in (tmp_path / "stage1" / "passrates.cache.jsonl").read_text().splitlines()]
    assert len(keys) == 2
    from data_synthesis.difficulty import estimate

    single = estimate(examples, HFSampler(model), demo_db_root, k=cfg.stages[0].estimate_k, seed=cfg.seed,
                      max_new_tokens=cfg.stages[0].max_new_tokens, temperature=cfg.stages[0].temperature,
                      top_p=cfg.stages[0].top_p, compare="bird", policy=str(model), prompt_format=data.prompt_format)
    assert {e.key for e in single}.isdisjoint(keys)  # episode estimates under their own keys
    assert [e.correct for e in single] == [0, 0]  # the same model asked single-turn never probes nor answers

    figures = backend.evaluate(model, data, "stage1")
    assert (figures["eval_exec_acc"], figures["eval_turns_mean"], figures["eval_probe_share"]) == (1.0, 1.0, 1.0)

    # the recorded turns of an episode, on the engines the backend started (the prompt alone: no instructions)
    (text,), = sampler.sample([[{"role": "user", "content": "How many customers live in Paris?"}]], 1,
                              db_ids=["retail"], temperature=0.0, max_new_tokens=16, seed=0)
    import sqlite3

    with sqlite3.connect(demo_db_root / "retail" / "retail.sqlite") as db:
        (count,), = db.execute(PROBE).fetchall()
    assert text == f"<sql>{PROBE}</sql>\n<observation>\nok: 1 row\ncount(*)\n{count}\n</observation>\n{ANSWER}"


def test_a_stage_whose_prompts_fit_only_without_the_probe_instructions_is_refused_before_verl(backend, demo_db_root,
                                                                                              tmp_path):
    from transformers import AutoTokenizer

    from data_synthesis.difficulty import prompt_for
    from data_synthesis.export import write_verl_parquet
    from data_synthesis.prompts import chat_text
    from sirius_train.config import ConfigError

    cfg, stage = backend.cfg, backend.cfg.stages[0]
    examples = [Example(f"q{i}", "retail", f"How many customers live in city number {i}?", GOLD)
                for i in range(stage.prompts_per_step)]
    data = RunData(demo_db_root, [], examples, examples, prompt_format(cfg), "bird")
    curriculum = write_verl_parquet(examples, tmp_path / "curriculum.parquet", demo_db_root,
                                    prompt_format=data.prompt_format)
    tokenizer = AutoTokenizer.from_pretrained(cfg.model.path)
    # the limit verl's filter applies: every row passes it, none does with the instructions
    cfg.verl.max_prompt_length = max(len(tokenizer(chat_text(tokenizer, prompt_for(e, demo_db_root, data.prompt_format)),
                                                   add_special_tokens=False)["input_ids"]) for e in examples)
    with pytest.raises(ConfigError, match=rf"{len(examples)} of {len(examples)} prompts of {curriculum} fit "
                                          rf"verl.max_prompt_length={cfg.verl.max_prompt_length} only without the "
                                          rf"probe instructions"):
        backend.train_stage(1, stage, curriculum, Path(cfg.model.path), data, tmp_path / "stage1")
    assert not (tmp_path / "stage1" / "verl_command.sh").exists()  # refused before anything was launched
