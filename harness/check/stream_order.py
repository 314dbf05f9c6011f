"""Stream order (docs/spec.md §11): every read of a tensor another stream wrote is ordered
after that write, by happens-before across streams, computed from a step's stream order as
the CPU stand-in streams logged it (`VllmExecTrace.stream_order`; a replayed graph logs
again what its capture logged). Pure functions over step records.

Happens-before is each stream's program order plus event edges: a wait on stream t of an
event takes in what its latest record (issued before the wait) had seen on its stream. Each
stream keeps a vector clock, one count of accesses per stream; a read on stream t of a write
that was the n-th access of stream s is ordered iff t's clock has seen n accesses of s. A
write is judged the same way against the reads and the write of its tensor before it: on a
GPU an unordered write may land before an earlier read, or before an earlier write, is done.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from harness.check.verdict import Judgement, failed, held, not_applicable
from harness.history.records import StepRecord, StreamOp

ACCESSES = ("write", "read")
NOTHING_RECORDED = ("no tensor access was recorded on stand-in streams (the harness's "
                    "execution, or real CUDA streams)")

Clock = dict[str, int]  # stream -> how many of its accesses are known to have happened


@dataclass(frozen=True)
class _Access:
    stream: str
    tick: int  # the access's place among its stream's accesses (from 1)
    op: str


def _merge(into: Clock, other: Clock) -> None:
    for stream, tick in other.items():
        if tick > into.get(stream, 0):
            into[stream] = tick


def _unordered(clock: Clock, earlier: _Access) -> bool:
    return clock.get(earlier.stream, 0) < earlier.tick


def first_race(ops: Sequence[StreamOp]) -> str | None:
    """The first access in `ops` not ordered after an earlier one of its tensor that it
    conflicts with (a read after a write; a write after a read or a write), described; None
    if none. Accesses of a tensor not written in `ops` are judged only among themselves."""
    clocks: dict[str, Clock] = {}
    recorded: dict[str, Clock] = {}  # event -> its latest record's clock
    writes: dict[str, _Access] = {}  # tensor -> its latest write
    reads: dict[str, list[_Access]] = {}  # tensor -> its reads since that write
    for op in ops:
        clock = clocks.setdefault(op.stream, {})
        if op.kind == "record":
            recorded[op.subject] = dict(clock)
        elif op.kind == "wait":
            _merge(clock, recorded.get(op.subject, {}))  # never recorded: orders nothing
        elif op.kind in ACCESSES:
            clock[op.stream] = clock.get(op.stream, 0) + 1
            access = _Access(op.stream, clock[op.stream], op.op)
            race = (_read_race(op, clock, writes.get(op.subject)) if op.kind == "read"
                    else _write_race(op, clock, writes.get(op.subject),
                                     reads.get(op.subject, ())))
            if race is not None:
                return race
            if op.kind == "read":
                reads.setdefault(op.subject, []).append(access)
            else:
                writes[op.subject], reads[op.subject] = access, []
    return None


def _read_race(op: StreamOp, clock: Clock, write: _Access | None) -> str | None:
    if write is None or not _unordered(clock, write):
        return None
    return (f"{op.op} on stream {op.stream} reads {op.subject}, written by {write.op} on "
            f"stream {write.stream} with no event wait ordering the write before the read")


def _write_race(op: StreamOp, clock: Clock, write: _Access | None,
                reads: Sequence[_Access]) -> str | None:
    read = next((r for r in reads if _unordered(clock, r)), None)
    if read is not None:
        return (f"{op.op} on stream {op.stream} writes {op.subject}, read by {read.op} on "
                f"stream {read.stream} with no event wait ordering the read before the write")
    if write is not None and _unordered(clock, write):
        return (f"{op.op} on stream {op.stream} writes {op.subject}, written by {write.op} "
                f"on stream {write.stream} with no event wait ordering the two writes")
    return None


def has_accesses(rec: StepRecord | None) -> bool:
    return (rec is not None and rec.vllm_exec is not None
            and any(op.kind in ACCESSES for op in rec.vllm_exec.stream_order))


def check_stream_order(records: Sequence[StepRecord | None]) -> Judgement:
    """No rank's step reads, on one stream, a tensor another stream wrote without an event
    wait ordering the write first: on CPU the rows are right by accident, on a GPU not."""
    traced = [rec for rec in records if has_accesses(rec)]
    if not traced:
        return not_applicable(NOTHING_RECORDED)
    for rec in traced:
        race = first_race(rec.vllm_exec.stream_order)
        if race is not None:
            return failed(f"rank {rec.rank} step {rec.step}: {race}")
    return held()
