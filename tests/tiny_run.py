"""A tiny configuration of the nano schedule for tests: the whole pipeline in well under a minute."""

from __future__ import annotations

from pathlib import Path

NANO = Path(__file__).resolve().parents[1] / "configs" / "nano.yaml"


def tiny_overrides(tmp: Path, name: str = "tiny") -> list[str]:
    return [
        f"name={name}", f"output_dir={tmp / 'runs'}", f"data.db_root={tmp / 'dbs'}",
        # one torch thread: on 2 cores other processes share, the nano default of 2 spins (its SFT took 255 s for
        # 160 steps here; docs/SFT.md measured 7x on pass rates)
        "threads=1",
        # one database, one rule, RL on the SFT examples too: a 100k-parameter model learns that much in seconds,
        # so the curriculum has groups whose pass rate is neither 0 nor 1
        "data.train_dbs=[retail]", "data.generated_train_dbs=0", "data.generated_eval_dbs=1",
        "data.eval_sets=[val-seen-types]",  # one held-out database (the demo evaluates two test sets)
        "data.synth_per_db=60", "data.eval_per_db=12", "data.synth_rules=[count]", "data.sft_share=0.5",
        "data.rl_pool=all",
        # the pipeline on plain data: WHERE filters (the count rule's query space), no taught mistakes, T = 1
        "data.synth_where=1.0", "data.sft_flaws=[]", "stages.0.temperature=1.0", "stages.1.temperature=1.0",
        "model.tokenizer_vocab=1000", "model.hidden_size=64", "model.intermediate_size=128",
        "model.num_hidden_layers=2", "model.num_attention_heads=2",
        "sft.epochs=80", "sft.batch_size=16", "sft.lr=1e-2",
        *(f"stages.{i}.{k}" for i in (0, 1) for k in (
            "prompts_per_step=2", "n_samples=4", "max_new_tokens=48", "overlong_cache=4", "max_gen_rounds=2",
            "estimate_k=4", "budget=8", "gen_batch_size=16", "micro_batch_size=4")),
        "stages.0.steps=6", "stages.0.checkpoint_every=2", "stages.1.steps=2", "stages.1.checkpoint_every=1",
        "logging.plots=true",
    ]
