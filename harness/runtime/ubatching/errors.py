"""What a microbatched run raises: a broken handoff, an abort, a hang."""

from __future__ import annotations

from collections.abc import Sequence

from harness.errors import ErrorOrigin


class ProtocolError(RuntimeError):
    """The handoff protocol was broken: two microbatch threads ran at once, or a context was
    used from a thread that is not its own."""


class MicrobatchAborted(RuntimeError):
    """Raised in a microbatch thread when its run is aborted (a sibling failed, or
    `abort_pending()`); the thread unwinds without running recv hooks."""

    origin = ErrorOrigin.ABORTED


class MicrobatchFailed(RuntimeError):
    """A microbatched run in which microbatch `ubatch` raised; the cause is its error (and
    says where the failure came from)."""

    def __init__(self, ubatch: int, num_ubatches: int) -> None:
        super().__init__(f"Microbatch {ubatch} of {num_ubatches} failed")
        self.ubatch = ubatch


class MicrobatchHang(RuntimeError):
    """A run that the stock protocol would never finish: `stuck_ids` waited past the hang
    timeout (or were still alive when the join bound ran out)."""

    origin = ErrorOrigin.HANG

    def __init__(self, stuck_ids: Sequence[int], num_ubatches: int,
                 failed_ids: Sequence[int] = ()) -> None:
        self.stuck_ids = tuple(sorted(stuck_ids))
        self.num_ubatches = num_ubatches
        self.failed_ids = tuple(sorted(failed_ids))
        failed = f"; failed: {list(self.failed_ids)}" if self.failed_ids else ""
        super().__init__(f"HANG: microbatch(es) {list(self.stuck_ids)} of {num_ubatches} "
                         f"never got the turn back{failed}")


class Stuck(BaseException):
    """Internal: a wait passed the hang timeout. BaseException so that bodies that catch
    Exception cannot swallow it; the thread ends as if it had hung."""
