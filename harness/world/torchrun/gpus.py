"""Where the ranks of an NCCL world run: one GPU per rank, or several ranks sharing a GPU.

NCCL refuses two ranks of one host on one GPU ("Duplicate GPU detected"). Given a host
identity of its own per rank (`NCCL_HOSTID`) it takes them for separate nodes and accepts
them; they then talk over sockets on loopback rather than NVLink or P2P, and time-slice the
GPU's SMs. The semantics of capture, replay and the all-to-alls are unchanged
(docs/worlds.md, "Shared-GPU NCCL worlds").
"""

from __future__ import annotations

import math
import shutil
import subprocess
import time
from dataclasses import dataclass

from harness.errors import ConfigError


@dataclass(frozen=True)
class GpuLayout:
    ranks: int
    gpus: int

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise ConfigError("backend", "nccl needs a GPU and none is visible here; use "
                              "BACKEND=gloo (or --backend gloo)")

    @property
    def shared(self) -> bool:
        return self.ranks > self.gpus

    @property
    def ranks_per_gpu(self) -> int:
        return math.ceil(self.ranks / self.gpus)

    def gpu_of(self, local_rank: int) -> int:
        """Round-robin: rank r on GPU r mod gpus (LOCAL_RANK itself when there are enough)."""
        return local_rank % self.gpus

    def describe(self) -> str:
        if not self.shared:
            return f"nccl: {self.ranks} ranks, one GPU each"
        return (f"nccl: {self.ranks} ranks share {self.gpus} GPU(s), up to "
                f"{self.ranks_per_gpu} per GPU, each with its own NCCL host identity: the "
                "all-to-alls go over sockets on loopback (not NVLink/P2P) and the ranks "
                "time-slice the GPU")


def shared_gpu_environment(rank: int, socket_ifname: str | None = None) -> dict[str, str]:
    """What a rank sets before NCCL starts when it shares its GPU: its own host identity,
    and the interface of the sockets NCCL then uses between the "hosts" (loopback unless
    the user chose one)."""
    return {"NCCL_HOSTID": f"dbo-harness-rank-{rank}",
            "NCCL_SOCKET_IFNAME": socket_ifname or "lo"}


def visible_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def pids_holding_gpu_memory(pids: list[int], settle_s: float = 5.0) -> list[int]:
    """Which of `pids` still hold GPU memory by nvidia-smi, given `settle_s` for the driver
    to release a process that just ended (none where nvidia-smi is absent)."""
    exe = shutil.which("nvidia-smi")
    if exe is None or not pids:
        return []
    deadline = time.monotonic() + settle_s
    while True:
        try:
            listed = subprocess.run([exe, "--query-compute-apps=pid", "--format=csv,noheader"],
                                    capture_output=True, text=True, timeout=10).stdout
        except (subprocess.TimeoutExpired, OSError):
            return []
        held = sorted(set(pids) & {int(p) for p in listed.split() if p.isdigit()})
        if not held or time.monotonic() >= deadline:
            return held
        time.sleep(0.2)
