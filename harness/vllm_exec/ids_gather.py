"""The top-k ids exchange before a vLLM-style dispatch (docs/spec.md §11.5): every rank
all-gathers each microbatch's top-k ids over the DP group on the microbatch's comm stream,
and its dispatch routes by its own row of what came back, so the gathered ids are on the
path of every routed row.

The comm stream must wait for the compute stream's write of the ids before the gather reads
them (ROCm/ATOM PR #1208 is that wait missing). `IdsGatherWait.AFTER_ROUTING` waits on an
event recorded once the router wrote them; the slip, `BEFORE_ROUTING`, syncs the two
streams before the router runs and issues the gather with no further wait: on CPU the
gather still reads the right ids (every op runs when issued), on a GPU it races the router.
Outside a microbatch's context the dbo_* calls do nothing and the gather runs in order on
the current stream.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import ModuleType

import torch
import torch.distributed as dist

from harness.bug_switches import IdsGatherWait
from harness.runtime.comm import (
    CollectiveLog,
    CollectiveTimeout,
    is_capturing,
    wait_bounded,
    wait_polled,
    wait_stream_ordered,
)
from harness.vllm_exec.stream_log import StreamLog

AllGather = Callable[[torch.Tensor, torch.Tensor], None]  # out <- all_gather(inp), waited


class BoundedAllGather:
    """`all_gather_into_tensor` over `group`, noted in the rank's collective log and waited within
    a bound: stream-ordered inside a CUDA graph capture, polled on CUDA, timed on gloo."""

    def __init__(self, group: dist.ProcessGroup, timeout_s: float, log: CollectiveLog) -> None:
        self.group = group
        self.timeout_s = timeout_s
        self.log = log

    def __call__(self, out: torch.Tensor, inp: torch.Tensor) -> None:
        self.log.add_tensor("all_gather", inp)
        what = f"all_gather of {tuple(inp.shape)}"
        in_capture = is_capturing(inp)
        try:
            work = dist.all_gather_into_tensor(out, inp, group=self.group, async_op=True)
        except RuntimeError as exc:
            raise CollectiveTimeout(f"{what} could not be issued: "
                                    f"{str(exc).splitlines()[0]}") from exc
        if in_capture:
            wait_stream_ordered(work, what)
        elif inp.is_cuda:  # NCCL: execution vllm refuses gloo on CUDA
            wait_polled(work, what, self.timeout_s)
        else:
            wait_bounded(work, what, self.timeout_s)


class IdsGather:
    """Each microbatch's top-k ids gathered on its comm stream through fixed-size buffers
    (`slots` ids per rank, the same on every rank), with the stream order logged."""

    def __init__(self, all_gather: AllGather, ubatching: ModuleType, stream_log: StreamLog,
                 rank: int, peers: int, slots: int, wait: IdsGatherWait,
                 device: torch.device) -> None:
        self.all_gather = all_gather
        self.u = ubatching
        self.stream_log = stream_log
        self.rank = rank
        self.peers = peers
        self.slots = slots
        self.early = wait is IdsGatherWait.BEFORE_ROUTING
        self.device = device
        self._buffers: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._lock = threading.Lock()

    def before_routing(self) -> None:
        """The slip's only sync: the comm stream waits on compute before the router runs."""
        if self.early:
            self.u.dbo_switch_to_comm_sync()
            self.u.dbo_switch_to_compute()

    def exchange(self, ub: int, topk_ids: torch.Tensor) -> torch.Tensor:
        """`topk_ids` [T, K] as this rank's row of the gathered ids (what the dispatch
        routes by). A batch too large for the buffers is left to the dispatch to refuse."""
        n = topk_ids.numel()
        if n > self.slots:
            return topk_ids
        send, recv = self._buffers_of(ub)
        send.fill_(-1)
        send[:n].copy_(topk_ids.reshape(-1))
        ids, gathered = f"top-k ids of microbatch {ub}", f"gathered ids of microbatch {ub}"
        self.stream_log.access("write", ids, "router")
        if self.early:
            self.u.dbo_switch_to_comm()  # the slip: relies on the sync before the router
        else:
            self.u.dbo_switch_to_comm_sync()
        self.stream_log.access("read", ids, "all_gather")
        self.all_gather(recv, send)
        self.stream_log.access("write", gathered, "all_gather")
        self.u.dbo_switch_to_compute_sync()
        # The dispatch reads them next, on the compute stream.
        self.stream_log.access("read", gathered, "dispatch")
        return recv.view(self.peers, self.slots)[self.rank, :n].view(topk_ids.shape)

    def _buffers_of(self, ub: int) -> tuple[torch.Tensor, torch.Tensor]:
        # Allocated at the first (eager, warm-up) use: a capture allocates nothing.
        with self._lock:
            if ub not in self._buffers:
                self._buffers[ub] = (
                    torch.full((self.slots,), -1, dtype=torch.int64, device=self.device),
                    torch.full((self.peers * self.slots,), -1, dtype=torch.int64,
                               device=self.device))
            return self._buffers[ub]
