"""A small adapter over the real Mooncake Store (lazy import; return codes mapped, never hidden)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

OK = 0
NO_AVAILABLE_HANDLE = -200  # store full: "not cached", never an error
OBJECT_NOT_FOUND = -704
OBJECT_HAS_LEASE = -706
TRANSFER_FAIL = -800
RPC_FAIL = -900
RPC_TIMEOUT = -901
INVALID_PARAMS = -600
REPLICA_IS_NOT_READY = -703
LEASE_EXPIRED = -707
NAMES = {OK: "OK", NO_AVAILABLE_HANDLE: "NO_AVAILABLE_HANDLE", INVALID_PARAMS: "INVALID_PARAMS",
         REPLICA_IS_NOT_READY: "REPLICA_IS_NOT_READY", OBJECT_NOT_FOUND: "OBJECT_NOT_FOUND",
         OBJECT_HAS_LEASE: "OBJECT_HAS_LEASE", LEASE_EXPIRED: "LEASE_EXPIRED", TRANSFER_FAIL: "TRANSFER_FAIL",
         RPC_FAIL: "RPC_FAIL", RPC_TIMEOUT: "RPC_TIMEOUT"}


class StoreError(RuntimeError):
    """The store could not be set up or answered something unusable."""


@runtime_checkable
class StoreClient(Protocol):
    """What a rank's engine asks of its store (MooncakeKV here; tests' FakeMooncake implements it in full).

    Batched and zero-copy: exist answers 1 / 0 / negative per key; put answers 0 or a negative code (a key that
    exists keeps its first value and answers 0); get answers the object's size or a negative code (-704: not
    found); remove answers 0, -704 or -706 (a lease); slabs are registered before transfers and unregistered
    before their memory is freed.
    """

    def register(self, ptr: int, nbytes: int) -> None: ...

    def unregister(self, ptr: int) -> None: ...

    def exist(self, keys: Sequence[str]) -> list[int]: ...

    def put(self, keys: Sequence[str], ptrs: Sequence[int], sizes: Sequence[int]) -> list[int]: ...

    def get(self, keys: Sequence[str], ptrs: Sequence[int], sizes: Sequence[int]) -> list[int]: ...

    def remove(self, key: str, force: bool = False) -> int: ...

    def close(self) -> None: ...


class MooncakeKV:
    """One rank's client of a Mooncake master: zero-copy batch put/get from registered KV slabs."""

    def __init__(self, master: str, segment_bytes: int = 256 << 20, local_buffer_bytes: int = 16 << 20) -> None:
        os.environ.setdefault("MC_STORE_CLIENT_SETUP_RETRIES", "1")
        from mooncake.store import MooncakeDistributedStore, ReplicateConfig  # lazy: optional dependency

        self._store = MooncakeDistributedStore()
        rc = self._store.setup("127.0.0.1", "P2PHANDSHAKE", segment_bytes, local_buffer_bytes, "tcp", "", master)
        if rc != 0:
            raise StoreError(f"mooncake setup against {master} failed with {rc}")
        self._config = ReplicateConfig()
        self._config.preferred_segment = self._store.get_hostname()  # a rank's shards live in its own segment
        self._registered: list[int] = []

    def register(self, ptr: int, nbytes: int) -> None:
        """Register one KV slab once (needed for RDMA; harmless over TCP)."""
        if self._store.register_buffer(ptr, nbytes) == 0:
            self._registered.append(ptr)

    @property
    def registered_count(self) -> int:
        """Return how many slabs are registered now (a leak shows as a count that grows)."""
        return len(self._registered)

    def unregister(self, ptr: int) -> None:
        """Unregister a slab before its memory is freed (a later slab may reuse the address)."""
        if ptr in self._registered:
            self._store.unregister_buffer(ptr)
            self._registered.remove(ptr)

    def exist(self, keys: Sequence[str]) -> list[int]:
        """Return 1 / 0 / negative per key (one batched RPC)."""
        return list(self._store.batch_is_exist(list(keys))) if keys else []

    def put(self, keys: Sequence[str], ptrs: Sequence[int], sizes: Sequence[int]) -> list[int]:
        """Return 0 or a negative code per key: zero-copy batch put from the given buffers."""
        if not keys:
            return []
        return list(self._store.batch_put_from(list(keys), list(ptrs), list(sizes), self._config))

    def get(self, keys: Sequence[str], ptrs: Sequence[int], sizes: Sequence[int]) -> list[int]:
        """Return the object size (>= 0) or a negative code per key: zero-copy batch get into the buffers."""
        if not keys:
            return []
        return list(self._store.batch_get_into(list(keys), list(ptrs), list(sizes)))

    def remove(self, key: str, force: bool = False) -> int:
        """Return 0, -704 or -706: remove one object."""
        return int(self._store.remove(key, force))

    def close(self) -> None:
        """Unregister the slabs and close the client."""
        for ptr in self._registered:
            self._store.unregister_buffer(ptr)
        self._registered.clear()
        self._store.close()
