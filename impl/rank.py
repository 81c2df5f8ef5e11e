"""One rank process's plumbing, in one place: device, process group, store client, the MIN all-reduce.

Every entry point that runs as a DCP rank (worker main and --serve, the transfer bench) builds one
RankProcess, so device choice, backend, rendezvous and the NCCL device hop cannot drift apart. The load
harness's ranks share no process group: each is a LocalRank (same device and store, no collectives).
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from .device import select_backend, select_device
from .mooncake_store import MooncakeKV


class RankProcess:
    """This process as rank `rank` of WORLD_SIZE: device, backend, process group (file rendezvous), store."""

    collective = True

    def __init__(self, rank: int, master: str, segment_bytes: int, local_buffer_bytes: int = 16 << 20) -> None:
        self.rank = rank
        self.world = int(os.environ["WORLD_SIZE"])
        self.device = select_device(rank)
        self.backend = select_backend(self.device, self.world)
        dist.init_process_group(self.backend, init_method=os.environ["KVSPEC_RENDEZVOUS"], rank=rank,
                                world_size=self.world)
        self.store = MooncakeKV(master, segment_bytes=segment_bytes, local_buffer_bytes=local_buffer_bytes)

    def all_reduce_min(self, t: torch.Tensor) -> None:
        """MIN-reduce a CPU int tensor across ranks in place (through the device when the backend is NCCL)."""
        if self.backend == "nccl":  # NCCL reduces device tensors only
            d = t.to(self.device)
            dist.all_reduce(d, op=dist.ReduceOp.MIN)
            t.copy_(d.cpu())
        else:
            dist.all_reduce(t, op=dist.ReduceOp.MIN)

    def barrier(self) -> None:
        """Wait for every rank."""
        dist.barrier()

    def close(self) -> None:
        """Close the store client, then leave the process group."""
        try:
            self.store.close()
        finally:
            dist.destroy_process_group()


class LocalRank:
    """This process as rank `rank` without a process group: device and store only; presence is probed on every
    rank's keys by the rank itself (RankEngine's probe_all_ranks), and a load's verdict is its own."""

    collective = False
    backend = "none"

    def __init__(self, rank: int, master: str, segment_bytes: int, local_buffer_bytes: int = 16 << 20) -> None:
        self.rank = rank
        self.device = select_device(rank)
        self.store = MooncakeKV(master, segment_bytes=segment_bytes, local_buffer_bytes=local_buffer_bytes)

    def all_reduce_min(self, t: torch.Tensor) -> None:
        """Leave t as it is (no other rank takes part)."""

    def barrier(self) -> None:
        """Return at once (no other rank takes part)."""

    def close(self) -> None:
        """Close the store client."""
        self.store.close()
