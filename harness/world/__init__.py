"""Worlds: where the ranks live. `sim`: threads with real gloo groups, in a sandbox process
that may die without taking the driver along; `torchrun`: persistent processes launched by
torchrun and fed by a driver."""

from __future__ import annotations

from harness.errors import ConfigError
from harness.timeouts import DEFAULT_TIMEOUTS, Timeouts
from harness.world.protocol import World

__all__ = ["BACKENDS", "BACKEND_HELP", "DEVICES", "DEVICE_HELP", "WORLDS", "World",
           "add_backend_flags", "check_execution_backend", "open_world", "world_for"]

WORLDS = ("sim", "torchrun")


def open_world(kind: str, nproc: int, backend: str = "gloo",
               timeouts: Timeouts = DEFAULT_TIMEOUTS, device: str | None = None,
               preload_vllm: bool = False) -> World:
    """A world of `nproc` ranks (harness/world/protocol.py); every world registers vLLM's
    code as it opens (harness/world/vllm_slots.py).
    `device` is where the ranks' tensors live (None: the backend's own, cuda for nccl);
    with gloo on CUDA the graphs are emulated. `preload_vllm`: torchrun ranks import vLLM
    before they say ready, so that its imports (12 s on two cores) fall in no deadline."""
    if kind == "sim":
        if backend != "gloo" or device not in (None, "cpu"):
            raise ConfigError("backend" if backend != "gloo" else "device",
                              "the sim world runs gloo on the CPU only")
        from harness.world.sandbox.world import SandboxedSimWorld

        return SandboxedSimWorld(nproc, timeouts)
    if kind == "torchrun":
        from harness.world.torchrun.world import TorchrunWorld

        # A hang under vLLM's execution code always costs a relaunch with vLLM's imports:
        # keep one booting beside the world (docs/measurements.md).
        return TorchrunWorld(nproc, backend, timeouts, device, preload_vllm=preload_vllm,
                             spares=1 if preload_vllm else None)
    raise ConfigError("world", f"unknown world {kind!r} (one of {', '.join(WORLDS)})")


def world_for(kind: str, config) -> str:
    """The world a scenario of `config` runs on: vLLM's execution code keeps its microbatch
    state in module globals, so each rank needs a process of its own; the default (sim)
    world hands such scenarios to a torchrun world of the same size."""
    from harness.config import Execution

    if kind == "sim" and config.system.execution is Execution.VLLM:
        return "torchrun"
    return kind


def check_execution_backend(execution: str, backend: str, device: str | None) -> None:
    """vLLM's execution code runs on CPU ranks over gloo (stand-in streams and graphs) or on
    CUDA ranks over NCCL (real ones); gloo's CUDA collectives cannot be captured into a real
    graph, and the emulated graphs are the CPU stand-ins'."""
    if execution == "vllm" and backend == "gloo" and device not in (None, "cpu"):
        raise ConfigError("device", "--exec vllm over gloo runs on CPU ranks (gloo's CUDA "
                          "collectives cannot be captured): use --backend nccl for CUDA")
    if execution == "vllm" and backend == "nccl" and device == "cpu":
        raise ConfigError("device", "--exec vllm over nccl runs on CUDA ranks")


BACKENDS = ("gloo", "nccl")
DEVICES = ("cpu", "cuda")
BACKEND_HELP = ("process-group backend of the torchrun world (nccl: real CUDA graphs; ranks "
                "share the GPUs when there are fewer GPUs than ranks)")
DEVICE_HELP = ("where the ranks' tensors live (default: cuda with nccl, cpu with gloo; cuda "
               "with gloo emulates the graphs over CUDA tensors)")


def add_backend_flags(parser) -> None:
    """`--backend` and `--device` of the commands that open a world."""
    parser.add_argument("--backend", choices=BACKENDS, default="gloo", help=BACKEND_HELP)
    parser.add_argument("--device", choices=DEVICES, default=None, help=DEVICE_HELP)
