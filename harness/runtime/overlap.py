"""How the MoE layer hands control to sibling microbatches (docs/spec.md §5.2 and §5.4).

The layer only talks to this interface: run the receive a sibling left for me, leave my own
receive for the next microbatch, yield. `NoOverlap` is the non-microbatched case, where a
registered receive runs at once; the threaded ring protocol implements the same Protocol.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

RecvHook = Callable[[], None]


@runtime_checkable
class MicrobatchOverlap(Protocol):
    def maybe_run_recv_hook(self) -> None:
        """Run (and clear) the receive hook a sibling microbatch registered for me, if any."""

    def register_recv_hook(self, hook: RecvHook) -> None:
        """Hand my pending receive to the microbatch that runs next."""

    def yield_(self) -> None:
        """Let the next microbatch run until it yields back."""

    def current_ubatch_id(self) -> int:
        """Which microbatch the caller is (selects per-microbatch communication buffers)."""


class NoOverlap:
    """No siblings: a registered receive completes immediately and yielding is a no-op.

    `ubatch_id` lets a sequential driver give each microbatch its own buffers.
    """

    def __init__(self, ubatch_id: int = 0) -> None:
        self._ubatch_id = ubatch_id

    def maybe_run_recv_hook(self) -> None:
        return None

    def register_recv_hook(self, hook: RecvHook) -> None:
        hook()

    def yield_(self) -> None:
        return None

    def current_ubatch_id(self) -> int:
        return self._ubatch_id
