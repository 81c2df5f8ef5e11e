"""Boundary sets that scale with groups, not tokens: runs (arithmetic progressions) plus points, less holes.

A store rule writes every whole span of a group up to some length (s, 2s, …, K·s) and a few points
(tails, checkpoints); evictions remove points.  `Boundaries` holds exactly that: its size is the
number of runs, points and holes, whatever the prompt length, and every question the lookup asks
of a group's present set (membership, the largest / smallest member in a window that is a multiple
of m, how many whole spans are present from the start) is answered by arithmetic.  `Objects` maps
groups to such sets and is a `collections.abc.Set` of (group, boundary) pairs, so the spec's
explicit code reads it unchanged (iteration expands it, in order).
"""

from __future__ import annotations

import bisect
import functools
import math
from collections.abc import Iterable, Iterator, Mapping
from collections.abc import Set as AbstractSet

import attrs

from .types import Boundary, GroupId

Run = tuple[int, int, int]  # (first, step, last): first, first + step, …, last (last ≡ first mod step, last >= first)


def _solve(f1: int, s1: int, f2: int, s2: int) -> tuple[int, int] | None:
    """Return (x0, M): the solutions of x ≡ f1 (mod s1), x ≡ f2 (mod s2) are x0 + k·M, M = lcm(s1, s2); None if none."""
    g = math.gcd(s1, s2)
    if (f2 - f1) % g:
        return None
    m = s1 // g * s2
    k = (f2 - f1) // g * pow(s1 // g, -1, s2 // g) % (s2 // g) if s2 // g > 1 else 0
    return (f1 + s1 * k) % m, m


@attrs.frozen(kw_only=True, cache_hash=True)
class Boundaries:
    """A set of positive integers: the union of disjoint runs and of points outside them, less the holes."""

    runs: tuple[Run, ...] = ()
    points: tuple[int, ...] = ()  # ascending, none inside a run
    holes: frozenset[int] = frozenset()  # members removed (evictions); only ever inside runs or points

    def __contains__(self, x: object) -> bool:
        return isinstance(x, int) and has_boundary(self, x)

    def __iter__(self) -> Iterator[int]:
        return iterate_boundaries(self)


EMPTY = Boundaries()


def make_boundaries(points: Iterable[int] = (), runs: Iterable[Run] = ()) -> Boundaries:
    """Return the set ∪ runs ∪ points (runs with equal first and step merged; points inside a run dropped)."""
    runs = tuple(runs)
    if not runs:  # the common small cases first: points only, or one run
        return Boundaries(points=tuple(sorted(set(points))))
    if len(runs) == 1 and runs[0][2] >= runs[0][0]:
        return Boundaries(runs=runs, points=tuple(sorted({x for x in points if not _in_run(runs[0], x)})))
    merged: dict[tuple[int, int], int] = {}
    for f, s, last in runs:
        if last >= f:
            merged[(f, s)] = max(merged.get((f, s), last), last)
    out: list[Run] = []
    loose = set(points)
    for (f, s), last in sorted(merged.items()):
        if any(_run_overlaps((f, s, last), r) for r in out):  # rare (two steps over one range): keep it as points
            loose.update(range(f, last + 1, s))
        else:
            out.append((f, s, last))
    runs_t = tuple(out)
    return Boundaries(runs=runs_t, points=tuple(sorted(x for x in loose if not _in_runs(runs_t, x))))


def make_run(step: int, last: int) -> Boundaries:
    """Return {k·step : 1 <= k <= ⌊last/step⌋}."""
    top = last // step * step
    return Boundaries(runs=((step, step, top),)) if top >= step else EMPTY


def _run_overlaps(a: Run, b: Run) -> bool:
    lo, hi = max(a[0], b[0]), min(a[2], b[2])
    if lo > hi:
        return False
    sol = _solve(a[0], a[1], b[0], b[1])
    return sol is not None and _first_at_least(sol, lo) <= hi


def _first_at_least(sol: tuple[int, int], lo: int) -> int:
    x0, m = sol
    return lo + (x0 - lo) % m


def _in_run(r: Run, x: int) -> bool:
    return r[0] <= x <= r[2] and (x - r[0]) % r[1] == 0


def _in_runs(runs: tuple[Run, ...], x: int) -> bool:
    return any(_in_run(r, x) for r in runs)


def has_boundary(b: Boundaries, x: int) -> bool:
    """Return whether x ∈ b."""
    if x in b.holes:
        return False
    i = bisect.bisect_left(b.points, x)
    return (i < len(b.points) and b.points[i] == x) or _in_runs(b.runs, x)


def compute_union(a: Boundaries, b: Boundaries) -> Boundaries:
    """Return a ∪ b (neither may have holes: evictions are applied last)."""
    assert not a.holes and not b.holes, "union of sets with holes"
    return make_boundaries((*a.points, *b.points), (*a.runs, *b.runs))


def compute_intersection(a: Boundaries, b: Boundaries) -> Boundaries:
    """Return a ∩ b."""
    runs = []
    for r in a.runs:
        for q in b.runs:
            sol = _solve(r[0], r[1], q[0], q[1])
            lo, hi = max(r[0], q[0]), min(r[2], q[2])
            if sol is not None and lo <= hi:
                first = _first_at_least(sol, lo)
                if first <= hi:
                    runs.append((first, sol[1], hi - (hi - first) % sol[1]))
    points = [x for x in a.points if has_boundary(attrs.evolve(b, holes=frozenset()), x)]
    points += [x for x in b.points if _in_runs(a.runs, x)]
    out = make_boundaries(points, runs)
    holes = {x for x in a.holes | b.holes if has_boundary(out, x)}
    return attrs.evolve(out, holes=frozenset(holes)) if holes else out


def compute_without(b: Boundaries, removed: Iterable[int]) -> Boundaries:
    """Return b less the removed members (absent ones are ignored)."""
    holes = {x for x in removed if has_boundary(b, x)}
    return attrs.evolve(b, holes=b.holes | holes) if holes else b


def compute_at_most(b: Boundaries, top: int) -> Boundaries:
    """Return {x ∈ b : x <= top}."""
    runs = tuple((f, s, top - (top - f) % s) if last > top else (f, s, last) for f, s, last in b.runs if f <= top)
    return Boundaries(runs=runs, points=tuple(x for x in b.points if x <= top),
                      holes=frozenset(x for x in b.holes if x <= top))


def find_max(b: Boundaries, lo: int, hi: int, mod: int = 1) -> int | None:
    """Return max{x ∈ b : lo < x <= hi, m | x}, None if there is none."""
    best = max((x for x in reversed(b.points) if lo < x <= hi and x % mod == 0 and x not in b.holes), default=None)
    for f, s, last in b.runs:
        sol = _solve(f, s, 0, mod)
        top = min(hi, last)
        if sol is None or top <= lo:
            continue
        x = top - (top - sol[0]) % sol[1]
        while x > lo and x >= f and x in b.holes:
            x -= sol[1]
        if x > lo and x >= f and (best is None or x > best):
            best = x
    return best


def find_min(b: Boundaries, lo: int, hi: int, mod: int = 1) -> int | None:
    """Return min{x ∈ b : lo < x <= hi, m | x}, None if there is none."""
    best = min((x for x in b.points if lo < x <= hi and x % mod == 0 and x not in b.holes), default=None)
    for f, s, last in b.runs:
        sol = _solve(f, s, 0, mod)
        bottom = max(lo + 1, f)
        if sol is None or bottom > min(hi, last):
            continue
        x = _first_at_least(sol, bottom)
        while x <= min(hi, last) and x in b.holes:
            x += sol[1]
        if x <= min(hi, last) and (best is None or x < best):
            best = x
    return best


def compute_whole_run(b: Boundaries, span: int) -> int:
    """Return the largest k with j·span ∈ b for every 1 <= j <= k (the whole spans present from the start)."""
    k = 0
    holes = sorted(x for x in b.holes if x % span == 0)
    while True:
        x = (k + 1) * span
        cover = next((r for r in b.runs if r[1] <= span and span % r[1] == 0 and _in_run(r, x)), None)
        if cover is not None:  # every multiple of span from x to the run's end is in it
            end = cover[2] // span
            cut = bisect.bisect_left(holes, x)
            if cut < len(holes) and holes[cut] <= end * span:
                return holes[cut] // span - 1
            k = end
        elif has_boundary(b, x):
            k += 1
        else:
            return k


def count_boundaries(b: Boundaries) -> int:
    """Return |b|."""
    return sum((last - f) // s + 1 for f, s, last in b.runs) + len(b.points) - len(b.holes)


def compute_members(b: Boundaries) -> set[int]:
    """Return b's members as a set (unordered: cheaper than iterate_boundaries when order does not matter)."""
    out = set(b.points)
    for f, s, last in b.runs:
        out.update(range(f, last + 1, s))
    return out - b.holes if b.holes else out


def iterate_boundaries(b: Boundaries) -> Iterator[int]:
    """Yield b's members in ascending order (expands the runs: cost grows with the prompt)."""
    runs = [range(f, last + 1, s) for f, s, last in b.runs]
    import heapq
    for x in heapq.merge(b.points, *runs):
        if x not in b.holes:
            yield x


@attrs.frozen(kw_only=True, eq=False)  # equality and hash of a set (Set's), not of the fields
class Objects(AbstractSet[tuple[GroupId, Boundary]]):
    """A set of (group, boundary) objects held per group as Boundaries (groups with none left out)."""

    groups: tuple[tuple[GroupId, Boundaries], ...] = ()  # ascending group ids

    @classmethod
    def _from_iterable(cls, it: Iterable[tuple[GroupId, Boundary]]  # type: ignore[override]
                       ) -> frozenset[tuple[GroupId, Boundary]]:
        return frozenset(it)  # the Set mixins (|, &, -) answer explicit sets

    def __contains__(self, item: object) -> bool:
        if not isinstance(item, tuple) or len(item) != 2:
            return False
        b = self.by_group.get(item[0])
        return b is not None and isinstance(item[1], int) and has_boundary(b, item[1])

    def __iter__(self) -> Iterator[tuple[GroupId, Boundary]]:
        for g, b in self.groups:
            for x in iterate_boundaries(b):
                yield g, Boundary(x)

    def __len__(self) -> int:
        return sum(count_boundaries(b) for _, b in self.groups)

    def __hash__(self) -> int:
        return hash(self.groups)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Objects):
            return self.groups == other.groups or (len(self) == len(other) and all(o in other for o in self))
        return AbstractSet.__eq__(self, other)

    @functools.cached_property
    def by_group(self) -> Mapping[GroupId, Boundaries]:
        """Return {group: its boundaries}."""
        return dict(self.groups)


def list_objects(objects: Objects) -> frozenset[tuple[GroupId, Boundary]]:
    """Return the objects as an explicit set."""
    return frozenset((g, Boundary(t)) for g, b in objects.groups for t in compute_members(b))


def make_objects(per_group: Mapping[GroupId, Boundaries]) -> Objects:
    """Return the Objects of per-group boundary sets (empty ones left out)."""
    return Objects(groups=tuple(sorted((g, b) for g, b in per_group.items() if b.runs or b.points)))


def compute_group_boundaries(objects: Objects, group: GroupId) -> Boundaries:
    """Return the group's boundaries (EMPTY when it has none)."""
    return objects.by_group.get(group, EMPTY)


def compute_objects_union(sets: Iterable[Objects]) -> Objects:
    """Return the union of object sets (no holes: before evictions)."""
    per: dict[GroupId, Boundaries] = {}
    for s in sets:
        for g, b in s.groups:
            per[g] = compute_union(per[g], b) if g in per else b
    return make_objects(per)
