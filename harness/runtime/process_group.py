"""Wrap a bare backend (e.g. one ThreadWorld rank's ProcessGroupGloo) into a ProcessGroup.

A backend's own methods run collectives without going through the dispatcher, so no
TorchDispatchMode sees them and the emulated graph cannot capture them. Through a
ProcessGroup they become c10d ops (`c10d.alltoall_base_`, ...) that it records and replays.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def as_process_group(backend: dist.ProcessGroup | object,
                     devices: tuple[str, ...] = ("cpu",)) -> dist.ProcessGroup:
    """A ProcessGroup that sends tensors on `devices` through `backend`."""
    if isinstance(backend, dist.ProcessGroup):
        return backend
    group = dist.ProcessGroup(backend.rank(), backend.size())
    backend_type = _backend_type(backend)
    group._set_default_backend(backend_type)
    for device in devices:
        group._register_backend(torch.device(device), backend_type, backend)
    return group


def _backend_type(backend: object) -> dist.ProcessGroup.BackendType:
    if isinstance(backend, dist.ProcessGroupGloo):
        return dist.ProcessGroup.BackendType.GLOO
    nccl = getattr(dist, "ProcessGroupNCCL", None)
    if nccl is not None and isinstance(backend, nccl):
        return dist.ProcessGroup.BackendType.NCCL
    return dist.ProcessGroup.BackendType.CUSTOM
