"""The implementation's own hybrid lookup: few existence probes in few rounds.

Independent of ``kvspec.spec.lookup`` by construction (this module never imports it): the
rule is re-derived from its statement and evaluated over a *presence oracle* that only knows
the keys probed so far and says so (``NeedProbe``) when the evaluation reads any other.  Probing
plan (all ranks' keys, one batched ``batch_is_exist`` per round, presence ANDed across ranks by a
MIN all-reduce):

1. every attention group's full-block boundaries up to the bound (the run is read from the
   start, so every one is needed), and for every group the boundaries a descending search reads
   first: its step multiples in (bound − 2·max(a, step), top] (step u in fine mode, else the
   group's span);
2. only when the evaluation read a key not probed yet: every group's unit boundaries around that
   key, from the group's highest known-present boundary below it (at most w below it) up to w above
   it, with w = max(L/8, a)·16^r on the r-th such round (at most four, then everything nameable).

A resend (the common case) is answered by round 1: O(N/s + a/u) keys per rank instead of vLLM's
O(N/u · groups); a partial hit adds one round of O(L/u) keys per group.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from kvspec.spec.geometry import Geometry, compute_alignment, compute_lcm_span, compute_span, is_fine

Probe = Callable[[list[tuple[int, int]]], set[tuple[int, int]]]  # (group, boundary) list -> present subset


class NeedProbe(Exception):
    """The evaluation needs the presence of keys not probed yet."""

    def __init__(self, wanted: set[tuple[int, int]]) -> None:
        super().__init__(f"{len(wanted)} keys")
        self.wanted = wanted


class Presence:
    """What is known about E: probed keys and the subset that is present (on every rank)."""

    def __init__(self) -> None:
        self.probed: set[tuple[int, int]] = set()
        self.present: set[tuple[int, int]] = set()

    def has(self, g: int, t: int) -> bool:
        if (g, t) not in self.probed:
            raise NeedProbe({(g, t)})
        return (g, t) in self.present

    def sorted_present(self, g: int) -> list[int]:
        return sorted(t for x, t in self.present if x == g)


class HybridLookup:
    """Lookup for one request: the hit length, each group's tail boundary, probe accounting."""

    def __init__(self, geometry: Geometry, n_tokens: int, cap: int | None = None, lookahead: int = 0) -> None:
        self.g = geometry
        self.n = n_tokens
        self.u = geometry.unit
        self.fine = is_fine(geometry)
        self.a = compute_alignment(geometry)
        self.L = compute_lcm_span(geometry)
        # with hash lookahead λ a key H_t names [0, t + λ): the request names boundaries up to ⌊(N − λ)/u⌋·u, and no
        # EAGLE drop is taken (the hash proves the token the drafter read)
        self.lookahead = lookahead
        named = max(n_tokens - lookahead, 0)
        self.top = named // self.u * self.u  # last nameable boundary
        self.bound = min(named, named if cap is None else cap) // self.a * self.a  # a retry caps the hit
        self.spans = [compute_span(geometry, i) for i in range(len(geometry.groups))]
        self.kinds = [gr.kind for gr in geometry.groups]
        # merged spec groups: same (kind, block size); attention first
        merged: dict[tuple[str, int], list[int]] = {}
        for i, gr in enumerate(geometry.groups):
            merged.setdefault((gr.kind, gr.block_size), []).append(i)
        self.spec = sorted(merged.values(), key=lambda ms: self.kinds[ms[0]] != "attention")
        self.state = Presence()
        self.rounds = 0
        self.probes = 0

    # ---------------------------------------------------------------- probing rounds
    def _round(self, keys: Iterable[tuple[int, int]], probe: Probe) -> None:
        probed = self.state.probed
        fresh = [k for k in dict.fromkeys(keys) if k not in probed]  # in the order asked, once each (a sort of
        # millions of keys was most of a long prompt's lookup: measured, issue 30)
        if not fresh:
            return
        self.rounds += 1
        self.probes += len(fresh)
        self.state.present |= probe(fresh)
        probed.update(fresh)

    def _step(self, group: int) -> int:
        """Return the spacing of the boundaries the rule reads for a group: u in fine mode, else its span."""
        return self.u if self.fine else self.spans[group]

    def _first_round(self) -> list[tuple[int, int]]:
        keys = []
        for i, kind in enumerate(self.kinds):
            if kind == "attention":
                s = self.spans[i]
                keys += [(i, t) for t in range(s, self.bound + 1, s)]
            step = self._step(i)
            lo = max(self.bound - 2 * max(self.a, step), 0) // step * step
            keys += [(i, t) for t in range(lo + step, self.top + 1, step)]
        return keys

    def _window(self, group: int, t: int, width: int) -> list[tuple[int, int]]:
        """Return the group's unit boundaries in (max(highest known-present boundary <= t, t − width), t + width]."""
        below = [x for x in self.state.sorted_present(group) if x <= t]
        start = max(below[-1] if below else 0, t - width) // self.u * self.u
        return [(group, x) for x in range(start + self.u, min(t + width, self.top) + 1, self.u)]

    LAZY_ROUNDS = 4  # windows of width max(L/8, a)·16^r, r < LAZY_ROUNDS, then one complete probe

    def run(self, probe: Probe, legacy: bool = False) -> tuple[int, list[tuple[int, int]]]:
        """Return (h, [(group, B_g)]) probing through `probe`; one round for a resend, two for most partial hits."""
        if self.bound <= 0:
            return 0, []
        self._round(self._first_round(), probe)
        for r in range(self.LAZY_ROUNDS):
            try:
                h = self._hit()
                return h, self._tails(h, legacy)
            except NeedProbe as need:  # the evaluation read an unprobed key: probe around it in every group
                (_, t), = need.wanted
                width = max(self.L // 8, self.a) * 16 ** r
                self._round([k for i in range(len(self.kinds)) for k in self._window(i, t, width)], probe)
        # last resort: everything nameable
        self._round([(g, t) for g in range(len(self.kinds)) for t in range(self.u, self.top + 1, self.u)], probe)
        h = self._hit()
        return h, self._tails(h, legacy)

    # ---------------------------------------------------------------- the rule, over the oracle
    def _have(self, members: list[int], t: int) -> bool:
        return all(self.state.has(m, t) for m in members)

    def _attention(self, members: list[int], cap: int, drop: bool) -> int:
        s = self.spans[members[0]]
        full = 0
        while full + s <= cap and self._have(members, full + s):
            full += s
        best = full
        if self.fine:
            t = min(full + s - self.u, cap // self.u * self.u)
            while t > full:
                if self._have(members, t):
                    best = t
                    break
                t -= self.u
        if drop and best > 0:
            best -= min(self.a, s)
        return max(best, 0) // self.a * self.a

    def _mamba(self, members: list[int], cap: int) -> int:
        b = self.g.groups[members[0]].block_size
        step = self.u if self.fine else b
        t = cap // step * step
        while t > 0:
            if (self.fine or t % self.a == 0) and self._have(members, t):
                return t
            t -= step
        return 0

    def _converge(self, cap0: int) -> int:
        eagle = [any(self.g.groups[m].eagle for m in ms) and self.lookahead == 0 for ms in self.spec]
        att = [self.kinds[ms[0]] == "attention" for ms in self.spec]
        if len(self.spec) == 1:
            ms = self.spec[0]
            return self._attention(ms, cap0, eagle[0]) if att[0] else self._mamba(ms, cap0)
        once = len(self.spec) == 2 and att[0] and not att[1]
        fixed: dict[int, int] = {}
        checked: set[int] = set()
        length = cap0
        while True:
            cur = length
            for k, ms in enumerate(self.spec):
                if att[k] and k in fixed:
                    cur = min(cur, fixed[k])
                    continue
                if att[k]:
                    drop = eagle[k] and k not in checked
                    peek = (self.u if self.fine and self.spans[ms[0]] > self.u else self.spans[ms[0]]) if drop else 0
                    new = self._attention(ms, min(cur + peek, cap0), drop)
                    fixed[k] = new
                else:
                    drop, new = False, self._mamba(ms, cur)
                if drop:
                    checked.add(k)
                elif new < cur:
                    checked.clear()
                cur = new
            if cur >= length or once:
                return min(cur, length)
            length = cur

    def _hit(self) -> int:
        h = self._converge(self.bound)
        if h >= self.n:
            b2 = (self.n - 1) // self.a * self.a
            h = self._converge(b2) if b2 > 0 else 0
        return h

    def _tails(self, h: int, legacy: bool) -> list[tuple[int, int]]:
        if h <= 0:
            return []
        out = []
        for i in range(len(self.kinds)):
            s = self.spans[i]
            if legacy or self.state.has(i, h):
                out.append((i, h))
                continue
            end = min(-(-h // s) * s, self.top)
            t = h + self.u
            while t <= end and not self.state.has(i, t):
                t += self.u
            if t > end:
                raise LookupError(f"no stored tail key for group {i} at hit length {h}")
            out.append((i, t))
        return out


def list_baseline_probes(geometry: Geometry, n_tokens: int) -> list[tuple[int, int]]:
    """Return vLLM's probe on one rank: every unit boundary up to the bound ⌊N/a⌋·a, for every group."""
    a, u = compute_alignment(geometry), geometry.unit
    return [(g, t) for g in range(len(geometry.groups)) for t in range(u, n_tokens // a * a + 1, u)]


def count_baseline_probes(geometry: Geometry, n_tokens: int) -> int:
    """Return vLLM's probe count: list_baseline_probes on every rank."""
    return len(list_baseline_probes(geometry, n_tokens)) * geometry.parallel.dcp


__all__ = ["HybridLookup", "NeedProbe", "Presence", "count_baseline_probes", "list_baseline_probes"]
