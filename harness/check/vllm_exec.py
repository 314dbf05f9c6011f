"""Checkers of steps that ran on vLLM's own execution code (docs/spec.md §8.7): its
microbatch threads' own errors, its process-global ubatching state after the step, and the
order of every receive (its hook before its reader). Pure functions over step records."""

from __future__ import annotations

from collections.abc import Sequence

from harness.check.verdict import Judgement, failed, held, not_applicable
from harness.errors import ErrorOrigin
from harness.history.records import StepRecord, UbatchError
from harness.history.step_error import StepError

# A microbatch that fails with one of these waited on, or was released by, another's failure.
CONSEQUENCES = (ErrorOrigin.INJECTED, ErrorOrigin.KILLED, ErrorOrigin.TIMEOUT,
                ErrorOrigin.LOST, ErrorOrigin.HANG, ErrorOrigin.ABORTED)
# Python's signs of a mistake in the program itself, and a race the CUDA sanitizer caught
# (docs/spec.md §10.1): a microbatch that dies of one crashed, whatever failed before it or is
# chained as its cause. Matched on the type's own name, which is what a recorded error keeps.
PROGRAMMING_ERRORS = frozenset({
    "AttributeError", "TypeError", "KeyError", "IndexError", "LookupError", "AssertionError",
    "NameError", "UnboundLocalError", "ZeroDivisionError", "ArithmeticError", "OverflowError",
    "RecursionError", "NotImplementedError", "ImportError", "ModuleNotFoundError",
    "SyntaxError", "SystemError", "FrozenInstanceError", "CUDASanitizerErrors"})
HARNESS_RAN = "the harness's own execution ran the step"


def microbatch_crash(records: Sequence[StepRecord | None]) -> str | None:
    """The first microbatch thread that failed of its own accord, named with where it raised;
    None if none. A thread's error is a consequence, not a crash, when it is no programming
    error and either carries a harness origin (an injected fault, a timeout, or traced to one
    through its causes) or was raised after the rank's first failure: a sibling a fix
    released, whatever exception the fix chose, chained or not."""
    for rec in records:
        if rec is None or rec.vllm_exec is None:
            continue
        errors = rec.vllm_exec.ubatch_errors
        preceded = _failed_outside_the_trace(rec.error, errors)
        for ue in errors:
            if _crashed(ue.error, after_a_failure=preceded):
                return (f"rank {rec.rank} microbatch {ue.ubatch} crashed: {ue.error.describe()} "
                        f"at {ue.where}")
            preceded = True  # threads record their errors in the order they leave the forward
    return None


def _crashed(error: StepError, *, after_a_failure: bool) -> bool:
    if error.kind in PROGRAMMING_ERRORS:
        return True
    return error.origin not in CONSEQUENCES and not after_a_failure


def _failed_outside_the_trace(step_error: StepError | None,
                              errors: Sequence[UbatchError]) -> bool:
    """The rank's step failed of a harness origin that no thread's recorded error carries: its
    fault fired outside every forward (a thread's set-up, a hook a context ran on its way out),
    so every error its threads recorded came after it."""
    return (step_error is not None and step_error.origin in CONSEQUENCES
            and not any(ue.error.origin in CONSEQUENCES for ue in errors))


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

