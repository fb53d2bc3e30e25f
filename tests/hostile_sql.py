"""Hostile SQL for the demo `retail` database: (name, sql, allowed statuses). Shared by sandbox, executor
and server tests; each must come back typed within the timeout + 0.5 s and harm nothing."""

from rewards.outcome import Status

CROSS = ", ".join(f"customers c{i}" for i in range(6))  # 400^6 rows

HOSTILE = [
    ("delete", "DELETE FROM customers", {Status.REJECTED}),
    ("update", "UPDATE customers SET name = 'x'", {Status.REJECTED}),
    ("insert", "INSERT INTO customers(name) VALUES ('x')", {Status.REJECTED}),
    ("drop", "DROP TABLE customers", {Status.REJECTED}),
    ("create", "CREATE TABLE evil(a)", {Status.REJECTED}),
    ("create temp", "CREATE TEMP TABLE evil AS SELECT * FROM customers", {Status.REJECTED}),
    ("alter", "ALTER TABLE customers ADD COLUMN x", {Status.REJECTED}),
    ("attach", "ATTACH DATABASE '/tmp/sirius_evil.db' AS evil", {Status.REJECTED}),
    ("attach memory", "ATTACH ':memory:' AS m", {Status.REJECTED}),
    ("pragma write", "PRAGMA query_only = 0", {Status.REJECTED}),
    ("pragma journal", "PRAGMA journal_mode = WAL", {Status.REJECTED}),
    ("pragma read", "PRAGMA table_info(customers)", {Status.REJECTED}),
    ("load_extension", "SELECT load_extension('/tmp/evil.so')", {Status.REJECTED}),
    ("vacuum", "VACUUM", {Status.REJECTED}),
    ("vacuum into", "VACUUM INTO '/tmp/sirius_copy.db'", {Status.REJECTED}),
    ("transaction", "BEGIN IMMEDIATE", {Status.REJECTED}),
    ("two statements", "SELECT 1; DELETE FROM customers", {Status.REJECTED}),
    ("two selects", "SELECT 1; SELECT 2", {Status.REJECTED}),
    ("endless recursive cte", "WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r) SELECT max(x) FROM r",
     {Status.TIMEOUT}),
    ("endless cte rows", "WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r) SELECT x FROM r",
     {Status.ERROR}),  # the row cap stops it first
    ("cartesian count", f"SELECT count(*) FROM {CROSS}", {Status.TIMEOUT}),
    ("cartesian sort", f"SELECT c0.name FROM {CROSS} ORDER BY random()", {Status.TIMEOUT, Status.ERROR}),
    ("cartesian rows", f"SELECT * FROM {CROSS}", {Status.ERROR, Status.TIMEOUT}),
    ("randomblob", "SELECT randomblob(4000000000)", {Status.ERROR}),
    ("zeroblob", "SELECT zeroblob(2000000000)", {Status.ERROR}),
    ("growing blob", "WITH RECURSIVE r(b) AS (SELECT zeroblob(1000) UNION ALL SELECT b || b FROM r) SELECT length(b) "
                     "FROM r", {Status.ERROR}),
    ("deep nesting", "SELECT " + "(" * 100_000 + "1" + ")" * 100_000, {Status.REJECTED}),
    ("deep subqueries", "SELECT * FROM " + "(SELECT * FROM " * 20_000 + "customers" + ")" * 20_000,
     {Status.ERROR, Status.REJECTED}),
    ("10 MB of SQL", "SELECT 1" + " " * 10_000_000, {Status.REJECTED}),
    ("NUL byte", "SELECT 'a\x00b'", {Status.REJECTED}),
    ("empty", "   ", {Status.REJECTED}),
    ("comment only", "-- nothing", {Status.REJECTED}),
    ("syntax error", "SELEC name FROM customers", {Status.ERROR}),
    ("unknown column", "SELECT nope FROM customers", {Status.ERROR}),
]
