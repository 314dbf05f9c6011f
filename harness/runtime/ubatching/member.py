"""What a ring protocol may read and write of one microbatch's context: its place in the ring,
its two events, and the receive-hook stores of both variants.

`protocols` is written against this view and `ring.UBatchContext` provides it, so the policies
never import the ring that asks them.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Protocol

from harness.runtime.overlap import RecvHook


class RingMember(Protocol):
    """One microbatch's context as its ring protocol sees it."""

    id: int
    wait_event: threading.Event  # set by whoever passes the turn to me
    signal_event: threading.Event  # my fixed ring successor's wait event
    recv_hook: RecvHook | None  # stock: one slot, as in vLLM
    inbox: list[RecvHook]  # abortable: hooks for me, FIFO, never overwritten
    own_hooks: list[RecvHook]  # abortable: my hooks whose target had exited
    dropped_hooks: int

    def maybe_run_recv_hook(self) -> None:
        """Run (and clear) the receive hooks pending for me."""


# The ring's peer slots: a context while it runs, None once it has exited.
Slots = Sequence["RingMember | None"]
