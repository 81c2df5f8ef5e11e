"""The spec's model store behind the implementation's store interface (spec-level and stateful tests only).

Bytes are copied with ctypes from the engine's zero-copy pointers; presence is the spec's
ModelStore (write-once), so the model is exercised every time the fake is.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

from kvspec.impl.mooncake_store import OBJECT_NOT_FOUND, TRANSFER_FAIL
from kvspec.spec.keys import parse_key
from kvspec.spec.model import ModelStore, apply_evict, apply_put


class FakeMooncake:
    """exist / put / get / remove over ModelStore + a bytes map; `fail` makes chosen gets fail with -800."""

    def __init__(self) -> None:
        self.model = ModelStore()
        self.data: dict[str, bytes] = {}
        self.fail: set[str] = set()
        self.gets: list[str] = []

    @staticmethod
    def _shard(key: str) -> tuple[bytes, int, int]:
        k = parse_key(key)
        return bytes.fromhex(k.hash_hex), k.group, k.dcp_rank

    def register(self, ptr: int, nbytes: int) -> None:
        pass  # ctypes reads and writes the engine's memory directly: nothing to register

    def unregister(self, ptr: int) -> None:
        pass

    def exist(self, keys: Sequence[str]) -> list[int]:
        return [1 if self.model.has(*self._shard(k)) else 0 for k in keys]

    def put(self, keys: Sequence[str], ptrs: Sequence[int], sizes: Sequence[int]) -> list[int]:
        for k, p, n in zip(keys, ptrs, sizes):
            if not self.model.has(*self._shard(k)):  # first writer wins
                self.data[k] = ctypes.string_at(p, n)
                self.model = apply_put(self.model, [self._shard(k)])
        return [0] * len(keys)

    def get(self, keys: Sequence[str], ptrs: Sequence[int], sizes: Sequence[int]) -> list[int]:
        out = []
        for k, p, n in zip(keys, ptrs, sizes):
            self.gets.append(k)
            if k in self.fail:
                out.append(TRANSFER_FAIL)
            elif not self.model.has(*self._shard(k)):
                out.append(OBJECT_NOT_FOUND)
            else:
                b = self.data[k]
                ctypes.memmove(p, b, min(n, len(b)))
                out.append(len(b))
        return out

    def remove(self, key: str, force: bool = False) -> int:
        if not self.model.has(*self._shard(key)):
            return OBJECT_NOT_FOUND
        self.model = apply_evict(self.model, [self._shard(key)])
        del self.data[key]
        return 0

    def close(self) -> None:
        pass
