"""Where a gold query's answer on a database is decided by a tie rather than by its meaning.

`... ORDER BY count(*) DESC LIMIT 1` names one row; when two rows share the top count, which one it
names depends on the plan (a join order, the column grouped by), so an equivalent query may name the
other. `SELECT min(v), name FROM t` takes `name` from one of the rows holding the minimum. On the
shipped database the question's author made sure the answer is unique; a variant database
(`rewards.variants`) may create the tie. A variant where the gold's answer hangs on a tie says nothing
about a prediction, so the scorer leaves it out for that gold.

Under GROUP BY the same holds per group: `SELECT name, max(score) FROM t GROUP BY class` takes each class's
`name` from one of its rows at the maximum.

`tie_probes(gold_sql)` is pure: it rewrites the gold into probes (one per ORDER BY ... LIMIT, at any
depth, and one per bare column beside a lone min/max) that also return the sort keys and one row past the
cut, and, under GROUP BY, one that returns a row only where a group holds two different bare values at its
extreme (`cut` 0: any row is a tie); `tied(probe, rows)` reads a probe's result. A probe that cannot run (a
correlated subquery) decides nothing. A top-level LIMIT without ORDER BY is always undetermined.
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
    cut: int  # rows the gold keeps (OFFSET + LIMIT); 0: the probe returns rows only where there is a tie
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
        >>> [p.sql for p in tie_probes("SELECT class, name, max(score) FROM t GROUP BY class")]  # doctest: +NORMALIZE_WHITESPACE
        ['SELECT 1 FROM (SELECT DISTINCT _sirius_k0, _sirius_b0 FROM (SELECT class AS _sirius_k0, name AS _sirius_b0,
          score AS _sirius_v, MAX(score) OVER (PARTITION BY class) AS _sirius_m FROM t) WHERE _sirius_v = _sirius_m)
          GROUP BY _sirius_k0 HAVING COUNT(*) > 1 LIMIT 1']
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
        probes += [p for p in (_order_limit_probe(select) or _extreme_probe(select), _grouped_extreme_probe(select))
                   if p is not None]
    if isinstance(tree, exp.SetOperation) and tree.args.get("order") and tree.args.get("limit"):
        probe = _compound_probe(tree)
        if probe is not None:
            probes.append(probe)
    return tuple(probes)


def tied(probe: Probe, rows) -> bool:
    """True when the probe's rows tie across the cut: the row after it has the keys of the last row kept (a probe
    with `cut` 0: any row)."""
    if probe.cut == 0:
        return bool(rows)
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
    keys = [_resolved(select, ordered.this) for ordered in order.expressions]  # ORDER BY 2, ORDER BY an alias
    if any(k is None for k in keys):
        return None
    keys = [k.copy() for k in keys]
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


def _grouped_extreme_probe(select: exp.Select) -> Probe | None:
    """`SELECT name, max(v) FROM ... GROUP BY g`: a group with two different bare values at its extreme decides
    `name` by a tie. The probe returns a row exactly when some group has them."""
    group = select.args.get("group")
    if group is None or not group.expressions:
        return None
    extremes = [e for e in select.find_all(exp.Min, exp.Max) if e.find_ancestor(exp.Select) is select]
    if len(extremes) != 1 or len(extremes[0].expressions) > 0:
        return None
    keys = [_resolved(select, k) for k in group.expressions]
    if any(k is None for k in keys):
        return None
    key_sql = {k.sql(dialect="sqlite") for k in keys}
    bare = [p.this if isinstance(p, exp.Alias) else p for p in select.expressions]
    bare = [b for b in bare if not b.find(exp.AggFunc) and b.find(exp.Column) and b.sql(dialect="sqlite") not in key_sql]
    if not bare:
        return None
    extreme = extremes[0]
    window = exp.Window(this=extreme.__class__(this=extreme.this.copy()), partition_by=[k.copy() for k in keys])
    inner = select.copy()
    for arg in ("group", "having", "order", "limit", "offset", "distinct"):
        inner.set(arg, None)
    inner.set("expressions", [exp.alias_(k.copy(), f"_sirius_k{i}") for i, k in enumerate(keys)] +
              [exp.alias_(b.copy(), f"_sirius_b{i}") for i, b in enumerate(bare)] +
              [exp.alias_(extreme.this.copy(), "_sirius_v"), exp.alias_(window, "_sirius_m")])
    names = ", ".join([f"_sirius_k{i}" for i in range(len(keys))] + [f"_sirius_b{i}" for i in range(len(bare))])
    groups = ", ".join(f"_sirius_k{i}" for i in range(len(keys)))
    return Probe(f"SELECT 1 FROM (SELECT DISTINCT {names} FROM ({inner.sql(dialect='sqlite')}) WHERE _sirius_v = "
                 f"_sirius_m) GROUP BY {groups} HAVING COUNT(*) > 1 LIMIT 1", 0, 0)


def _resolved(select: exp.Select, key: exp.Expression) -> exp.Expression | None:
    """A GROUP BY / ORDER BY key as an expression: an ordinal or an output alias replaced by what it names."""
    if isinstance(key, exp.Literal) and not key.is_string and key.this.isdigit():
        position = int(key.this) - 1
        if not 0 <= position < len(select.expressions):
            return None
        key = select.expressions[position]
        return key.this if isinstance(key, exp.Alias) else key
    aliases = {p.alias: p.this for p in select.expressions if isinstance(p, exp.Alias) and p.alias}
    if isinstance(key, exp.Column) and not key.table and key.name in aliases:
        return aliases[key.name]
    return key


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
