"""The pool: Example records, Spider/BIRD/JSONL loaders, gold validation, LLM-written questions."""

import json

import pytest
from fake_openai import FakeOpenAIServer

from data_synthesis.chat_client import ChatClient, EndpointError
from data_synthesis.loaders import DatasetError, load_dataset, load_tables
from data_synthesis.records import Example, RecordError, read_examples, write_examples
from data_synthesis.sqlgen.llm_writer import LLMQuestionWriter, usable
from data_synthesis.sqlgen.synthesize import synthesize
from data_synthesis.validate import missing_databases, validate_examples
from rewards.databases import UnknownDatabase


def _write(path, data):
    path.write_text(json.dumps(data))
    return path


def test_example_jsonl_round_trip(tmp_path):
    examples = [Example("a", "retail", "How many?", "SELECT 1", evidence="e", source="bird", level="simple",
                        meta={"rule": "x"}), Example("b", "retail", "Q?", "SELECT 2")]
    write_examples(tmp_path / "p.jsonl", examples)
    back = read_examples(tmp_path / "p.jsonl")
    assert back == examples and back[0].meta == {"rule": "x"} and back[0].level == "simple"


def test_bad_pool_lines_name_file_line_and_field(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"id": 1, "db_id": "d", "question": "q", "gold_sql": "SELECT 1"}\n{"id": 2, "db_id": "d"}\n')
    with pytest.raises(RecordError, match=r"p.jsonl:2: missing field\(s\) \['question', 'gold_sql'\]"):
        read_examples(path)
    path.write_text('{"id": 1, "db_id": "d", "question": "q", "gold_sql": "S"}\n' * 2)
    with pytest.raises(RecordError, match=r"duplicate example id\(s\) \['1'\]"):
        read_examples(path)
    path.write_text("{not json\n")
    with pytest.raises(RecordError, match="p.jsonl:1: not valid JSON"):
        read_examples(path)


def test_spider_and_bird_formats(tmp_path):
    spider = _write(tmp_path / "dev.json", [{"db_id": "shop", "question": "How many?",
                                            "query": "SELECT count(*) FROM t", "query_toks": ["SELECT"], "sql": {}}])
    tables = _write(tmp_path / "tables.json", [{"db_id": "shop", "table_names_original": ["t"]}])
    [e] = load_dataset(spider, tables=tables)
    assert (e.id, e.db_id, e.gold_sql, e.source, e.evidence) == ("spider-dev-0", "shop", "SELECT count(*) FROM t",
                                                                 "spider", "")
    bird = _write(tmp_path / "bird_dev.json", [{"question_id": 7, "db_id": "shop", "question": "Q?",
                                               "evidence": "t means things", "SQL": "SELECT 1",
                                               "difficulty": "moderate"}])
    [b] = load_dataset(bird)
    assert (b.id, b.evidence, b.level, b.source) == ("bird-bird_dev-7", "t means things", "moderate", "bird")
    assert list(load_tables(tables)) == ["shop"]


def test_dataset_errors_are_clear(tmp_path):
    with pytest.raises(DatasetError, match="no such dataset file"):
        load_dataset(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text("[{")
    with pytest.raises(DatasetError, match=r"bad.json:1: truncated: the file ends before the JSON does"):
        load_dataset(tmp_path / "bad.json")
    with pytest.raises(DatasetError, match=r"cannot tell the format .* Spider items have 'query'"):
        load_dataset(_write(tmp_path / "odd.json", [{"db_id": "x", "question": "q", "answer": "a"}]))
    with pytest.raises(DatasetError, match=r"item 1: field 'query' must be a non-empty string, got None"):
        load_dataset(_write(tmp_path / "gap.json", [{"db_id": "x", "question": "q", "query": "S"},
                                                    {"db_id": "x", "question": "q"}]))
    spider = _write(tmp_path / "dev.json", [{"db_id": "other", "question": "q", "query": "SELECT 1"}])
    with pytest.raises(DatasetError, match=r"1 example\(s\) use database\(s\) not in the tables file: \['other'\]"):
        load_dataset(spider, tables=_write(tmp_path / "tables.json", [{"db_id": "shop"}]))


def test_real_spider_files(spider_root):
    dev = load_dataset(spider_root / "dev.jsonl")
    assert len(dev) == 431 and dev[0].db_id and dev[0].gold_sql.upper().startswith("SELECT")
    tables = load_tables(spider_root / "tables.json")
    assert {e.db_id for e in dev} <= set(tables)


def test_validation_drops_broken_gold_and_records_time(demo_db_root):
    good = synthesize(demo_db_root / "clinic" / "clinic.sqlite", 3)
    pool = good + [Example("err", "clinic", "q", "SELECT nope FROM doctors"),
                   Example("dup", good[0].db_id, good[0].question, good[0].gold_sql),
                   Example("empty", "clinic", "q2", "SELECT name FROM doctors WHERE 0"),
                   Example("big", "clinic", "q3", "SELECT * FROM appointments AS a, patients AS b")]
    kept, dropped = validate_examples(pool, demo_db_root, max_rows=10_000)
    assert [e.id for e in kept] == [e.id for e in good] + ["empty"]
    assert all(e.meta["gold_time_s"] >= 0 and e.meta["gold_rows"] >= 0 for e in kept)
    reasons = {e.id: r for e, r in dropped}
    assert reasons["err"] == "gold error: no such column: nope"
    assert reasons["dup"] == f"duplicate: same database, question and gold SQL as {good[0].id}"
    assert reasons["big"] == "gold result too large"
    kept, dropped = validate_examples(pool[:4] + pool[5:6], demo_db_root, drop_empty=True)
    assert {e.id: r for e, r in dropped}["empty"] == "gold empty"


def test_missing_database_is_an_error_not_a_drop(demo_db_root):
    pool = [Example("1", "clinic", "q", "SELECT 1"), Example("2", "atlantis", "q", "SELECT 1")]
    assert missing_databases(pool, demo_db_root) == {"atlantis": 1}
    with pytest.raises(UnknownDatabase, match=r"1 example\(s\) use database\(s\) not found .* \['atlantis'\]"):
        validate_examples(pool, demo_db_root)


def test_llm_question_writer_over_http(demo_db_root):
    path = demo_db_root / "retail" / "retail.sqlite"
    examples = [Example("a", "retail", "List the name of customers whose city is 'Paris'.",
                        "SELECT name FROM customers WHERE city = 'Paris'"),
                Example("b", "retail", "How many orders are there whose status is 'shipped'?",
                        "SELECT COUNT(*) FROM orders WHERE status = 'shipped'"),
                Example("c", "retail", "What is the maximum price of products?", "SELECT MAX(price) FROM products")]
    replies = {"a": 'Question: "Who are the customers living in \'Paris\'?"',
               "b": "How many orders are there?",  # drops the filter value
               "c": "SELECT MAX(price) FROM products"}  # not a question
    by_sql = {e.gold_sql: replies[e.id] for e in examples}

    def answer(messages, i):
        prompt = messages[-1]["content"]
        assert "CREATE TABLE customers" in prompt and "Draft question" in prompt
        return by_sql[prompt.split("SQL:\n")[1].split("\n\n")[0]]

    with FakeOpenAIServer(answer) as server:
        out = LLMQuestionWriter(ChatClient(server.url, "writer"), concurrency=2).rewrite(examples, path)
    assert len(server.requests) == 3 and {r["model"] for r in server.requests} == {"writer"}
    assert out[0].question == "Who are the customers living in 'Paris'?" and out[0].meta["question_from"] == "llm"
    assert out[1].question == examples[1].question and out[1].meta == {
        "question_from": "template", "llm_rejected": "does not mention the value 'shipped'"}
    assert out[2].question == examples[2].question and out[2].meta["llm_rejected"] == "looks like SQL, not a question"
    assert [e.gold_sql for e in out] == [e.gold_sql for e in examples]


def test_llm_answer_checks():
    sql = "SELECT name FROM t WHERE city = 'Paris' AND pop > 1000 ORDER BY pop DESC LIMIT 3"
    assert usable("Which 3 towns in 'Paris' have pop over 1000?", sql) == (
        "Which 3 towns in 'Paris' have pop over 1000?", None)
    assert usable("", sql) == (None, "empty answer")
    assert usable("SELECT name FROM t", sql)[1] == "looks like SQL, not a question"
    assert usable("Towns in Paris?", sql)[1] == "does not mention the value '1000'"


def test_unreachable_llm_endpoint_is_an_error(demo_db_root):
    path = demo_db_root / "retail" / "retail.sqlite"
    writer = LLMQuestionWriter(ChatClient("http://127.0.0.1:9/v1", "m", max_retries=0, timeout_s=2))
    with pytest.raises(EndpointError, match="127.0.0.1:9"):
        synthesize(path, 2, writer=writer)
