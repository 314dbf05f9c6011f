"""The microbatch ("DBO") thread protocol: k threads pass one turn around a ring.

docs/spec.md §5. Two variants, chosen by name: ``stock`` (faithful to vLLM, bugs
§7.3/§7.4 included) and ``abortable`` (the default: a failure unwinds its siblings).

- `errors`: what a run raises (`ProtocolError`, `MicrobatchAborted`, `MicrobatchFailed`,
  `MicrobatchHang`).
- `member`: what a policy may touch of a context (`RingMember`), so it never imports the ring.
- `protocols`: the variants as policies (`StockProtocol`, `AbortableProtocol`).
- `ring`: one microbatch's end of the ring (`UBatchContext`) and a run's shared state.
- `threads`: `MicrobatchThreads`, which starts, finishes and aborts runs.
- `binding`: which context a thread runs; `THREAD_OVERLAP`.
- `proof`: one step under controlled schedules (`harness.runtime.schedule`), judged; the
  exhaustive counts (docs/schedules.md). Not imported here.

The MoE layer takes one `MicrobatchOverlap`; `THREAD_OVERLAP` (also
`MicrobatchThreads.overlap`) implements it for whichever microbatch thread calls it, and
behaves like `NoOverlap` on a thread that is not a microbatch thread. A context also
implements it itself.
"""

from harness.runtime.ubatching.binding import THREAD_OVERLAP, ThreadOverlap, current_context
from harness.runtime.ubatching.errors import (
    MicrobatchAborted,
    MicrobatchFailed,
    MicrobatchHang,
    ProtocolError,
)
from harness.runtime.ubatching.protocols import (
    DEFAULT_VARIANT,
    VARIANTS,
    AbortableProtocol,
    RingProtocol,
    StockProtocol,
    protocol_for,
)
from harness.runtime.ubatching.ring import UBatchContext
from harness.runtime.ubatching.threads import MicrobatchThreads

__all__ = [
    "DEFAULT_VARIANT",
    "THREAD_OVERLAP",
    "VARIANTS",
    "AbortableProtocol",
    "MicrobatchAborted",
    "MicrobatchFailed",
    "MicrobatchHang",
    "MicrobatchThreads",
    "ProtocolError",
    "RingProtocol",
    "StockProtocol",
    "ThreadOverlap",
    "UBatchContext",
    "current_context",
    "protocol_for",
]
