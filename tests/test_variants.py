"""Variant databases (rewards.variants), the tie rule (rewards.ties) and suite scoring (rewards.scoring + suites).

What must hold: a variant keeps the schema, keys, foreign keys, NULL-free columns and the names that identify
rows; it is the same file content on every build; several processes may build it at once; the user's
database is never written; and the reward with variants catches a query that is right only by luck, while
an equivalent query, and a gold whose answer hangs on a tie, are not punished.
"""

from __future__ import annotations

import hashlib
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from rewards.executor import Executor
from rewards.scoring import ScoreItem, Scorer
from rewards.suites import Suite
from rewards.ties import UNDETERMINED, Probe, tie_probes, tied
from rewards.variants import TableData, VariantCache, read_tables, variant_rows

PROJECT = Path(__file__).resolve().parents[1]
SPIDER_DEV_DBS = ("concert_singer", "course_teach", "cre_Doc_Template_Mgt", "dog_kennels", "museum_visit",
                  "network_1", "pets_1", "poker_player", "real_estate_properties", "singer")


def _dump(path: Path) -> dict:
    with sqlite3.connect(path) as conn:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")]
        return {t: conn.execute(f'SELECT * FROM "{t}"').fetchall() for t in tables}


def _schema(path: Path) -> list:
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT type, name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' "
                            "ORDER BY type, name").fetchall()


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _school(root: Path) -> Path:
    """A tiny database where a wrong query is right by luck: no student outside grade 9 is older than 14."""
    folder = root / "school"
    folder.mkdir(parents=True)
    path = folder / "school.sqlite"
    with sqlite3.connect(path) as conn:
        conn.executescript("""
            CREATE TABLE class (class_id INTEGER PRIMARY KEY, title TEXT NOT NULL);
            CREATE TABLE student (id INTEGER PRIMARY KEY, name TEXT, grade INTEGER, age INTEGER,
                                  class_id INTEGER REFERENCES class(class_id));
            INSERT INTO class VALUES (1, 'Math'), (2, 'Art'), (3, 'Music');
            INSERT INTO student VALUES (1, 'Ann', 9, 14, 1), (2, 'Bob', 9, 15, 2), (3, 'Cid', 9, 16, 1),
                                       (4, 'Dee', 10, 13, 3), (5, 'Eve', 9, 17, 2), (6, 'Fay', 10, 12, 1);
        """)
    return path


# ---------------------------------------------------------------------------------------------- the builder
def test_variants_keep_schema_keys_foreign_keys_and_null_free_columns(spider_root, tmp_path):
    cache = VariantCache(tmp_path / "cache")
    for db_id in SPIDER_DEV_DBS:
        original = spider_root / "databases" / db_id / f"{db_id}.sqlite"
        with sqlite3.connect(f"file:{original}?mode=ro", uri=True) as conn:
            tables = {t.name: t for t in read_tables(conn)}
            null_free = {(t, c) for t, table in tables.items() for i, c in enumerate(table.columns)
                         if table.rows and all(r[i] is not None for r in table.rows)}
        for path in cache.paths(original, 3):
            assert _schema(path) == _schema(original), f"{db_id}: the schema changed"
            with sqlite3.connect(path) as conn:
                assert conn.execute("PRAGMA foreign_key_check").fetchall() == [], f"{db_id}: a dangling key"
                for name, table in tables.items():
                    rows = conn.execute(f'SELECT * FROM "{name}"').fetchall()
                    assert rows or not table.rows, f"{db_id}.{name} was emptied"
                    for unique in table.unique:
                        keys = [tuple(r[i] for i in unique) for r in rows if None not in (r[i] for i in unique)]
                        assert len(keys) == len(set(keys)), f"{db_id}.{name}: {unique} repeats"
                    for i, column in enumerate(table.columns):
                        if (name, column) in null_free:
                            assert all(r[i] is not None for r in rows), f"{db_id}.{name}.{column} got a NULL"


def test_a_name_that_picks_out_one_row_still_does(spider_root, tmp_path):
    """network_1's Highschooler names are 14 distinct in 16 (two namesakes): 'Kyle' names one student, and must
    still name one in every variant (else "the student Kyle" becomes ambiguous and equivalent queries differ)."""
    original = spider_root / "databases" / "network_1" / "network_1.sqlite"
    for path in VariantCache(tmp_path).paths(original, 5):
        with sqlite3.connect(path) as conn:
            counts = dict(conn.execute("SELECT name, count(*) FROM Highschooler GROUP BY name").fetchall())
        assert counts.get("Kyle", 0) <= 1 and max(counts.values()) <= 2


def test_variants_change_the_data(spider_root, tmp_path):
    original = spider_root / "databases" / "concert_singer" / "concert_singer.sqlite"
    dumps = [_dump(p) for p in VariantCache(tmp_path).paths(original, 3)]
    assert all(d != _dump(original) for d in dumps)
    assert dumps[0] != dumps[1] != dumps[2]
    # rows are added too: clones get fresh keys (singer_id) and fresh names, so they survive the key check
    assert max(len(d["singer"]) for d in dumps) > len(_dump(original)["singer"])


def test_building_is_deterministic_and_never_writes_the_original(spider_root, tmp_path):
    original = spider_root / "databases" / "dog_kennels" / "dog_kennels.sqlite"
    before = _digest(original)
    first = [_dump(p) for p in VariantCache(tmp_path / "a").paths(original, 2)]
    second = [_dump(p) for p in VariantCache(tmp_path / "b").paths(original, 2)]
    assert first == second
    assert [_dump(p) for p in VariantCache(tmp_path / "c", seed=1).paths(original, 2)] != first
    assert _digest(original) == before


def test_the_pure_core_is_a_function_of_rows_and_seed():
    t = TableData("t", ("id", "name", "age"), tuple((i, f"n{i}", 20 + i % 5) for i in range(10)),
                  unique=((0,), (1,)), keys=frozenset({0}))
    assert variant_rows([t], "x") == variant_rows([t], "x") != variant_rows([t], "y")
    rows = variant_rows([t], "x")["t"]
    assert all(20 <= r[2] <= 24 for r in rows), "a number left its column's range"
    assert len({r[0] for r in rows}) == len({r[1] for r in rows}) == len(rows) > 0


def test_a_changed_database_gets_new_variants(tmp_path):
    path = _school(tmp_path / "dbs")
    cache = VariantCache(tmp_path / "cache")
    first = cache.paths(path, 1)[0]
    with sqlite3.connect(path) as conn:
        conn.execute("INSERT INTO class VALUES (4, 'Drama')")
    second = cache.paths(path, 1)[0]
    assert first != second and "Drama" in str(_dump(second)["class"]) + str(_dump(path)["class"])


def test_concurrent_builders_share_one_build(tmp_path):
    path = _school(tmp_path / "dbs")
    script = ("import sys; from rewards.variants import VariantCache; "
              "print(*VariantCache(sys.argv[1]).paths(sys.argv[2], 3))")
    procs = [subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "cache"), str(path)], cwd=PROJECT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(4)]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _, err in outputs]
    assert len({out for out, _ in outputs}) == 1
    files = sorted(p.name for p in (tmp_path / "cache").rglob("*") if p.is_file())
    assert files == [".lock", "school.v1.sqlite", "school.v2.sqlite", "school.v3.sqlite"], files


# ---------------------------------------------------------------------------------------------- the tie rule
def test_tie_probes():
    (probe,) = tie_probes("SELECT name FROM t ORDER BY age DESC LIMIT 2 OFFSET 1")
    assert probe == Probe("SELECT name, age FROM t ORDER BY age DESC LIMIT 4", 3, 1)
    assert tied(probe, [("a", 9), ("b", 8), ("c", 7), ("d", 7)])
    assert not tied(probe, [("a", 9), ("b", 8), ("c", 7), ("d", 6)])
    assert not tied(probe, [("a", 9), ("b", 8), ("c", 7)])  # nothing past the cut
    nested = tie_probes("SELECT name FROM s WHERE id = (SELECT sid FROM t GROUP BY sid ORDER BY count(*) DESC LIMIT 1)")
    assert [p.sql for p in nested] == ["SELECT sid, COUNT(*) FROM t GROUP BY sid ORDER BY COUNT(*) DESC LIMIT 2"]
    assert tie_probes("SELECT a FROM t UNION SELECT b FROM u ORDER BY 1 LIMIT 1")[0].cut == 1
    assert tie_probes("SELECT name FROM t LIMIT 1") == UNDETERMINED
    assert tie_probes("SELECT count(*) FROM t") == () == tie_probes("not sql at all (")


def _scores(scorer: Scorer, gold: str, preds: list[str]) -> list[bool]:
    return [scorer.score(ScoreItem("school", gold, p, "spider")).match for p in preds]


def test_variants_catch_a_lucky_query_and_keep_an_equivalent_one(tmp_path):
    _school(tmp_path / "dbs")
    gold = "SELECT name FROM student WHERE grade = 9 AND age > 14"
    preds = ["SELECT name FROM student WHERE age > 14",  # drops the grade filter: right only on this database
             "SELECT s.name FROM student AS s WHERE s.age >= 15 AND s.grade IN (9)"]  # the same question
    assert _scores(Scorer(tmp_path / "dbs"), gold, preds) == [True, True]
    suite = Suite(variants=3, cache_dir=str(tmp_path / "cache"))
    assert _scores(Scorer(tmp_path / "dbs", suite=suite), gold, preds) == [False, True]


def test_a_gold_whose_answer_hangs_on_a_tie_is_not_checked_there(tmp_path):
    _school(tmp_path / "dbs")
    gold = "SELECT T2.title FROM student AS T1 JOIN class AS T2 ON T1.class_id = T2.class_id " \
           "GROUP BY T2.class_id ORDER BY count(*) DESC LIMIT 1"
    # the same question, ties broken both ways: on a tied variant one of them differs from the gold
    same = [f"SELECT title FROM class WHERE class_id = (SELECT class_id FROM student GROUP BY class_id "
            f"ORDER BY count(*) DESC, class_id {way} LIMIT 1)" for way in ("ASC", "DESC")]
    suite = Suite(variants=6, cache_dir=str(tmp_path / "cache"))
    scorer = Scorer(tmp_path / "dbs", suite=suite)
    tied_somewhere = False
    for path in scorer.suite_paths("school"):
        with sqlite3.connect(path) as conn:
            counts = [c for (c,) in conn.execute("SELECT count(*) FROM student GROUP BY class_id ORDER BY 1 DESC")]
        tied_somewhere |= len(counts) > 1 and counts[0] == counts[1]
    assert tied_somewhere, "no variant ties: the test would prove nothing (change the seed)"
    assert _scores(scorer, gold, same) == [True, True]


# ---------------------------------------------------------------------------------------------- the plumbing
def test_executor_workers_and_compute_score_apply_the_variants(tmp_path):
    from rewards.verl_reward import compute_score

    _school(tmp_path / "dbs")
    gold, lucky = "SELECT name FROM student WHERE grade = 9 AND age > 14", "SELECT name FROM student WHERE age > 14"
    suite = Suite(variants=3, cache_dir=str(tmp_path / "cache"))
    with Executor(tmp_path / "dbs", workers=1, suite=suite) as executor:
        (result,) = executor.score([ScoreItem("school", gold, lucky, "spider")])
    assert (result.match, result.reward, result.pred_status) == (False, 0.0, "ok")
    answer = f"```sql\n{lucky}\n```"
    extra = {"db_id": "school", "db_root": str(tmp_path / "dbs")}
    assert compute_score("spider", answer, gold, extra)["acc"] == 1.0  # the default: no variants
    assert compute_score("spider", answer, gold, extra, variants=3, variants_dir=str(tmp_path / "cache"))["acc"] == 0.0


def test_a_database_whose_variants_cannot_be_built_is_scored_on_itself(tmp_path, capsys):
    _school(tmp_path / "dbs")
    (tmp_path / "cache").write_text("a file where the cache folder should be")
    scorer = Scorer(tmp_path / "dbs", suite=Suite(variants=2, cache_dir=str(tmp_path / "cache")))
    gold, lucky = "SELECT name FROM student WHERE grade = 9 AND age > 14", "SELECT name FROM student WHERE age > 14"
    assert _scores(scorer, gold, [lucky]) == [True]
    assert "school: scored on its own database only" in capsys.readouterr().err


def test_an_official_test_suite_folder(tmp_path):
    """`Suite(folder=True)`: every *.sqlite beside the database counts, as in Zhong et al.'s evaluator."""
    original = _school(tmp_path / "ts")
    extra = original.with_name("school_2.sqlite")
    extra.write_bytes(original.read_bytes())
    with sqlite3.connect(extra) as conn:
        conn.execute("UPDATE student SET grade = 10 WHERE id = 5")
    gold, lucky = "SELECT name FROM student WHERE grade = 9 AND age > 14", "SELECT name FROM student WHERE age > 14"
    assert Suite(folder=True).extra_paths(original) == [extra]
    assert _scores(Scorer(tmp_path / "ts", suite=Suite(folder=True)), gold, [lucky, gold]) == [False, True]


def test_the_reward_server_applies_its_variants(tmp_path, monkeypatch):
    """`sirius reward-server --variants K`: the /v1/score contract is unchanged, the server asks for the match on
    K variants, says so on /health, and verl's compute_score on that server gets the stricter reward."""
    import httpx

    from rewards.service import ServerConfig
    from rewards.verl_reward import compute_score
    from server_harness import running_server

    _school(tmp_path / "dbs")
    for name in ("SIRIUS_REWARD_URL", "SIRIUS_REWARD_TOKEN", "SIRIUS_DB_ROOT"):
        monkeypatch.delenv(name, raising=False)
    gold, lucky = "SELECT name FROM student WHERE grade = 9 AND age > 14", "SELECT name FROM student WHERE age > 14"
    config = ServerConfig(tmp_path / "dbs", workers=1, variants=3, variants_dir=str(tmp_path / "cache"))
    with running_server(config) as server:
        assert httpx.get(server.url + "/health", timeout=10).json()["variants"] == 3
        items = [{"db_id": "school", "gold_sql": gold, "pred_sql": sql, "compare": "spider"} for sql in (lucky, gold)]
        answer = httpx.post(server.url + "/v1/score", json={"items": items}, timeout=60).json()
        assert [r["match"] for r in answer["results"]] == [False, True]
        extra = {"db_id": "school", "compare": "spider"}
        assert compute_score("spider", f"```sql\n{lucky}\n```", gold, extra, reward_url=server.url)["acc"] == 0.0


def test_reward_variants_reach_verl_and_the_local_backend_keeps_plain_ex(tmp_path):
    """`reward.variants: K` loads, is refused below 0, reaches compute_score's kwargs on the verl backend (in-process
    and as a server's fallback), and leaves held-out evaluation on the plain EX scorer."""
    from sirius_train.config import ConfigError, load_config
    from sirius_train.local.backend import LocalBackend
    from sirius_train.verl_backend.translate import StagePaths, stage_overrides

    nano = PROJECT / "configs" / "nano.yaml"
    paths = StagePaths(train_files="/r/c.parquet", val_files="/r/e.parquet", model="/r/m", checkpoints="/r/ck",
                       reward_fn="/code/rewards/verl_reward.py", db_root="/data/dbs", pythonpath="/code",
                       metrics="/r/m.jsonl")
    for extra in ([], ["reward.url=http://a:8000"]):
        cfg = load_config(nano, ["backend=verl", "reward.variants=3", *extra])
        overrides = dict(o.split("=", 1) for o in stage_overrides(cfg, 1, cfg.stages[0], paths))
        assert overrides["+reward.custom_reward_function.reward_kwargs.variants"] == "3"
    plain = load_config(nano, ["backend=verl"])
    assert not [o for o in stage_overrides(plain, 1, plain.stages[0], paths) if "variants" in o]
    with pytest.raises(ConfigError, match="reward.variants"):
        load_config(nano, ["reward.variants=-1"])
    _school(tmp_path / "dbs")
    backend = LocalBackend(load_config(nano, ["reward.variants=2", f"data.db_root={tmp_path / 'dbs'}",
                                              f"output_dir={tmp_path / 'runs'}"]))
    try:
        assert backend.executor.suite.variants == 2 and backend.eval_executor.suite.variants == 0
    finally:
        backend.close()
