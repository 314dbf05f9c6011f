"""The single-rank GPU world: DP rank 0 of a world of one, on one GPU.

The GPU machine has one GPU and NCCL refuses two ranks on one GPU, so the GPU path of the
rank code runs on a world of ONE rank. Its process group has two backends, as the torchrun
world's would: gloo for the DP sync (a CPU all-reduce, as vLLM's CPU group) and NCCL for the
expert all-to-alls on CUDA tensors. The all-to-all is a real NCCL collective of size one
(a copy through NCCL), so capture, replay, streams and threads are exercised for real; what
one rank cannot show is a peer that disagrees.

How the group is built (`SingleRankGpuWorld.how`): a `ProcessGroupGloo` and a
`ProcessGroupNCCL` constructed directly over one in-process `HashStore` and registered, per
device type, on one `ProcessGroup` (no global state: no `init_process_group`). If this torch
cannot construct them directly, `dist.init_process_group("cpu:gloo,cuda:nccl", ...)` over a
HashStore is the fallback, and `how` says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from harness.config import HarnessConfig

DIRECT = "ProcessGroupGloo + ProcessGroupNCCL over a HashStore, on one ProcessGroup"
DEFAULT_GROUP = "init_process_group('cpu:gloo,cuda:nccl') over a HashStore"


def single_rank_config(**fields: Any) -> HarnessConfig:
    """A config of ONE DP rank, microbatched if `fields` ask for it (rank 0 owns every
    expert, and the reference has one rank). HarnessConfig allows that only with its
    `single_rank_gpu_world` switch, which names this world."""
    fields = dict(fields)
    if fields.pop("dp_size", 1) != 1:
        raise ValueError("the single-rank GPU world has exactly one rank")
    return HarnessConfig(**fields, dp_size=1, single_rank_gpu_world=True)


@dataclass
class SingleRankGpuWorld:
    """Rank 0 of a world of one on `device`; `group` routes CPU tensors to gloo and CUDA
    tensors to NCCL."""

    group: dist.ProcessGroup
    device: torch.device
    how: str
    timeout_s: float
    _backends: tuple[Any, ...] = ()

    @property
    def rank(self) -> int:
        return 0

    def close(self) -> None:
        """Shut the NCCL communicator down (best effort; the process may go on)."""
        if self.how == DEFAULT_GROUP:
            if dist.is_initialized():
                dist.destroy_process_group()
            return
        for backend in self._backends:
            for name in ("shutdown", "abort"):
                method = getattr(backend, name, None)
                if method is None:
                    continue
                try:
                    method()
                    break
                except Exception:  # noqa: BLE001, S112 - best effort at teardown
                    continue

    def __enter__(self) -> SingleRankGpuWorld:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def open_single_rank_gpu_world(timeout_s: float = 30.0,
                               device: torch.device | str = "cuda") -> SingleRankGpuWorld:
    """Build the world and run one all-reduce and one all-to-all through it (the NCCL
    communicator is created here, outside any graph capture)."""
    if not torch.cuda.is_available():
        raise RuntimeError("the single-rank GPU world needs a CUDA device")
    device = torch.device(device)
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    torch.cuda.set_device(device)
    timeout = timedelta(seconds=timeout_s)
    try:
        group, backends = _direct_group(timeout)
        world = SingleRankGpuWorld(group, device, DIRECT, timeout_s, backends)
    except (RuntimeError, TypeError, AttributeError):
        if dist.is_initialized():
            raise
        dist.init_process_group("cpu:gloo,cuda:nccl", store=dist.HashStore(), rank=0,
                                world_size=1, timeout=timeout)
        world = SingleRankGpuWorld(dist.group.WORLD, device, DEFAULT_GROUP, timeout_s)
    _check(world)
    return world


def _direct_group(timeout: timedelta) -> tuple[dist.ProcessGroup, tuple[Any, ...]]:
    store = dist.HashStore()
    gloo = dist.ProcessGroupGloo(dist.PrefixStore("gloo", store), 0, 1, timeout)
    options = dist.ProcessGroupNCCL.Options()
    options._timeout = timeout
    nccl = dist.ProcessGroupNCCL(dist.PrefixStore("nccl", store), 0, 1, options)
    group = dist.ProcessGroup(0, 1)
    types = dist.ProcessGroup.BackendType
    group._set_default_backend(types.NCCL)
    group._register_backend(torch.device("cpu"), types.GLOO, gloo)
    group._register_backend(torch.device("cuda"), types.NCCL, nccl)
    return group, (nccl, gloo)


def _check(world: SingleRankGpuWorld) -> None:
    cpu = torch.ones(2, dtype=torch.int32)
    world.group.allreduce([cpu]).wait(timedelta(seconds=world.timeout_s))
    inp = torch.arange(4, dtype=torch.float64, device=world.device)
    out = torch.zeros_like(inp)
    work = dist.all_to_all_single(out, inp, group=world.group, async_op=True)
    work.wait(timedelta(seconds=world.timeout_s))
    torch.cuda.synchronize(world.device)
    if cpu.tolist() != [1, 1] or not torch.equal(out, inp):
        raise RuntimeError(f"the single-rank GPU world ({world.how}) returned wrong data")


def single_rank_cpu_group(timeout_s: float = 30.0) -> dist.ProcessGroup:
    """The same world of one on the CPU (gloo only, emulated graphs): to debug the GPU
    suite's and the bench's code on a machine without a GPU."""
    from harness.runtime.process_group import as_process_group

    gloo = dist.ProcessGroupGloo(dist.HashStore(), 0, 1, timedelta(seconds=timeout_s))
    return as_process_group(gloo)
