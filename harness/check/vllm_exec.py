"""Checkers of steps that ran on vLLM's own execution code (docs/spec.md §8.7): its
microbatch threads' own errors, its process-global ubatching state after the step, and the
order of every receive (its hook before its reader). Pure functions over step records."""

from __future__ import annotations

from collections.abc import Sequence

from harness.check.verdict import Judgement, failed, held, not_applicable
from harness.errors import ErrorOrigin
from harness.history.records import StepRecord

# A microbatch that fails with one of these waited on, or was released by, another's failure.
CONSEQUENCES = (ErrorOrigin.INJECTED, ErrorOrigin.KILLED, ErrorOrigin.TIMEOUT,
                ErrorOrigin.LOST, ErrorOrigin.HANG, ErrorOrigin.ABORTED)
HARNESS_RAN = "the harness's own execution ran the step"


def microbatch_crash(records: Sequence[StepRecord | None]) -> str | None:
    """The first microbatch thread that failed of its own accord (not an injected fault, nor
    traced to one or to a peer through its causes), named with where it raised; None if none."""
    for rec in records:
        if rec is None or rec.vllm_exec is None:
            continue
        for ue in rec.vllm_exec.ubatch_errors:
            if ue.error.origin not in CONSEQUENCES:
                return (f"rank {rec.rank} microbatch {ue.ubatch} crashed: {ue.error.describe()} "
                        f"at {ue.where}")
    return None


def check_ubatching_state(records: Sequence[StepRecord]) -> Judgement:
    """vLLM's ubatching globals (_CURRENT_CONTEXTS, _THREAD_ID_TO_CONTEXT) and its forward
    context are clear after every step, failed or not: the next step starts from nothing."""
    if all(rec.vllm_exec is None for rec in records):
        return not_applicable(HARNESS_RAN)
    for rec in records:
        if rec.vllm_exec is not None and rec.vllm_exec.leftovers:
            return failed(f"rank {rec.rank} after step {rec.step}: "
                         + "; ".join(rec.vllm_exec.leftovers))
    return held()


def check_recv_before_read(records: Sequence[StepRecord]) -> Judgement:
    """Every receive's hook ran before its receiver read the buffer (docs/spec.md §5.2)."""
    if all(rec.vllm_exec is None for rec in records):
        return not_applicable(HARNESS_RAN)
    if not any(rec.vllm_exec is not None and rec.vllm_exec.receives for rec in records):
        return not_applicable("no rank recorded a receive")
    for rec in records:
        if rec.vllm_exec is None:
            continue
        hooked: set[int] = set()
        for event in rec.vllm_exec.receives:
            if event.kind == "hook":
                hooked.add(event.receive)
            elif event.kind == "read" and event.receive not in hooked:
                return failed(f"rank {rec.rank} microbatch {event.ubatch} read its "
                             f"{event.what} receive #{event.receive} before its hook ran")
    return held()

