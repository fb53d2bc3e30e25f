"""Difficulty smoothing (SPEC 2.4), pure and seeded: pass rates in, a flattened selection out.

1. p = 1 is dropped: an all-correct group has zero advantage, so no DAPO gradient.
2. p = 0 is dropped too, unless `keep_zero_share` reserves that share of the budget for it.
3. The rest fall in `n_bins` equal bins on (0, 1): bin b holds b/n <= p < (b+1)/n. The bins are placed over
   the rates k samples can produce (j/k): with k known there are at most k - 1 of them (`bins_for`), so every
   bin holds at least one attainable rate -- one bin per rate when k - 1 <= 4 (k = 4: 1/4, 1/2, 3/4), else
   each bin groups the rates of its interval (k = 8: {1/8}, {2/8, 3/8}, {4/8, 5/8}, {6/8, 7/8}). Equal bins
   on (0, 1) put no attainable rate in (0, 1/4) when k = 4: that bin could never fill.
4. Each bin gets an equal share of the stage budget (the remainder of the division goes to the lowest bins).
   A bin fills its share by using each example `share // n` or `share // n + 1` times (a seeded choice of
   which ones get the extra use), never more than `max_repeats` times; with more examples than its share,
   a seeded sample without repetition.
5. What a bin still lacks is its shortfall: `fill_requests` turns it into how many new examples to
   synthesize near that bin (`data_synthesis.curriculum` does the synthesis and estimation).
6. What the bins still cannot hold goes to the bins that can, in equal parts (`spread`): the stage fills its
   budget whenever the pool holds enough slots at `max_repeats`, flat where the pool allows, and the plan's
   `notes` say which bin was short and why. (A short stage is no flatter: the trainer would only cycle it.)

Nothing here reads a file or draws from a global RNG: the same inputs and seed give the same plan.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class SmoothingConfig:
    """How a stage's examples are chosen from their pass rates (SPEC 2.4; the numbers are our choice)."""

    n_bins: int = 4  # equal-width bins on (0, 1); at most k - 1 when `k` is known (`bins_for`)
    max_repeats: int = 3  # how often one example may appear in a stage
    keep_zero_share: float = 0.0  # share of the budget for p = 0 examples (0: drop them all)
    k: int | None = None  # samples behind each pass rate (rates are then j/k); None: unknown

    def __post_init__(self):
        if self.n_bins < 1:
            raise ValueError(f"n_bins must be >= 1, got {self.n_bins}")
        if self.max_repeats < 1:
            raise ValueError(f"max_repeats must be >= 1, got {self.max_repeats}")
        if not 0.0 <= self.keep_zero_share < 1.0:
            raise ValueError(f"keep_zero_share must be in [0, 1), got {self.keep_zero_share}; "
                             "use 0 to drop every p = 0 example (the SPEC default)")
        if self.k is not None:
            bins_for(self.k, self.n_bins)


MAX_BINS = 4  # SPEC 2.4's 4 bins (our choice): the most a stage is split into unless asked for more


def fraction(p: float, k: int) -> str:
    """A pass rate as the count of k it is: 0.25 over k = 4 is "1/4"."""
    return f"{round(p * k)}/{k}"


def attainable_rates(k: int) -> list[float]:
    """The pass rates k samples can produce strictly between 0 and 1: j/k for j = 1 .. k - 1.

    >>> attainable_rates(4)
    [0.25, 0.5, 0.75]
    """
    return [j / k for j in range(1, k)]


def bins_for(k: int | None, n_bins: int | None = None) -> int:
    """How many bins a stage uses: `n_bins` as asked (checked against k), or one per attainable rate, at most 4.

    With k samples a pass rate is j/k; `min(n_bins, k - 1)` equal bins on (0, 1) each hold at least one
    such rate, more bins leave one empty by construction. None for `k`: rates of unknown k, `n_bins` or 4.

    >>> bins_for(4), bins_for(5), bins_for(8), bins_for(2), bins_for(8, 2), bins_for(None)
    (3, 4, 4, 1, 2, 4)
    """
    if k is None:
        return MAX_BINS if n_bins is None else n_bins
    if k < 2:
        raise ValueError(f"a pass rate over k={k} sample is 0 or 1, both dropped by the smoothed curriculum "
                         "(no DAPO gradient)")
    if n_bins is None:
        return min(MAX_BINS, k - 1)
    if n_bins > k - 1:
        rates = ", ".join(fraction(p, k) for p in attainable_rates(k))
        raise ValueError(f"{n_bins} bins over pass rates of k={k} samples: the rates in (0, 1) are {rates}, so at "
                         f"most {k - 1} bins can hold an example and {n_bins - (k - 1)} would stay empty")
    return n_bins


@dataclass(frozen=True)
class BinReport:
    lo: float
    hi: float
    available: int  # distinct examples whose pass rate falls in the bin
    target: int  # the bin's share of the budget
    selected: int  # slots filled (repeats counted)
    unique: int  # distinct examples used
    max_uses: int  # the most any one example is used
    short: int  # what the bin lacks of its own share: max(0, target - selected)
    extra: int = 0  # slots it took over from bins that could not hold their share
    attainable: tuple[float, ...] = ()  # the pass rates j/k that fall in the bin (when k is known)


@dataclass(frozen=True)
class Plan:
    selection: tuple[str, ...]  # example ids in training order, repeats included
    bins: tuple[BinReport, ...]
    zero: BinReport  # the p = 0 examples kept by `keep_zero_share` (target 0 when none are kept)
    dropped: dict = field(default_factory=dict)  # reason -> count
    budget: int = 0
    notes: tuple[str, ...] = ()  # why a bin, or the stage, is short of its share

    def to_json(self) -> dict:
        return {"budget": self.budget, "selected": len(self.selection), "dropped": dict(self.dropped),
                "bins": [asdict(b) for b in self.bins], "zero": asdict(self.zero), "notes": list(self.notes)}


def bin_of(p: float, n_bins: int = 4) -> int | None:
    """The bin of a pass rate strictly between 0 and 1; None for p = 0, p = 1 (and anything outside).

    Example:
        >>> [bin_of(p) for p in (0.0, 0.125, 0.25, 0.49, 0.5, 0.875, 1.0)]
        [None, 0, 1, 1, 2, 3, None]
    """
    if not 0.0 < p < 1.0:
        return None
    return min(int(p * n_bins + 1e-9), n_bins - 1)  # 1e-9: j/k on an edge (2/6 x 3 = 0.99999...) is on it


def bin_label(b: int, n_bins: int, k: int | None = None) -> str:
    """How a bin is named in tables: its interval, and the rates j/k in it when k is known.

    >>> bin_label(0, 3, 4), bin_label(1, 4, 8), bin_label(3, 4)
    ('bin [0.00, 0.33): 1/4', 'bin [0.25, 0.50): 2/8 3/8', 'bin [0.75, 1.00)')
    """
    rates = " ".join(fraction(p, k) for p in attainable_rates(k) if bin_of(p, n_bins) == b) if k else ""
    return f"bin [{b / n_bins:.2f}, {(b + 1) / n_bins:.2f})" + (f": {rates}" if rates else "")


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


def spread(shares: list[int], capacity: list[int], total: int) -> list[int]:
    """Slots per bin: each bin its share where it can hold it, the rest of `total` over the bins that still can.

    What a bin cannot hold (`capacity`: its examples x max_repeats) is split equally over the others (the
    remainder to the lowest), again and again until `total` is placed or every bin is full: the flattest
    stage the caps allow.

    Example:
        >>> spread([107, 107, 106], [195, 126, 60], 320)  # bin 2 holds 60: its 46 go 23 + 23, bin 1 caps at 126
        [134, 126, 60]
        >>> spread([3, 3], [0, 4], 6)
        [0, 4]
    """
    slots = [min(s, c) for s, c in zip(shares, capacity)]
    left = total - sum(slots)
    while left > 0:
        room = [b for b in range(len(slots)) if slots[b] < capacity[b]]
        if not room:
            break
        base, extra = divmod(left, len(room))
        for i, b in enumerate(room):
            add = min(base + (i < extra), capacity[b] - slots[b])
            slots[b] += add
            left -= add
    return slots


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
    n = config.n_bins
    zero_target, targets = bin_targets(budget, n, config.keep_zero_share)
    ids = sorted(pass_rates)  # input order never changes the plan
    zeros = [i for i in ids if pass_rates[i] == 0.0]
    ones = [i for i in ids if pass_rates[i] == 1.0]
    members = bin_members(pass_rates, n)
    kept_zeros = allocate(zeros, zero_target, 1, rng)  # a p = 0 example is never repeated
    slots = spread(targets, [len(members[b]) * config.max_repeats for b in range(n)], budget - len(kept_zeros))
    selection: list[str] = []
    reports = []
    for b in range(n):
        chosen = allocate(members[b], slots[b], config.max_repeats, rng)
        selection += chosen
        attainable = tuple(p for p in attainable_rates(config.k) if bin_of(p, n) == b) if config.k else ()
        reports.append(_report(b / n, (b + 1) / n, members[b], targets[b], chosen, attainable))
    selection += kept_zeros
    dropped = {}
    if ones:
        dropped["all correct (p = 1)"] = len(ones)
    if len(zeros) > len(kept_zeros):
        dropped["all wrong (p = 0)"] = len(zeros) - len(set(kept_zeros))
    rng.shuffle(selection)
    zero = _report(0.0, 0.0, zeros, zero_target, kept_zeros)
    return Plan(tuple(selection), tuple(reports), zero, dropped, budget,
                tuple(shortfall_notes(reports, zero, budget, len(selection), config.max_repeats, config.k)))


def _report(lo: float, hi: float, members: list[str], target: int, chosen: list[str],
            attainable: tuple[float, ...] = ()) -> BinReport:
    uses: dict[str, int] = {}
    for i in chosen:
        uses[i] = uses.get(i, 0) + 1
    return BinReport(lo, hi, len(members), target, len(chosen), len(uses), max(uses.values(), default=0),
                     max(0, target - len(chosen)), max(0, len(chosen) - target), attainable)


def shortfall_notes(bins: Sequence[BinReport], zero: BinReport, budget: int, selected: int, max_repeats: int,
                    k: int | None = None) -> list[str]:
    """One sentence per bin short of its share (and for the stage short of its budget), saying why.

    Example:
        >>> bins = [BinReport(0.0, 0.5, 0, 40, 0, 0, 0, 40, attainable=(0.25,)),
        ...         BinReport(0.5, 1.0, 10, 40, 30, 10, 3, 10, attainable=(0.5, 0.75))]
        >>> for note in shortfall_notes(bins, BinReport(0, 0, 0, 0, 0, 0, 0, 0), 80, 30, 3, k=4):
        ...     print(note)
        bin [0.00, 0.50) is empty: no rated example has a pass rate of 1/4
        bin [0.50, 1.00) is short by 10 of its share 40: its 10 examples fill 30 at max_repeats=3
        the stage has 30 of its budget of 80: every bin is at max_repeats=3 (30 slots in all); a larger pool, more repeats or gap filling fills it
    """
    notes = []
    for b in bins:
        if not b.short:
            continue
        where = f"bin [{b.lo:.2f}, {b.hi:.2f})"
        if not b.available:
            rates = " or ".join(fraction(p, k) for p in b.attainable) if k and b.attainable else ""
            notes.append(f"{where} is empty: no rated example has a pass rate {f'of {rates}' if rates else 'in it'}")
        else:
            its = f"its {b.available} examples fill" if b.available > 1 else "its 1 example fills"
            notes.append(f"{where} is short by {b.short} of its share {b.target}: {its} {b.selected} at "
                         f"max_repeats={max_repeats}")
    if zero.short and zero.target:
        notes.append(f"the p = 0 share is short by {zero.short} of {zero.target}: {zero.available} examples "
                     "with p = 0 (never repeated)")
    moved = sum(b.extra for b in bins)
    if moved:
        notes.append(f"{moved} slot{'s' * (moved > 1)} went to the bins with room: " + ", ".join(
            f"[{b.lo:.2f}, {b.hi:.2f}) +{b.extra}" for b in bins if b.extra))
    if selected < budget:
        room = sum(b.selected for b in bins)
        notes.append(f"the stage has {selected} of its budget of {budget}: every bin is at max_repeats="
                     f"{max_repeats} ({room} slots in all); a larger pool, more repeats or gap filling fills it")
    return notes


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
