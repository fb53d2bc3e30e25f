"""Synthesis rules: each builds one SQL tree over a profiled database together with the question it answers.

A rule is a function `(Context) -> Draft | None` (None: the database cannot support it, e.g. no numeric
column). `RULES` is the ordered, weighted table the synthesizer draws from; the weights set the mix of SQL
features (joins, aggregates, GROUP BY/HAVING, ORDER BY/LIMIT, nesting, set operations) and were tuned so that
mix lands near Spider's own (docs/benchmarks/synth.md measures it). Everything here is pure: the profile holds
the real values, the seeded `random.Random` makes every choice.

Joins follow foreign keys only. A joined source is `parent AS T1 JOIN child AS T2` (plus `JOIN parent2 AS T3`
through a bridge table), and columns in joined questions are named with their table ("customer city").
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from sqlglot import exp

from data_synthesis.sqlgen.profile import DATE, NUMBER, TEXT, ColumnProfile, DbProfile, Link, TableProfile
from data_synthesis.sqlgen.templates import AGGREGATES, comparison, join_words, plural, singular, value_text, words
from data_synthesis.sqlgen.trees import column, literal, table

AGG_NODES = {"max": exp.Max, "min": exp.Min, "avg": exp.Avg, "sum": exp.Sum}


@dataclass(frozen=True)
class Draft:
    tree: exp.Expression
    question: str
    rule: str


@dataclass
class Context:
    profile: DbProfile
    rng: random.Random
    joins: bool = True  # False: single-table queries only (small models, first curricula)
    where_scale: float = 1.0  # scales every rule's chance of a WHERE filter (0: no literal to copy)

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def pick(self, items, weights=None):
        return self.rng.choices(list(items), weights=weights, k=1)[0] if items else None


# --------------------------------------------------------------------------------------------- sources
class Source:
    """The FROM clause of a query: one table, or tables joined along foreign keys, with their words."""

    def __init__(self, tables: list[TableProfile], links: list[Link] = (), child_words: str | None = None):
        self.tables = tables
        self.links = list(links)
        self.child_words = child_words or plural(tables[-1].name)
        self.joined = len(tables) > 1
        self.aliases = {t.name: f"T{i + 1}" for i, t in enumerate(tables)} if self.joined else {}

    @property
    def main(self) -> TableProfile:
        return self.tables[0]

    def col(self, c: ColumnProfile) -> exp.Column:
        return column(c.name, self.aliases.get(c.table))

    def say(self, c: ColumnProfile) -> str:
        """'city' alone; 'customer city' when several tables are in play."""
        w = words(c.name)
        if not self.joined:
            return w
        owner = singular(c.table)
        return w if w.startswith(owner) or owner.endswith(w) else f"{owner} {w}"

    @property
    def noun(self) -> str:
        """What the rows are: 'orders', 'customers and their orders', 'students and their courses'."""
        if not self.joined:
            return plural(self.main.name)
        return f"{plural(self.tables[0].name)} and their {self.child_words}"

    def columns(self, pred: Callable[[ColumnProfile], bool] = lambda c: True) -> list[ColumnProfile]:
        return [c for t in self.tables for c in t.columns if pred(c)]

    def select(self, *projections) -> exp.Select:
        first = self.tables[0]
        query = exp.select(*projections).from_(table(first.name, self.aliases.get(first.name)))
        for link, t in zip(self.links, self.tables[1:]):
            mine = self.aliases[t.name]
            if link.child == t.name:  # t is the child: its key points at an earlier table
                on = column(link.parent_column, self.aliases[link.parent]).eq(column(link.child_column, mine))
            else:
                on = column(link.child_column, self.aliases[link.child]).eq(column(link.parent_column, mine))
            query = query.join(table(t.name, mine), on=on)
        return query


def pick_source(ctx: Context, p_join: float) -> Source:
    profile = ctx.profile
    if ctx.joins and profile.links and ctx.chance(p_join):
        bridges = _bridges(profile)
        if bridges and ctx.chance(0.25):
            a, b = ctx.pick(bridges)
            return Source([profile.table(a.parent), profile.table(a.child), profile.table(b.parent)], [a, b])
        link = ctx.pick(profile.links)
        return Source([profile.table(link.parent), profile.table(link.child)], [link], child_noun(profile, link))
    return Source([ctx.pick(profile.tables, [min(t.n_rows, 50) + 5 for t in profile.tables])])


def child_noun(profile: DbProfile, link: Link) -> str:
    """'routes', or 'routes by dst apid' when the child has several keys to the same parent."""
    twins = [lk for lk in profile.links if lk.child == link.child and lk.parent == link.parent]
    return plural(link.child) + (f" by {words(link.child_column)}" if len(twins) > 1 else "")


def link_source(profile: DbProfile, link: Link) -> tuple[Source, TableProfile, TableProfile, ColumnProfile] | None:
    """(`parent AS T1 JOIN child AS T2`, parent, child, the parent's label column), or None without a label."""
    parent, child = profile.table(link.parent), profile.table(link.child)
    if parent.label is None:
        return None
    return Source([parent, child], [link], child_noun(profile, link)), parent, child, parent.label


def _bridges(profile: DbProfile) -> list[tuple[Link, Link]]:
    """Pairs of keys from one child to two different parents (a many-to-many bridge table)."""
    return [(a, b) for a in profile.links for b in profile.links
            if a.child == b.child and a.parent != b.parent and a.child_column != b.child_column]


# --------------------------------------------------------------------------------------------- pieces
def askable(c: ColumnProfile) -> bool:
    return not c.is_key and bool(c.values)


def pick_columns(ctx: Context, src: Source, k: int, exclude=()) -> list[ColumnProfile]:
    """Up to `k` columns worth showing; a table's label column (`name`, `title`) first more often than not."""
    pool = [c for c in src.columns(askable) if c not in exclude]
    if not pool:
        return []
    out = []
    label = src.main.label
    if label in pool and ctx.chance(0.6):
        out.append(label)
    rest = [c for c in pool if c not in out]
    ctx.rng.shuffle(rest)
    return (out + rest)[:k]


def condition(ctx: Context, src: Source, exclude=()) -> tuple[exp.Expression, str, ColumnProfile] | None:
    """One filter on a real value: (tree, clause such as "status is 'shipped'", the column it tests)."""
    cols = [c for c in src.columns(askable) if c not in exclude]
    if not cols:
        return None
    weights = [3.0 if c.categorical else 2.0 if c.kind in (NUMBER, DATE) else 1.0 for c in cols]
    c = ctx.pick(cols, weights)
    node, say = src.col(c), src.say(c)
    if c.kind in (NUMBER, DATE) and len(c.quantiles) >= 3 and (not c.categorical or ctx.chance(0.5)):
        if ctx.chance(0.1) and c.quantiles[1] != c.quantiles[3]:
            lo, hi = c.quantiles[1], c.quantiles[3]
            return (exp.Between(this=node, low=literal(lo), high=literal(hi)),
                    f"{say} is between {value_text(lo)} and {value_text(hi)}", c)
        op = ctx.pick(["gt", "lt", "gte", "lte"], [3, 3, 1, 1])
        value = ctx.pick(c.quantiles[1:4])
        tree = {"gt": exp.GT, "lt": exp.LT, "gte": exp.GTE, "lte": exp.LTE}[op](this=node, expression=literal(value))
        return tree, f"{say} {comparison(op, value, is_date=c.kind == DATE)}", c
    if c.kind == TEXT and not c.categorical and ctx.chance(0.4):
        fragment = _fragment(ctx, c)
        if fragment:
            pattern = exp.Literal.string(f"%{fragment}%")
            return exp.Like(this=node, expression=pattern), f"{say} contains {value_text(fragment)}", c
    value = ctx.pick(c.values, c.counts)
    if c.categorical and ctx.chance(0.15):
        return exp.NEQ(this=node, expression=literal(value)), f"{say} {comparison('neq', value)}", c
    return exp.EQ(this=node, expression=literal(value)), f"{say} {comparison('eq', value)}", c


def _fragment(ctx: Context, c: ColumnProfile) -> str | None:
    """A word of a real value, for LIKE '%word%'."""
    tokens = [w for v in c.values if isinstance(v, str) for w in v.split() if len(w) >= 3 and w.isalpha()]
    return ctx.pick(tokens)


def where(ctx: Context, src: Source, p: float, exclude=()) -> tuple[exp.Expression | None, str]:
    """With probability `p` (times `ctx.where_scale`) a filter (sometimes two, joined by AND/OR) and its phrase."""
    if not ctx.chance(p * ctx.where_scale):
        return None, ""
    first = condition(ctx, src, exclude)
    if first is None:
        return None, ""
    tree, clause, used = first
    if ctx.chance(0.15):
        second = condition(ctx, src, (*exclude, used))
        if second is not None:
            op = ctx.pick(["and", "or"], [3, 1])
            tree = (exp.And if op == "and" else exp.Or)(this=tree, expression=second[0])
            clause = f"{clause} {op} {second[1]}"
    return tree, f" whose {clause}"


def numeric_columns(src: Source) -> list[ColumnProfile]:
    return src.columns(lambda c: askable(c) and c.kind == NUMBER and len(c.quantiles) >= 3)


def group_columns(src: Source) -> list[ColumnProfile]:
    return src.columns(lambda c: askable(c) and c.categorical)


def _focus(ctx: Context, p_join: float, candidates: Callable[[Source], list[ColumnProfile]], p_where: float):
    """(source, one of its `candidates` columns, optional filter on another column, its phrase), or None."""
    src = pick_source(ctx, p_join)
    cols = candidates(src)
    if not cols:
        return None
    c = ctx.pick(cols)
    cond, phrase = where(ctx, src, p_where, exclude=(c,))
    return src, c, cond, phrase


def _ordered(node: exp.Expression, desc: bool) -> exp.Ordered:
    # SQLite's own NULL placement (first when ascending), so the SQL reads plainly `ORDER BY x ASC`
    return exp.Ordered(this=node, desc=desc, nulls_first=not desc)


def _with_where(query: exp.Select, cond: exp.Expression | None) -> exp.Select:
    return query.where(cond) if cond is not None else query


def _count() -> exp.Expression:
    return exp.Count(this=exp.Star())


# --------------------------------------------------------------------------------------------- rules
def rows(ctx: Context) -> Draft | None:
    """SELECT [DISTINCT] columns FROM source [WHERE ...] [ORDER BY ...]."""
    src = pick_source(ctx, 0.45)
    cols = pick_columns(ctx, src, ctx.pick([1, 2, 3], [5, 4, 1]))
    if not cols:
        return None
    cond, phrase = where(ctx, src, 0.85)
    query = _with_where(src.select(*[src.col(c) for c in cols]), cond)
    distinct = (len(cols) == 1 and cols[0].categorical and ctx.chance(0.8)) or (src.joined and ctx.chance(0.45))
    shown = join_words([src.say(c) for c in cols])
    if distinct:
        query = query.distinct()
        question = ctx.pick([f"What are the distinct {shown} of {src.noun}{phrase}?",
                             f"List the different {shown} of {src.noun}{phrase}."])
    else:
        question = ctx.pick([f"What are the {shown} of {src.noun}{phrase}?", f"List the {shown} of {src.noun}{phrase}.",
                             f"Show the {shown} of all {src.noun}{phrase}."])
    return Draft(query, question, "rows")


def count(ctx: Context) -> Draft | None:
    """SELECT COUNT(*) | COUNT(DISTINCT c) FROM source [WHERE ...]."""
    src = pick_source(ctx, 0.45)
    cond, phrase = where(ctx, src, 0.8)
    distinct_cols = [c for c in src.columns(askable) if c.n_distinct > 1]
    if distinct_cols and ctx.chance(0.15):
        c = ctx.pick(distinct_cols)
        query = _with_where(src.select(exp.Count(this=exp.Distinct(expressions=[src.col(c)]))), cond)
        return Draft(query, f"How many distinct {src.say(c)} values are there among {src.noun}{phrase}?", "count")
    query = _with_where(src.select(_count()), cond)
    question = ctx.pick([f"How many {src.noun} are there{phrase}?", f"Count the {src.noun}{phrase}.",
                         f"What is the number of {src.noun}{phrase}?"])
    return Draft(query, question, "count")


def aggregate(ctx: Context) -> Draft | None:
    """SELECT MAX/MIN/AVG/SUM(c) [, another] FROM source [WHERE ...]."""
    focus = _focus(ctx, 0.35, numeric_columns, 0.5)
    if focus is None:
        return None
    src, c, cond, phrase = focus
    fns = ctx.pick([["max"], ["min"], ["avg"], ["sum"], ["max", "min"], ["avg", "max"]], [3, 3, 3, 2, 2, 1])
    query = _with_where(src.select(*[AGG_NODES[f](this=src.col(c)) for f in fns]), cond)
    what = join_words([AGGREGATES[f] for f in fns])
    verb = "are" if len(fns) > 1 else "is"
    question = ctx.pick([f"What {verb} the {what} {src.say(c)} of {src.noun}{phrase}?",
                         f"Find the {what} {src.say(c)} of {src.noun}{phrase}."])
    return Draft(query, question, "aggregate")


def group(ctx: Context) -> Draft | None:
    """GROUP BY a category (or a parent row along a join), with counts, aggregates, HAVING or an arg-max."""
    profile = ctx.profile
    if ctx.joins and profile.links and ctx.chance(0.4):
        return _group_by_parent(ctx, ctx.pick(profile.links))
    focus = _focus(ctx, 0.25, group_columns, 0.2)
    if focus is None:
        return None
    src, g, cond, phrase = focus
    gcol, gsay = src.col(g), src.say(g)
    variant = ctx.pick(["count", "agg", "having", "argmax"], [4, 2, 4, 3])
    nums = [c for c in numeric_columns(src) if c != g]
    if variant == "agg" and nums:
        c = ctx.pick(nums)
        fn = ctx.pick(["avg", "max", "min", "sum"], [3, 2, 1, 1])
        query = _with_where(src.select(gcol, AGG_NODES[fn](this=src.col(c))), cond).group_by(gcol.copy())
        return Draft(query, f"What is the {AGGREGATES[fn]} {src.say(c)} of {src.noun}{phrase} for each {gsay}?",
                     "group")
    if variant == "having":
        counts = sorted(n for n in g.counts if n >= 2)
        if counts:  # a real group size, so some group passes (when unfiltered)
            n = counts[len(counts) // 2] if not cond and not src.joined else 2
            query = _with_where(src.select(gcol), cond).group_by(gcol.copy()).having(
                exp.GTE(this=_count(), expression=literal(n)))
            return Draft(query, f"Which {gsay} values appear in at least {n} {src.noun}{phrase}?", "group")
    if variant == "argmax":
        desc = ctx.chance(0.75)
        query = _with_where(src.select(gcol), cond).group_by(gcol.copy()).order_by(_ordered(_count(), desc)).limit(1)
        most = "the most" if desc else "the fewest"
        return Draft(query, f"Which {gsay} has {most} {src.noun}{phrase}?", "group")
    query = _with_where(src.select(gcol, _count()), cond).group_by(gcol.copy())
    question = ctx.pick([f"For each {gsay}, how many {src.noun}{phrase} are there?",
                         f"How many {src.noun}{phrase} are there for each {gsay}?"])
    return Draft(query, question, "group")


def _group_by_parent(ctx: Context, link: Link) -> Draft | None:
    if (found := link_source(ctx.profile, link)) is None:
        return None
    src, parent, child, label = found
    key = src.col(parent.column(parent.primary_key)) if parent.primary_key else src.col(label)
    owner, children = singular(parent.name), src.child_words
    variant = ctx.pick(["count", "argmax", "having", "agg"], [4, 3, 3, 2])
    if variant == "argmax":
        desc = ctx.chance(0.75)
        query = src.select(src.col(label)).group_by(key).order_by(_ordered(_count(), desc)).limit(1)
        return Draft(query, f"What is the {words(label.name)} of the {owner} with the "
                            f"{'most' if desc else 'fewest'} {children}?", "group")
    if variant == "having":
        n = ctx.pick([2, 2, 3, 5])
        query = src.select(src.col(label)).group_by(key).having(exp.GTE(this=_count(), expression=literal(n)))
        return Draft(query, f"What are the {words(label.name)} of {plural(parent.name)} with at least {n} "
                            f"{children}?", "group")
    nums = [c for c in child.columns if askable(c) and c.kind == NUMBER and len(c.quantiles) >= 3]
    if variant == "agg" and nums:
        c = ctx.pick(nums)
        fn = ctx.pick(["avg", "max", "sum"])
        query = src.select(src.col(label), AGG_NODES[fn](this=src.col(c))).group_by(key)
        return Draft(query, f"For each {owner}, give its {words(label.name)} and the {AGGREGATES[fn]} "
                            f"{words(c.name)} of its {children}.", "group")
    query = src.select(src.col(label), _count()).group_by(key)
    return Draft(query, f"For each {owner}, show its {words(label.name)} and the number of {children}.", "group")


def top(ctx: Context) -> Draft | None:
    """ORDER BY a number or date, with LIMIT 1 (superlative), LIMIT k, or a full ordering."""
    src = pick_source(ctx, 0.3)
    keys = src.columns(lambda c: askable(c) and c.kind in (NUMBER, DATE) and c.n_distinct > 1)
    if not keys:
        return None
    o = ctx.pick(keys)
    cols = pick_columns(ctx, src, ctx.pick([1, 2], [3, 1]), exclude=(o,))
    if not cols:
        return None
    cond, phrase = where(ctx, src, 0.3, exclude=(o,))
    desc = ctx.chance(0.6)
    query = _with_where(src.select(*[src.col(c) for c in cols]), cond).order_by(_ordered(src.col(o), desc))
    shown, osay = join_words([src.say(c) for c in cols]), src.say(o)
    high = ("latest" if desc else "earliest") if o.kind == DATE else ("highest" if desc else "lowest")
    variant = ctx.pick(["one", "k", "all"], [4, 2, 3])
    if variant == "one":
        one = singular(src.main.name) if not src.joined else f"record of {src.noun}"
        question = ctx.pick([f"What is the {shown} of the {one}{phrase} with the {high} {osay}?",
                             f"Which {one}{phrase} has the {high} {osay}? Give its {shown}."])
        return Draft(query.limit(1), question, "top")
    if variant == "k":
        k = ctx.pick([3, 5])
        return Draft(query.limit(k), f"List the {shown} of the {k} {src.noun}{phrase} with the {high} {osay}.",
                     "top")
    order = "descending" if desc else "ascending"
    return Draft(query, f"List the {shown} of {src.noun}{phrase}, sorted by {osay} in {order} order.", "top")


def nested(ctx: Context) -> Draft | None:
    """A subquery: compare with an aggregate of the table, or keep rows whose key is (not) IN a child's keys."""
    profile = ctx.profile
    if ctx.joins and profile.links and ctx.chance(0.55):
        return _nested_in(ctx, ctx.pick(profile.links))
    src = Source([ctx.pick(profile.tables)])
    nums = numeric_columns(src)
    cols = pick_columns(ctx, src, ctx.pick([1, 2], [3, 1]))
    if not nums or not cols:
        return None
    c = ctx.pick(nums)
    t, say = src.main.name, words(c.name)
    if ctx.chance(0.7):
        gt = ctx.chance(0.6)
        sub = exp.Subquery(this=exp.select(exp.Avg(this=column(c.name))).from_(table(t)))
        cmp = (exp.GT if gt else exp.LT)(this=column(c.name), expression=sub)
        question = (f"What are the {join_words([words(x.name) for x in cols])} of {plural(t)} whose {say} is "
                    f"{'greater' if gt else 'less'} than the average {say}?")
    else:
        fn = ctx.pick(["max", "min"])
        sub = exp.Subquery(this=exp.select(AGG_NODES[fn](this=column(c.name))).from_(table(t)))
        cmp = exp.EQ(this=column(c.name), expression=sub)
        question = (f"What is the {join_words([words(x.name) for x in cols])} of the {singular(t)} with the "
                    f"{AGGREGATES[fn]} {say}?")
    return Draft(exp.select(*[column(x.name) for x in cols]).from_(table(t)).where(cmp), question, "nested")


def _nested_in(ctx: Context, link: Link) -> Draft | None:
    profile = ctx.profile
    parent, child = profile.table(link.parent), profile.table(link.child)
    psrc, csrc = Source([parent]), Source([child])
    cols = pick_columns(ctx, psrc, ctx.pick([1, 2], [3, 1]))
    if not cols:
        return None
    negate = ctx.chance(0.4)
    cond, phrase = where(ctx, csrc, 0.4 if negate else 0.85)
    sub = _with_where(exp.select(column(link.child_column)).from_(table(child.name)), cond)
    test = exp.In(this=column(link.parent_column), query=exp.Subquery(this=sub))
    query = exp.select(*[column(c.name) for c in cols]).from_(table(parent.name)).where(test.not_() if negate else test)
    shown = join_words([words(c.name) for c in cols])
    have = "do not have any" if negate else "have"
    children = child_noun(profile, link)
    return Draft(query, f"What are the {shown} of {plural(parent.name)} that {have} {children}{phrase}?", "nested")


def set_operation(ctx: Context) -> Draft | None:
    """UNION / INTERSECT / EXCEPT of two filtered queries with the same projection."""
    profile = ctx.profile
    kind = ctx.pick(["union", "intersect", "except"], [2, 2, 2])
    if ctx.joins and profile.links and ctx.chance(0.5):
        return _set_over_link(ctx, ctx.pick(profile.links), kind)
    src = Source([ctx.pick(profile.tables)])
    cols = pick_columns(ctx, src, 1)
    if not cols:
        return None
    first = condition(ctx, src, exclude=cols)
    second = condition(ctx, src, exclude=cols)
    if first is None or second is None or first[1] == second[1]:
        return None
    shown = src.say(cols[0])
    left = src.select(src.col(cols[0])).where(first[0])
    if kind == "except":
        right = src.select(src.col(cols[0])).where(second[0])
        return Draft(exp.except_(left, right), f"What are the {shown} of {src.noun} whose {first[1]}, "
                                               f"except those whose {second[1]}?", "set_op")
    right = src.select(src.col(cols[0])).where(second[0])
    if kind == "union":
        return Draft(exp.union(left, right), f"What are the {shown} of {src.noun} whose {first[1]} or "
                                             f"whose {second[1]}?", "set_op")
    return Draft(exp.intersect(left, right), f"What are the {shown} that appear both among {src.noun} whose "
                                             f"{first[1]} and among those whose {second[1]}?", "set_op")


def _set_over_link(ctx: Context, link: Link, kind: str) -> Draft | None:
    """Parents with children of two kinds (INTERSECT/UNION), or without children of one kind (EXCEPT)."""
    if (found := link_source(ctx.profile, link)) is None:
        return None
    src, parent, child, label = found
    first = condition(ctx, Source([child]))
    if first is None:
        return None
    owners, children = plural(parent.name), src.child_words
    shown = words(label.name)

    def branch(cond: exp.Expression) -> exp.Select:
        return src.select(src.col(label)).where(_requalify(cond, "T2"))

    if kind == "except":
        left = Source([parent]).select(column(label.name))
        return Draft(exp.except_(left, branch(first[0])), f"What are the {shown} of {owners} that do not have "
                                                         f"{children} whose {first[1]}?", "set_op")
    second = condition(ctx, Source([child]))
    if second is None or second[1] == first[1]:
        return None
    op = exp.union if kind == "union" else exp.intersect
    joint = "or" if kind == "union" else "and also"
    return Draft(op(branch(first[0]), branch(second[0])),
                 f"What are the {shown} of {owners} that have {children} whose {first[1]} {joint} "
                 f"{children} whose {second[1]}?", "set_op")


def _requalify(cond: exp.Expression, alias: str) -> exp.Expression:
    """A single-table condition with its columns qualified by `alias`."""
    cond = cond.copy()
    for col in cond.find_all(exp.Column):
        col.set("table", exp.Identifier(this=alias))
    return cond


@dataclass(frozen=True)
class Rule:
    name: str
    weight: float
    build: Callable[[Context], Draft | None]


# The synthesizer's mix. Tuned by measuring (benchmarks/bench_synth.py), never per benchmark database.
RULES: tuple[Rule, ...] = (
    Rule("rows", 22, rows),
    Rule("count", 12, count),
    Rule("aggregate", 10, aggregate),
    Rule("group", 19, group),
    Rule("top", 14, top),
    Rule("nested", 9, nested),
    Rule("set_op", 6, set_operation),
)
