"""Words for questions: schema names made readable, values quoted as in SQL, and the phrase per operator.

Template questions name the tables, columns and values they use literally or nearly so ("How many orders
have status 'shipped'?"): a small model trained from scratch can only learn a mapping it can see, and a
larger one loses nothing by it. Values appear as the SQL has them (strings in single quotes), so a
question and its SQL never disagree about a literal.
"""

from __future__ import annotations

import re

_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")

# operator -> how a question says it; `mutate` swaps these phrases together with the operator
COMPARISONS = {
    "eq": "is",
    "neq": "is not",
    "gt": "is greater than",
    "lt": "is less than",
    "gte": "is at least",
    "lte": "is at most",
}
DATE_COMPARISONS = {"gt": "is after", "lt": "is before", "gte": "is on or after", "lte": "is on or before"}
AGGREGATES = {"max": "maximum", "min": "minimum", "avg": "average", "sum": "total"}


def words(name: str) -> str:
    """A schema name as lower-case words.

    Example:
        >>> [words(n) for n in ("signup_year", "Song_release_year", "FirstName", "LName", "dept")]
        ['signup year', 'song release year', 'first name', 'l name', 'dept']
    """
    spaced = _CAMEL.sub(" ", name.replace("_", " ").replace("-", " "))
    return " ".join(spaced.lower().split())


_IE_WORDS = ("movies", "cookies", "pies", "ties", "lies", "zombies", "rookies", "calories", "species")


def singular(name: str) -> str:
    """Table name as one thing.

    Example:
        >>> [singular(n) for n in ("orders", "order_items", "categories", "addresses", "singer", "status", "movies",
        ...                        "dishes", "boxes")]
        ['order', 'order item', 'category', 'address', 'singer', 'status', 'movie', 'dish', 'box']
    """
    w = words(name)
    if w.endswith(_IE_WORDS):
        return w[:-1]
    if w.endswith("ies") and len(w) > 4:
        return w[:-3] + "y"
    if w.endswith(("sses", "xes", "ches", "shes")):
        return w[:-2]
    if w.endswith("s") and not w.endswith(("ss", "us", "is")):
        return w[:-1]
    return w


def plural(name: str) -> str:
    """Table name as many things.

    Example:
        >>> [plural(n) for n in ("orders", "singer", "company", "class", "singer_in_concert")]
        ['orders', 'singers', 'companies', 'classes', 'singer in concert records']
    """
    w = words(name)
    if " in " in w or " of " in w:
        return w + " records"
    if w.endswith("s") and not w.endswith(("ss", "us")):
        return w
    if w.endswith("y") and len(w) > 1 and w[-2] not in "aeiou":
        return w[:-1] + "ies"
    if w.endswith(("ss", "x", "ch", "sh")):
        return w + "es"
    return w + "s"


def value_text(value) -> str:
    """A value as a question shows it: text in single quotes (unescaped: questions are prose), numbers bare.

    Example:
        >>> value_text("Paris"), value_text("O'Neil"), value_text(3), value_text(2.5)
        ("'Paris'", "'O'Neil'", '3', '2.5')
    """
    if isinstance(value, str):
        return f"'{value}'"
    return repr(value) if isinstance(value, float) else str(value)


def comparison(op: str, value, is_date: bool = False) -> str:
    """`gt`, 10 -> 'is greater than 10'; dates read 'is after ...'.

    Example:
        >>> comparison("gte", 5), comparison("lt", "2020-01-01", is_date=True), comparison("eq", "x")
        ('is at least 5', "is before '2020-01-01'", "is 'x'")
    """
    phrase = (DATE_COMPARISONS.get(op) if is_date else None) or COMPARISONS[op]
    return f"{phrase} {value_text(value)}"


def join_words(items: list[str]) -> str:
    """'a', 'a and b', 'a, b and c'.

    Example:
        >>> join_words(["name"]), join_words(["name", "age"]), join_words(["a", "b", "c"])
        ('name', 'name and age', 'a, b and c')
    """
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]

