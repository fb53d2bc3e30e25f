"""Where a gold query's answer on a database is decided by a tie rather than by its meaning.

`... ORDER BY count(*) DESC LIMIT 1` names one row; when two rows share the top count, which one it
names depends on the plan (a join order, the column grouped by), so an equivalent query may name the
other. `SELECT min(v), name FROM t` takes `name` from one of the rows holding the minimum. On the
shipped database the question's author made sure the answer is unique; a variant database
(`rewards.variants`) may create the tie. A variant where the gold's answer hangs on a tie says nothing
about a prediction, so the scorer leaves it out for that gold.

`tie_probes(gold_sql)` is pure: it rewrites the gold into probes (one per ORDER BY ... LIMIT, at any
depth, and one per bare column beside a lone min/max) that also return the sort keys and one row past the
cut; `tied(probe, rows)` reads a probe's result. A probe that cannot run (a correlated subquery) decides
nothing. A top-level LIMIT without ORDER BY is always undetermined.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import sqlglot
from sqlglot import exp

UNDETERMINED = "undetermined"  # a probe that needs no running: the gold's rows are an arbitrary subset


@dataclass(frozen=True)
class Probe:
    sql: str  # returns the query's rows with its sort keys as the last `keys` columns, one row past the cut
    cut: int  # rows the gold keeps (OFFSET + LIMIT)
    keys: int


@lru_cache(maxsize=8192)  # a gold is checked on every variant, for every sample of its group
def tie_probes(gold_sql: str) -> tuple[Probe, ...] | str:
    """The probes of `gold_sql`, or UNDETERMINED (a top-level LIMIT without ORDER BY). Pure (and cached).

    Example:
        >>> [p.sql for p in tie_probes("SELECT name FROM t GROUP BY id ORDER BY count(*) DESC LIMIT 1")]
        ['SELECT name, COUNT(*) FROM t GROUP BY id ORDER BY COUNT(*) DESC LIMIT 2']
        >>> [(p.sql, p.cut) for p in tie_probes("SELECT min(v), name FROM t WHERE x > 1")]
        [('SELECT v FROM t WHERE x > 1 ORDER BY v ASC NULLS LAST LIMIT 2', 1)]
        >>> tie_probes("SELECT name FROM t LIMIT 3"), tie_probes("SELECT count(*) FROM t")
        ('undetermined', ())
    """
    try:
        tree = sqlglot.parse_one(gold_sql, read="sqlite")
    except (sqlglot.errors.SqlglotError, ValueError, RecursionError):
        return ()
    if tree is None:
        return ()
    if _int(tree.args.get("limit")) is not None and not tree.args.get("order"):
        return UNDETERMINED
    probes = []
    for select in tree.find_all(exp.Select):
        probe = _order_limit_probe(select) or _extreme_probe(select)
        if probe is not None:
            probes.append(probe)
    if isinstance(tree, exp.SetOperation) and tree.args.get("order") and tree.args.get("limit"):
        probe = _compound_probe(tree)
        if probe is not None:
            probes.append(probe)
    return tuple(probes)


def tied(probe: Probe, rows) -> bool:
    """True when the probe's rows tie across the cut: the row after it has the keys of the last row kept."""
    return len(rows) > probe.cut >= 1 and rows[probe.cut - 1][-probe.keys:] == rows[probe.cut][-probe.keys:]


def _int(node) -> int | None:
    if node is None:
        return None
    value = node.args.get("expression") if isinstance(node, (exp.Limit, exp.Offset)) else node
    if isinstance(value, exp.Literal) and not value.is_string and value.this.isdigit():
        return int(value.this)
    return None


def _cut(query: exp.Expression) -> int | None:
    limit = _int(query.args.get("limit"))
    offset = _int(query.args.get("offset")) if query.args.get("offset") is not None else 0
    return None if limit is None or offset is None or limit < 1 else limit + offset


def _order_limit_probe(select: exp.Select) -> Probe | None:
    order, cut = select.args.get("order"), _cut(select)
    if order is None or cut is None:
        return None
    aliases = {p.alias: p.this for p in select.expressions if isinstance(p, exp.Alias) and p.alias}
    keys = []
    for ordered in order.expressions:
        key = ordered.this
        if isinstance(key, exp.Literal) and not key.is_string and key.this.isdigit():  # ORDER BY 2
            position = int(key.this) - 1
            if not 0 <= position < len(select.expressions):
                return None
            key = select.expressions[position]
            key = key.this if isinstance(key, exp.Alias) else key
        elif isinstance(key, exp.Column) and not key.table and key.name in aliases:  # ORDER BY an output alias
            key = aliases[key.name]
        keys.append(key.copy())
    probe = select.copy()
    probe.set("expressions", [e.copy() for e in select.expressions] + keys)
    probe.set("offset", None)
    probe.set("limit", exp.Limit(expression=exp.Literal.number(cut + 1)))
    return Probe(probe.sql(dialect="sqlite"), cut, len(keys))


def _extreme_probe(select: exp.Select) -> Probe | None:
    """`SELECT min(v), name FROM ... [WHERE ...]` (no GROUP BY): ties at the extreme decide `name`."""
    if select.args.get("group") or select.args.get("order") or select.args.get("limit"):
        return None
    extremes = [e for e in select.find_all(exp.Min, exp.Max) if e.find_ancestor(exp.Select) is select]
    if len(extremes) != 1 or len(extremes[0].expressions) > 0:
        return None
    bare = [p for p in select.expressions
            if not (p.this if isinstance(p, exp.Alias) else p).find(exp.AggFunc) and p.find(exp.Column)]
    if not bare:
        return None
    extreme = extremes[0]
    probe = select.copy()
    probe.set("expressions", [extreme.this.copy()])
    probe.set("distinct", None)
    probe = probe.order_by(exp.Ordered(this=extreme.this.copy(), desc=isinstance(extreme, exp.Max)), copy=False)
    probe.set("limit", exp.Limit(expression=exp.Literal.number(2)))
    return Probe(probe.sql(dialect="sqlite"), 1, 1)


def _compound_probe(tree: exp.SetOperation) -> Probe | None:
    """A UNION / INTERSECT / EXCEPT with ORDER BY ... LIMIT: its order keys must be output columns or ordinals."""
    cut = _cut(tree)
    if cut is None:
        return None
    inner = tree.copy()
    for arg in ("order", "limit", "offset"):
        inner.set(arg, None)
    keys = []
    for ordered in tree.args["order"].expressions:
        key = ordered.this
        if isinstance(key, exp.Literal) and not key.is_string and key.this.isdigit():
            keys.append(f"_sirius_tie.{_output_name(inner, int(key.this) - 1)}")
        elif isinstance(key, exp.Column):
            keys.append(f"_sirius_tie.{exp.to_identifier(key.name).sql('sqlite')}")
        else:
            return None
        if keys[-1].endswith(".None"):
            return None
    order = ", ".join(o.sql(dialect="sqlite").replace(o.this.sql(dialect="sqlite"), k, 1)
                      for o, k in zip(tree.args["order"].expressions, keys))
    sql = (f"SELECT _sirius_tie.*, {', '.join(keys)} FROM ({inner.sql(dialect='sqlite')}) AS _sirius_tie "
           f"ORDER BY {order} LIMIT {cut + 1}")
    return Probe(sql, cut, len(keys))


def _output_name(query: exp.Expression, position: int) -> str | None:
    first = query
    while isinstance(first, exp.SetOperation):
        first = first.this
    if not isinstance(first, exp.Select) or not 0 <= position < len(first.expressions):
        return None
    name = first.expressions[position].alias_or_name
    return exp.to_identifier(name).sql("sqlite") if name else None
