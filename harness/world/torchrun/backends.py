"""Whether a torchrun world of a backend and device can run on this machine, in one line."""

from __future__ import annotations

from harness.errors import ConfigError
from harness.world.torchrun.gpus import GpuLayout, visible_gpus


def check_backend(backend: str, nproc: int, device: str | None = None) -> GpuLayout | None:
    """One clear line for a world that cannot run here (no silent fallback, no skip); the
    GPU layout of an NCCL world. `device` None means the backend's own: cuda for nccl."""
    if backend not in ("gloo", "nccl"):
        raise ConfigError("backend", f"unknown backend {backend!r} (gloo or nccl)")
    device = device or ("cuda" if backend == "nccl" else "cpu")
    if device not in ("cpu", "cuda"):
        raise ConfigError("device", f"unknown device {device!r} (cpu or cuda)")
    if nproc < 2:
        raise ConfigError("nproc", f"is {nproc}; a DP world needs at least 2 ranks")
    if backend == "nccl":
        if device != "cuda":
            raise ConfigError("device", "nccl runs on cuda; use --device cuda or gloo")
        return GpuLayout(nproc, visible_gpus())
    if device == "cuda" and visible_gpus() == 0:
        raise ConfigError("device", "cuda: no GPU is visible here; use DEVICE=cpu")
    return None


def rank_device(backend: str, device: str | None) -> str:
    """Where a torchrun world's rank tensors live: cuda under nccl, else as given (cpu)."""
    return "cuda" if backend == "nccl" else (device or "cpu")
