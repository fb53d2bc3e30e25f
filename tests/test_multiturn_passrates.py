"""Pass rates of a multi-turn run are estimated in episodes: the curriculum of a stage that trains a probing
policy must see that policy's episodes, not single-turn answers it was never taught to give. The policy is a real
tiny Llama whose weights follow a script (tests/multiturn_policy.py): it probes, and answers only after reading
an observation; the databases are real."""

from __future__ import annotations

from multiturn_policy import scripted_policy

PROBE = "SELECT count(*) FROM customers"
GOLD = "SELECT count(*) FROM customers WHERE city = 'Paris'"
ANSWER = f"```sql\n{GOLD}\n```"
# "=" ends every prompt, "\n" every observation: probe, then answer; without an observation it stops after the probe
PROBE_THEN_ANSWER = {"=": "<sql>", "<sql>": PROBE, PROBE: "</sql>", "</sql>": "<eos>", "\n": ANSWER}


def test_pass_rates_of_a_probing_policy_are_estimated_in_episodes(demo_db_root, tmp_path):
    from data_synthesis.difficulty import estimate_pass_rates
    from data_synthesis.interaction import ProbeLimits
    from data_synthesis.records import Example
    from data_synthesis.samplers import EpisodeSampler, HFSampler

    model, tokenizer = scripted_policy(["<sql>", "</sql>", PROBE, ANSWER], PROBE_THEN_ANSWER)
    examples = [Example(f"q{i}", "retail", question, GOLD)
                for i, question in enumerate(["How many customers live in Paris?", "Count the Parisians."])]
    hf = HFSampler(model, tokenizer, batch_size=8)
    options = dict(k=2, max_new_tokens=24, temperature=1.0, seed=0, batch_size=2)
    cache = tmp_path / "passrates.cache.jsonl"
    single = estimate_pass_rates(examples, hf, demo_db_root, cache_path=cache, **options)
    episodes = estimate_pass_rates(examples, EpisodeSampler(hf, ProbeLimits(max_turns=2), demo_db_root), demo_db_root,
                                   cache_path=cache, **options)
    assert single == {"q0": 0.0, "q1": 0.0}  # a probe and no answer: a format failure
    assert episodes == {"q0": 1.0, "q1": 1.0}  # probe, observation, right answer; not the cached 0s
    assert len(cache.read_text().splitlines()) == 4  # the episode estimates are cached under their own keys
