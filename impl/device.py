"""The one place that decides where KV lives and how ranks talk: CUDA + NCCL when present, else CPU + gloo."""

from __future__ import annotations

import os

import torch


def select_device(local_rank: int = 0) -> torch.device:
    """Return cuda:<local_rank> when CUDA is available (and not disabled by KVSPEC_DEVICE=cpu), else cpu."""
    want = os.environ.get("KVSPEC_DEVICE", "auto")
    if want != "cpu" and torch.cuda.is_available():
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    if want == "cuda":
        raise RuntimeError("KVSPEC_DEVICE=cuda but CUDA is not available")
    return torch.device("cpu")


def select_backend(device: torch.device, world_size: int = 1) -> str:
    """Return the torch.distributed backend: nccl when every rank has its own GPU, else gloo."""
    return "nccl" if device.type == "cuda" and torch.cuda.device_count() >= world_size else "gloo"
