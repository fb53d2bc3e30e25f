"""Mutations for gap filling: one edit of the tree, carried into the question only when that is unambiguous."""

import random

import pytest
from fake_openai import FakeOpenAIServer

from data_synthesis.curriculum import MutationFiller
from data_synthesis.records import Example
from data_synthesis.samplers import OpenAISampler
from data_synthesis.sqlgen.mutations import (change_limit, flip_comparison, flip_order, mutate, rebind_literal,
                                             swap_aggregate)
from data_synthesis.sqlgen.profile import profile_database
from data_synthesis.sqlgen.trees import parse


@pytest.fixture(scope="module")
def retail(demo_db_root):
    return profile_database(demo_db_root / "retail" / "retail.sqlite")


def _one(operator, sql, question, profile, seed=0):
    return operator(parse(sql), question, profile, random.Random(seed))


def test_rebind_literal_uses_real_values_and_edits_the_question(retail):
    cities = set(retail.table("customers").column("city").values)
    out = _one(rebind_literal, "SELECT COUNT(*) FROM customers WHERE city = 'Paris'",
               "How many customers live in 'Paris'?", retail)
    assert len(out) == 2
    for m in out:
        new = m.sql.split("'")[1]
        assert new in cities and new != "Paris"
        assert m.question == f"How many customers live in '{new}'?" and m.kind == "rebind_literal"
    # a Spider-style question that names the value without quotes, through a join alias
    out = _one(rebind_literal, "SELECT T1.name FROM customers AS T1 JOIN orders AS T2 ON T1.id = T2.customer_id "
                               "WHERE T2.status = 'cancelled'", "Names of customers with cancelled orders", retail)
    assert all(m.question == f"Names of customers with {m.sql.split(chr(39))[1]} orders" for m in out)


def test_question_is_none_when_the_edit_is_ambiguous(retail):
    out = _one(rebind_literal, "SELECT name FROM products WHERE category = 'home'",
               "Products at home in the home category", retail)  # 'home' twice
    assert out and all(m.question is None for m in out)
    [m] = _one(flip_order, "SELECT name FROM products ORDER BY price DESC LIMIT 1",
               "Which product with the highest price has at most 5 in stock?", retail)
    assert m.sql == "SELECT name FROM products ORDER BY price ASC LIMIT 1" and m.question is None
    [m] = _one(flip_order, "SELECT name FROM products ORDER BY price DESC LIMIT 1", "Which product costs most?",
               retail)
    assert m.question == "Which product costs least?"


def test_structural_flips(retail):
    [m] = _one(flip_comparison, "SELECT name FROM products WHERE price > 100", "Products with price above 100.",
               retail)
    assert (m.sql, m.question) == ("SELECT name FROM products WHERE price < 100", "Products with price below 100.")
    [m] = _one(flip_order, "SELECT name FROM products ORDER BY stock DESC LIMIT 3",
               "The 3 products with the highest stock.", retail)
    assert (m.sql, m.question) == ("SELECT name FROM products ORDER BY stock ASC LIMIT 3",
                                   "The 3 products with the lowest stock.")
    [m] = _one(swap_aggregate, "SELECT MAX(price) FROM products", "What is the maximum price?", retail)
    assert (m.sql, m.question) == ("SELECT MIN(price) FROM products", "What is the minimum price?")
    [m] = _one(change_limit, "SELECT name FROM products ORDER BY stock DESC LIMIT 3",
               "The 3 products with the highest stock.", retail)
    k = int(m.sql.rsplit(" ", 1)[1])
    assert k != 3 and m.question == f"The {k} products with the highest stock."
    assert _one(flip_comparison, "SELECT name FROM products WHERE price > 1 AND stock < 9", "x", retail) == []


def test_mutate_never_changes_its_input_and_ignores_bad_sql(retail):
    sql = "SELECT name FROM products WHERE price > 100 ORDER BY stock DESC LIMIT 3"
    tree = parse(sql)
    before = tree.sql()
    mutants = mutate(sql, "The 3 products with price above 100 with the highest stock.", retail, random.Random(1))
    assert tree.sql() == before
    assert len({m.sql for m in mutants}) == len(mutants) and sql not in {m.sql for m in mutants}
    assert {m.kind for m in mutants} >= {"rebind_literal", "flip_comparison", "flip_order", "change_limit"}
    assert mutate("SELECT FROM WHERE", "q", retail, random.Random(0)) == []


def test_mutation_filler_validates_and_estimates(demo_db_root):
    parents = [(Example("p1", "retail", "How many orders have status 'shipped'?",
                        "SELECT COUNT(*) FROM orders WHERE status = 'shipped'"), 1),
               (Example("p2", "retail", "What is the maximum price of products?", "SELECT MAX(price) FROM products"),
                2)]

    def answer(messages, i):  # the policy gets every mutant right on half its samples
        question = messages[-1]["content"].split("Question: ")[-1]
        return "```sql\nSELECT 1\n```" if i % 2 else f"<answer>{golds[question]}</answer>"

    golds = {}
    with FakeOpenAIServer(answer) as server:
        filler = MutationFiller(demo_db_root, OpenAISampler(server.url, "m"), 4, seed=0)
        original = filler._one  # record each accepted mutant's gold, as the "policy" knows it

        def remember(parent, target, taken):
            child = original(parent, target, taken)
            if child is not None:
                golds[child.question] = child.gold_sql
            return child

        filler._one = remember
        made = filler(parents * 3)
    assert len(made) >= 3 and filler.rejected  # repeated parents run out of new, distinct mutants
    for child, rate in made:
        assert rate == 0.5 and child.source == "mutation" and child.meta["parent"] in {"p1", "p2"}
        assert child.meta["target_bin"] in (1, 2) and child.id.startswith(child.meta["parent"] + "~")
    assert len({c.gold_sql for c, _ in made}) == len(made)


def test_mutation_filler_asks_the_llm_writer_for_questions_it_cannot_edit(demo_db_root):
    from data_synthesis.chat_client import ChatClient
    from data_synthesis.sqlgen.llm_writer import SYSTEM, LLMQuestionWriter, required_literals

    # 'home' appears twice in the question, so a re-bound category cannot be carried into it by a text edit
    parent = Example("p", "retail", "Which home products are in the home category?",
                     "SELECT name FROM products WHERE category = 'home'")

    def answer(messages, i):
        prompt = messages[-1]["content"]
        if messages[0]["content"] == SYSTEM:  # the writer: names every value, except for 'travel'
            sql = prompt.split("SQL:\n")[1].split("\n\n")[0]
            values = required_literals(sql)
            return "Which products?" if values == ["travel"] else f"Which products are in {values}?"
        return "no SQL"  # the policy

    with FakeOpenAIServer(answer) as server:
        writer = LLMQuestionWriter(ChatClient(server.url, "writer"))
        filler = MutationFiller(demo_db_root, OpenAISampler(server.url, "policy"), 2, seed=0, writer=writer)
        made = filler([(parent, 0)] * 6)
    assert made and all(rate == 0.0 for _, rate in made)
    for child, _ in made:
        value = child.gold_sql.split("'")[1]
        assert value not in ("home", "travel") and child.question == f"Which products are in ['{value}']?"
        assert child.meta["question_from"] == "llm" and not child.meta["question_edited"]
    assert sorted(c.gold_sql.split("'")[1] for c, _ in made) == ["kitchen", "office"]
    assert filler.rejected["llm question rejected"] == 1  # the 'travel' mutant: the writer dropped its value
