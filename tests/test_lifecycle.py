"""Pre-execution filter, structural repair operators and the model-free lifecycle, on real SQLite files."""

from __future__ import annotations

import pytest

from data_synthesis.schema import read_schema
from rewards.executor import Executor
from rewards.outcome import Status
from sirius_train.inference.candidates import Candidate, Question
from sirius_train.inference.lifecycle import Lifecycle, Task, condensed_feedback
from sirius_train.inference.operators import closest_value, literal_uses, rebind_literals, relax_case, relax_containment
from sirius_train.inference.prefilter import prefilter


@pytest.fixture(scope="module")
def retail(demo_db_root):
    return read_schema(demo_db_root / "retail" / "retail.sqlite")


@pytest.mark.parametrize("sql, kind", [
    ("SELECT name FROM customers WHERE city = 'Paris'", None),
    ('SELECT name FROM customers WHERE city = "Paris"', None),  # SQLite reads an unknown "name" as a string
    ("SELECT c.name, count(*) AS n FROM customers AS c JOIN orders AS o ON o.customer_id = c.id GROUP BY c.id "
     "ORDER BY n DESC", None),  # an output alias used in ORDER BY
    ("WITH big AS (SELECT customer_id, count(*) AS n FROM orders GROUP BY customer_id) SELECT b.n FROM big AS b", None),
    ("SELECT x.total FROM (SELECT sum(price) AS total FROM products) AS x", None),
    ("SELECT name FROM customers AS c WHERE EXISTS (SELECT 1 FROM orders WHERE orders.customer_id = c.id)", None),
    ("SELECT rowid, * FROM products", None),
    ("SELECT name FROM customers JOIN orders USING (id)", None),
    ("SELECT nme FROM customers", "unknown_column"),
    ("SELECT c.nme FROM customers AS c", "unknown_column"),
    ("SELECT o.name FROM customers AS c", "unknown_column"),  # no alias o in scope
    ("SELECT name FROM customer", "unknown_table"),
    ("SELECT id FROM customers JOIN orders ON orders.customer_id = customers.id", "ambiguous_column"),
    ("SELECT city FROM customers WHERE count(*) > 2", "misused_aggregate"),
    ("DELETE FROM customers", "not_select"),
    ("SELECT 1; SELECT 2", "unparsable"),
    ("", "unparsable"),
    ("SELEC name FROM customers", "unanalysable"),  # sqlglot cannot read it: the engine judges
    ("SELECT name FROM customers JOIN customers", "unanalysable"),  # sqlglot: Alias already used
])
def test_prefilter(retail, sql, kind):
    verdict = prefilter(sql, retail)
    assert verdict.admitted == (kind in (None, "unanalysable")), verdict.reason
    assert verdict.kind == kind
    if kind:
        assert verdict.reason


def test_prefilter_reasons_name_the_culprit(retail):
    assert prefilter("SELECT nme FROM customers", retail).reason == "unknown column: nme (not in customers)"
    assert "orders" in prefilter("SELECT name FROM order", retail).reason  # lists the real tables


def test_prefilter_never_refuses_a_query_sqlite_runs(spider_root, spider_pools):
    """Every distinct query of the real pools (and their gold) that executes must pass the filter."""
    schemas, queries = {}, set()
    for pool in spider_pools:
        db = pool["db_id"]
        schemas.setdefault(db, read_schema(spider_root / "databases" / db / f"{db}.sqlite", n_samples=0))
        queries.update((db, sql) for sql in [pool["gold_sql"]] + [c["sql"] for c in pool["candidates"]])
    queries = sorted(queries)
    with Executor(spider_root / "databases", workers=0) as executor:
        outcomes = executor.execute_many(queries)
    refused_but_ran = [(db, sql) for (db, sql), o in zip(queries, outcomes)
                       if o.executed and not prefilter(sql, schemas[db]).admitted]
    caught = sum(not prefilter(sql, schemas[db]).admitted for (db, sql), o in zip(queries, outcomes)
                 if o.status is Status.ERROR)
    errors = sum(o.status is Status.ERROR for o in outcomes)
    assert len(queries) > 4000 and not refused_but_ran
    assert caught >= 0.8 * errors  # most engine errors are caught before execution, with a reason


# Valid SQLite the resolver must not trip over: windows, CTEs (recursive, VALUES, declared columns), compound
# ORDER BY, correlated subqueries, output aliases in WHERE / HAVING, every quoting style, table-valued functions.
SQLITE_ACCEPTS = [
    "SELECT name, rank() OVER (PARTITION BY city ORDER BY signup_year) AS r FROM customers",
    "SELECT name, sum(price) OVER w FROM products WINDOW w AS (PARTITION BY category)",
    "SELECT CASE WHEN price > 100 THEN 'hi' ELSE 'lo' END AS band, count(*) FROM products GROUP BY band",
    "SELECT iif(stock > 0, 'in', 'out'), CAST(price AS INTEGER) FROM products",
    "SELECT strftime('%Y', order_date) AS y, count(*) FROM orders GROUP BY y HAVING count(*) > 1 ORDER BY y",
    "SELECT group_concat(name, ', ') FROM customers WHERE city = 'Paris'",
    "SELECT name, (SELECT count(*) FROM orders WHERE orders.customer_id = customers.id) AS n FROM customers",
    "SELECT * FROM customers NATURAL JOIN orders",
    "SELECT c.name, o.id FROM customers c LEFT JOIN orders o ON o.customer_id = c.id WHERE o.id IS NULL",
    "WITH v(a, b) AS (VALUES (1, 2), (3, 4)) SELECT a + b FROM v",
    "SELECT name AS n FROM customers WHERE n LIKE 'A%' ORDER BY n",
    "SELECT * FROM (SELECT name FROM customers) WHERE name LIKE 'B%'",
    "SELECT customers.* FROM customers",
    "SELECT [name], `city` FROM customers",
    "SELECT name FROM customers ORDER BY 1 LIMIT 5 OFFSET 2",
    "SELECT name FROM customers WHERE city = 'paris' COLLATE NOCASE",
    "SELECT name FROM customers WHERE name LIKE 'A!_%' ESCAPE '!'",
    "SELECT name FROM customers WHERE name GLOB 'A*'",
    "SELECT name FROM customers WHERE email IS NOT NULL AND signup_year BETWEEN 2016 AND 2018",
    "SELECT count(DISTINCT city) FROM customers",
    "WITH a AS (SELECT id FROM customers), b AS (SELECT id FROM a WHERE id < 10) SELECT count(*) FROM b",
    "SELECT city FROM customers UNION ALL SELECT category FROM products ORDER BY city",
    "SELECT name FROM customers WHERE id IN (WITH x AS (SELECT customer_id FROM orders) SELECT customer_id FROM x)",
    "SELECT DISTINCT city FROM customers",
    "SELECT json_extract('{\"a\": 1}', '$.a')",
    "SELECT value FROM json_each('[1,2,3]')",
    "SELECT 1",
    "SELECT count(*) FROM customers AS c WHERE NOT EXISTS (SELECT 1 FROM orders AS o WHERE o.customer_id = c.id)",
    "SELECT c.city, max(p.price) FROM customers AS c, orders AS o, order_items AS i, products AS p WHERE o.customer_id = c.id AND i.order_id = o.id AND p.id = i.product_id GROUP BY c.city",
    "SELECT name FROM customers WHERE city IN ('Paris', 'Rome')",
    "SELECT upper(name) FROM customers WHERE length(name) > 10 AND abs(-1) = 1",
    "SELECT T1.name FROM customers AS T1 WHERE T1.id = (SELECT max(T2.customer_id) FROM orders AS T2)",
    "SELECT o.status, count(*) AS cnt FROM orders o GROUP BY 1 HAVING cnt > 100",
    "SELECT * FROM orders WHERE order_date > date('now', '-10 years')",
    "SELECT name FROM customers INTERSECT SELECT name FROM customers WHERE city = 'Paris' EXCEPT SELECT 'x'",
    "SELECT a.name, b.name FROM customers a JOIN customers b ON a.city = b.city AND a.id < b.id LIMIT 3",
    "SELECT e.x FROM (SELECT 1 AS x UNION SELECT 2) AS e",
    "SELECT d.cnt FROM (SELECT count(*) AS cnt FROM orders GROUP BY status) d(cnt)",
    "select \"name\" from \"customers\" where \"city\" = 'Paris'",
    "SELECT max(price) - min(price) FROM products",
    "SELECT name FROM products ORDER BY price DESC NULLS LAST LIMIT 1",
    "SELECT total(quantity) FROM order_items",
    "SELECT o.id FROM orders AS o WHERE o.customer_id IN (SELECT id FROM customers WHERE customers.city = 'Paris' AND o.status = 'shipped')",
    "SELECT ROWID FROM customers LIMIT 1",
    "SELECT count(*) FILTER (WHERE price > 10) FROM products",
    "SELECT p.name FROM products p WHERE p.price > (SELECT avg(price) FROM products WHERE category = p.category)",
]


@pytest.mark.parametrize("sql", SQLITE_ACCEPTS)
def test_prefilter_admits_what_sqlite_runs(demo_db_root, retail, sql):
    from rewards.sandbox import Sandbox

    with Sandbox(demo_db_root / "retail" / "retail.sqlite") as sandbox:
        ran = sandbox.run(sql).executed
    assert prefilter(sql, retail).admitted or not ran, prefilter(sql, retail).reason


# ------------------------------------------------------------------------------------------ operators
@pytest.mark.parametrize("literal, values, expected", [
    ("Dog", ["cat", "dog"], "dog"),
    (" new  york", ["New York", "Newark"], "New York"),
    ("Katherine", ["Catherine", "Kate"], "Catherine"),
    ("House", ["House, Bungalow, etc.", "Apartment"], "House, Bungalow, etc."),
    ("WI", ["Wisconsin", "Hawaii"], None),  # short codes are never matched by containment
    ("French", ["France", "Germany"], None),  # a different word, not a typo
    ("Apple", ["Apple pie", "Apple juice"], None),  # ambiguous containment
    ("x", [1, 2, None], None),
])
def test_closest_value(literal, values, expected):
    assert closest_value(literal, values) == expected


def test_operators_edit_only_ungrounded_literals(retail):
    values = {("customers", "city"): ["Paris", "Lisbon"], ("orders", "status"): ["shipped", "pending"]}
    lookup = lambda table, column: values.get((table, column.lower()))
    sql = ("SELECT count(*) FROM customers AS c JOIN orders AS o ON o.customer_id = c.id "
           "WHERE c.city = 'paris' AND o.status = 'shipped' AND c.name = 'Ana'")
    uses = {(u.column, u.value): (u.grounded, u.closest) for u in literal_uses(sql, retail, lookup)}
    assert uses == {("c.city", "paris"): (False, "Paris"), ("o.status", "shipped"): (True, None),
                    ("c.name", "Ana"): (None, None)}  # name values unknown to this lookup
    assert rebind_literals(sql, retail, lookup).edits == ("c.city: 'paris' -> 'Paris'",)
    assert "c.city LIKE 'paris'" in relax_case(sql, retail, lookup).sql
    assert "c.name LIKE '%Ana%'" not in relax_containment(sql, retail, lookup).sql  # 3 letters: too short
    assert "o.status = 'shipped'" in relax_containment(sql, retail, lookup).sql  # grounded: untouched


def test_relaxed_patterns_match_a_literal_wildcard_only_as_itself(tmp_path):
    """`= '100% wool'` relaxed to LIKE must not let its `%` (or a `_`) match other text: the patterns escape
    them. Checked on a real SQLite file."""
    import sqlite3

    from data_synthesis.schema import Column, Schema, Table

    path = tmp_path / "shop.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE item (name TEXT)")
        conn.executemany("INSERT INTO item VALUES (?)", [("100% Wool",), ("1000 wool",), ("A_B coat",), ("AxB coat",),
                                                         ("my a_b coat",), ("my axb coat",)])
    schema = Schema("shop", (Table("item", (Column("name", "TEXT"),)),))
    unknown = lambda table, column: None

    def run(rewrite):
        with sqlite3.connect(path) as conn:
            return sorted(r[0] for r in conn.execute(rewrite.sql))

    assert run(relax_case("SELECT name FROM item WHERE name = '100% WOOL'", schema, unknown)) == ["100% Wool"]
    assert run(relax_case("SELECT name FROM item WHERE name = 'a_b COAT'", schema, unknown)) == ["A_B coat"]
    assert run(relax_containment("SELECT name FROM item WHERE name = 'a_b coat'", schema, unknown)) == [
        "A_B coat", "my a_b coat"]
    plain = relax_case("SELECT name FROM item WHERE name = 'wool'", schema, unknown)
    assert "ESCAPE" not in plain.sql  # nothing to escape: the pattern stays as it was


def test_relax_case_never_proposes_the_query_it_was_given(retail):
    """`col LIKE 'x'` is already case-insensitive: relax_case has nothing to offer (not the same SQL again)."""
    unknown = lambda table, column: None
    assert relax_case("SELECT name FROM customers WHERE city LIKE 'PARIS'", retail, unknown) is None
    assert relax_containment("SELECT name FROM customers WHERE city LIKE 'PARIS'", retail, unknown).sql.endswith(
        "city LIKE '%PARIS%'")


# ------------------------------------------------------------------------------------------ lifecycle, no model
def test_lifecycle_without_llm_filters_executes_and_rebinds(demo_db_root, retail):
    candidates = [Candidate("spec", 0, "SELECT name FROM customers WHERE city = 'Paris'"),
                  Candidate("spec", 1, "SELECT name FROM customers WHERE city = 'paris '"),  # empty -> rebind
                  Candidate("spec", 2, "SELECT count(*) FROM customers WHERE cty = 'Paris'"),  # filtered
                  Candidate("gen", 0, "SELECT count(*) FROM customers WHERE substr(city) = 'P'"),  # engine error
                  Candidate("gen", 1, None),  # no SQL in the answer
                  Candidate("gen", 2, "SELECT name FROM customers WHERE signup_year > 3000")]  # empty, no literal
    task = Task(Question(1, "retail", "Which customers live in Paris?", retail.to_text()), retail, candidates)
    with Executor(demo_db_root, workers=0) as executor:
        lifecycle = Lifecycle(executor)
        lifecycle.run([task])
    first, rebound, filtered, broken, no_sql, empty = candidates
    assert first.outcome.status is Status.OK and first.dropped is None
    assert rebound.outcome.rows == first.outcome.rows and rebound.sql.endswith("city = 'Paris'")
    repair = [e for e in rebound.events if e["step"] == "repair"][0]
    assert repair["operator"] == "rebind_literal" and repair["readmitted"]
    assert filtered.dropped.startswith("filtered: unknown column: cty") and filtered.outcome is None
    assert broken.dropped == "error: wrong number of arguments to function substr()"
    assert no_sql.dropped.startswith("no SQL in the answer")
    assert empty.outcome.status is Status.EMPTY and empty.dropped is None  # still a legal (empty) answer
    assert [e["step"] for e in broken.events] == ["filter", "execute", "drop"]
    assert lifecycle.stats["filtered:unknown_column"] == 1 and lifecycle.stats["filtered:no_sql"] == 1
    assert [b.status for b in task.ballots()] == [Status.OK, Status.OK, Status.REJECTED, Status.ERROR,
                                                  Status.REJECTED, Status.EMPTY]
    assert "rebind_literal on empty readmitted 1" in lifecycle.summary()


def test_grounding_marks_literals_no_value_of_their_column_matches(demo_db_root, retail):
    sqls = ["SELECT name FROM customers WHERE city != 'Atlantis'",  # rows, but the filter filters nothing
            "SELECT name FROM customers WHERE city != 'Paris'",
            "SELECT count(*) FROM customers WHERE signup_year = '2016'",  # numeric affinity: '2016' is 2016
            "SELECT count(*) FROM customers WHERE signup_year = '1066'",  # a count of nothing: (0,)
            "SELECT name FROM customers WHERE city = 'Atlantis'"]  # empty, and no operator can help
    candidates = [Candidate("spec", k, sql) for k, sql in enumerate(sqls)]
    task = Task(Question(1, "retail", "Who does not live in Paris?", retail.to_text()), retail, candidates)
    with Executor(demo_db_root, workers=0) as executor:
        lifecycle = Lifecycle(executor)
        lifecycle.run([task])
    assert [c.ungrounded for c in candidates] == [("city: 'Atlantis'",), (), (), ("signup_year: '1066'",),
                                                  ("city: 'Atlantis'",)]
    assert [e for e in candidates[0].events if e["step"] == "ground"] == [
        {"step": "ground", "ungrounded": ["city: 'Atlantis'"]}]
    assert candidates[0].to_json()["ungrounded"] == ["city: 'Atlantis'"] and "ungrounded" not in candidates[1].to_json()
    ballots = task.ballots()
    assert [b.status for b in ballots] == [Status.OK, Status.OK, Status.OK, Status.OK, Status.EMPTY]
    assert lifecycle.stats["ungrounded:ok"] == 2 and lifecycle.stats["ungrounded:empty"] == 1


def test_condensed_feedback_lists_each_failure_once():
    from rewards.outcome import Outcome

    same = "SELECT a FROM t"
    candidates = [Candidate("s", 0, same, dropped="error: no such column: a"),
                  Candidate("s", 1, same, dropped="error: no such column: a"),
                  Candidate("s", 2, "SELECT b FROM t", outcome=Outcome(Status.EMPTY)),
                  Candidate("s", 3, "SELECT c FROM t", outcome=Outcome(Status.OK, rows=((1,),)))]
    assert condensed_feedback(candidates).splitlines() == ["- SELECT a FROM t -> error: no such column: a",
                                                           "- SELECT b FROM t -> returned no rows"]
