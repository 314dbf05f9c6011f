"""The two protocol variants, as policies the ring asks (docs/spec.md §5.5-5.6, bugs §7.3/§7.4).

Everything the variants disagree on lives here: whom a yield wakes, where a receive hook
goes, what happens to pending hooks when a microbatch leaves, and whether one failure unwinds
its siblings. `UBatchContext` and `MicrobatchThreads` hold no variant flag.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

from harness.runtime.overlap import RecvHook
from harness.runtime.ubatching.errors import MicrobatchAborted
from harness.runtime.ubatching.member import RingMember, Slots


class RingProtocol(ABC):
    """What the ring asks of a variant. `me` is the calling microbatch's context."""

    name: ClassVar[str]
    # Whether a failure sets the run's abort event, so siblings unwind instead of waiting.
    unwinds_siblings: ClassVar[bool]

    @abstractmethod
    def run_hooks(self, me: RingMember) -> None:
        """Run (and clear) the receive hooks pending for `me`."""

    @abstractmethod
    def leave_hook(self, me: RingMember, peer: RingMember | None,
                   hook: RecvHook) -> None:
        """Hand `me`'s receive to `peer`, its ring successor (None once it has exited)."""

    @abstractmethod
    def next_to_wake(self, me: RingMember, slots: Slots) -> threading.Event | None:
        """The event `me` sets to pass the turn on; None when there is nobody to pass it to."""

    @abstractmethod
    def after_turn(self, me: RingMember) -> None:
        """`me` has the turn back at the end of a yield."""

    @abstractmethod
    def settle_hooks_at_exit(self, me: RingMember, error: BaseException | None) -> None:
        """`me` leaves the ring; `error` is None when its body returned."""

    @abstractmethod
    def wakes_next_on_exit(self, error: BaseException | None) -> bool:
        """Whether an exit that holds the turn passes it on."""


@dataclass(frozen=True)
class StockProtocol(RingProtocol):
    """Faithful to vLLM, bugs included.

    A failing microbatch never yields again; its exit runs its pending recv hook and wakes the
    next context once, so a survivor that yields again waits forever (docs/spec.md §7.4;
    bounded here by the hang timeout and reported as `MicrobatchHang`). Peer slots are cleared
    on exit, so registering a recv hook for an exited peer raises
    ``AttributeError("'NoneType' object has no attribute 'recv_hook'")`` (docs/spec.md §7.3).
    """

    name: ClassVar[str] = "stock"
    unwinds_siblings: ClassVar[bool] = False

    def run_hooks(self, me: RingMember) -> None:
        if me.recv_hook is not None:
            hook, me.recv_hook = me.recv_hook, None
            hook()

    def leave_hook(self, me: RingMember, peer: RingMember | None,
                   hook: RecvHook) -> None:
        if peer is not None and peer.recv_hook is not None:
            peer.dropped_hooks += 1  # vLLM overwrites the slot
        peer.recv_hook = hook  # peer None -> AttributeError, bug §7.3 of docs/spec.md

    def next_to_wake(self, me: RingMember, slots: Slots) -> threading.Event:
        return me.signal_event  # the fixed ring neighbour, whether or not it has exited

    def after_turn(self, me: RingMember) -> None:
        return None

    def settle_hooks_at_exit(self, me: RingMember, error: BaseException | None) -> None:
        me.maybe_run_recv_hook()  # as vLLM's context exit: even after a failure

    def wakes_next_on_exit(self, error: BaseException | None) -> bool:
        return True


@dataclass(frozen=True)
class AbortableProtocol(RingProtocol):
    """The default: a failure aborts the run, and the ring skips exited contexts.

    A failing microbatch sets the run's abort event, so every sibling raises
    `MicrobatchAborted` at its next wait and unwinds; `finish()` names the lowest original
    failure. A yield or exit wakes the next live context; a yield with no live sibling returns
    at once. A recv hook registered for an exited peer is retargeted to the registrant and runs
    when its next `yield_()` gets the turn back (or earlier at its own `maybe_run_recv_hook()`,
    or at its exit): before the body reads the received data, never dropped. Pending hooks of
    a context that fails or is aborted are dropped and counted in `dropped_hooks`.
    """

    name: ClassVar[str] = "abortable"
    unwinds_siblings: ClassVar[bool] = True

    def run_hooks(self, me: RingMember) -> None:
        while me.inbox or me.own_hooks:
            hook = (me.inbox or me.own_hooks).pop(0)
            hook()

    def leave_hook(self, me: RingMember, peer: RingMember | None,
                   hook: RecvHook) -> None:
        if peer is None or peer is me:
            me.own_hooks.append(hook)  # nobody left to receive it: I wait for it myself
        else:
            peer.inbox.append(hook)

    def next_to_wake(self, me: RingMember, slots: Slots) -> threading.Event | None:
        k = len(slots)
        for step in range(1, k):
            peer = slots[(me.id + step) % k]
            if peer is not None:
                return peer.wait_event
        return None

    def after_turn(self, me: RingMember) -> None:
        while me.own_hooks:  # my receive whose target had exited, before my body reads it
            me.own_hooks.pop(0)()

    def settle_hooks_at_exit(self, me: RingMember, error: BaseException | None) -> None:
        try:
            if error is None:
                me.maybe_run_recv_hook()
        finally:
            # A receive whose sender died must not be waited on: drop it, but count it.
            me.dropped_hooks += len(me.inbox) + len(me.own_hooks)
            me.inbox.clear()
            me.own_hooks.clear()

    def wakes_next_on_exit(self, error: BaseException | None) -> bool:
        return not isinstance(error, MicrobatchAborted)  # every sibling is unwinding anyway


PROTOCOLS: dict[str, RingProtocol] = {p.name: p for p in (StockProtocol(), AbortableProtocol())}
VARIANTS = tuple(PROTOCOLS)
DEFAULT_VARIANT = AbortableProtocol.name


def protocol_for(variant: str) -> RingProtocol:
    """The policy for a variant name (`HarnessConfig.mutation.protocol.value`)."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown ubatching variant {variant!r}; expected one of {VARIANTS}")
    return PROTOCOLS[variant]
