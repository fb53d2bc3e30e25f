"""The demo's held-out sets are held out the way the README says, table by table.

No database, question or query of a held-out set is trained on. What else is new to the model depends on the
set's kind, which the README's table of held-out sets states: "seen table types" (new databases, rows and
values, built from the training databases' table types) or "unseen table and column names" (no word of a
table name, a column name or a text value occurs in any training database, the `id` key and the `_id` of a
foreign key aside). Each claim is checked on the built databases, so the README cannot claim unseen tables
where a held-out table's name and columns are a training table's.
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import pytest
from tiny_run import NANO

from data_synthesis.demo_dbs import HELD_OUT_SETS
from sirius_train.config import load_config
from sirius_train.schedule import prepare_data

README = Path(__file__).resolve().parents[1] / "README.md"
KINDS = {"seen table types": "seen", "unseen table and column names": "unseen"}
ALL_SETS = f"data.eval_sets=[{','.join(HELD_OUT_SETS)}]"


def readme_claims(text: str) -> dict[str, tuple[str, tuple[int, int] | None]]:
    """Held-out set -> ("seen" | "unseen", (n, of) where it says "n of m tables have a training table's name and
    columns"), from the README's table rows `| `set` | split | kind | what is new |`."""
    claims = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        name = cells[0].strip("`")
        if line.startswith("|") and name in HELD_OUT_SETS and len(cells) > 3:
            count = re.search(r"(\d+) of (\d+) tables have a training table's name and columns", cells[3])
            claims[name] = (KINDS[cells[2]], count and (int(count[1]), int(count[2])))
    return claims


def tables(path: Path) -> dict[str, list[tuple[str, str]]]:
    """table -> [(column, declared type)], the primary key `id` left out."""
    with sqlite3.connect(path) as conn:
        names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {t: [(r[1], r[2]) for r in conn.execute(f"PRAGMA table_info({t})") if r[1] != "id"] for t in names}


def words(name: str) -> set[str]:
    return {w for w in re.split(r"[^a-z]+", name.lower()) if w} - {"id"}


def name_words(path: Path) -> set[str]:
    return {w for table, cols in tables(path).items() for w in words(table) | {w for c, _ in cols for w in words(c)}}


def value_words(path: Path) -> set[str]:
    with sqlite3.connect(path) as conn:
        out = set()
        for table, cols in tables(path).items():
            for col in (c for c, kind in cols if kind == "TEXT"):
                out |= {w for (v,) in conn.execute(f"SELECT DISTINCT {col} FROM {table}") if v for w in words(v)}
        return out


def rows(path: Path) -> set[tuple]:
    """(table, its rows without the key and the foreign keys): what a table holds, whichever database it is in."""
    with sqlite3.connect(path) as conn:
        out = set()
        for table, cols in tables(path).items():
            keep = ", ".join(c for c, _ in cols if not c.endswith("_id"))
            out.add((table, frozenset(conn.execute(f"SELECT {keep} FROM {table}"))))
        return out


def table_type(columns) -> frozenset:
    """A table's type: its columns but the foreign keys (which depend on the tables it was drawn with)."""
    return frozenset(c for c in columns if not c[0].endswith("_id"))


def check_claims(claims: dict[str, tuple], data, cfg) -> None:
    db = lambda db_id: data.db_root / db_id / f"{db_id}.sqlite"  # noqa: E731
    train_dbs = cfg.data.all_train_dbs()
    train_types = {(t, table_type(cols)) for d in train_dbs for t, cols in tables(db(d)).items()}
    train_names = set().union(*(name_words(db(d)) for d in train_dbs))
    train_values = set().union(*(value_words(db(d)) for d in train_dbs))
    train_rows = set().union(*(rows(db(d)) for d in train_dbs))
    for name, dbs in cfg.data.held_out_sets().items():
        kind, count = claims[name]
        trained_types = []
        for d in dbs:
            for t, cols in tables(db(d)).items():
                trained_types.append((t, table_type(cols)) in train_types)
                if kind == "unseen":
                    assert not words(t) & train_names, f"{d}.{t}: a training table's name, README says unseen"
                    assert not {w for c, _ in cols for w in words(c)} & train_names, f"{d}.{t}: training column names"
            if kind == "unseen":
                assert not value_words(db(d)) & train_values, f"{d}: text values of the training databases"
            else:  # the table types of training, with rows of their own
                assert not rows(db(d)) & train_rows, f"{d}: a training table's rows"
        assert count == (None if kind == "unseen" else (sum(trained_types), len(trained_types))), name


def test_the_readme_describes_every_held_out_set_the_demo_reports():
    claims = readme_claims(README.read_text())
    cfg = load_config(NANO)
    assert set(cfg.data.eval_sets) <= set(claims) and set(claims) <= set(HELD_OUT_SETS)
    assert all(claims[name][0] == ("unseen" if "unseen" in name else "seen") for name in claims)


# the shipped data (taught mistakes, no WHERE filters: a small query space, where a held-out gold can equal a flawed
# demo's SQL) and the plain data (WHERE filters, no taught mistakes); every held-out set
@pytest.fixture(scope="module", params=[[], ["data.synth_where=1.0", "data.sft_flaws=[]"]], ids=["shipped", "plain"])
def run_data(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("holdout")
    cfg = load_config(NANO, [f"output_dir={tmp}", f"data.db_root={tmp / 'dbs'}", ALL_SETS, *request.param])
    return cfg, prepare_data(cfg)


def test_demo_never_trains_on_its_held_out_databases_or_questions(run_data):
    cfg, data = run_data
    training = data.sft_pool + data.rl_pool
    train_dbs = {e.db_id for e in training}
    assert list(data.eval_sets) == list(HELD_OUT_SETS) and data.eval_set == data.eval_sets[cfg.data.eval_sets[0]]
    questions = {e.question for e in training}
    queries = {e.gold_sql for e in training} | {e.meta.get("clean_sql", e.gold_sql) for e in data.sft_pool}
    for name, held_out in data.eval_sets.items():
        assert len(held_out) >= 0.9 * cfg.data.eval_per_db * cfg.data.generated_eval_dbs, name
        assert {e.db_id for e in held_out} == set(cfg.data.held_out_sets()[name]) and not train_dbs & {
            e.db_id for e in held_out}
        assert not {e.question for e in held_out} & questions
        assert not {e.gold_sql for e in held_out} & queries
        assert not any(e.meta.get("flaw") for e in held_out)  # the evaluation uses the correct gold
    # the flawed demonstrations are SFT's only: RL's reward uses the correct gold
    assert any(e.meta.get("flaw") for e in data.sft_pool) == bool(cfg.data.sft_flaws)
    assert not any(e.meta.get("flaw") for e in data.rl_pool)
    # test and validation are drawn apart: no database and no question in common
    val = {e.question for n, s in data.eval_sets.items() if n.startswith("val") for e in s}
    assert not val & {e.question for n, s in data.eval_sets.items() if n.startswith("test") for e in s}

    check_claims(readme_claims(README.read_text()), data, cfg)
    # the two unseen-names sets share no word either: a choice made on the one is not fitted to the other's names
    unseen = [{w for d in cfg.data.held_out_sets()[name] for w in name_words(data.db_root / d / f"{d}.sqlite")
               | value_words(data.db_root / d / f"{d}.sqlite")} for name in ("val-unseen-names", "test-unseen-names")]
    assert not unseen[0] & unseen[1]


def test_the_inference_example_is_in_no_training_pool(run_data):
    """docs/INFERENCE.md shows the demo's model answering a question "in none of its training pools": so it is."""
    cfg, data = run_data
    if not cfg.data.sft_flaws:
        pytest.skip("the claim is about the shipped data")
    question = re.search(r'--question "([^"]+)"', (README.parent / "docs" / "INFERENCE.md").read_text())[1]
    assert "in none of its training pools" in (README.parent / "docs" / "INFERENCE.md").read_text()
    assert question not in {e.question for e in data.sft_pool + data.rl_pool}


def test_an_unseen_claim_fails_on_held_out_tables_of_training_types(run_data):
    """The check above can fail: claim unseen names for the seen-types sets, and it does."""
    cfg, data = run_data
    with pytest.raises(AssertionError, match="a training table's name, README says unseen"):
        check_claims({name: ("unseen", None) for name in HELD_OUT_SETS}, data, cfg)


def test_the_nano_tokenizer_is_fitted_on_training_schemas_only(run_data, tmp_path, monkeypatch):
    """The tokenizer is a trained part too: a held-out schema's names must not shape its vocabulary."""
    from data_synthesis.schema import read_schema
    from sirius_train.local import model as nano
    from sirius_train.local.backend import LocalBackend

    cfg, data = run_data
    fitted = []
    real = nano.train_tokenizer
    monkeypatch.setattr(nano, "train_tokenizer", lambda texts, *a, **k: real(fitted.extend(texts) or fitted, *a, **k))
    LocalBackend(cfg).prepare_base(data, tmp_path / "base")

    def schema(db):
        fmt = data.prompt_format
        return read_schema(data.db_root / db / f"{db}.sqlite", n_samples=0).to_text(samples=False,
                                                                                  style=fmt.schema_style)

    assert all(schema(db) in fitted for db in cfg.data.all_train_dbs())
    assert not any(schema(db) in fitted for db in cfg.data.all_eval_dbs())
