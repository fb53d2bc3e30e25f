"""R-VES (and the other official metrics) shown one way: `sirius benchmark` and `sirius evaluate` print the same
figure for the same mean, as BIRD's `print_data` prints it -- `{:.2f}` of the mean x 100, no `%` (issue 39: the
benchmark showed R-VES 87.5%, evaluate 87.50; R-VES goes up to 111.80, so it is no percentage). The reports' JSON
keeps the means (`greedy_r_ves`, `r_ves`) as they were."""

from __future__ import annotations

import math
import re

from official_reference import bird_printed

from rewards.scoring import ScoreResult
from sirius_train.evaluation.benchmark import markdown
from sirius_train.evaluation.official_metrics import printed
from sirius_train.evaluation.reports import EvalItem, ex_report, markdown_report

REWARDS = [1.25, 1.0, 0.0, 0.25]  # per question; R-VES = 100 x mean sqrt(reward) = 65.45
SQRT = [math.sqrt(r) for r in REWARDS]
MEAN = sum(SQRT) / len(SQRT)
SOFT_F1 = [1.0, 1.0, 0.0, 0.5]


def evaluate_text() -> str:
    items = [EvalItem(k, "db", "q", "q", "simple") for k in range(4)]
    results = [ScoreResult(k, REWARDS[k] > 0, 1.0, "ok", "ok") for k in range(4)]
    return markdown_report(ex_report(items, results, "bird", {"r_ves": SQRT, "soft_f1": SOFT_F1}))


def benchmark_text() -> str:
    figures = {"n": 4, "greedy_ex": 0.75, "pass_at_k": 0.75, "greedy_r_ves": MEAN, "greedy_soft_f1": 0.625}
    model = {"model": "m", "temperature": 0.8, "overall": figures, "buckets": {"simple": figures},
             "databases": {"db": figures}, "tokens": {"prompt": 1, "answer": 1, "at_max_new_tokens": 0, "answers": 4},
             "questions_per_s": 1.0}
    return markdown({"name": "b", "questions": "q.jsonl", "n": 4, "k": 2, "n_samples": 2, "compare": "bird",
                     "models": [model]})


def test_the_official_way_of_printing():
    assert printed(MEAN) == bird_printed(SQRT) == "65.45"
    assert printed(math.sqrt(1.25)) == "111.80"  # above 100: a score, not a share


def test_evaluate_and_benchmark_show_r_ves_the_same_way():
    ours = evaluate_text()
    assert "R-VES 65.45" in ours and "Soft-F1 62.50" in ours
    bench = benchmark_text()
    header, _, row = bench.splitlines()[4:7]
    cells = dict(zip([c.strip() for c in header.split("|")], [c.strip() for c in row.split("|")]))
    assert cells["R-VES"] == "65.45" and cells["Soft-F1"] == "62.50", cells  # was 65.5% / 62.5%
    assert cells["greedy_ex"] == "75.0%"  # a share of questions stays a %
    assert "R-VES 65.45" in bench  # per bucket and database (was "R-VES 65.5")
    assert not re.search(r"R-VES[^|]*?\d%", bench)
