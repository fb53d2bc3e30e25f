"""Difficulty smoothing (SPEC 2.4), pure and seeded: pass rates in, a flattened selection out.

1. p = 1 is dropped: an all-correct group has zero advantage, so no DAPO gradient.
2. p = 0 is dropped too, unless `keep_zero_share` reserves that share of the budget for it.
3. The rest fall in `n_bins` equal bins on (0, 1): bin b holds b/n <= p < (b+1)/n.
4. Each bin gets an equal share of the stage budget (the remainder of the division goes to the lowest bins).
   A bin fills its share by using each example `share // n` or `share // n + 1` times (a seeded choice of
   which ones get the extra use), never more than `max_repeats` times; with more examples than its share,
   a seeded sample without repetition.
5. What a bin still lacks is its shortfall: `fill_requests` turns it into how many new examples to
   synthesize near that bin (`data_synthesis.curriculum` does the synthesis and estimation).

Nothing here reads a file or draws from a global RNG: the same inputs and seed give the same plan.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class SmoothingConfig:
    """How a stage's examples are chosen from their pass rates (SPEC 2.4; the numbers are our choice)."""

    n_bins: int = 4  # equal-width bins on (0, 1)
    max_repeats: int = 3  # how often one example may appear in a stage
    keep_zero_share: float = 0.0  # share of the budget for p = 0 examples (0: drop them all)

    def __post_init__(self):
        if self.n_bins < 1:
            raise ValueError(f"n_bins must be >= 1, got {self.n_bins}")
        if self.max_repeats < 1:
            raise ValueError(f"max_repeats must be >= 1, got {self.max_repeats}")
        if not 0.0 <= self.keep_zero_share < 1.0:
            raise ValueError(f"keep_zero_share must be in [0, 1), got {self.keep_zero_share}; "
                             "use 0 to drop every p = 0 example (the SPEC default)")


@dataclass(frozen=True)
class BinReport:
    lo: float
    hi: float
    available: int  # distinct examples whose pass rate falls in the bin
    target: int  # the bin's share of the budget
    selected: int  # slots filled (repeats counted)
    unique: int  # distinct examples used
    max_uses: int  # the most any one example is used
    short: int  # target - selected


@dataclass(frozen=True)
class Plan:
    selection: tuple[str, ...]  # example ids in training order, repeats included
    bins: tuple[BinReport, ...]
    zero: BinReport  # the p = 0 examples kept by `keep_zero_share` (target 0 when none are kept)
    dropped: dict = field(default_factory=dict)  # reason -> count
    budget: int = 0

    def to_json(self) -> dict:
        return {"budget": self.budget, "selected": len(self.selection), "dropped": dict(self.dropped),
                "bins": [asdict(b) for b in self.bins], "zero": asdict(self.zero)}


def bin_of(p: float, n_bins: int = 4) -> int | None:
    """The bin of a pass rate strictly between 0 and 1; None for p = 0, p = 1 (and anything outside).

    Example:
        >>> [bin_of(p) for p in (0.0, 0.125, 0.25, 0.49, 0.5, 0.875, 1.0)]
        [None, 0, 1, 1, 2, 3, None]
    """
    if not 0.0 < p < 1.0:
        return None
    return min(int(p * n_bins), n_bins - 1)


def bin_members(pass_rates: Mapping[str, float], n_bins: int = 4) -> dict[int, list[str]]:
    """The sorted ids in each bin (p = 0 and p = 1 belong to none).

    Example:
        >>> bin_members({"a": 0.9, "b": 0.1, "c": 1.0, "d": 0.2}, 4)
        {0: ['b', 'd'], 1: [], 2: [], 3: ['a']}
    """
    members: dict[int, list[str]] = {b: [] for b in range(n_bins)}
    for i in sorted(pass_rates):
        b = bin_of(pass_rates[i], n_bins)
        if b is not None:
            members[b].append(i)
    return members


def bin_targets(budget: int, n_bins: int = 4, keep_zero_share: float = 0.0) -> tuple[int, list[int]]:
    """(slots for p = 0, slots per bin): equal shares, the remainder to the lowest bins.

    Example:
        >>> bin_targets(10, 4), bin_targets(100, 4, keep_zero_share=0.1)
        ((0, [3, 3, 2, 2]), (10, [23, 23, 22, 22]))
    """
    if budget < 0:
        raise ValueError(f"budget must be >= 0, got {budget}")
    zero = round(budget * keep_zero_share)
    base, extra = divmod(budget - zero, n_bins)
    return zero, [base + (b < extra) for b in range(n_bins)]


def allocate(ids: list[str], target: int, max_repeats: int, rng: random.Random) -> list[str]:
    """Fill `target` slots from `ids` as evenly as possible, at most `max_repeats` uses each.

    Example:
        >>> sorted(allocate(["a", "b"], 5, 3, random.Random(0)))
        ['a', 'a', 'b', 'b', 'b']
        >>> len(allocate(["a", "b"], 9, 3, random.Random(0)))  # capped at 2 x 3
        6
    """
    if not ids or target <= 0:
        return []
    take = min(target, len(ids) * max_repeats)
    rounds, extra = divmod(take, len(ids))
    return list(ids) * rounds + rng.sample(list(ids), extra)


def plan_curriculum(pass_rates: Mapping[str, float], budget: int, config: SmoothingConfig = SmoothingConfig(),
                    seed: int = 0) -> Plan:
    """Choose a stage's examples so every difficulty bin gets an equal share of `budget`.

    Example:
        >>> rates = {"a": 0.125, "b": 0.375, "c": 0.5, "d": 0.875, "e": 1.0, "f": 0.0}
        >>> plan = plan_curriculum(rates, 8, seed=0)
        >>> sorted(plan.selection), plan.dropped
        (['a', 'a', 'b', 'b', 'c', 'c', 'd', 'd'], {'all correct (p = 1)': 1, 'all wrong (p = 0)': 1})
    """
    for i, p in pass_rates.items():
        if not 0.0 <= p <= 1.0 or math.isnan(p):
            raise ValueError(f"pass rate of {i!r} is {p}: pass rates must lie in [0, 1]")
    rng = random.Random(seed)
    zero_target, targets = bin_targets(budget, config.n_bins, config.keep_zero_share)
    ids = sorted(pass_rates)  # input order never changes the plan
    zeros = [i for i in ids if pass_rates[i] == 0.0]
    ones = [i for i in ids if pass_rates[i] == 1.0]
    members = bin_members(pass_rates, config.n_bins)
    selection: list[str] = []
    reports = []
    for b in range(config.n_bins):
        chosen = allocate(members[b], targets[b], config.max_repeats, rng)
        selection += chosen
        reports.append(_report(b / config.n_bins, (b + 1) / config.n_bins, members[b], targets[b], chosen))
    kept_zeros = allocate(zeros, zero_target, 1, rng)  # a p = 0 example is never repeated
    selection += kept_zeros
    dropped = {}
    if ones:
        dropped["all correct (p = 1)"] = len(ones)
    if len(zeros) > len(kept_zeros):
        dropped["all wrong (p = 0)"] = len(zeros) - len(set(kept_zeros))
    rng.shuffle(selection)
    return Plan(tuple(selection), tuple(reports), _report(0.0, 0.0, zeros, zero_target, kept_zeros), dropped,
                budget)


def _report(lo: float, hi: float, members: list[str], target: int, chosen: list[str]) -> BinReport:
    uses: dict[str, int] = {}
    for i in chosen:
        uses[i] = uses.get(i, 0) + 1
    return BinReport(lo, hi, len(members), target, len(chosen), len(uses), max(uses.values(), default=0),
                     target - len(chosen))


def fill_requests(plan: Plan, max_repeats: int) -> dict[int, int]:
    """New examples to synthesize per short bin: enough that, at `max_repeats` uses each, the gap closes.

    Example:
        >>> plan = plan_curriculum({"a": 0.1, "b": 0.3, "c": 0.6, "d": 0.9}, 20, SmoothingConfig(max_repeats=3))
        >>> [b.short for b in plan.bins], fill_requests(plan, 3)
        ([2, 2, 2, 2], {0: 1, 1: 1, 2: 1, 3: 1})
    """
    return {b: math.ceil(r.short / max_repeats) for b, r in enumerate(plan.bins) if r.short > 0}


def pick_parents(members: Mapping[int, list[str]], b: int, n: int, rng: random.Random) -> list[str]:
    """`n` examples to mutate for bin `b`: its own members, or those of the nearest non-empty bins.

    Example:
        >>> pick_parents({0: [], 1: ["x"], 2: ["y", "z"], 3: []}, 0, 3, random.Random(0))
        ['x', 'x', 'x']
    """
    for distance in range(len(members)):
        near = sorted({i for d in {b - distance, b + distance} for i in members.get(d, [])})
        if near:
            return [rng.choice(near) for _ in range(n)]
    return []
