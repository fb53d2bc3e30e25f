"""The docs describe the nano design that ships: TRAINING.md's figures are configs/nano.yaml's, and CLUSTER.md's
`sirius doctor configs/nano.yaml` sample shows what the doctor says about it."""

from __future__ import annotations

import re
from pathlib import Path

from tiny_run import NANO

from sirius_train.config import load_config

DOCS = Path(__file__).resolve().parents[1] / "docs"


def sci(x: float) -> str:
    """2e-4, as the docs write a learning rate."""
    return f"{x:.0e}".replace("e-0", "e-")


def test_training_md_describes_the_shipped_nano_config():
    text = (DOCS / "TRAINING.md").read_text().split("## The nano default", 1)[1].split("\n## ", 1)[0]
    text = " ".join(text.split())
    cfg = load_config(NANO)
    d, m, s1, s2 = cfg.data, cfg.model, cfg.stages[0], cfg.stages[1]
    expected = [f"{len(d.train_dbs)} hand-written and {d.generated_train_dbs} procedurally generated",
                f"held-out sets of {d.generated_eval_dbs} generated databases", f"{d.synth_per_db} single-table",
                f"rules `{', '.join(d.synth_rules)}`", f"{d.sft_flaw_share:.0%} of the ORDER BY",
                f"hidden {m.hidden_size}, {m.num_hidden_layers} layers", f"{cfg.sft.epochs:g} epochs of SFT",
                f"two DAPO stages of {s1.steps} + {s2.steps} steps",
                f"{s1.prompts_per_step} prompts × {s1.n_samples} answers", f"T = {s1.temperature:g}",
                f"lr {sci(s1.lr)} / {sci(s2.lr)}", f"estimated with {s1.estimate_k} samples per example"]
    assert d.synth_where == 0 and "without WHERE filters" in text
    assert s1.temperature == s2.temperature and s1.estimate_k == s2.estimate_k
    assert [e for e in expected if e not in text] == []


def test_cluster_md_shows_the_doctors_verdict_on_the_demo():
    from sirius_train.preflight import budget_checks, database_checks, model_checks, reward_checks

    block = (DOCS / "CLUSTER.md").read_text().split("$ sirius doctor configs/nano.yaml", 1)[1].split("```", 1)[0]
    shown = {m[1]: (m[2], m[3]) for m in re.finditer(r"^│ (\S[^│]*?)\s*│ (\S+)\s*│ (.*?)\s*│", block, re.M)}
    cfg = load_config(NANO, ["data.db_root=demo_data/does-not-exist"])  # the sample's: a clone before make demo
    for check in [*model_checks(cfg), *database_checks(cfg), *reward_checks(cfg), *budget_checks(cfg)]:
        status, detail = shown[check.name]
        first_line = check.detail.replace("does-not-exist", "dbs")
        assert (status, first_line[:len(detail)]) == (check.status, detail), check.name


def test_trainer_md_names_the_shipped_nano_design_beside_the_one_it_measured():
    """docs/benchmarks/trainer.md measured an older nano design; what it says today's config builds is the config."""
    text = " ".join((DOCS / "benchmarks" / "trainer.md").read_text().split())
    cfg = load_config(NANO)
    today = f"Today's `configs/nano.yaml` builds a {cfg.sft.epochs:g}-epoch warm start"
    assert today in text and f"samples at T = {cfg.stages[0].temperature:g}" in text.split(today, 1)[1][:120]
