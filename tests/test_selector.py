"""The hybrid selector's math (pure, exact) and `sirius select` on the real pools."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from rewards.outcome import Status
from sirius_train.inference.selector import (Ballot, SelectorConfig, admitted, consensus_scores, explain,
                                             majority_vote, preference_scores, result_classes, select)
from sirius_train.inference.structure import signature

OK, EMPTY, ERROR = Status.OK, Status.EMPTY, Status.ERROR


def ballot(source, sql, *rows, status=OK):
    return Ballot(source, sql, status, tuple(rows))


# ------------------------------------------------------------------------------------------ classes
def test_classes_follow_the_compare_modes():
    b = [ballot("a", "q", (1, "x")), ballot("b", "q", ("x", 1)), ballot("c", "q", (1, "x"), (1, "x")),
         ballot("d", "q", (1.0, "x"))]
    assert [c.members for c in result_classes(b, range(4), "bird")] == [[0, 2, 3], [1]]
    assert [c.members for c in result_classes(b, range(4), "spider")] == [[0, 1, 3], [2]]


def test_admission_keeps_empty_only_as_a_strict_majority_or_last_resort():
    ok, empty, err = ballot("a", "q", (1,)), ballot("b", "q", status=EMPTY), ballot("c", "q", status=ERROR)
    assert admitted([ok, empty]) == [0]  # 1 of 2 is not a strict majority
    assert admitted([ok, empty, empty]) == [0, 1, 2]
    assert admitted([empty, err, err]) == [0]  # nothing else executed
    assert admitted([err, err]) == []


def test_partial_agreement_counts_when_weighted_and_votes_alone_decide_by_default():
    """Three one-vote results: weighted, the two that share a row outscore the loner that comes first in input
    order. Shipped, votes alone decide (no positive weight gained on both open pools: docs/benchmarks/selector.md)."""
    pool = [ballot("a", "q1", (9,)), ballot("b", "q2", (1,), (2,)), ballot("c", "q3", (1,), (3,))]
    assert select(pool, SelectorConfig(partial_weight=0.5)).index == 1
    assert select(pool).index == 0  # votes alone: input order decides


def test_the_structural_gate_is_off_unless_asked():
    """A three-way near tie where sources repeat: the gate would pick the shape two generators share. Shipped it
    stays shut (on the open pools' model families it lost questions on pool A and won none on pool B)."""
    b = [ballot("spec", "SELECT max(a) FROM t", (3,)), ballot("spec", "SELECT count(*) FROM t WHERE a = 'x'", (2,)),
         ballot("gen", "SELECT count(*) FROM t WHERE a = 'X'", (1,))]
    shipped = select(b)
    assert (shipped.decided_by, shipped.index) == ("consensus", 0)
    gated = select(b, SelectorConfig(rerank="auto"))
    assert (gated.decided_by, gated.index) == ("structure", 1)


def test_structural_support_counts_only_candidates_that_executed():
    """A near tie the reranker breaks: the shape behind rows (1,) is backed by one source that ran; the
    other shape is written by three sources, but two of them failed to run, so it has one too."""
    x, y = "SELECT a FROM t WHERE k = 1", "SELECT b FROM t"
    pool = [ballot("s1", x, (1,)), ballot("s2", y, (2,)), ballot("s1", y, status=ERROR), ballot("s3", y, status=ERROR)]
    chosen = select(pool, SelectorConfig(rerank="auto"))
    assert chosen.decided_by == "structure" and [c.support for c in chosen.classes] == [1, 1]
    assert chosen.index == 0  # supports tie: S_coarse ties too, input order decides


# ------------------------------------------------------------------------------------------ S_maj, S_rm
def test_consensus_scores_exact_values():
    b = [ballot("a", "q", (1,), (2,)), ballot("b", "q", (1,), (2,)), ballot("c", "q", (1,), (3,)), ballot("d", "q", (9,))]
    classes = result_classes(b, range(4))
    assert consensus_scores(classes, 5, 0.0) == [2 / 5, 1 / 5, 1 / 5]
    # partial credit: row Dice({1,2},{1,3}) = 0.5 in both directions; {9} overlaps nothing
    assert consensus_scores(classes, 5, 0.5) == pytest.approx([(2 + 0.5 * 0.5) / 5, (1 + 0.5 * 2 * 0.5) / 5, 1 / 5])


def test_partial_agreement_follows_the_compare_mode_in_column_order():
    """Under `bird` the same cells in another column order are another answer: no partial credit either;
    under `spider` they are one class already."""
    b = [ballot("a", "q", (1, "x"), (2, "y")), ballot("b", "q", ("x", 1), ("y", 2)), ballot("c", "q", (1, "x"))]
    bird = result_classes(b, [0, 1, 2], "bird")
    assert [c.members for c in bird] == [[0], [1], [2]]
    assert consensus_scores(bird, 3, 1.0, "bird") == pytest.approx([(1 + 2 / 3) / 3, 1 / 3, (1 + 2 / 3) / 3])
    spider = result_classes(b, [0, 1, 2], "spider")
    assert [c.members for c in spider] == [[0, 1], [2]]
    assert consensus_scores(spider, 3, 1.0, "spider") == pytest.approx([(2 + 2 / 3) / 3, (1 + 2 * 2 / 3) / 3])


def test_a_column_swapped_minority_does_not_overturn_a_bird_majority():
    """5 candidates of one generator agree; 4 other generators return the same cells in another column
    order (another answer under `bird`). Partial credit across column orders made it a near tie the
    structural reranker then gave to the 4 sources; the majority must win by consensus."""
    rows, swapped = ((1, "x"), (2, "y")), (("x", 1), ("y", 2))
    pool = [Ballot("spec", "SELECT id, name FROM t", OK, rows)] * 5 + \
        [Ballot(f"gen{k}", "SELECT name, id FROM t", OK, swapped) for k in range(4)]
    chosen = select(pool, SelectorConfig(compare="bird", partial_weight=0.5, rerank="auto"))
    assert chosen.index == 0 and chosen.decided_by == "consensus", chosen
    assert chosen.classes[0].s_maj == pytest.approx(5 / 9)


def test_preference_asks_both_orders_and_cancels_position_bias():
    b = [ballot("a", "SELECT 1", (1,)), ballot("b", "SELECT 2", (2,)), ballot("c", "SELECT 3", (3,))]
    classes = result_classes(b, range(3))
    asked = []

    def first_always(x, y):
        asked.append((x[0], y[0]))
        return 0

    assert preference_scores(b, classes, first_always, top_k=3) == [0.5, 0.5, 0.5]
    assert sorted(asked) == sorted([(x, y) for x in ("SELECT 1", "SELECT 2", "SELECT 3")
                                    for y in ("SELECT 1", "SELECT 2", "SELECT 3") if x != y])
    prefers_3 = lambda x, y: 0 if x[0] == "SELECT 3" else 1 if y[0] == "SELECT 3" else None
    assert preference_scores(b, classes, prefers_3, top_k=3) == [0.0, 0.0, 1.0]
    assert preference_scores(b, classes, prefers_3, top_k=2) == [0.0, 0.0, 0.0]  # class 3 is outside the top 2


def test_judge_can_break_a_near_tie_but_not_a_landslide():
    near = [ballot("a", "SELECT 1", (1,)), ballot("b", "SELECT 1", (1,)), ballot("c", "SELECT 2", (2,))]
    prefers_2 = lambda x, y: 0 if x[0] == "SELECT 2" else 1
    config = SelectorConfig(judge_weight=0.5, margin=0.0)
    assert select(near, config, prefers_2).index == 2  # 2/3 vs 1/3 + 0.5
    landslide = near[:2] * 3 + near[2:]
    assert select(landslide, config, prefers_2).index == 0  # 6/7 vs 1/7 + 0.5


# ------------------------------------------------------------------------------------------ baseline and gate
def test_majority_vote_counts_empty_results_and_breaks_ties_by_input_order():
    b = [ballot("a", "q1", (1,)), ballot("b", "q2", status=EMPTY), ballot("c", "q3", status=EMPTY),
         ballot("d", "q4", (1,))]
    assert majority_vote(b).index == 0  # 2 vs 2: the class holding candidate 0
    assert majority_vote(b[1:]).index == 0  # the empty class, 2 vs 1
    assert majority_vote([ballot("a", "q", status=ERROR)]).decided_by == "no_executable"


def test_reranker_prefers_the_shape_more_sources_share():
    b = [ballot("spec", "SELECT max(a) FROM t", (3,)),
         ballot("spec", "SELECT count(*) FROM t WHERE a = 'x'", (2,)),
         ballot("gen", "SELECT count(*) FROM t WHERE a = 'X'", (1,)),
         ballot("spec", "SELECT name FROM t", ("n",), status=ERROR)]
    s = select(b, SelectorConfig(margin=0.1, rerank="auto"))
    assert s.decided_by == "structure" and s.index == 1  # 3-way tie; {spec, gen} share the count(*) shape
    assert s.classes[0].support == 2
    assert select(b, SelectorConfig(margin=0.0, rerank="auto")).index == 0  # gate closed: input order breaks the tie


def test_rerank_auto_only_when_provenance_groups_are_shared():
    b = [ballot("s1", "SELECT count(*) FROM t", (3,)), ballot("s2", "SELECT max(a) FROM t", (2,)),
         ballot("s3", "SELECT max(a) FROM t WHERE b = 1", (1,))]
    assert select(b, SelectorConfig(rerank="auto")).decided_by == "consensus"
    forced = select(b, SelectorConfig(rerank="always"))
    assert forced.decided_by == "structure" and forced.index == 1
    with pytest.raises(ValueError, match="rerank must be one of"):
        SelectorConfig(rerank="sometimes")


def test_selection_explains_itself():
    b = [ballot("spec", "SELECT 1", (1,)), ballot("gen", "SELECT 1", (1,)), ballot("spec", "SELECT 2", (2,))]
    text = explain(select(b), b)
    assert text.startswith("consensus: 2 of 3 candidates (gen, spec)")
    assert explain(select([]), []) == "empty pool"


def test_config_errors_name_the_value_and_the_rule():
    with pytest.raises(ValueError, match="partial_weight must be in \\[0, 1\\], got 2"):
        SelectorConfig(partial_weight=2)
    with pytest.raises(ValueError, match="unknown compare mode 'exact'"):
        SelectorConfig(compare="exact")


def test_signatures_ignore_aliases_case_and_literals_but_not_shape():
    assert signature("SELECT T1.name FROM singer AS T1 WHERE T1.age > 30") == signature(
        "select name from SINGER where age > 40")
    assert signature("SELECT name FROM singer ORDER BY age") != signature("SELECT name FROM singer ORDER BY age DESC")
    assert signature("SELECT count(*) FROM singer") != signature("SELECT count(*) FROM singer GROUP BY country")
    assert signature("SELEC name FROM") is None


# ------------------------------------------------------------------------------------------ real pools, real CLI
def run_select_bytes(tmp_path, spider_root, *extra, pools=None) -> bytes:
    out = tmp_path / "picks.jsonl"
    inp = spider_root / "dev_candidate_pools.jsonl" if pools is None else pools
    result = subprocess.run([sys.executable, "-m", "sirius_train.cli", "select", "--db-root",
                             str(spider_root / "databases"), "--input", str(inp), "--output", str(out), "--quiet",
                             *extra], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return out.read_bytes()


def test_select_on_real_pools_keeps_the_contract_and_is_deterministic(tmp_path, spider_root, spider_pools):
    first = run_select_bytes(tmp_path, spider_root)
    assert run_select_bytes(tmp_path, spider_root) == first  # the same bytes twice
    picks = [json.loads(line) for line in first.splitlines()]
    assert [p["id"] for p in picks] == [p["id"] for p in spider_pools]
    assert all(set(p) == {"id", "sql", "source", "score"} for p in picks)
    by_id = {p["id"]: p for p in spider_pools}
    for pick in picks:  # the pick is one of the given candidates, with its own source
        assert {"source": pick["source"], "sql": pick["sql"]} in by_id[pick["id"]]["candidates"]
        assert 0.0 < pick["score"] <= 1.0
    subset = tmp_path / "subset.jsonl"  # the same picks again, in a smaller batch: batch-independent
    subset.write_text("".join(json.dumps(p) + "\n" for p in spider_pools[::10]))
    assert run_select_bytes(tmp_path, spider_root, pools=subset).splitlines() == first.splitlines()[::10]


def test_select_keeps_the_agreeing_majority_on_a_real_pool(tmp_path, spider_root, spider_pools):
    """Spider dev question 1007: 14 of 18 systems write `citizenship != 'French'`; the column holds 'France'.
    The trace names the 14 slips, but nothing takes an agreeing majority out of the vote (the former
    grounding rule did, and cost a held-out database 8.8 points)."""
    from sirius_train.commands.select import select_file

    pools = tmp_path / "q1007.jsonl"
    pools.write_text(json.dumps(next(p for p in spider_pools if p["id"] == 1007)) + "\n")
    [answer] = select_file(spider_root / "databases", pools, tmp_path / "picks.jsonl", config=SelectorConfig(),
                           workers=0, show_progress=False)
    assert "French" in answer.pick()["sql"] and answer.selection.decided_by == "consensus"
    slips = [c.ungrounded for c in answer.task.candidates if c.ungrounded]
    assert len(slips) == 14 and all(len(u) == 1 and u[0].lower().endswith("citizenship: 'french'") for u in slips)


def test_select_rejects_bad_pools_clearly(tmp_path, spider_root):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": 1, "db_id": "singer", "question": "q", "candidates": [{"sql": "SELECT 1"}]}) + "\n")
    result = subprocess.run([sys.executable, "-m", "sirius_train.cli", "select", "--db-root",
                             str(spider_root / "databases"), "--input", str(bad), "--output",
                             str(tmp_path / "o.jsonl"), "--quiet"], capture_output=True, text=True)
    assert result.returncode == 2
    assert "candidate 0 must be an object with 'source' and 'sql'" in result.stderr
    assert not (tmp_path / "o.jsonl").exists()


def test_select_file_keeps_every_question_even_without_a_usable_candidate(tmp_path, demo_db_root):
    from sirius_train.commands.select import select_file

    rows = [{"id": "none", "db_id": "retail", "question": "q", "candidates": []},
            {"id": "broken", "db_id": "retail", "question": "q",
             "candidates": [{"source": "a", "sql": None}, {"source": "b", "sql": "SELECT nme FROM customers"}]},
            {"id": "fine", "db_id": "retail", "question": "q",
             "candidates": [{"source": "a", "sql": "SELECT count(*) FROM customers"}]}]
    pools = tmp_path / "pools.jsonl"
    pools.write_text("".join(json.dumps(r) + "\n" for r in rows))
    answers = select_file(demo_db_root, pools, tmp_path / "picks.jsonl", config=SelectorConfig(), workers=0,
                          trace_path=tmp_path / "trace.jsonl", show_progress=False)
    picks = [json.loads(line) for line in (tmp_path / "picks.jsonl").read_text().splitlines()]
    assert [p["id"] for p in picks] == ["none", "broken", "fine"]
    assert picks[0] == {"id": "none", "sql": None, "source": None, "score": 0.0}
    assert picks[1] == {"id": "broken", "sql": "SELECT nme FROM customers", "source": "b", "score": 0.0}
    assert answers[1].selection.decided_by == "no_executable"
    assert picks[2] == {"id": "fine", "sql": "SELECT count(*) FROM customers", "source": "a", "score": 1.0}
    trace = [json.loads(line) for line in (tmp_path / "trace.jsonl").read_text().splitlines()]
    assert trace[1]["candidates"][1]["dropped"] == "filtered: unknown column: nme (not in customers)"


@pytest.mark.parametrize("method", ["hybrid", "majority"])
def test_trace_is_strict_json_when_one_result_class_has_no_rival(tmp_path, demo_db_root, method):
    """A lone result class has no margin: the trace says null, never `Infinity` (not JSON)."""
    from sirius_train.commands.select import select_file

    row = {"id": "one", "db_id": "retail", "question": "q",
           "candidates": [{"source": "a", "sql": "SELECT count(*) FROM customers"},
                          {"source": "b", "sql": "SELECT count(*) FROM customers"}]}
    pools = tmp_path / "pools.jsonl"
    pools.write_text(json.dumps(row) + "\n")
    select_file(demo_db_root, pools, tmp_path / "picks.jsonl", config=SelectorConfig(), method=method, workers=0,
                trace_path=tmp_path / "trace.jsonl", show_progress=False)

    def refuse(name):
        raise ValueError(f"{name} is not JSON")

    (trace,) = [json.loads(line, parse_constant=refuse) for line in (tmp_path / "trace.jsonl").read_text().splitlines()]
    assert trace["selection"]["margin"] is None
