"""Step and start-up records: what each rank decided and did, as plain frozen data.

Tensors are stored as nested tuples of floats so a record is serialisable and hashable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from harness.history.codec import decode, encode
from harness.history.decision import StepPlan
from harness.history.step_error import StepError

Rows = tuple[tuple[float, ...], ...]
Fingerprint = tuple[tuple[str, tuple[int, ...], str], ...]  # (op, shape, dtype) per call
Span = tuple[int, int, int, int]  # req_start, req_stop, tok_start, tok_stop
Route = tuple[int, int, int]  # (source rank, token, expert)


@dataclass(frozen=True)
class GraphRecord:
    """One captured graph of one rank."""

    label: str
    num_ubatches: int
    empty: bool | None
    fingerprint: Fingerprint
    bytes: int
    # The rank's own claim: a legal all-equal decode size that replays it (None: none does).
    # The judge reads only the label, and computes reach from the spec.
    reached_by: int | None


@dataclass(frozen=True)
class StartupRecord:
    rank: int
    planned: tuple[str, ...]  # the graphs this rank's table captures, in capture order
    graphs: tuple[GraphRecord, ...]
    error: StepError | None
    threads_alive: tuple[str, ...]
    pending_run: bool
    seconds: float


@dataclass(frozen=True)
class UbatchError:
    """A microbatch thread's own error, with where it was raised (file:line (function))."""

    ubatch: int
    error: StepError
    where: str


@dataclass(frozen=True)
class RecvEvent:
    """One moment of a receive's life under vLLM's runner: "issued" by microbatch `ubatch`,
    its "hook" run (by `ubatch`), or its buffer "read" by its receiver `ubatch`."""

    kind: str
    receive: int  # the receive's id within the step
    ubatch: int
    what: str  # "dispatch" or "combine"


@dataclass(frozen=True)
class StreamOp:
    """One entry of a step's stream order on the CPU stand-in streams, in issue order: an
    event "record" or "wait" on `stream` (`subject` names the event), or a tracked tensor's
    "write" or "read" on it (`subject` names the tensor, `op` what touched it)."""

    kind: str  # "record", "wait", "write" or "read"
    stream: str
    subject: str  # e.g. "event-3", or "dispatch recv of microbatch 1"
    op: str = ""  # an access's op, e.g. "all_to_all", "experts"


@dataclass(frozen=True)
class VllmExecTrace:
    """What a step under vLLM's own execution code left for the checkers to read."""

    ubatch_errors: tuple[UbatchError, ...]
    receives: tuple[RecvEvent, ...]
    # vLLM's process-global ubatching state and forward context that the step left set
    # (empty: clean), e.g. "_CURRENT_CONTEXTS[1] is set".
    leftovers: tuple[str, ...]
    # Event records and waits on the stand-in streams, in issue order ("record ev on s").
    stream_events: tuple[str, ...] = ()
    # The same records and waits with each tracked tensor's writes and reads, in one issue
    # order (empty where the streams are real CUDA streams): harness/check/stream_order.py.
    stream_order: tuple[StreamOp, ...] = ()


@dataclass(frozen=True)
class StepRecord:
    rank: int
    step: int
    plan: StepPlan | None  # None when the rank failed before the DP sync returned
    # "replay", "eager-microbatched", "eager", "failed", or "skipped" (left before the sync)
    executed: str
    captured_split: tuple[Span, ...]  # empty unless a graph was replayed
    replay_split: tuple[Span, ...]
    # Collectives this rank issued (or its graph replays); None: unknown, the rank never
    # reported the step (its process died), which is not the same as having issued none.
    fingerprint: Fingerprint | None
    routes: tuple[Route, ...]  # received in the dispatch, sorted
    outputs: Rows  # the real rows only
    state: Rows  # the whole per-request state cache after the step
    threads_alive: tuple[str, ...]
    pending_run: bool
    error: StepError | None
    injected_fault: bool
    seconds: float
    replayed: str | None = None  # label of the captured graph whose replay ran, if any
    ran_split: tuple[Span, ...] = ()  # the slices the model ran (one for an unsplit step)
    a2a_tokens_per_rank: int | None = None  # what this rank's all-to-all buffers take
    vllm_exec: VllmExecTrace | None = None  # under vLLM's execution code only
    # The readiness tag of the run, and (microbatch, source rank, tag) of every block its
    # dispatches delivered (docs/spec.md §7.23); None where no run tags them.
    run_tag: int | None = None
    received_tags: tuple[tuple[int, int, int], ...] = ()
    # The choices a controlled schedule made in the step's microbatch run (None under os).
    schedule_choices: tuple[int, ...] | None = None

    @classmethod
    def failed(cls, rank: int, step: int, error: StepError, *,
               injected_fault: bool = False) -> StepRecord:
        """The record of a rank that never reported the step (its process is gone)."""
        return cls(rank=rank, step=step, plan=None, executed="failed", captured_split=(),
                   replay_split=(), fingerprint=None, routes=(), outputs=(), state=(),
                   threads_alive=(), pending_run=False, error=error,
                   injected_fault=injected_fault, seconds=0.0)

    def to_dict(self) -> dict[str, Any]:
        """Every field as plain JSON data, outputs and state exactly: `from_dict` reads it."""
        return encode(self, StepRecord)

    @classmethod
    def from_dict(cls, data: Any, where: str = "record") -> StepRecord:
        return decode(data, cls, where)


def span(sl) -> Span:
    return (sl.req_start, sl.req_stop, sl.tok_start, sl.tok_stop)


def rows_of(tensor) -> Rows:
    """A tensor's rows as nested tuples of floats."""
    return tuple(tuple(row) for row in tensor.tolist())


def rows_tensor(rows: Rows) -> torch.Tensor:
    """Recorded rows back as a float64 tensor (the model's dtype); none: a 0 x 0 tensor."""
    return (torch.tensor(rows, dtype=torch.float64) if rows
            else torch.zeros(0, 0, dtype=torch.float64))
