"""The process group of the single-rank GPU world: one rank, gloo for CPU tensors (the DP
sync, as vLLM's CPU group) and NCCL for CUDA tensors (the expert all-to-alls).

How it is built (`RankGroup.how`): a `ProcessGroupGloo` and a `ProcessGroupNCCL` constructed
directly over one in-process `HashStore` and registered, per device type, on one
`ProcessGroup` (no global state: no `init_process_group`). If this torch cannot construct
them directly, `dist.init_process_group("cpu:gloo,cuda:nccl", ...)` over a HashStore is the
fallback, and `how` says so. On the CPU the same world of one is gloo alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from harness.runtime.process_group import as_process_group

DIRECT = "ProcessGroupGloo + ProcessGroupNCCL over a HashStore, on one ProcessGroup"
DEFAULT_GROUP = "init_process_group('cpu:gloo,cuda:nccl') over a HashStore"
CPU_GROUP = "gloo, emulated"


@dataclass(frozen=True)
class RankGroup:
    """The group of rank 0 and how it was built; `backends` are what `close` shuts down."""

    group: dist.ProcessGroup
    how: str
    backends: tuple[Any, ...] = ()

    def close(self) -> None:
        """Shut the communicators down (best effort; the process may go on)."""
        if self.how == DEFAULT_GROUP:
            if dist.is_initialized():
                dist.destroy_process_group()
            return
        for backend in self.backends:
            for name in ("shutdown", "abort"):
                method = getattr(backend, name, None)
                if method is None:
                    continue
                try:
                    method()
                    break
                except Exception:  # best effort at teardown
                    continue


def open_cuda_group(device: torch.device, timeout_s: float) -> RankGroup:
    """The gloo + NCCL group on `device`, checked with one all-reduce and one all-to-all (the
    NCCL communicator is created here, outside any graph capture)."""
    torch.cuda.set_device(device)
    timeout = timedelta(seconds=timeout_s)
    try:
        group, backends = _direct_group(timeout)
        opened = RankGroup(group, DIRECT, backends)
    except (RuntimeError, TypeError, AttributeError):
        if dist.is_initialized():
            raise
        dist.init_process_group("cpu:gloo,cuda:nccl", store=dist.HashStore(), rank=0,
                                world_size=1, timeout=timeout)
        opened = RankGroup(dist.group.WORLD, DEFAULT_GROUP)
    _check(opened, device, timeout_s)
    return opened


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


def _check(opened: RankGroup, device: torch.device, timeout_s: float) -> None:
    cpu = torch.ones(2, dtype=torch.int32)
    opened.group.allreduce([cpu]).wait(timedelta(seconds=timeout_s))
    inp = torch.arange(4, dtype=torch.float64, device=device)
    out = torch.zeros_like(inp)
    work = dist.all_to_all_single(out, inp, group=opened.group, async_op=True)
    work.wait(timedelta(seconds=timeout_s))
    torch.cuda.synchronize(device)
    if cpu.tolist() != [1, 1] or not torch.equal(out, inp):
        raise RuntimeError(f"the single-rank GPU world ({opened.how}) returned wrong data")


def single_rank_cpu_group(timeout_s: float = 30.0) -> dist.ProcessGroup:
    """The same world of one on the CPU (gloo only, emulated graphs): to debug the GPU
    suite's and the bench's code on a machine without a GPU."""
    gloo = dist.ProcessGroupGloo(dist.HashStore(), 0, 1, timedelta(seconds=timeout_s))
    return as_process_group(gloo)


def open_cpu_group(timeout_s: float) -> RankGroup:
    return RankGroup(single_rank_cpu_group(timeout_s), CPU_GROUP)
