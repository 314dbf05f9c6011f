"""Collectives as the rank code issues them, on any torch process group, always bounded."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist


class CollectiveTimeout(RuntimeError):
    """A collective did not complete within its bound (a peer skipped it, died or is stuck)."""


def is_capturing(tensor: torch.Tensor) -> bool:
    """Whether the calling thread's current CUDA stream is capturing a graph (and `tensor`,
    the collective's data, is a CUDA tensor: CPU collectives never take part in a capture)."""
    return tensor.is_cuda and torch.cuda.is_current_stream_capturing()


def wait_bounded(work, what: str, timeout_s: float) -> None:
    """Wait for a collective's Work, turning a timeout or a broken peer into CollectiveTimeout."""
    try:
        work.wait(timedelta(seconds=timeout_s))
    except RuntimeError as exc:
        raise CollectiveTimeout(f"{what} did not complete: {str(exc).splitlines()[0]}") from exc


def wait_stream_ordered(work, what: str) -> None:
    """Wait for a collective issued into a CUDA graph capture without touching the host.

    A timed wait on NCCL polls the Work's event from the host until it completes, which is
    illegal while the stream captures (and the captured collective only runs at replay).
    The untimed wait only makes the current stream wait on the collective's stream, so it is
    recorded into the graph; the bound is the process group's own timeout (its watchdog) and,
    at replay, the deadline of whoever waits for the replay's results on the host.
    """
    try:
        work.wait()
    except RuntimeError as exc:
        raise CollectiveTimeout(f"{what} could not be joined into the capture: "
                                f"{str(exc).splitlines()[0]}") from exc


def all_reduce_sum(group, tensor: torch.Tensor, timeout_s: float) -> torch.Tensor:
    """SUM all-reduce in place over `group`; the same call in every world."""
    wait_bounded(group.allreduce([tensor]), f"all_reduce of {tuple(tensor.shape)}", timeout_s)
    return tensor


class EagerAllToAll:
    """`all_to_all_single` with equal splits, issued async; its wait is bounded on the host,
    or stream-ordered when it was issued or is waited inside a CUDA graph capture."""

    def __init__(self, group: dist.ProcessGroup, timeout_s: float) -> None:
        self.group = group
        self.timeout_s = timeout_s

    def __call__(self, out: torch.Tensor, inp: torch.Tensor) -> Callable[[], None]:
        issued_in_capture = is_capturing(inp)
        work = dist.all_to_all_single(out, inp, group=self.group, async_op=True)
        what = f"all_to_all of {tuple(inp.shape)}"

        def wait() -> None:
            if issued_in_capture or is_capturing(inp):
                wait_stream_ordered(work, what)
            else:
                wait_bounded(work, what, self.timeout_s)

        return wait


class CollectiveLog:
    """The collectives one rank issues, in issue order: (op, shape) per call.

    Ranks must issue the same sequence; comparing logs across ranks is the fingerprint check.
    """

    def __init__(self, trace_path: str | None = None) -> None:
        self._calls: list[tuple[str, tuple[int, ...]]] = []
        self._lock = threading.Lock()
        # A line per collective, flushed before it is issued: a hung rank's last line says
        # which collective it is stuck in, read by the driver from outside.
        self._trace = open(trace_path, "a", buffering=1) if trace_path else None  # noqa: SIM115

    def add(self, op: str, shape: tuple[int, ...]) -> None:
        with self._lock:
            self._calls.append((op, shape))
            if self._trace is not None:
                self._trace.write(f"#{len(self._calls) - 1} {op} {list(shape)}\n")

    def note(self, text: str) -> None:
        """A marker line in the trace (e.g. which step starts), not a collective."""
        if self._trace is not None:
            self._trace.write(f"-- {text}\n")

    def mark(self) -> int:
        with self._lock:
            return len(self._calls)

    def since(self, mark: int) -> tuple[tuple[str, tuple[int, ...]], ...]:
        with self._lock:
            return tuple(self._calls[mark:])


class LoggedAllToAll:
    """An all-to-all that notes every call it issues in a CollectiveLog."""

    def __init__(self, inner: Callable[[torch.Tensor, torch.Tensor], Callable[[], None]],
                 log: CollectiveLog) -> None:
        self.inner = inner
        self.log = log

    def __call__(self, out: torch.Tensor, inp: torch.Tensor) -> Callable[[], None]:
        self.log.add("all_to_all", tuple(inp.shape))
        return self.inner(out, inp)
