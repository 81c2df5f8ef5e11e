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


def needs_staging(device: torch.device) -> bool:
    """Return whether KV on this device must be staged through host buffers for the store client.

    KVSPEC_STAGING=1 forces staging, =0 forbids it; by default CUDA tensors are staged when the installed
    Mooncake wheel is the non-CUDA build (it can register and address host memory only).
    """
    want = os.environ.get("KVSPEC_STAGING", "auto")
    if want in ("0", "1"):
        return want == "1"
    if device.type != "cuda":
        return False
    from importlib import metadata
    try:
        metadata.distribution("mooncake-transfer-engine")
        return False  # the CUDA wheel registers device memory itself
    except metadata.PackageNotFoundError:
        return True


def select_backend(device: torch.device, world_size: int = 1) -> str:
    """Return the torch.distributed backend: nccl when every rank has its own GPU, else gloo."""
    return "nccl" if device.type == "cuda" and torch.cuda.device_count() >= world_size else "gloo"
