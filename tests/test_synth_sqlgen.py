"""SQL synthesis over any SQLite file: executable, non-empty, distinct, canonical, grounded, seeded."""

import sqlite3
from collections import Counter

import pytest
from tiny_run import NANO

from data_synthesis.demo_dbs import DEMO_DB_IDS
from data_synthesis.sqlgen.features import FEATURES, feature_shares, sql_features
from data_synthesis.sqlgen.llm_writer import required_literals
from data_synthesis.sqlgen.profile import profile_database
from data_synthesis.sqlgen.rules import RULES, child_noun
from data_synthesis.sqlgen.synthesize import Synthesizer, synthesize
from data_synthesis.sqlgen.trees import ident, parse, render
from rewards.sandbox import Sandbox
from sirius_train.config import ConfigError, load_config


@pytest.fixture(scope="module")
def demo_examples(demo_db_root):
    return {db: synthesize(demo_db_root / db / f"{db}.sqlite", 40, seed=0) for db in DEMO_DB_IDS}


def test_every_gold_executes_non_empty_and_is_distinct(demo_examples, demo_db_root):
    for db, examples in demo_examples.items():
        assert len(examples) == 40
        assert len({e.gold_sql for e in examples}) == 40 and len({e.id for e in examples}) == 40
        assert len({e.question for e in examples}) == 40  # one question, one SQL
        with Sandbox(demo_db_root / db / f"{db}.sqlite") as sandbox:  # checked again, independently
            outcomes = [sandbox.run(e.gold_sql) for e in examples]
        assert all(o.status.value == "ok" and o.rows for o in outcomes), db
        assert all(e.db_id == db and e.source == "synth" and e.meta["rule"] for e in examples)


def test_sql_is_canonical_and_questions_name_their_values(demo_examples):
    for examples in demo_examples.values():
        for e in examples:
            assert render(parse(e.gold_sql)) == e.gold_sql  # one surface form: sqlglot's
            for text in required_literals(e.gold_sql):
                assert text in e.question, (e.question, e.gold_sql)
            assert e.question[-1] in "?." and e.question[0].isupper()


def test_the_mix_covers_every_feature(demo_examples):
    shares, parsed, failed = feature_shares(e.gold_sql for ex in demo_examples.values() for e in ex)
    assert failed == 0 and parsed == 200
    assert all(shares[f] > 0 for f in FEATURES), shares
    rules = Counter(e.meta["rule"] for ex in demo_examples.values() for e in ex)
    assert set(rules) == {"rows", "count", "aggregate", "group", "top", "nested", "set_op"}


def test_seeded(demo_db_root):
    path = demo_db_root / "flights" / "flights.sqlite"
    a = synthesize(path, 15, seed=3)
    assert a == synthesize(path, 15, seed=3)  # meta (gold timings) is not part of equality
    assert {e.gold_sql for e in a} != {e.gold_sql for e in synthesize(path, 15, seed=4)}


def test_where_scale_zero_leaves_no_filter_and_one_is_the_rules_own_mix(demo_db_root):
    path = demo_db_root / "retail" / "retail.sqlite"
    plain = synthesize(path, 40, seed=0, where_scale=0.0, rules=tuple(r for r in RULES if r.name not in ("nested", "set_op")))
    assert len(plain) == 40 and not any(" WHERE " in e.gold_sql for e in plain)
    assert synthesize(path, 20, seed=0, where_scale=1.0) == synthesize(path, 20, seed=0)
    assert sum(" WHERE " in e.gold_sql for e in synthesize(path, 40, seed=0)) >= 10
    with pytest.raises(ValueError, match="where_scale"):
        synthesize(path, 5, where_scale=1.5)
    with pytest.raises(ConfigError, match="data.synth_where"):
        load_config(NANO, ["data.synth_where=-0.5"])


def test_joins_follow_foreign_keys_only(demo_examples, demo_db_root):
    profile = profile_database(demo_db_root / "university" / "university.sqlite")
    keys = {frozenset([(lk.child.lower(), lk.child_column.lower()), (lk.parent.lower(), lk.parent_column.lower())])
            for lk in profile.links}
    from sqlglot import exp
    for e in demo_examples["university"]:
        for join in parse(e.gold_sql).find_all(exp.Join):
            select = join.find_ancestor(exp.Select)
            alias = {t.alias_or_name: t.name for t in select.find_all(exp.Table)}
            on = join.args["on"]
            pair = frozenset((alias[c.table].lower(), c.name.lower()) for c in (on.this, on.expression))
            assert pair in keys, e.gold_sql


def test_two_keys_to_one_parent_are_told_apart(demo_db_root):
    profile = profile_database(demo_db_root / "flights" / "flights.sqlite")
    twins = [lk for lk in profile.links if lk.parent == "airports"]
    assert sorted(child_noun(profile, lk) for lk in twins) == ["flights by dest airport id",
                                                               "flights by source airport id"]
    assert child_noun(profile, next(lk for lk in profile.links if lk.parent == "airlines")) == "flights"


def test_any_sqlite_file_with_awkward_names(tmp_path):
    path = tmp_path / "odd.sqlite"
    conn = sqlite3.connect(path)
    conn.executescript("""
        CREATE TABLE "Order" ("Order Id" INTEGER PRIMARY KEY, "group" TEXT, "Total Amount" REAL, note TEXT);
        CREATE TABLE item (id INTEGER PRIMARY KEY, "Order Id" INTEGER REFERENCES "Order"("Order Id"), qty INTEGER);
    """)
    rows = [(i, ["a", "b", "c'd"][i % 3], i * 1.5, f"n {i}") for i in range(1, 31)]
    conn.executemany('INSERT INTO "Order" VALUES (?, ?, ?, ?)', rows)
    conn.executemany("INSERT INTO item VALUES (?, ?, ?)", [(i, i % 30 + 1, i % 4) for i in range(1, 91)])
    conn.commit()
    conn.close()
    examples = synthesize(path, 30, seed=0)
    assert len(examples) == 30
    with Sandbox(path) as sandbox:
        assert all(sandbox.run(e.gold_sql).rows for e in examples)
    assert any('"Order"' in e.gold_sql for e in examples) and any("JOIN" in e.gold_sql for e in examples)
    assert [ident(n).sql("sqlite") for n in ("Order", "group", "qty", "Total Amount")] == \
        ['"Order"', '"group"', "qty", '"Total Amount"']


def test_empty_database_yields_nothing_and_says_why(tmp_path):
    path = tmp_path / "empty.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE t (a INTEGER, b TEXT)")
    conn.close()
    synth = Synthesizer(path)
    assert synth.run(10) == []
    assert synth.stats.rejected == {"no table with rows": 1}
    with pytest.raises(FileNotFoundError, match="database file not found"):
        synthesize(tmp_path / "missing.sqlite", 3)


def test_feature_counter():
    assert sql_features("SELECT name FROM t") == frozenset()
    assert sql_features("SELECT a FROM t WHERE b > (SELECT AVG(b) FROM t)") == {"nested", "where", "aggregate"}
    assert sql_features("SELECT a FROM (SELECT a FROM t)") == {"nested"}
    assert sql_features("SELECT a FROM t INTERSECT SELECT a FROM u") == {"set_op"}
    assert sql_features("SELECT DISTINCT a FROM t ORDER BY a LIMIT 2") == {"distinct", "order_limit"}
    assert sql_features("SELECT c, COUNT(*) FROM t GROUP BY c HAVING COUNT(*) > 1") == \
        {"aggregate", "group_by", "having"}


def test_spider_databases(spider_root):
    for db in ("concert_singer", "world_1", "car_1"):
        path = spider_root / "databases" / db / f"{db}.sqlite"
        if not path.exists():
            continue
        examples = synthesize(path, 25, seed=0)
        assert len(examples) == 25 and len({e.gold_sql for e in examples}) == 25
        with Sandbox(path) as sandbox:
            assert all(sandbox.run(e.gold_sql).rows for e in examples)
