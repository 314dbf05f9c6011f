"""Collectives as the rank code issues them, on any torch process group, always bounded."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist

from harness.errors import ErrorOrigin
from harness.runtime.sanitizer import announce_written

POLL_S = 0.0002  # an all-to-all over sockets takes about 2 ms


class CollectiveTimeout(RuntimeError):
    """A collective did not complete within its bound (a peer skipped it, died or is stuck)."""

    origin = ErrorOrigin.TIMEOUT


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


def wait_polled(work, what: str, timeout_s: float) -> None:
    """Wait for a CUDA collective (NCCL) by polling its completion from the host.

    NCCL's own timed wait frees a collective that times out only by aborting the whole
    communicator, which was measured to hang with two ranks sharing an H200 (docs/worlds.md).
    A collective whose peer never comes is instead left on the device: the step fails here
    with a named timeout, and the rank's device fence finds its streams held (DeviceWedged).
    """
    deadline = time.monotonic() + timeout_s
    try:
        while not work.is_completed():
            if time.monotonic() >= deadline:
                raise CollectiveTimeout(f"{what} did not complete within {timeout_s:.1f} s")
            time.sleep(POLL_S)
        work.wait()  # only orders the current stream after the finished collective
    except RuntimeError as exc:
        if isinstance(exc, CollectiveTimeout):
            raise
        raise CollectiveTimeout(f"{what} failed: {str(exc).splitlines()[0]}") from exc


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


def all_reduce_sum(group, tensor: torch.Tensor, timeout_s: float,
                   log: CollectiveLog | None = None) -> torch.Tensor:
    """SUM all-reduce in place over `group`; the same call in every world. `log` notes the
    tensor as passed, so a rank that passes another shape or dtype shows in its fingerprint."""
    if log is not None:
        log.add_tensor("all_reduce", tensor)
    wait_bounded(group.allreduce([tensor]), f"all_reduce of {tuple(tensor.shape)}", timeout_s)
    return tensor


class EagerAllToAll:
    """`all_to_all_single` with equal splits, issued async; its wait is bounded on the host,
    or stream-ordered when it was issued or is waited inside a CUDA graph capture."""

    def __init__(self, group: dist.ProcessGroup, timeout_s: float,
                 host_synced: bool = False) -> None:
        """`host_synced`: the group's CUDA collectives complete on the host (gloo), so their
        own timed wait is the bound; otherwise (NCCL) the wait polls the device."""
        self.group = group
        self.timeout_s = timeout_s
        self.host_synced = host_synced

    def __call__(self, out: torch.Tensor, inp: torch.Tensor) -> Callable[[], None]:
        issued_in_capture = is_capturing(inp)
        what = f"all_to_all of {tuple(inp.shape)}"
        try:
            work = dist.all_to_all_single(out, inp, group=self.group, async_op=True)
        except RuntimeError as exc:
            # NCCL refuses new work on a communicator aborted after an earlier timeout.
            raise CollectiveTimeout(f"{what} could not be issued: "
                                    f"{str(exc).splitlines()[0]}") from exc

        def wait() -> None:
            if issued_in_capture or is_capturing(inp):
                wait_stream_ordered(work, what)
            elif inp.is_cuda and not self.host_synced:
                wait_polled(work, what, self.timeout_s)
            else:
                wait_bounded(work, what, self.timeout_s)
            announce_written(out)  # the receive is ready on this stream from now on

        return wait


class CollectiveLog:
    """The collectives one rank issues, in issue order: (op, shape, dtype) of what each call
    was given.

    Ranks must issue the same sequence; comparing logs across ranks is the fingerprint check.
    """

    def __init__(self, trace_path: str | None = None) -> None:
        self._calls: list[tuple[str, tuple[int, ...], str]] = []
        self._lock = threading.Lock()
        # A line per collective, flushed before it is issued: a hung rank's last line says
        # which collective it is stuck in, read by the driver from outside.
        self._trace = open(trace_path, "a", buffering=1) if trace_path else None

    def add(self, op: str, shape: tuple[int, ...], dtype: str) -> None:
        with self._lock:
            self._calls.append((op, shape, dtype))
            if self._trace is not None:
                self._trace.write(f"#{len(self._calls) - 1} {op} {list(shape)} {dtype}\n")

    def add_tensor(self, op: str, tensor: torch.Tensor) -> None:
        self.add(op, tuple(tensor.shape), str(tensor.dtype).removeprefix("torch."))

    def note(self, text: str) -> None:
        """A marker line in the trace (e.g. which step starts), not a collective."""
        if self._trace is not None:
            self._trace.write(f"-- {text}\n")

    def mark(self) -> int:
        with self._lock:
            return len(self._calls)

    def since(self, mark: int) -> tuple[tuple[str, tuple[int, ...], str], ...]:
        with self._lock:
            return tuple(self._calls[mark:])


class LoggedAllToAll:
    """An all-to-all that notes every call it issues in a CollectiveLog."""

    def __init__(self, inner: Callable[[torch.Tensor, torch.Tensor], Callable[[], None]],
                 log: CollectiveLog) -> None:
        self.inner = inner
        self.log = log

    def __call__(self, out: torch.Tensor, inp: torch.Tensor) -> Callable[[], None]:
        self.log.add_tensor("all_to_all", inp)
        return self.inner(out, inp)

