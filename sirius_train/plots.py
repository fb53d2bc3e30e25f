"""Pictures of a run, from `metrics.jsonl`: reward, accuracy, entropy and the entropy coefficient per step,
and held-out execution accuracy per phase."""

from __future__ import annotations

from pathlib import Path

from data_synthesis.jsonl import iter_jsonl

PANELS = (("reward_mean", "reward (mean)"), ("acc_mean", "rollout accuracy"), ("entropy", "entropy (nats/token)"),
          ("entropy_coef", "entropy coefficient"))


def plot_run(run_dir: str | Path) -> Path:
    """Write `run_dir/training.png`; returns its path. A run without DAPO steps (the warm start alone) gets only
    the held-out panel; a phase evaluated twice (a resumed run) shows its last evaluation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    rows = list(iter_jsonl(run_dir / "metrics.jsonl"))
    steps = [r for r in rows if "reward_mean" in r]
    # insertion order: the phases' order; `<phase>@<set>` rows are the other held-out sets', the first set's is shown
    evals = {r["stage"]: r for r in rows if r.get("eval") == "final" and "@" not in r["stage"]}
    panels = PANELS if steps else ()
    fig, axes = plt.subplots(1, len(panels) + 1, figsize=(4 * (len(panels) + 1), 3.4), squeeze=False)
    axes = axes[0]
    stages = list(dict.fromkeys(r["stage"] for r in steps))
    offset, x_of = 0, {}
    for stage in stages:  # stages laid end to end on one step axis
        n = max(r["step"] for r in steps if r["stage"] == stage)
        x_of[stage] = offset
        offset += n
    for ax, (key, title) in zip(axes, panels):
        for stage in stages:
            pts = [(x_of[stage] + r["step"], r[key]) for r in steps if r["stage"] == stage and r.get(key) is not None]
            if pts:
                ax.plot(*zip(*pts), label=stage, lw=1.4)
        ax.set_title(title)
        ax.set_xlabel("DAPO step")
        ax.grid(alpha=0.3)
    if panels and axes[0].get_legend_handles_labels()[0]:
        axes[0].legend(fontsize=8)
    ax = axes[-1]
    if evals:
        values = [100 * r["eval_exec_acc"] for r in evals.values()]
        bars = ax.bar(list(evals), values, color="#4C72B0")
        ax.bar_label(bars, fmt="%.1f")
        ax.set_ylim(0, max(values + [1]) * 1.25)
    ax.set_title("held-out EX (%)")
    fig.tight_layout()
    out = run_dir / "training.png"
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
