from data_synthesis.prompts import render_prompt
from data_synthesis.schema import read_schema


def test_read_schema_of_demo_db(demo_db_root):
    schema = read_schema(demo_db_root / "retail" / "retail.sqlite")
    assert schema.db_id == "retail"
    assert [t.name for t in schema.tables] == ["customers", "products", "orders", "order_items"]
    orders = schema.table("ORDERS")
    assert orders.row_count == 1500 and orders.column("status").samples[0] == "shipped"
    assert orders.column("id").primary_key
    fk = {(f.table, f.column, f.ref_table, f.ref_column) for f in schema.foreign_keys}
    assert ("orders", "customer_id", "customers", "id") in fk
    text = schema.to_text()
    assert "FOREIGN KEY (customer_id) REFERENCES customers(id)" in text
    assert "status TEXT, -- e.g. 'shipped'" in text
    assert "e.g." not in schema.to_text(samples=False)


def test_read_schema_of_spider_db(spider_root):
    schema = read_schema(spider_root / "databases" / "concert_singer" / "concert_singer.sqlite")
    assert {t.name for t in schema.tables} >= {"stadium", "singer", "concert", "singer_in_concert"}
    assert any(f.ref_table == "stadium" for f in schema.foreign_keys)


def test_prompt_includes_evidence():
    msgs = render_prompt("Q?", "CREATE TABLE t (a INT);", evidence="a is age")
    assert "External knowledge: a is age" in msgs[-1]["content"]
