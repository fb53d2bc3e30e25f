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


def test_a_database_replaced_with_its_size_and_mtime_kept_gets_new_variants(tmp_path):
    """`cp -p` / `rsync -a` of another release keeps size and mtime: variants of the old rows would judge the new
    database. The fingerprint's inode and change time (which no copy keeps) tell them apart."""
    import os
    import shutil

    def database(path: Path, value: int) -> Path:
        with sqlite3.connect(path) as conn:
            conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v INTEGER)")
            conn.executemany("INSERT INTO t VALUES (?, ?)", [(i, value) for i in range(20)])
        conn.close()
        return path

    original, release = database(tmp_path / "school.sqlite", 1), database(tmp_path / "release.sqlite", 2)
    assert original.stat().st_size == release.stat().st_size
    cache = VariantCache(tmp_path / "cache")
    before = cache.folder(original)
    assert cache.folder(original) == before  # unchanged: the same variants
    kept = original.stat()
    shutil.copyfile(release, original)
    os.utime(original, ns=(kept.st_atime_ns, kept.st_mtime_ns))  # what cp -p keeps
    assert (original.stat().st_size, original.stat().st_mtime_ns) == (kept.st_size, kept.st_mtime_ns)
    assert cache.folder(original) != before


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


# ---------------------------------------------------------------------------------- what the shipped data implies
def _spider_scores(spider_root: Path, tmp_path: Path, db_id: str, gold: str, preds: list[str], k: int = 3,
                   mode: str = "spider") -> tuple[list[bool], list[bool]]:
    """Each prediction's match on the shipped database alone, and with `k` variants."""
    db_root = spider_root / "databases"
    plain = Scorer(db_root)
    suite = Scorer(db_root, suite=Suite(variants=k, cache_dir=str(tmp_path / "cache")))
    return ([plain.score(ScoreItem(db_id, gold, p, mode)).match for p in preds],
            [suite.score(ScoreItem(db_id, gold, p, mode)).match for p in preds])


def test_a_dependency_the_rows_hold_holds_in_every_variant(spider_root, tmp_path):
    """mountain_photos: each range lies in one country (Toubkal Atlas: Morocco). A right answer that says so
    stays right; a lucky one (the country filter dropped) is still caught."""
    original = spider_root / "databases" / "mountain_photos" / "mountain_photos.sqlite"
    moved = False
    for path in VariantCache(tmp_path / "cache").paths(original, 3):
        with sqlite3.connect(path) as conn:
            pairs = conn.execute("SELECT Range, count(DISTINCT Country) FROM mountain GROUP BY Range").fetchall()
            moved |= conn.execute("SELECT count(*) FROM mountain WHERE Range = 'Toubkal Atlas'").fetchone()[0] != 5
        assert all(n == 1 for _, n in pairs), f"{path.name}: a range in two countries"
    assert moved, "the ranges' rows never changed: the test would prove nothing"
    gold = "SELECT name FROM mountain WHERE Range = 'Toubkal Atlas'"
    same = "SELECT name FROM mountain WHERE Range = 'Toubkal Atlas' AND Country = 'Morocco'"
    assert _spider_scores(spider_root, tmp_path, "mountain_photos", gold, [same]) == ([True], [True])
    gold = "SELECT name FROM mountain WHERE Country = 'Ethiopia' AND Height > 4190"
    lucky = "SELECT name FROM mountain WHERE Height > 4190"  # every mountain over 4190 m is Ethiopian here
    assert _spider_scores(spider_root, tmp_path, "mountain_photos", gold, [lucky]) == ([True], [False])


def test_an_undeclared_reference_found_in_the_data_points_at_a_row(spider_root, tmp_path):
    """activity_1: Student.Advisor holds faculty ids (18 of 58 sparse ids in 1082..9922) with no declared foreign
    key. Every variant's advisor is a faculty member there, so "each student with their advisor's name" by a
    join or by a lookup stays the same answer."""
    original = spider_root / "databases" / "activity_1" / "activity_1.sqlite"
    with sqlite3.connect(f"file:{original}?mode=ro", uri=True) as conn:
        (student,) = [t for t in read_tables(conn) if t.name == "Student"]
    assert [(student.columns[fk.columns[0]], fk.parent) for fk in student.foreign_keys] == [("Advisor", "Faculty")]
    for path in VariantCache(tmp_path / "cache").paths(original, 3):
        with sqlite3.connect(path) as conn:
            assert conn.execute("SELECT count(*) FROM Student WHERE Advisor NOT IN (SELECT FacID FROM Faculty)"
                                ).fetchone() == (0,), f"{path.name}: an advisor who is not on the faculty"
    gold = "SELECT T1.Fname, T2.Lname FROM Student AS T1 JOIN Faculty AS T2 ON T1.Advisor = T2.FacID"
    same = "SELECT Fname, (SELECT Lname FROM Faculty WHERE FacID = Advisor) FROM Student"
    assert _spider_scores(spider_root, tmp_path, "activity_1", gold, [same]) == ([True], [True])


def test_no_repeated_rows_or_pairs_where_the_shipped_data_has_none(spider_root, tmp_path):
    """product_catalog's Catalog_Contents_Additional_Attributes has no key and no repeated row, nor has
    activity_1's Participates_in: a SELECT DISTINCT of them is the same answer in every variant (spider's bags
    told them apart where a clone repeated a row). course_teach's arrangements never repeat a (course, teacher)
    pair: "teachers of at least two courses" counted by rows or by distinct courses stays the same answer."""
    for db, table in (("product_catalog", "Catalog_Contents_Additional_Attributes"), ("activity_1", "Participates_in")):
        gold = f"SELECT * FROM {table}"
        assert _spider_scores(spider_root, tmp_path, db, gold, [f"SELECT DISTINCT * FROM {table}"]) == ([True], [True])
    gold = ("SELECT T2.Name FROM course_arrange AS T1 JOIN teacher AS T2 ON T1.Teacher_ID = T2.Teacher_ID "
            "GROUP BY T2.Name HAVING COUNT(*) >= 2")
    same = gold.replace("COUNT(*)", "COUNT(DISTINCT T1.Course_ID)")
    assert _spider_scores(spider_root, tmp_path, "course_teach", gold, [same]) == ([True], [True])
    original = spider_root / "databases" / "course_teach" / "course_teach.sqlite"
    for path in VariantCache(tmp_path / "cache").paths(original, 3):
        with sqlite3.connect(path) as conn:
            assert conn.execute("SELECT count(*) FROM (SELECT DISTINCT Course_ID, Teacher_ID FROM course_arrange)"
                                ).fetchone() == conn.execute("SELECT count(*) FROM course_arrange").fetchone()


def test_a_variant_without_the_questions_premise_takes_no_answer_for_an_answer(spider_root, tmp_path):
    """concert_singer's third variant has no singer from the Netherlands: there max() gives NULL and ORDER BY ...
    LIMIT 1 no row, both saying "nobody". Lucky answers stay caught: a wrong literal that matches the empty gold
    on the shipped database (pets_1: 'Cat' for 'cat'), a comparison that selects nothing (`Highest = 100`)."""
    db = "concert_singer"
    original = spider_root / "databases" / db / f"{db}.sqlite"
    gone = [sqlite3.connect(p).execute("SELECT count(*) FROM singer WHERE Country = 'Netherlands'").fetchone() == (0,)
            for p in VariantCache(tmp_path / "cache").paths(original, 3)]
    assert any(gone), "every variant kept a Dutch singer: the test would prove nothing"
    gold = "SELECT max(Age) FROM singer WHERE Country = 'Netherlands'"
    same = ["SELECT Age FROM singer WHERE Country = 'Netherlands' ORDER BY Age DESC LIMIT 1",
            "SELECT max(Age) FROM singer WHERE Country = 'Netherlands' GROUP BY Country"]
    assert _spider_scores(spider_root, tmp_path, db, gold, same) == ([True, True], [True, True])
    gold = ("select count(*) from concert where stadium_id = (select stadium_id from stadium order by capacity desc "
            "limit 1)")
    lucky = "SELECT count(*) FROM concert JOIN stadium ON concert.stadium_id = stadium.stadium_id WHERE highest = 100"
    assert _spider_scores(spider_root, tmp_path, db, gold, [lucky]) == ([True], [False])
    both = ("SELECT T1.fname FROM student AS T1 JOIN has_pet AS T2 ON T1.stuid = T2.stuid JOIN pets AS T3 ON "
            "T3.petid = T2.petid WHERE T3.pettype = '{}' INTERSECT SELECT T1.fname FROM student AS T1 JOIN has_pet AS "
            "T2 ON T1.stuid = T2.stuid JOIN pets AS T3 ON T3.petid = T2.petid WHERE T3.pettype = '{}'")
    assert _spider_scores(spider_root, tmp_path, "pets_1", both.format("cat", "dog"), [both.format("Cat", "Dog")]) \
        == ([True], [False])


def test_a_tie_at_a_groups_extreme_is_not_checked_there(spider_root, tmp_path):
    """pets_1: "for each sex, the first name of the oldest student" takes the name from one of the rows at the
    maximum; where a variant gives two students of one sex the top age, a query breaking the tie the other way
    is the same answer."""
    original = spider_root / "databases" / "pets_1" / "pets_1.sqlite"
    tie = ("SELECT 1 FROM Student AS s WHERE Age = (SELECT max(Age) FROM Student WHERE Sex = s.Sex) "
           "GROUP BY Sex HAVING count(DISTINCT Fname) > 1")
    assert any(sqlite3.connect(p).execute(tie).fetchall() for p in VariantCache(tmp_path / "cache").paths(original, 3))
    gold = "SELECT Sex, Fname, max(Age) FROM Student GROUP BY Sex"
    same = [f"SELECT Sex, (SELECT s2.Fname FROM Student AS s2 WHERE s2.Sex = s.Sex ORDER BY s2.Age DESC, s2.Fname "
            f"{way} LIMIT 1), max(Age) FROM Student AS s GROUP BY Sex" for way in ("ASC", "DESC")]
    assert _spider_scores(spider_root, tmp_path, "pets_1", gold, same) == ([True, True], [True, True])


def test_floats_in_scientific_notation_build(spider_root, tmp_path):
    """1e-05 and 1e+16 once crashed the builder (`_float_step` read repr's decimals); now they nudge by their own
    scale, and a variant of a real database with such a column builds."""
    db = tmp_path / "dbs" / "poker_player" / "poker_player.sqlite"
    db.parent.mkdir(parents=True)
    db.write_bytes((spider_root / "databases" / "poker_player" / "poker_player.sqlite").read_bytes())
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE measure (id INTEGER PRIMARY KEY, tiny REAL, huge REAL)")
        conn.executemany("INSERT INTO measure VALUES (?, ?, ?)",
                         [(i, v, w) for i, (v, w) in enumerate([(1e-05, 1e+16), (2e-05, 3e+16), (5e-05, 2e+16)] * 3)])
    for path in VariantCache(tmp_path / "cache").paths(db, 2):
        with sqlite3.connect(path) as conn:
            rows = conn.execute("SELECT tiny, huge FROM measure").fetchall()
        assert rows and all(1e-05 <= t <= 5e-05 and 1e+16 <= h <= 3e+16 for t, h in rows)
