"""A stage's outputs: verl-layout parquet, the JSON report, and a histogram picture.

Parquet rows follow verl's RL dataset layout (`verl.utils.dataset.rl_dataset.RLHFDataset` reads them as is):

    data_source   "sirius-sql"
    prompt        chat messages [{"role", "content"}] -- `render_prompt(question, schema text, evidence)`
    ability       "sql"
    reward_model  {"style": "rule", "ground_truth": gold SQL}
    extra_info    {"db_id", "index", "difficulty" (pass rate, or null), "question", "id", "evidence",
                   "source", "level", "compare"}

`rewards.verl_reward.compute_score` reads `ground_truth` as the gold SQL and `extra_info["db_id"]` (and
`compare`), so a verl run scores these rows with the same execution reward the estimate used.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from data_synthesis.difficulty import prompt_for
from data_synthesis.prompts import PromptFormat
from data_synthesis.records import Example, write_examples
from data_synthesis.smoothing import SmoothingConfig, bin_of

DATA_SOURCE = "sirius-sql"

SCHEMA = pa.schema([
    ("data_source", pa.string()),
    ("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
    ("ability", pa.string()),
    ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
    ("extra_info", pa.struct([("db_id", pa.string()), ("index", pa.int64()), ("difficulty", pa.float64()),
                              ("question", pa.string()), ("id", pa.string()), ("evidence", pa.string()),
                              ("source", pa.string()), ("level", pa.string()), ("compare", pa.string())])),
])


def verl_rows(examples: Sequence[Example], db_root: str | Path, *, pass_rates: Mapping[str, float] | None = None,
              data_source: str = DATA_SOURCE, compare: str = "bird",
              prompt_format: PromptFormat = PromptFormat()) -> list[dict]:
    """The parquet rows of `examples`, in order (`index` is the row number)."""
    rates = pass_rates or {}
    return [{"data_source": data_source, "prompt": prompt_for(e, db_root, prompt_format), "ability": "sql",
             "reward_model": {"style": "rule", "ground_truth": e.gold_sql},
             "extra_info": {"db_id": e.db_id, "index": i, "difficulty": rates.get(e.id), "question": e.question,
                            "id": e.id, "evidence": e.evidence, "source": e.source, "level": e.level,
                            "compare": compare}}
            for i, e in enumerate(examples)]


def write_verl_parquet(examples: Sequence[Example], path: str | Path, db_root: str | Path, *,
                       pass_rates: Mapping[str, float] | None = None, data_source: str = DATA_SOURCE,
                       compare: str = "bird", prompt_format: PromptFormat = PromptFormat()) -> Path:
    """Write a stage's examples as verl-layout parquet (atomically); returns the path."""
    path = Path(path)
    table = pa.Table.from_pylist(verl_rows(examples, db_root, pass_rates=pass_rates, data_source=data_source,
                                           compare=compare, prompt_format=prompt_format), schema=SCHEMA)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)
    return path


def write_report(report: dict, path: str | Path) -> Path:
    """The stage report as indented JSON (atomically)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def histogram_counts(rates: Sequence[float], n_bins: int) -> list[int]:
    """Counts for the picture: [p = 0, bin 0, ..., bin n-1, p = 1].

    Example:
        >>> histogram_counts([0.0, 0.1, 0.1, 0.6, 1.0, 1.0], 4)
        [1, 2, 0, 1, 0, 2]
    """
    counts = [0] * (n_bins + 2)
    for p in rates:
        b = bin_of(p, n_bins)
        counts[0 if p <= 0 else n_bins + 1 if b is None else b + 1] += 1
    return counts


def plot_histogram(pool_rates: Sequence[float], selected_rates: Sequence[float], path: str | Path,
                   config: SmoothingConfig = SmoothingConfig(), title: str = "") -> Path:
    """Pass-rate histogram of the pool beside the selected stage: the flattening, at a glance (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = config.n_bins
    labels = ["p=0"] + [f"[{b / n:.2f},{(b + 1) / n:.2f})" for b in range(n)] + ["p=1"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, rates, name in ((axes[0], pool_rates, "pool"), (axes[1], selected_rates, "selected (repeats counted)")):
        counts = histogram_counts(rates, n)
        colors = ["#bbbbbb"] + ["#3b75af"] * n + ["#bbbbbb"]
        ax.bar(range(len(counts)), counts, color=colors)
        ax.set_xticks(range(len(counts)), labels, rotation=30, fontsize=8)
        ax.set_title(f"{name}: {len(rates)} examples")
        ax.set_xlabel("pass rate under the policy")
        for x, c in enumerate(counts):
            ax.text(x, c, str(c), ha="center", va="bottom", fontsize=8)
    axes[0].set_ylabel("examples")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_stage(curriculum, out_dir: str | Path, name: str, db_root: str | Path, *,
                config: SmoothingConfig = SmoothingConfig(), compare: str = "bird",
                data_source: str = DATA_SOURCE, prompt_format: PromptFormat = PromptFormat()) -> dict[str, Path]:
    """All outputs of one stage under `out_dir`: `<name>.parquet`, `<name>.report.json`, `<name>.histogram.png`,
    `<name>.jsonl` (the selected examples, pass rate in `meta`) and `<name>.new_examples.jsonl` (mutants made
    to fill short bins, to add to the pool). Returns the paths by kind."""
    out = Path(out_dir)
    rates = curriculum.pass_rates
    paths = {"parquet": write_verl_parquet(curriculum.examples, out / f"{name}.parquet", db_root, pass_rates=rates,
                                           data_source=data_source, compare=compare,
                                           prompt_format=prompt_format),
             "report": write_report(curriculum.report, out / f"{name}.report.json"),
             "histogram": plot_histogram(list(rates.values()), [rates[e.id] for e in curriculum.examples],
                                         out / f"{name}.histogram.png", config, title=name)}
    for kind, examples in (("examples", curriculum.examples), ("new_examples", curriculum.new_examples)):
        path = out / (f"{name}.jsonl" if kind == "examples" else f"{name}.new_examples.jsonl")
        write_examples(path, (replace(e, meta={**e.meta, "pass_rate": rates.get(e.id)}) for e in examples))
        paths[kind] = path
    return paths
