"""Which microbatch context the calling thread runs, and `THREAD_OVERLAP`, which forwards the
`MicrobatchOverlap` calls of any thread to it."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from harness.runtime.overlap import RecvHook

if TYPE_CHECKING:
    from harness.runtime.ubatching.ring import UBatchContext

_TLS = threading.local()


def current_context() -> UBatchContext | None:
    """The microbatch context bound to the calling thread, if it is a microbatch thread."""
    return getattr(_TLS, "ctx", None)


def bind(ctx: UBatchContext | None) -> None:
    """Bind (or, with None, unbind) the calling thread's microbatch context."""
    _TLS.ctx = ctx


class ThreadOverlap:
    """`MicrobatchOverlap` for whichever microbatch thread calls it; outside a microbatch
    thread it behaves like `NoOverlap(0)` (a registered hook runs at once)."""

    def maybe_run_recv_hook(self) -> None:
        ctx = current_context()
        if ctx is not None:
            ctx.maybe_run_recv_hook()

    def register_recv_hook(self, hook: RecvHook) -> None:
        ctx = current_context()
        if ctx is None:
            hook()
        else:
            ctx.register_recv_hook(hook)

    def yield_(self) -> None:
        ctx = current_context()
        if ctx is not None:
            ctx.yield_()

    def current_ubatch_id(self) -> int:
        ctx = current_context()
        return 0 if ctx is None else ctx.id


THREAD_OVERLAP = ThreadOverlap()
