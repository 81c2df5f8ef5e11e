"""What a rank's store, lookup and load report: typed records, JSON only at the process boundary (`to_json`)."""

from __future__ import annotations

from typing import Any

import attrs

Obj = tuple[int, int]  # (group, boundary t)


@attrs.frozen(kw_only=True)
class StoreReport:
    """One request's store on one rank: its objects, the keys put, those that existed (skipped), what failed."""

    objects: tuple[Obj, ...]
    put: tuple[str, ...]  # keys this call wrote
    existing: tuple[str, ...]  # keys that existed already: not put again (write-once)
    store_full: int  # puts refused for space (NO_AVAILABLE_HANDLE)
    failed: tuple[tuple[str, int], ...]  # (key, return code) of every other failed put
    bytes: int

    def to_json(self) -> dict[str, Any]:
        """Return the JSON object of the report (lists for tuples)."""
        return {"objects": [list(o) for o in self.objects], "put": list(self.put), "existing": list(self.existing),
                "store_full": self.store_full, "failed": [list(f) for f in self.failed], "bytes": self.bytes}


@attrs.frozen(kw_only=True)
class LookupReport:
    """The hit every rank agreed on, each group's tail boundary, and the lookup's cost."""

    hit: int
    tails: tuple[tuple[int, int], ...]  # (group, B_g)
    rounds: int
    probes: int  # this rank's existence probes
    error: str | None  # the loud form of a -704: no tail key (nothing loaded)

    def to_json(self) -> dict[str, Any]:
        """Return the JSON object of the report."""
        return {"hit": self.hit, "tails": [list(t) for t in self.tails], "rounds": self.rounds, "probes": self.probes,
                "error": self.error}


@attrs.frozen(kw_only=True)
class LoadReport:
    """One rank's load: the plan (group, block, key boundary), its keys, every get's return code."""

    plan: tuple[tuple[int, int, int], ...]
    keys: tuple[str, ...]
    results: tuple[int, ...]  # bytes read, or a negative Mooncake code (-704: not found)
    bytes: int

    @property
    def failed(self) -> tuple[tuple[str, int], ...]:
        """Return (key, code) of every failed get."""
        return tuple((k, rc) for k, rc in zip(self.keys, self.results) if rc < 0)

    @property
    def loaded(self) -> tuple[bool, ...]:
        """Return, per plan entry, whether this rank got its block."""
        return tuple(rc >= 0 for rc in self.results)

    def to_json(self) -> dict[str, Any]:
        """Return the JSON object of the report."""
        return {"plan": [list(p) for p in self.plan], "keys": list(self.keys), "results": list(self.results),
                "failed": [list(f) for f in self.failed], "bytes": self.bytes}
